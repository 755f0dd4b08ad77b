"""`keras-preact export` and `keras-preact predict` over `keras_preact.export`, e.g.
``keras-preact export runs/best.keras --format litert --out exports/lite`` and
``keras-preact predict exports/lite cat.png dog.jpg``."""

import json
import os
import sys

from keras_preact.cli.common import partial_status, print_error

#: `keras_preact.export.FORMATS` and `QUANTIZATIONS`: that module imports TensorFlow, which
#: `--help` must not. Then the flags of one format only.
EXPORT_FORMATS = ("saved_model", "litert", "onnx")
QUANTIZATIONS = ("float16", "dynamic_range")
_FORMAT_FLAGS = {"version": "saved_model", "accept_encoded": "saved_model",
                 "quantization": "litert"}


def add_commands(subparsers):
    p = subparsers.add_parser(
        "export", help="export a model as SavedModel, LiteRT or ONNX, with a model card",
        description="Export for serving: a SavedModel for TF Serving (OUT/<version>/), LiteRT "
        "(.tflite) or ONNX on uint8 images, checked against Keras, with model_card.json/.md.")
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT", help="a model name from "
                   "`keras-preact list` (random initialisation) or a .keras file")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="saved_model")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="saved_model: the base folder (the export goes to DIR/<version>); "
                        "litert/onnx: the export folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export")
    p.add_argument("--version", type=int, help="saved_model version folder (default 1)")
    p.add_argument("--top-k", type=int, help="classes in the top_k_* outputs (default 5, or fewer)")
    p.add_argument("--include-features", action="store_true", help="add the `features` output")
    p.add_argument("--accept-encoded", action="store_true", default=None,
                   help="saved_model: add the serve_encoded signature (JPEG/PNG bytes)")
    p.add_argument("--quantization", choices=QUANTIZATIONS, help="litert only")
    p.add_argument("--preprocessing", default="auto",
                   help="'auto' (the model's own layer; cifar10 for a model name), a preset "
                        "(symmetric, unit, cifar10, cifar100, imagenet) or 'none'")
    p.add_argument("--classes", type=int, default=10, help="for a model built by name (default 10)")
    p.add_argument("--class-names", metavar="FILE", help="one class name a line, or a JSON list")
    p.add_argument("--no-parity-check", action="store_true", help="skip comparing with Keras")
    p.set_defaults(func=cmd_export)

    p = subparsers.add_parser(
        "predict", help="classify images with an export or a .keras model",
        description="Print the top-k classes of each image. Images are checked (size, "
        "channels, 8-bit pixels, readable) before the model runs; a bad image is "
        "reported on stderr and the others are still classified (exit status 1).")
    p.add_argument("model", metavar="EXPORT_OR_MODEL",
                   help="a SavedModel export (base or version folder), a LiteRT/ONNX export "
                        "folder or file, or a .keras file")
    p.add_argument("images", metavar="IMAGE", nargs="+",
                   help="image files (PNG, JPEG, ...) or .npy uint8 arrays")
    p.add_argument("--top-k", type=int, help="default: the export's top-k")
    p.add_argument("--preprocessing", default="auto", help="for a .keras model without its layer")
    p.add_argument("--class-names", metavar="FILE", help="overrides the export's class names")
    p.add_argument("--resize", action="store_true",
                   help="convert images to the model's channels (grey, RGB) and resize them "
                        "to its input size, instead of refusing them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_predict)


def _preprocessing(value):
    """'none' means None; a preset name is checked before any model loads."""
    if value.lower() == "none":
        return None
    if value != "auto":
        from keras_preact.layers.preprocessing import resolve_preprocessing
        resolve_preprocessing(value)
    return value


def cmd_export(args):
    options = {k: getattr(args, k) for k in _FORMAT_FLAGS if getattr(args, k) is not None}
    for name, only in _FORMAT_FLAGS.items():
        if name in options and args.format != only:
            raise ValueError(f"--{name.replace('_', '-')} applies to --format {only} only. "
                             f"Received: --format {args.format}")
    preprocessing = _preprocessing(args.preprocessing)
    from keras_preact import export
    class_names = None if args.class_names is None else export.read_class_names(args.class_names)
    model, described = export.load_model_to_export(args.model, classes=args.classes,
                                                   preprocessing=preprocessing)
    folder = export.export_model(
        model, args.out, format=args.format, top_k=args.top_k,
        include_features=args.include_features, class_names=class_names,
        overwrite=args.overwrite, check_parity=not args.no_parity_check,
        verbose=sys.stdout.isatty(), **described, **options)
    print(f"Exported {args.model} as {args.format} to {folder}")
    if parity := export.read_model_card(folder).get("parity"):
        print("Parity with the Keras model: max |difference| of probabilities "
              f"{parity['max_abs_diff']:.3g} (tolerance {parity['tolerance']:.3g}), top-1 "
              f"agreement {parity['top1_agreement']:.0%} on {parity['images']} images")
    print(f"Model card: {os.path.join(folder, 'model_card.md')}")
    return 0


def cmd_predict(args):
    import numpy as np

    from keras_preact import export
    preprocessing = _preprocessing(args.preprocessing)
    class_names = None if args.class_names is None else export.read_class_names(args.class_names)
    # From the model card (or a .keras file's config), so that bad images are found
    # before the model loads; loaded first only when it is the only source.
    served, shape = None, export.expected_input_shape(args.model)
    if shape is None:
        served = export.load_export(args.model, preprocessing=preprocessing)
        shape = served.input_shape
    named, failed = [], 0
    for path in args.images:
        try:
            named += export.read_image_file(path, shape, resize=args.resize)
        except ValueError as err:  # the other images are still classified
            print_error(err)
            failed += 1
    if not named:
        return partial_status(failed, len(args.images))
    served = served or export.load_export(args.model, preprocessing=preprocessing)
    names, images = zip(*named)
    top = export.top_k_predictions(served.predict(np.stack(images)), top_k=args.top_k,
                                   class_names=class_names or served.class_names)
    if args.json:
        print(json.dumps([{"image": n, "top_k": t} for n, t in zip(names, top)], indent=2))
    else:
        for name, entries in zip(names, top):
            print(name)
            for rank, entry in enumerate(entries, start=1):
                label = entry.get("label", str(entry["class"]))
                print(f"  {rank:>2}. {label:<20} {entry['score']:.4f}")
    return partial_status(failed, len(args.images))
