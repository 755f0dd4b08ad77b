"""The `keras-preact export` and `keras-preact predict` commands.

Listed in `keras_preact.cli.COMMAND_MODULES`. TensorFlow and the exporters
(`keras_preact.export`) are imported only when a command runs, after its arguments
and input files have been checked, so bad input fails fast.

Examples:
    keras-preact export preact_resnet20 --format saved_model --out exports/r20
    keras-preact export runs/best.keras --format litert --quantization float16 --out exports/r20_lite
    keras-preact predict exports/r20 cat.png dog.jpg
"""

import json
import os
import sys

import numpy as np

from keras_preact.cli import error_message
from keras_preact.cli import partial_status

EXPORT_FORMATS = ("saved_model", "litert", "onnx")
QUANTIZATIONS = ("float16", "dynamic_range")
#: Image files `predict` reads with Pillow; `.npy` files hold uint8 arrays.
NPY_SUFFIX = ".npy"


class CommandError(ValueError):
    """Bad input to a command (`keras_preact.cli.main` reports it)."""


# ----------------------------------------------------------------------------------
# export
# ----------------------------------------------------------------------------------


def _read_class_names(path):
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise CommandError(f"cannot read --class-names {path!r}: {err.strerror or err}") from None
    if path.endswith(".json"):
        try:
            names = json.loads(text)
        except ValueError as err:
            raise CommandError(f"--class-names {path!r} is not valid JSON ({err})") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CommandError(f"--class-names {path!r} must hold a JSON list of strings")
        return names
    return [line.strip() for line in text.splitlines() if line.strip()]


def _parse_preprocessing(value):
    """'auto' stays 'auto', 'none' means None, anything else is a preset name."""
    if value == "auto":
        return "auto"
    if value.lower() == "none":
        return None
    from keras_preact.layers.preprocessing import resolve_preprocessing

    try:
        resolve_preprocessing(value)
    except ValueError as err:
        raise CommandError(f"--preprocessing: {err}") from None
    return value


def _load_model_argument(name_or_path, *, classes, preprocessing):
    """Returns (model, preprocessing for the exporter, weights_info)."""
    import keras_preact as kp

    if name_or_path in kp.list_models():
        if preprocessing == "auto":
            # The zoo's nets are CIFAR networks; without weights there is no other
            # statistic to prefer.
            preprocessing = "cifar10" if kp.model_info(name_or_path)["family"] == "cifar" else "imagenet"
            print(f"note: building {name_or_path} with preprocessing={preprocessing!r} "
                  "(random initialisation)", file=sys.stderr)
        model = kp.get_model(name_or_path, classes=classes, preprocessing=preprocessing)
        return model, "auto", {"tag": None, "initialization": "random (He normal), no weights loaded"}
    if name_or_path.endswith(".keras"):
        if not os.path.isfile(name_or_path):
            raise CommandError(f"MODEL_OR_CHECKPOINT {name_or_path!r} does not exist")
        from keras_preact.export import file_sha256
        from keras_preact.weights.local import load_keras_file

        model = load_keras_file(name_or_path)
        weights_info = {"file": os.path.basename(name_or_path), "sha256": file_sha256(name_or_path)}
        return model, preprocessing, weights_info
    raise CommandError(
        f"MODEL_OR_CHECKPOINT must be a model name from `keras-preact list` or a .keras "
        f"file. Received: {name_or_path!r}. Models: {', '.join(kp.list_models())}"
    )


def _cmd_export(args):
    if args.quantization is not None and args.format != "litert":
        raise CommandError(
            f"--quantization applies to --format litert only. Received: --format {args.format}"
        )
    if args.format != "saved_model":
        for flag, given in (("--version", args.version != 1), ("--accept-encoded", args.accept_encoded)):
            if given:
                raise CommandError(f"{flag} applies to --format saved_model only")
    class_names = _read_class_names(args.class_names)
    preprocessing = _parse_preprocessing(args.preprocessing)
    model, preprocessing, weights_info = _load_model_argument(
        args.model, classes=args.classes, preprocessing=preprocessing
    )
    from keras_preact import export

    kwargs = dict(
        top_k=args.top_k,
        include_features=args.include_features,
        preprocessing=preprocessing,
        class_names=class_names,
        weights_info=weights_info,
        # A training run's model.keras: its measured test accuracy goes into the card.
        metrics=export.run_metrics(args.model) if args.model.endswith(".keras") else None,
        overwrite=args.overwrite,
        check_parity=not args.no_parity_check,
        verbose=sys.stdout.isatty(),
    )
    if args.format == "saved_model":
        kwargs.update(version=args.version, accept_encoded=args.accept_encoded)
    elif args.format == "litert":
        kwargs.update(quantization=args.quantization)
    folder = export.export_model(model, args.out, format=args.format, **kwargs)
    card = export.read_model_card(folder)
    print(f"Exported {args.model} as {args.format} to {folder}")
    parity = card.get("parity")
    if parity:
        print(
            f"Parity with the Keras model: max |difference| of probabilities "
            f"{parity['max_abs_diff']:.3g} (tolerance {parity['tolerance']:.3g}), "
            f"top-1 agreement {parity['top1_agreement']:.0%} on {parity['images']} images"
        )
    print(f"Model card: {os.path.join(folder, 'model_card.md')}")
    return 0


