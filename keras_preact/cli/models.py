"""`keras-preact list` and `keras-preact summary`."""

import fnmatch

from keras_preact.cli.common import print_table


def add_commands(subparsers):
    p = subparsers.add_parser("list", help="list the models with parameters and multiply-adds")
    p.add_argument("pattern", nargs="?", help="shell wildcard, e.g. 'preact_resnet1*'")
    p.set_defaults(func=cmd_list, uses_keras=False)
    p = subparsers.add_parser("summary", help="print a model's layers and costs")
    p.add_argument("name", help="a model name from `keras-preact list`")
    p.add_argument("--classes", type=int, default=10, help="classifier outputs (default 10)")
    p.add_argument("--expand", action="store_true", help="expand the units' sub-layers")
    p.set_defaults(func=cmd_summary)


def cmd_list(args):
    # From the catalog (costs counted on the built models, a test checks them): no model
    # is built and neither Keras nor TensorFlow is imported.
    from keras_preact.zoo_catalog import load_json
    models = load_json("models.json")["models"]
    if not (names := fnmatch.filter(models, args.pattern or "*")):
        raise ValueError(f"No model matches the pattern. Received: pattern={args.pattern!r}. "
                         f"Models: {', '.join(models)}")
    rows = [(n, str(m["depth"]), m["block"], f"{m['params']:,}", f"{m['macs'] / 1e6:,.1f}M")
            for n, m in models.items() if n in names]
    print_table(("model", "depth", "block", "parameters", "multiply-adds"), rows, right=(3, 4))
    return 0


def cmd_summary(args):
    from keras_preact import models
    model = models.get_model(args.name, classes=args.classes)
    model.summary(expand_nested=args.expand)
    print(f"Trainable parameters: {models.count_params(model):,}")
    print(f"Multiply-adds per image: {models.count_macs(model):,}")
    return 0
