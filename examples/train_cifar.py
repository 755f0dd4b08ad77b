"""Reproduce the paper's CIFAR results with its recipe, on every GPU of one machine.

He et al. 2016, "Identity Mappings in Deep Residual Networks": batch 128 (the paper:
two GPUs, 64 each), SGD momentum 0.9, weight decay 1e-4, lr 0.1 (0.01 for the first
400 iterations), divided by 10 at 32k and 48k iterations, 64k iterations; 4-pixel
pad, random crop and horizontal flip. The paper's test error (%, median of 5 runs) for
ResNet-110, 164 and 1001 is printed beside ours (from the catalog, zoo/models.json).

Examples:

    # CIFAR-10 from TFDS (prepared beforehand, e.g. with --download once):
    python examples/train_cifar.py --model preact_resnet164 --dataset cifar10

    # From the original archive, two GPUs, bfloat16:
    python examples/train_cifar.py --model preact_resnet1001 --dataset cifar100 \\
        --data-dir ~/data --data-source archive --precision mixed_bfloat16

    # A few steps on a CPU (what CI runs):
    python examples/train_cifar.py --model preact_resnet20 --dataset digits --steps 4 \\
        --batch-size 16 --cpu-devices 2 --workdir /tmp/run

Stop it at any time and run the same command again: it resumes from the last
completed epoch. The run's folder (default ``runs/<model>-<dataset>-seed<seed>``)
gets checkpoints, ``metrics.json``/``.csv``, TensorBoard logs, the training curve and
the final ``model.keras``.

The flags here are the few this recipe needs; ``keras-preact train`` has one for every
`TrainConfig` field. The defaults differ from it only in ``strategy="mirrored"`` (all
visible GPUs, as the paper used two) and the workdir.
"""

import argparse
import logging
import os
import sys


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a pre-activation ResNet with the paper's CIFAR recipe.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:")[1],
    )
    parser.add_argument("--model", default="preact_resnet110")
    parser.add_argument("--dataset", default="cifar10", help="cifar10, cifar100 or digits")
    parser.add_argument("--data-dir", default=None, help="the CIFAR files or TFDS data folder")
    parser.add_argument("--data-source", default="auto", help="auto, tfds or archive")
    parser.add_argument("--download", action="store_true",
                        help="let TFDS download (default: offline)")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None,
                        help="stretch the schedule to this many epochs")
    length.add_argument("--steps", type=int, default=None,
                        help="stretch the schedule to this many updates")
    parser.add_argument("--batch-size", type=int, default=128,
                        help="global batch (the paper's 128)")
    parser.add_argument("--precision", default="fp32", help="fp32, mixed_float16 or mixed_bfloat16")
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="split the CPU into N logical devices (mirrored on a CPU-only host)")
    parser.add_argument("--eval-every", type=int, default=1,
                        help="epochs between test evaluations (0: end only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", default="auto", choices=("auto", "0", "1", "2"))
    parser.add_argument("--workdir", default=None, help="default runs/<model>-<dataset>-seed<seed>")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    workdir = args.workdir or os.path.join("runs", f"{args.model}-{args.dataset}-seed{args.seed}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from keras_preact.training import TrainConfig, train_and_evaluate

    config = TrainConfig(
        model=args.model, dataset=args.dataset, data_dir=args.data_dir,
        data_source=args.data_source, download=args.download, epochs=args.epochs,
        steps=args.steps, batch_size=args.batch_size, precision=args.precision,
        strategy="mirrored", cpu_devices=args.cpu_devices, eval_every=args.eval_every,
        seed=args.seed,
        verbose=args.verbose if args.verbose == "auto" else int(args.verbose),
    )
    try:
        result = train_and_evaluate(config, workdir)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"test accuracy {100 * result['test_accuracy']:.2f}%  "
          f"test loss {result['test_loss']:.4f}  "
          f"({result['epochs']} epochs, {result['steps']} steps)")
    print(f"workdir: {result['workdir']}")
    print(f"model:   {result['model_path']}")
    print(f"replicas: {result['num_replicas']}")
    from keras_preact.zoo_catalog import load_json

    entry = load_json("models.json")["models"].get(args.model, {})
    paper = entry.get(f"paper_error_{args.dataset}")
    if paper is not None:
        ours = 100.0 * (1.0 - result["test_accuracy"])
        print(f"test error {ours:.2f}% (paper: {paper:.2f}%, median of 5 runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
