"""`keras-preact list` and `keras-preact summary`."""

import sys

from keras_preact.cli.common import print_table


def add_commands(subparsers):
    p = subparsers.add_parser("list", help="list the models with parameters and multiply-adds")
    p.add_argument("pattern", nargs="?", help="shell wildcard, e.g. 'preact_resnet1*'")
    p.set_defaults(func=cmd_list)
    p = subparsers.add_parser("summary", help="print a model's layers and costs")
    p.add_argument("name", help="a model name from `keras-preact list`")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--expand", action="store_true", help="expand the units' sub-layers")
    p.set_defaults(func=cmd_summary)


def cmd_list(args):
    from keras_preact import models
    names = models.list_models(args.pattern)
    if not names:
        raise ValueError(f"No model matches the pattern. Received: pattern={args.pattern!r}. "
                         f"Models: {', '.join(models.list_models())}")
    from keras.utils import Progbar
    bar = Progbar(len(names), unit_name="model", verbose=1 if sys.stderr.isatty() else 0)
    rows = []
    for i, name in enumerate(names):
        info = models.model_info(name)
        model = models.get_model(name)
        rows.append((name, str(info["depth"]), info["block"], f"{models.count_params(model):,}",
                     f"{models.count_macs(model) / 1e6:,.1f}M"))
        del model  # freed before the next one is built
        bar.update(i + 1)
    print_table(("model", "depth", "block", "parameters", "multiply-adds"), rows, right=(3, 4))
    return 0


def cmd_summary(args):
    from keras_preact import models
    model = models.get_model(args.name, classes=args.classes)
    model.summary(expand_nested=args.expand)
    print(f"Trainable parameters: {models.count_params(model):,}")
    print(f"Multiply-adds per image: {models.count_macs(model):,}")
    return 0
