"""`keras-preact train`, `keras-preact evaluate` and `keras-preact demo`.

The library raises ValueError with the details of bad input; `keras_preact.cli.main`
reports it.
"""

import argparse
import json

from keras_preact.cli import verbosity
from keras_preact.training.config import DECAY_VARIABLES
from keras_preact.training.config import LR_SCALINGS
from keras_preact.training.config import PRECISIONS
from keras_preact.training.config import SCHEDULE_UNITS
from keras_preact.training.config import STRATEGIES
from keras_preact.training.config import TrainConfig

_DEFAULTS = TrainConfig()


def add_commands(subparsers):
    """Adds ``train``, ``evaluate`` and ``demo`` to the `keras-preact` parser."""
    p = subparsers.add_parser(
        "train",
        help="train a model with the paper's recipe (resumes an interrupted run)",
        description=(
            "Train with the paper's CIFAR recipe: batch 128, SGD momentum 0.9, coupled "
            "weight decay 1e-4, lr 0.1 (0.01 for the first 400 iterations), /10 at 32k "
            "and 48k iterations, stop at 64k. --epochs/--steps stretch that schedule "
            "to the given length; other batch sizes scale it (--lr-scale). Running the "
            "same command again resumes from the last completed epoch."
        ),
    )
    add_train_arguments(p)
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser(
        "evaluate",
        help="loss and accuracy of a trained model on a test split",
        description="Evaluate a run (--workdir) or a weights file (--model + --weights).",
    )
    p.add_argument("--workdir", help="a training workdir (uses its model.keras or newest checkpoint)")
    p.add_argument("--model", help="a model name from `keras-preact list` (for a .weights.h5)")
    p.add_argument("--weights", help="a .keras file, or a .weights.h5 file with --model")
    p.add_argument("--dataset", help="dataset name (default: the workdir's)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--data-source", default="auto", help="auto, tfds or archive")
    p.add_argument("--data-path", default=None)
    p.add_argument("--split", default="test")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--verbose", default="auto", type=verbosity)
    p.set_defaults(func=cmd_evaluate)

    from keras_preact.training.demo import DEMO_EPOCHS
    from keras_preact.training.demo import DEMO_WORKDIR

    p = subparsers.add_parser(
        "demo",
        help="offline demo: preact ResNet-20 on scikit-learn's digits (minutes on a CPU)",
        description=(
            "Train pre-activation ResNet-20 on the digits that ship with scikit-learn "
            "(no download), report held-out accuracy and write the training curve."
        ),
    )
    p.add_argument("--workdir", default=DEMO_WORKDIR)
    p.add_argument("--epochs", type=int, default=DEMO_EPOCHS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-export", action="store_true", help="skip the export step")
    p.add_argument("--verbose", default="auto", type=verbosity)
    p.set_defaults(func=cmd_demo)


def add_train_arguments(p, *, workdir_required=True):
    """The `train` flags (shared with examples/train_cifar.py)."""
    d = _DEFAULTS
    g = p.add_argument_group("what to train")
    g.add_argument("--model", default=d.model, help=f"a model name (default {d.model})")
    g.add_argument(
        "--model-kwargs", type=_json_dict, default={},
        help='JSON dict of extra model arguments, e.g. \'{"bottleneck_stride": "first"}\'; '
        '{"architecture": {...}} builds a PreActResNet from that config',
    )
    g.add_argument("--dataset", default=d.dataset, help="cifar10, cifar100, digits or folder")
    g.add_argument("--data-dir", default=None, help="CIFAR files or TFDS data folder")
    g.add_argument("--data-source", default=d.data_source, help="auto, tfds or archive")
    g.add_argument("--data-path", default=None, help="an archive, extracted folder or image folder")
    g.add_argument("--download", action="store_true", help="let TFDS download (default: offline)")
    g.add_argument(
        "--weights", default=None,
        help="fine-tune from pretrained weights: a catalog tag of --model (e.g. cifar10), "
        "a .weights.h5 or .keras file (e.g. another run's checkpoint), or URL#sha256=<hex>",
    )
    g.add_argument(
        "--freeze", default="",
        help="comma-separated parts kept frozen: stem, stage1, stage2, ..., head, backbone",
    )
    g.add_argument("--no-augment", dest="augment", action="store_const", const=False, default=None)
    g.add_argument("--workdir", required=workdir_required, default=None,
                   help="folder for checkpoints, metrics and the model")

    g = p.add_argument_group("recipe")
    length = g.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=int, default=None, help="run length in epochs (stretches the schedule)")
    length.add_argument("--steps", type=int, default=None, help="run length in updates (stretches the schedule)")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="global batch (default 128)")
    g.add_argument("--base-batch-size", type=int, default=d.base_batch_size)
    g.add_argument("--lr", dest="learning_rate", type=float, default=d.learning_rate)
    g.add_argument("--warmup-lr", dest="warmup_learning_rate", type=float, default=d.warmup_learning_rate)
    g.add_argument("--lr-scale", dest="lr_scaling", choices=LR_SCALINGS, default=d.lr_scaling,
                   help="how rates follow the batch size (default linear)")
    g.add_argument("--momentum", type=float, default=d.momentum)
    g.add_argument("--nesterov", action="store_true")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="coupled L2 (default 1e-4)")
    g.add_argument("--weight-decay-on", choices=DECAY_VARIABLES, default=d.weight_decay_on)
    g.add_argument("--schedule-unit", choices=SCHEDULE_UNITS, default=d.schedule_unit)
    g.add_argument("--warmup", type=float, default=d.warmup)
    g.add_argument("--boundaries", type=_float_list, default=list(d.boundaries),
                   help="comma-separated, e.g. 32000,48000")
    g.add_argument("--decay-factor", type=float, default=d.decay_factor)
    g.add_argument("--total", type=float, default=d.total)
    g.add_argument("--seed", type=int, default=d.seed)
    g.add_argument("--eval-every", type=int, default=d.eval_every, help="epochs between test evaluations (0: end only)")
    g.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints)

    g = p.add_argument_group("hardware")
    g.add_argument("--strategy", choices=STRATEGIES, default=d.strategy)
    g.add_argument("--cpu-devices", type=int, default=None,
                   help="split the CPU into N logical devices (mirrored on a CPU-only host)")
    g.add_argument("--synchronized-bn", action="store_true", help="BatchNorm statistics over the global batch")
    g.add_argument("--precision", choices=PRECISIONS, default=d.precision)
    g.add_argument("--jit-compile", action="store_true", help="XLA (measure first: slower on CPU here)")
    g.add_argument("--deterministic", action="store_true", help="TensorFlow op determinism (bit-exact reruns)")
    g.add_argument("--intra-op-threads", type=int, default=None)
    g.add_argument("--inter-op-threads", type=int, default=None)
    g.add_argument("--verbose", default="auto", type=verbosity,
                   help="auto (a progress bar on a terminal, else a line per epoch), 0, 1, 2")


