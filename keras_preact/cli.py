"""The `keras-preact` command."""

import argparse
import os
import sys


def _quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _cmd_list(args):
    import keras_preact as kp

    names = kp.list_models(args.pattern)
    if not names:
        print(f"No model matches {args.pattern!r}. Models: {', '.join(kp.list_models())}")
        return 1
    rows = []
    iterator = names
    if sys.stderr.isatty():
        from keras.utils import Progbar

        bar = Progbar(len(names), stateful_metrics=None, unit_name="model")
    else:
        bar = None
    for i, name in enumerate(iterator):
        info = kp.model_info(name)
        model = kp.get_model(name)
        rows.append(
            (
                name,
                str(info["depth"]),
                info["block"],
                f"{kp.count_params(model):,}",
                f"{kp.count_macs(model) / 1e6:,.1f}M",
            )
        )
        del model
        if bar is not None:
            bar.update(i + 1)
    header = ("model", "depth", "block", "parameters", "multiply-adds")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return 0


def _cmd_summary(args):
    import keras_preact as kp

    try:
        model = kp.get_model(args.name, classes=args.classes)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    model.summary(expand_nested=args.expand)
    print(f"Trainable parameters: {kp.count_params(model):,}")
    print(f"Multiply-adds per image: {kp.count_macs(model):,}")
    return 0


#: Modules that add subcommands: each defines `add_commands(subparsers)`, where every
#: subparser sets `func` (called with the parsed args, returning an exit code).
#: They are imported only when the CLI runs, so the library never imports the CLI.
COMMAND_MODULES = (
    "keras_preact.training.commands",
    "keras_preact.export_commands",
    "keras_preact.weights.commands",
    "keras_preact.diagnostics_commands",
    "keras_preact.tuning.commands",
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-preact",
        description="Pre-activation ResNets (He et al. 2016) for Keras 3.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the models with parameters and multiply-adds")
    p.add_argument("pattern", nargs="?", default=None, help="shell wildcard, e.g. 'preact_resnet1*'")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("summary", help="print a model's layers and costs")
    p.add_argument("name", help="a model name from `keras-preact list`")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--expand", action="store_true", help="expand the units' sub-layers")
    p.set_defaults(func=_cmd_summary)
    import importlib

    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # that part of the package is not there yet
            raise
        module.add_commands(sub)
    return parser


def main(argv=None):
    _quiet_tensorflow()
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
