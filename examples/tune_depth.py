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


def main(argv=None):
    from keras_preact.tuning import commands

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    commands.add_commands(sub)
    # The example is `keras-preact tune` with the same flags.
    args = parser.parse_args(["tune", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