def config_from_args(args):
    """The `TrainConfig` a parsed `train` command line describes."""
    return TrainConfig(
        model=args.model,
        model_kwargs=args.model_kwargs,
        dataset=args.dataset,
        data_dir=args.data_dir,
        data_source=args.data_source,
        data_path=args.data_path,
        download=args.download,
        augment=args.augment,
        weights=getattr(args, "weights", None),
        freeze=getattr(args, "freeze", "") or (),
        batch_size=args.batch_size,
        base_batch_size=args.base_batch_size,
        learning_rate=args.learning_rate,
        warmup_learning_rate=args.warmup_learning_rate,
        lr_scaling=args.lr_scaling,
        momentum=args.momentum,
        nesterov=args.nesterov,
        weight_decay=args.weight_decay,
        weight_decay_on=args.weight_decay_on,
        schedule_unit=args.schedule_unit,
        warmup=args.warmup,
        boundaries=tuple(args.boundaries),
        decay_factor=args.decay_factor,
        total=args.total,
        epochs=args.epochs,
        steps=args.steps,
        seed=args.seed,
        deterministic=args.deterministic,
        strategy=args.strategy,
        cpu_devices=args.cpu_devices,
        synchronized_bn=args.synchronized_bn,
        precision=args.precision,
        jit_compile=args.jit_compile,
        eval_every=args.eval_every,
        keep_checkpoints=args.keep_checkpoints,
        intra_op_threads=args.intra_op_threads,
        inter_op_threads=args.inter_op_threads,
        verbose=args.verbose,
    )


def print_result(result):
    print(
        f"test accuracy {100 * result['test_accuracy']:.2f}%  test loss "
        f"{result['test_loss']:.4f}  ({result['epochs']} epochs, {result['steps']} steps)"
    )
    print(f"workdir: {result['workdir']}")
    print(f"model:   {result['model_path']}")


def cmd_train(args):
    from keras_preact.training.trainer import train_and_evaluate

    result = train_and_evaluate(config_from_args(args), args.workdir)
    if result["resumed_from_epoch"] is None:
        print("The run was already complete.")
    elif result["resumed_from_epoch"]:
        print(f"Resumed from epoch {result['resumed_from_epoch']}.")
    if result.get("task") is not None and not result.get("is_chief"):
        # A multi-worker run: only the chief writes (and reports) the outputs.
        print(f"{result['task']} done; the chief wrote the outputs.")
    else:
        print_result(result)
    if result.get("weights_digest"):
        print(f"weights digest: {result['weights_digest']}")
    return 0


def cmd_evaluate(args):
    if args.workdir is None and (args.dataset is None or (args.model is None and args.weights is None)):
        raise ValueError(
            "give --workdir, or --dataset with --weights (a .keras file, or --model and "
            f"its .weights.h5). Received: --dataset {args.dataset}, --model {args.model}, "
            f"--weights {args.weights}"
        )
    from keras_preact.training.trainer import evaluate

    result = evaluate(
        args.workdir, model=args.model, weights=args.weights, dataset=args.dataset,
        data_dir=args.data_dir, data_source=args.data_source, data_path=args.data_path,
        batch_size=args.batch_size, split=args.split, verbose=args.verbose,
    )
    print(
        f"{result['dataset']} {result['split']}: accuracy {100 * result['accuracy']:.2f}%  "
        f"loss {result['loss']:.4f}  ({result['num_examples']} images; {result['source']})"
    )
    return 0


def cmd_demo(args):
    from keras_preact.training.demo import run_demo

    result = run_demo(
        args.workdir, epochs=args.epochs, seed=args.seed, export=not args.no_export,
        verbose=args.verbose,
    )
    print(f"Held-out accuracy on digits: {100 * result['test_accuracy']:.2f}%")
    print(f"Training curve: {result['curve_path']}")
    print_result(result)
    if result.get("export"):
        print(f"Export: {result['export']}")
    return 0


def _json_dict(value):
    try:
        out = json.loads(value)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {value!r}") from None
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {value!r}")
    return out


def _float_list(value):
    try:
        return [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, not {value!r}") from None
