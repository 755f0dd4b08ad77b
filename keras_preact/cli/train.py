"""`keras-preact train`, `evaluate` and `demo`; a `TrainConfig` field is a `train` flag."""

import argparse
import dataclasses
import typing

from keras_preact.cli.common import float_list, json_dict, verbosity
from keras_preact.training.config import ALIASES, RECIPES, TrainConfig, recipe
from keras_preact.training.demo import DEMO_EPOCHS, DEMO_WORKDIR

#: Argument types the annotations do not tell (`TrainConfig` splits `freeze` at the commas).
_TYPES = {"model_kwargs": json_dict, "boundaries": float_list, "freeze": str, "verbose": verbosity}
#: The first field of each group of `keras-preact train --help`.
_GROUPS = {"model": "what to train", "batch_size": "recipe", "deterministic": "how to run"}
#: The `TrainConfig` fields, each a `train` flag (what `tune` passes on too).
CONFIG_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


def add_commands(subparsers):
    p = subparsers.add_parser(
        "train", help="train a model with the paper's recipe (resumes an interrupted run)",
        description="Train with the paper's CIFAR recipe: batch 128, SGD momentum 0.9, coupled "
        "weight decay 1e-4, lr 0.1 (0.01 for the first 400 iterations), /10 at 32k and 48k "
        "iterations, stop at 64k. --epochs/--steps stretch that schedule to the given length; "
        "other batch sizes scale it (--lr-scale). Running the same command again resumes from "
        "the last completed epoch.")
    p.add_argument("--workdir", required=True, help="folder for checkpoints, metrics and the model")
    p.add_argument("--recipe", choices=list(RECIPES), default="paper", help="paper (the "
                   "defaults below) or fast (" + ", ".join(
                       f"{k}={v}" for k, v in RECIPES["fast"].items() if v != ())
                   + "); the flags given win")
    add_config_arguments(p)
    p.set_defaults(func=cmd_train)

    p = subparsers.add_parser(
        "evaluate", help="loss and accuracy of a trained model on a test split",
        description="Evaluate a run (--workdir) or a weights file (--model + --weights).")
    p.add_argument("--workdir", help="a training workdir (its model.keras or newest checkpoint)")
    p.add_argument("--model", help="a model name from `keras-preact list` (for a .weights.h5)")
    p.add_argument("--weights", help="a .keras file, or a .weights.h5 file with --model")
    p.add_argument("--dataset", help="dataset name (default: the workdir's)")
    p.add_argument("--data-dir", default=None, help="CIFAR files or TFDS data folder")
    p.add_argument("--data-source", default="auto", help="auto, tfds or archive")
    p.add_argument("--data-path", default=None, help="an archive, extracted folder or image folder")
    p.add_argument("--split", default="test", help="test or train (default test)")
    p.add_argument("--batch-size", type=int, default=256, help="images per batch (default 256)")
    p.add_argument("--verbose", default="auto", type=verbosity,
                   help="auto (a bar on a terminal, else a line), 0, 1, 2")
    p.add_argument("--flip", action="store_true", help="test-time augmentation: average the "
                   "probabilities of each image and its horizontal mirror")
    p.set_defaults(func=cmd_evaluate)

    p = subparsers.add_parser(
        "demo", help="offline demo: preact ResNet-20 on scikit-learn's digits (minutes on a CPU)",
        description="Train pre-activation ResNet-20 on the digits that ship with scikit-learn "
        "(no download), report held-out accuracy and write the training curve.")
    p.add_argument("--workdir", default=DEMO_WORKDIR,
                   help="folder of the run (default %(default)s; a rerun resumes it)")
    p.add_argument("--epochs", type=int, default=DEMO_EPOCHS, help="epochs (default %(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="initialisation, data order and augmentation (default 0)")
    p.add_argument("--no-export", action="store_true", help="skip the export step")
    p.add_argument("--verbose", default="auto", type=verbosity,
                   help="auto (a bar on a terminal, else a line per epoch), 0, 1, 2")
    p.set_defaults(func=cmd_demo)


def add_config_arguments(parser):
    """One flag per `TrainConfig` field: ``--batch-size`` for `batch_size`, and so on."""
    defaults, group, recipes = TrainConfig(), parser, set().union(*RECIPES.values())
    for field in dataclasses.fields(TrainConfig):
        group = parser.add_argument_group(_GROUPS[field.name]) if field.name in _GROUPS else group
        flags = ["--" + name.replace("_", "-") for name in [field.name, *(
            alias for alias, name in ALIASES.items() if name == field.name)]]
        default = getattr(defaults, field.name)
        # A recipe's field not given stays out of the namespace: the recipe's value applies.
        kwargs = dict(dest=field.name, choices=field.metadata["choices"],
                      default=argparse.SUPPRESS if field.name in recipes else default,
                      help=field.metadata["help"] + (
                          f" (default {default})" if default not in (None, (), {}) else ""))
        if field.type is bool:
            kwargs["action"] = argparse.BooleanOptionalAction  # --download and --no-download
        else:
            # Optional[int] -> int; a field of any type (`augment`) takes a name.
            arg_type = _TYPES.get(field.name) or next(
                (t for t in typing.get_args(field.type) if t is not type(None)), field.type)
            kwargs["type"] = str if arg_type is object else arg_type
        # --augment NAME and --no-augment exclude each other.
        into = group.add_mutually_exclusive_group() if field.name == "augment" else group
        into.add_argument(*flags, **kwargs)
        if field.name == "augment":
            into.add_argument("--no-augment", dest="augment", action="store_const", const=False,
                              default=argparse.SUPPRESS, help="no augmentation")


def cmd_train(args):
    from keras_preact.training.api import train_and_evaluate
    config = recipe(args.recipe, **{k: getattr(args, k) for k in CONFIG_FIELDS if hasattr(args, k)})
    result = train_and_evaluate(config, args.workdir)
    if result["resumed_from_epoch"] is None:
        print("The run was already complete.")
    elif result["resumed_from_epoch"]:
        print(f"Resumed from epoch {result['resumed_from_epoch']}.")
    if result.get("task") is not None and not result.get("is_chief"):
        # A multi-worker run: only the chief writes (and reports) the outputs.
        print(f"{result['task']} done; the chief wrote the outputs.")
    else:
        print(f"test accuracy {100 * result['test_accuracy']:.2f}%  test loss "
              f"{result['test_loss']:.4f}  ({result['epochs']} epochs, {result['steps']} steps)")
        print(f"workdir: {result['workdir']}\nmodel:   {result['model_path']}")
    if result.get("weights_digest"):
        print(f"weights digest: {result['weights_digest']}")
    return 0


def cmd_evaluate(args):
    from keras_preact.training.api import evaluate
    result = evaluate(args.workdir, **{k: getattr(args, k) for k in (
        "model", "weights", "dataset", "data_dir", "data_source", "data_path", "batch_size",
        "split", "verbose", "flip")})
    print(f"{result['dataset']} {result['split']}{' (flip)' * args.flip}: accuracy "
          f"{100 * result['accuracy']:.2f}%  "
          f"loss {result['loss']:.4f}  ({result['num_examples']} images; {result['source']})")
    return 0


def cmd_demo(args):
    from keras_preact.training.demo import run_demo
    result = run_demo(args.workdir, epochs=args.epochs, seed=args.seed, export=not args.no_export,
                      verbose=args.verbose)
    print(f"Held-out accuracy on digits: {100 * result['test_accuracy']:.2f}%  (loss "
          f"{result['test_loss']:.4f}; {result['epochs']} epochs, {result['steps']} steps)")
    print(f"model:   {result['model_path']}\ncurve:   {result['curve_path']}")
    if result.get("export"):
        print(f"export:  {result['export']['saved_model']}")
    return 0
