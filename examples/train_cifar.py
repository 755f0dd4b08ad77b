"""Reproduce the paper's CIFAR results with its recipe, on every GPU of one machine.

He et al. 2016, "Identity Mappings in Deep Residual Networks": batch 128 (the paper:
two GPUs, 64 each), SGD momentum 0.9, weight decay 1e-4, lr 0.1 (0.01 for the first
400 iterations), divided by 10 at 32k and 48k iterations, 64k iterations; 4-pixel
pad, random crop and horizontal flip. Test error (%, median of 5 runs) in the paper:

    pre-act ResNet-110  CIFAR-10  6.37
    pre-act ResNet-164  CIFAR-10  5.46    CIFAR-100  24.33
    pre-act ResNet-1001 CIFAR-10  4.92    CIFAR-100  22.71

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

Every flag of ``keras-preact train`` works here; the defaults differ only in
``--strategy mirrored`` (all visible GPUs, as the paper used two) and the workdir.
"""

import argparse
import logging
import os
import sys

from keras_preact.training.commands import add_train_arguments
from keras_preact.training.commands import config_from_args
from keras_preact.training.commands import print_result

#: Test error (%) of the paper's pre-activation networks (median of 5 runs).
PAPER_ERROR = {
    ("preact_resnet110", "cifar10"): 6.37,
    ("preact_resnet164", "cifar10"): 5.46,
    ("preact_resnet164", "cifar100"): 24.33,
    ("preact_resnet1001", "cifar10"): 4.92,
    ("preact_resnet1001", "cifar100"): 22.71,
}


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a pre-activation ResNet with the paper's CIFAR recipe.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("Examples:")[1],
    )
    add_train_arguments(parser, workdir_required=False)
    parser.set_defaults(strategy="mirrored")
    args = parser.parse_args(argv)
    if args.workdir is None:
        args.workdir = os.path.join("runs", f"{args.model}-{args.dataset}-seed{args.seed}")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from keras_preact.training import train_and_evaluate

    try:
        config = config_from_args(args)
        result = train_and_evaluate(config, args.workdir)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print_result(result)
    print(f"replicas: {result['num_replicas']}")
    paper = PAPER_ERROR.get((args.model, args.dataset))
    if paper is not None:
        ours = 100.0 * (1.0 - result["test_accuracy"])
        print(f"test error {ours:.2f}% (paper: {paper:.2f}%, median of 5 runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