# ----------------------------------------------------------------------------------
# predict
# ----------------------------------------------------------------------------------

_MODE_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4}


def read_image(path):
    """Reads one image file (or `.npy` array) as uint8 ``[H, W, C]`` without TensorFlow.

    Args:
        path: an image file Pillow reads (PNG, JPEG, BMP, GIF, ...) or a ``.npy`` file
            holding a uint8 array ``[H, W]``, ``[H, W, C]`` or ``[N, H, W, C]``.

    Returns:
        numpy uint8 array, ``[H, W, C]`` (or ``[N, H, W, C]`` from a `.npy` batch).

    Raises:
        ValueError: naming the file, for a missing or unreadable file or pixels that
            are not 8-bit.
    """
    if not os.path.exists(path):
        raise CommandError(f"image {path!r} does not exist")
    if not os.path.isfile(path):
        raise CommandError(f"image {path!r} is not a file")
    if path.endswith(NPY_SUFFIX):
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise CommandError(f"image {path!r} is not a readable .npy array ({err})") from None
        if array.dtype != np.uint8:
            raise CommandError(
                f"image {path!r} has dtype {array.dtype}; the model takes uint8 pixels (0..255)"
            )
        if array.ndim == 2:
            array = array[..., None]
        if array.ndim not in (3, 4):
            raise CommandError(
                f"image {path!r} has shape {array.shape}; expected [H, W], [H, W, C] or [N, H, W, C]"
            )
        return array
    from PIL import Image
    from PIL import UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            if mode == "1":
                image = image.convert("L")
            elif mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif mode in ("YCbCr", "LAB", "HSV"):
                image = image.convert("RGB")
            elif mode not in _MODE_CHANNELS:
                raise CommandError(
                    f"image {path!r} has {mode!r} pixels (not 8-bit); the model takes "
                    "8-bit (uint8) images"
                )
            array = np.asarray(image, dtype=np.uint8)
    except CommandError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise CommandError(f"image {path!r} cannot be read as an image ({err})") from None
    if array.ndim == 2:
        array = array[..., None]
    return array


#: Pillow modes by channel count, for --resize.
_CHANNEL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def fit_image(name, array, input_shape, *, resize=False):
    """One uint8 ``[H, W, C]`` image in the model's channels and size.

    Args:
        name: the image's name in messages.
        array: uint8 ``[H, W, C]``.
        input_shape: the model's ``(height, width, channels)``; a None height or
            width takes any.
        resize: bool, default False: convert the channels (Pillow's grey / RGB / RGBA
            conversions) and resize (bilinear) instead of refusing a mismatch.

    Returns:
        The image, converted when `resize` is set.

    Raises:
        CommandError: naming the image, for a mismatch without `resize` (with the hint
            ``--resize``) or channels that cannot be converted.
    """
    height, width, channels = input_shape
    h, w, c = array.shape
    if c == channels and height in (None, h) and width in (None, w):
        return array
    if not resize:
        if c != channels:
            raise CommandError(
                f"image {name!r} has {c} channel(s); the model takes {channels} "
                f"({'RGB' if channels == 3 else 'channels last'}): pass --resize to convert it"
            )
        raise CommandError(
            f"image {name!r} is {h}x{w} (height x width); the model takes "
            f"{height}x{width}: pass --resize to resize it"
        )
    if c not in _CHANNEL_MODES or channels not in (1, 3, 4):
        raise CommandError(
            f"image {name!r} has {c} channel(s) and the model takes {channels}; --resize "
            "converts 1 to 4 channels into 1, 3 or 4"
        )
    from PIL import Image

    image = Image.fromarray(array[..., 0] if c == 1 else array).convert(_CHANNEL_MODES[channels])
    image = image.resize((width or w, height or h), Image.Resampling.BILINEAR)
    out = np.asarray(image, dtype=np.uint8)
    return out[..., None] if out.ndim == 2 else out


