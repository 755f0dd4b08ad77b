"""`keras-preact export` and `keras-preact predict` over `keras_preact.export`.

`keras_preact.export` (and with it TensorFlow) is imported only when a command runs.

Examples:
    keras-preact export preact_resnet20 --format saved_model --out exports/r20
    keras-preact export runs/best.keras --format litert --quantization float16 --out exports/r20_lite
    keras-preact predict exports/r20 cat.png dog.jpg
"""

import json
import os
import sys

from keras_preact.cli.common import partial_status
from keras_preact.cli.common import print_error

#: `keras_preact.export.FORMATS` and `QUANTIZATIONS`, spelled here because that module
#: imports TensorFlow, which `--help` must not.
EXPORT_FORMATS = ("saved_model", "litert", "onnx")
QUANTIZATIONS = ("float16", "dynamic_range")


def add_commands(subparsers):
    """Adds ``export`` and ``predict`` to the `keras-preact` parser."""
    p = subparsers.add_parser(
        "export",
        help="export a model as SavedModel, LiteRT or ONNX, with a model card",
        description="Export a model for serving: a SavedModel for TF Serving "
        "(OUT/<version>/), LiteRT (.tflite) or ONNX, each taking uint8 images and "
        "checked against the Keras model, with model_card.json/.md beside it.",
    )
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT",
                   help="a model name from `keras-preact list` (random initialisation) or a .keras file")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="saved_model")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="saved_model: the base folder (the export goes to DIR/<version>); "
                        "litert/onnx: the export folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export")
    p.add_argument("--version", type=int, default=1, help="saved_model version folder (default 1)")
    p.add_argument("--top-k", type=int, default=None,
                   help="classes in the top_k_* outputs (default 5, or fewer classes)")
    p.add_argument("--include-features", action="store_true", help="add the pooled `features` output")
    p.add_argument("--accept-encoded", action="store_true",
                   help="saved_model: add the serve_encoded signature (JPEG/PNG bytes)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, default=None, help="litert only")
    p.add_argument("--preprocessing", default="auto",
                   help="'auto' (the model's own layer; cifar10 for a model name), a preset "
                        "(symmetric, unit, cifar10, cifar100, imagenet) or 'none'")
    p.add_argument("--classes", type=int, default=10, help="classes of a model built by name (default 10)")
    p.add_argument("--class-names", metavar="FILE", help="one class name a line, or a JSON list")
    p.add_argument("--no-parity-check", action="store_true", help="skip comparing the export with the Keras model")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser(
        "predict",
        help="classify images with an export or a .keras model",
        description="Print the top-k classes of each image. Images are checked (size, "
        "channels, 8-bit pixels, readable) before the model runs; a bad image is "
        "reported on stderr and the others are still classified (exit status 1).",
    )
    p.add_argument("model", metavar="EXPORT_OR_MODEL",
                   help="a SavedModel export (base or version folder), a LiteRT/ONNX export "
                        "folder or file, or a .keras file")
    p.add_argument("images", metavar="IMAGE", nargs="+", help="image files (PNG, JPEG, ...) or .npy uint8 arrays")
    p.add_argument("--top-k", type=int, default=None, help="default: the export's top-k")
    p.add_argument("--preprocessing", default="auto", help="for .keras models without their own layer")
    p.add_argument("--class-names", metavar="FILE", help="overrides the export's class names")
    p.add_argument("--resize", action="store_true",
                   help="convert images to the model's channels (grey, RGB) and resize them "
                        "to its input size, instead of refusing them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_predict)


def _preprocessing(value):
    """'auto' stays 'auto', 'none' means None, anything else is a checked preset name."""
    if value.lower() == "none":
        return None
    if value != "auto":
        from keras_preact.layers.preprocessing import resolve_preprocessing

        try:
            resolve_preprocessing(value)
        except ValueError as err:
            raise ValueError(f"--preprocessing: {err}") from None
    return value


def _class_names(path):
    from keras_preact.export import read_class_names

    return None if path is None else read_class_names(path)


def cmd_export(args):
    if args.quantization is not None and args.format != "litert":
        raise ValueError(f"--quantization applies to --format litert only. Received: --format {args.format}")
    if args.format != "saved_model":
        for flag, given in (("--version", args.version != 1), ("--accept-encoded", args.accept_encoded)):
            if given:
                raise ValueError(f"{flag} applies to --format saved_model only")
    class_names = _class_names(args.class_names)
    preprocessing = _preprocessing(args.preprocessing)
    from keras_preact import export

    model, described = export.load_model_to_export(args.model, classes=args.classes, preprocessing=preprocessing)
    options = {"saved_model": dict(version=args.version, accept_encoded=args.accept_encoded),
               "litert": dict(quantization=args.quantization), "onnx": {}}[args.format]
    folder = export.export_model(
        model, args.out, format=args.format, top_k=args.top_k, include_features=args.include_features,
        class_names=class_names, overwrite=args.overwrite, check_parity=not args.no_parity_check,
        verbose=sys.stdout.isatty(), **described, **options,
    )
    print(f"Exported {args.model} as {args.format} to {folder}")
    parity = export.read_model_card(folder).get("parity")
    if parity:
        print(f"Parity with the Keras model: max |difference| of probabilities {parity['max_abs_diff']:.3g} "
              f"(tolerance {parity['tolerance']:.3g}), top-1 agreement {parity['top1_agreement']:.0%} "
              f"on {parity['images']} images")
    print(f"Model card: {os.path.join(folder, 'model_card.md')}")
    return 0


def cmd_predict(args):
    import numpy as np

    from keras_preact import export

    preprocessing = _preprocessing(args.preprocessing)
    # From the model card (or a .keras file's config), so that bad images are found
    # before the model loads; loaded first only when it is the only source.
    shape = export.expected_input_shape(args.model)
    class_names = _class_names(args.class_names)
    served = None
    if shape is None:
        served = export.load_export(args.model, preprocessing=preprocessing)
        shape = served.input_shape
    names, images, failed = [], [], 0
    for path in args.images:
        try:
            read = export.read_image_file(path, shape, resize=args.resize)
        except ValueError as err:  # the other images are still classified
            print_error(err)
            failed += 1
            continue
        names += [name for name, _ in read]
        images += [image for _, image in read]
    if not images:
        return partial_status(failed, len(args.images))
    served = served or export.load_export(args.model, preprocessing=preprocessing)
    top = export.top_k_predictions(served.predict(np.stack(images)), top_k=args.top_k,
                                   class_names=class_names or served.class_names)
    if args.json:
        print(json.dumps([{"image": n, "top_k": t} for n, t in zip(names, top)], indent=2))
    else:
        for name, entries in zip(names, top):
            print(name)
            for rank, entry in enumerate(entries, start=1):
                print(f"  {rank:>2}. {entry.get('label', str(entry['class'])):<20} {entry['score']:.4f}")
    return partial_status(failed, len(args.images))
