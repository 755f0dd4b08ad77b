"""How deep should my network be for my data and budget? A depth sweep with KerasTuner.

Searches pre-activation ResNet depths (and, if asked, the block, unit variant, width
multiplier and recipe) under a cost budget, then prints the results table and where
the CSV, the plot and the best model (``.keras`` and SavedModel) are. Re-running the
same command continues the search; ``--overwrite`` starts it again.

Offline demo on scikit-learn's digits (minutes on a CPU):

    python examples/tune_depth.py --dataset digits --depths 8,14,20 --widths 0.5,1 \
        --max-params 150000 --batch-size 32 --epochs 4 --max-trials 4 \
        --workdir runs/tune_digits

The paper's question on CIFAR-10 (a GPU; data from TFDS or the original archives):

    python examples/tune_depth.py --dataset cifar10 --depths 20,56,110,164 \
        --max-macs 260e6 --epochs 30 --max-trials 8 --workdir runs/tune_cifar10

Distributed (KerasTuner's chief / worker mode; same --workdir on a shared disk):

    KERASTUNER_TUNER_ID=chief  KERASTUNER_ORACLE_IP=10.0.0.1 KERASTUNER_ORACLE_PORT=8000 \
        python examples/tune_depth.py ...   # on one machine: runs the oracle
    KERASTUNER_TUNER_ID=tuner0 KERASTUNER_ORACLE_IP=10.0.0.1 KERASTUNER_ORACLE_PORT=8000 \
        python examples/tune_depth.py ...   # on each worker: tuner0, tuner1, ...
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _numbers(value):
    """"8,14,0.5" -> [8, 14, 0.5]: whole numbers stay ints, as the study records them."""
    return [int(v) if v.strip().isdigit() else float(v) for v in value.split(",")]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="cifar10", help="cifar10, cifar100, digits or folder")
    parser.add_argument("--depths", type=_numbers, default=None, help="e.g. 20,56,110,164")
    parser.add_argument("--widths", type=_numbers, default=[1],
                        help="width multipliers, e.g. 0.5,1")
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--max-params", type=float, default=None, help="trainable parameters")
    budget.add_argument("--max-macs", type=float, default=None, help="multiply-adds per image")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per trial")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-trials", type=int, default=10)
    parser.add_argument("--overwrite", action="store_true", help="start this study again")
    parser.add_argument("--workdir", required=True)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from keras_preact.tuning import tune

    budget = None
    if args.max_params is not None:
        budget = {"kind": "params", "limit": int(args.max_params)}
    elif args.max_macs is not None:
        budget = {"kind": "macs", "limit": int(args.max_macs)}
    space = dict(dataset=args.dataset, width_multipliers=args.widths, epochs=args.epochs,
                 batch_size=args.batch_size, budget=budget)
    if args.depths is not None:
        space["depths"] = args.depths
    result = tune(args.workdir, max_trials=args.max_trials, overwrite=args.overwrite, **space)
    if result["role"] == "worker":
        print("Worker done: the chief writes the results.")
        return 0
    for row in result["rows"]:
        accuracy = (row["status"] if row["val_accuracy"] is None
                    else f"{100 * row['val_accuracy']:.2f}%")
        print(f"trial {row['trial']}: depth {row['depth']} {row['block']}, width {row['width']}, "
              f"{row['params']} parameters: validation accuracy {accuracy}")
    best = result["best"]
    print("best: none within the budget" if best is None else f"best: trial {best['trial']}")
    print(f"results: {result['csv']} and {result['png']}")
    print(f"model:   {result['best_model']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