def _read_images(paths, input_shape, *, resize):
    """Reads every image, reporting each bad file on stderr and going on with the rest.

    Returns:
        ``(names, arrays, failed)``: one name and ``[H, W, C]`` array per image (a
        `.npy` batch gives ``path[i]``), and the number of files that failed.
    """
    names, arrays, failed = [], [], 0
    for path in paths:
        try:
            array = read_image(path)
            labels = [f"{path}[{i}]" for i in range(len(array))] if array.ndim == 4 else [path]
            images = list(array) if array.ndim == 4 else [array]
            images = [fit_image(n, a, input_shape, resize=resize) for n, a in zip(labels, images)]
        except CommandError as err:
            print(f"error: {error_message(err)}", file=sys.stderr)
            failed += 1
            continue
        names += labels
        arrays += images
    return names, arrays, failed


def _cmd_predict(args):
    from keras_preact import export

    if args.top_k is not None and args.top_k < 1:
        raise CommandError(f"--top-k must be >= 1. Received: {args.top_k}")
    preprocessing = _parse_preprocessing(args.preprocessing)
    export._resolve_export(args.model)  # a clear error for a wrong path, first
    class_names = _read_class_names(args.class_names)
    # From the model card (or a .keras file's config), so that bad images are found
    # before the model loads; loaded first only when it is the only source.
    shape = export.expected_input_shape(args.model)
    served = None
    if shape is None:
        served = export.load_export(args.model, preprocessing=preprocessing)
        shape = served.input_shape
    names, arrays, failed = _read_images(args.images, shape, resize=args.resize)
    if not arrays:
        return partial_status(failed, len(args.images))
    served = served or export.load_export(args.model, preprocessing=preprocessing)
    outputs = served.predict(np.stack(arrays))
    exported_k = outputs["top_k_classes"].shape[-1]
    k = exported_k if args.top_k is None else args.top_k
    if k > exported_k:
        raise CommandError(f"--top-k {k} is more than the export's top-k ({exported_k})")
    labels = class_names or served.class_names
    if labels is not None and len(labels) != outputs["probabilities"].shape[-1]:
        raise CommandError(
            f"--class-names has {len(labels)} names; the model has "
            f"{outputs['probabilities'].shape[-1]} classes"
        )
    results = []
    for i, path in enumerate(names):
        top = []
        for cls, score in zip(outputs["top_k_classes"][i][:k], outputs["top_k_scores"][i][:k]):
            entry = {"class": int(cls), "score": float(score)}
            if labels is not None:
                entry["label"] = labels[int(cls)]
            top.append(entry)
        results.append({"image": path, "top_k": top})
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            print(result["image"])
            for rank, entry in enumerate(result["top_k"], start=1):
                label = entry.get("label", str(entry["class"]))
                print(f"  {rank:>2}. {label:<20} {entry['score']:.4f}")
    return partial_status(failed, len(args.images))


def add_commands(subparsers):
    """Adds `export` and `predict` to the `keras-preact` command."""
    p = subparsers.add_parser(
        "export",
        help="export a model as SavedModel, LiteRT or ONNX, with a model card",
        description="Export a model for serving: a SavedModel for TF Serving "
        "(OUT/<version>/), LiteRT (.tflite) or ONNX, each taking uint8 images and "
        "checked against the Keras model, with model_card.json/.md beside it.",
    )
    p.add_argument(
        "model",
        metavar="MODEL_OR_CHECKPOINT",
        help="a model name from `keras-preact list` (random initialisation) or a .keras file",
    )
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
    p.add_argument("--no-parity-check", action="store_true",
                   help="skip comparing the export with the Keras model")
    p.set_defaults(func=_cmd_export)

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
    p.add_argument("images", metavar="IMAGE", nargs="+",
                   help="image files (PNG, JPEG, ...) or .npy uint8 arrays")
    p.add_argument("--top-k", type=int, default=None, help="default: the export's top-k")
    p.add_argument("--preprocessing", default="auto", help="for .keras models without their own layer")
    p.add_argument("--class-names", metavar="FILE", help="overrides the export's class names")
    p.add_argument("--resize", action="store_true",
                   help="convert images to the model's channels (grey, RGB) and resize them "
                        "to its input size, instead of refusing them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_predict)
