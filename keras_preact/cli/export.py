"""`keras-preact export` and `keras-preact predict` over `keras_preact.export`, e.g.
``keras-preact export runs/best.keras --format litert --out exports/lite`` and
``keras-preact predict exports/lite cat.png dog.jpg``."""

import json
import os
import sys

import numpy as np

from keras_preact.cli.common import error_message, partial_status, print_error
from keras_preact.file_io import file_hash, user_path
from keras_preact.training.config import TrainConfig
from keras_preact.training.workdir import Workdir, run_metrics, workdir_of

#: Copies of `keras_preact.export.FORMATS` and `QUANTIZATIONS` (it imports TensorFlow, which
#: `--help` must not), and the formats that take each flag of some formats only.
EXPORT_FORMATS = ("saved_model", "litert", "onnx")
QUANTIZATIONS = ("float16", "dynamic_range", "int8")
_FORMAT_FLAGS = {"version": ("saved_model",), "accept_encoded": ("saved_model",),
                 "quantization": ("litert", "onnx")}


def add_commands(subparsers):
    p = subparsers.add_parser(
        "export", help="export a model as SavedModel, LiteRT or ONNX, with a model card",
        description="Export for serving: a SavedModel for TF Serving (OUT/<version>/), LiteRT "
        "(.tflite) or ONNX on uint8 images, checked against Keras, with model_card.json/.md.")
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT", help="a model name from "
                   "`keras-preact list` (random initialisation), a .keras file, a training "
                   "workdir (its model.keras, else its newest checkpoint) or one of its "
                   "checkpoints/ckpt-*.weights.h5")
    p.add_argument("--format", choices=EXPORT_FORMATS, default="saved_model",
                   help="saved_model (TF Serving), litert (.tflite) or onnx (default saved_model)")
    p.add_argument("--out", required=True, metavar="DIR", help="saved_model: the base folder "
                   "(the export goes to DIR/<version>); litert/onnx: the export folder")
    p.add_argument("--overwrite", action="store_true", help="replace an existing export")
    p.add_argument("--version", type=int, help="saved_model version folder (default 1)")
    p.add_argument("--top-k", type=int, help="classes in the top_k_* outputs (default 5, or fewer)")
    p.add_argument("--include-features", action="store_true", help="add the `features` output")
    p.add_argument("--accept-encoded", action="store_true", default=None,
                   help="saved_model: add the serve_encoded signature (JPEG/PNG bytes)")
    p.add_argument("--quantize", "--quantization", dest="quantization", choices=QUANTIZATIONS,
                   help="litert: any; onnx: int8 (calibrated on training images)")
    p.add_argument("--calibration-data", metavar="DATASET", help="int8: the dataset whose "
                   "train split calibrates (default: the run's, from config.json beside MODEL)")
    p.add_argument("--calibration-images", type=int, default=256, metavar="N",
                   help="images that calibrate int8 (default 256)")
    for flag in ("--data-dir", "--data-source", "--data-path"):
        p.add_argument(flag, help="as for train, for --calibration-data")
    p.add_argument("--held-out-images", type=int, default=1000, metavar="N", help="check on up to "
                   "N test images of the run's dataset, with accuracies (default 1000; 0: none)")
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
    p.add_argument("model", metavar="EXPORT_OR_MODEL", help="a SavedModel export (base or "
                   "version folder), a LiteRT/ONNX export folder or file, or a .keras file")
    p.add_argument("images", metavar="IMAGE", nargs="+",
                   help="image files (PNG, JPEG, ...), .npy uint8 arrays or image folders")
    p.add_argument("--top-k", type=int, help="default: the export's top-k")
    p.add_argument("--preprocessing", default="auto", help="for a .keras model without its layer")
    p.add_argument("--class-names", metavar="FILE", help="overrides the export's class names")
    p.add_argument("--resize", action="store_true", help="convert images to the model's channels "
                   "(grey, RGB) and resize them to its input size, instead of refusing them")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_predict)


def _preprocessing_and_names(args):
    """--preprocessing ('none' means None; a preset is checked before any model loads) and
    the names of --class-names."""
    preprocessing = None if args.preprocessing.lower() == "none" else args.preprocessing
    if preprocessing not in (None, "auto"):
        from keras_preact.layers.preprocessing import resolve_preprocessing
        resolve_preprocessing(preprocessing)
    from keras_preact.export import read_class_names
    return preprocessing, None if args.class_names is None else read_class_names(
        args.class_names, argument="--class-names")


def _check_format_flags(args):
    """The format-specific flags given, checked against --format."""
    options = {k: getattr(args, k) for k in _FORMAT_FLAGS if getattr(args, k) is not None}
    for name in options:
        flag = "--quantize" if name == "quantization" else f"--{name.replace('_', '-')}"
        if args.format not in _FORMAT_FLAGS[name]:
            raise ValueError(f"{flag} applies to --format {' or '.join(_FORMAT_FLAGS[name])} "
                             f"only. Received: --format {args.format}")
    if args.format == "onnx" and options.get("quantization", "int8") != "int8":
        raise ValueError("--format onnx takes --quantize int8. "
                         f"Received: --quantize {args.quantization}")
    if args.quantization != "int8" and args.calibration_data is not None:
        raise ValueError("--calibration-data is for --quantize int8 only. "
                         f"Received: --quantize {args.quantization}")
    return options


def _run_dataset(model_path):
    """`load_arrays`' arguments for the dataset of the training run whose workdir holds
    `model_path` (a run's model.keras, the workdir or a checkpoint) and the class names the
    run recorded, or ``(None, None)``."""
    stored = (Workdir(workdir).read_config() or {}) if (workdir := workdir_of(model_path)) else {}
    if "train_config" not in stored:
        return None, None
    run = TrainConfig.from_dict(stored["train_config"])
    return {"name": run.dataset, "data_dir": run.data_dir, "source": run.data_source,
            "path": run.data_path}, stored.get("class_names")


def _model_to_export(args, preprocessing):
    """`load_model_to_export`'s ``(model, described)``, also for a workdir or checkpoint."""
    from keras_preact import export
    if not (os.path.isdir(path := user_path(args.model)) or path.endswith(".weights.h5")):
        model, described = export.load_model_to_export(args.model, classes=args.classes,
                                                       preprocessing=preprocessing)
        # A .keras file may be a training run's (None for a model name: no such file).
        return model, {**described, "metrics": run_metrics(path)}
    from keras_preact.training.api import load_workdir_model
    if (workdir := workdir_of(path)) is None:
        raise ValueError("A folder or .weights.h5 file to export must be a training workdir or "
                         f"one of its checkpoints (no config.json found). Received: {args.model}")
    model, _, source = load_workdir_model(workdir, None if os.path.isdir(path) else path)
    weights_info = {"file": os.path.relpath(source, workdir), "sha256": file_hash(source)}
    return model, {"preprocessing": preprocessing, "metrics": None, "weights_info": weights_info}


def _export_data(args, class_names):
    """Export options from datasets: int8 calibration images, held-out parity images, and
    `class_names` (default: those the training run recorded)."""
    from keras_preact.data import load_arrays
    run, names = _run_dataset(args.model)
    options = {"class_names": class_names or names}
    if args.quantization == "int8":
        given = {"name": args.calibration_data, "data_dir": args.data_dir,
                 "source": args.data_source or "auto", "path": args.data_path}
        if (source := given if args.calibration_data else run) is None:
            raise ValueError("--quantize int8 needs calibration images: give --calibration-data "
                             "DATASET (a name `train --dataset` takes), or export a training run's "
                             f"model.keras. Received: {args.model}")
        images = load_arrays(split="train", **source)[0]
        pick = np.random.default_rng(0).permutation(len(images))[:args.calibration_images]
        options["calibration_images"] = images[np.sort(pick)]
    if run and args.held_out_images > 0 and not args.no_parity_check:
        try:
            images, labels = (a[:args.held_out_images] for a in load_arrays(split="test", **run))
        except ValueError as err:  # e.g. the run's data is not on this machine
            print(f"warning: no held-out check ({error_message(err)})", file=sys.stderr)
            return options
        options.update(parity_images=images, parity_labels=labels)
    return options


def cmd_export(args):
    options = _check_format_flags(args)
    for flag, least in (("calibration_images", 1), ("held_out_images", 0)):
        if (value := getattr(args, flag)) < least:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= {least}. Received: {value}")
    preprocessing, class_names = _preprocessing_and_names(args)
    from keras_preact import export
    options.update(_export_data(args, class_names))
    model, described = _model_to_export(args, preprocessing)
    folder = export.export_model(
        model, args.out, format=args.format, top_k=args.top_k,
        include_features=args.include_features, overwrite=args.overwrite,
        check_parity=not args.no_parity_check, verbose=sys.stdout.isatty(), **described, **options)
    card = export.read_model_card(folder)
    quantized = f" {args.quantization}" if args.quantization else ""
    size = f" ({card['serving']['bytes'] / 1e6:.2f} MB)" if card["serving"].get("bytes") else ""
    print(f"Exported {args.model} as {args.format}{quantized} to {folder}{size}")
    if parity := card.get("parity"):
        print("Parity with the Keras model: max |difference| of probabilities "
              f"{parity['max_abs_diff']:.3g} (tolerance {parity['tolerance']:.3g}), top-1 "
              f"agreement {parity['top1_agreement']:.1%} on {parity['images']} images")
        if accuracy := parity.get("accuracy"):
            print("Held-out accuracy: export {export:.2%}, Keras {keras:.2%}".format(**accuracy))
    print(f"Model card: {os.path.join(folder, 'model_card.md')}")
    return 0


def cmd_predict(args):
    from keras_preact import export
    from keras_preact.data.folder import image_files
    preprocessing, class_names = _preprocessing_and_names(args)
    # From the model card (or a .keras file's config), so that bad images are found
    # before the model loads; loaded first only when it is the only source.
    served, shape = None, export.expected_input_shape(args.model)
    if shape is None:
        served = export.load_export(args.model, preprocessing=preprocessing)
        shape = served.input_shape
    # A folder stands for the images under it, sorted, as `train` reads them.
    paths = [p for path in args.images
             for p in ((image_files(path) or [path]) if os.path.isdir(path) else [path])]
    named, failed = [], 0
    for path in paths:
        try:
            if os.path.isdir(path):
                raise ValueError(f"image folder {path!r} holds no images Pillow reads")
            named += export.read_image_file(path, shape, resize=args.resize)
        except ValueError as err:  # the other images are still classified
            print_error(err)
            failed += 1
    if not named:
        return partial_status(failed, len(paths))
    served = served or export.load_export(args.model, preprocessing=preprocessing)
    names, images = zip(*named)
    top = export.top_k_predictions(served.predict(np.stack(images)), top_k=args.top_k,
                                   class_names=class_names or served.class_names
                                   or _run_dataset(args.model)[1])
    if args.json:
        print(json.dumps([{"image": n, "top_k": t} for n, t in zip(names, top)], indent=2))
    else:
        for name, entries in zip(names, top):
            print(name)
            for rank, entry in enumerate(entries, start=1):
                label = entry.get("label", str(entry["class"]))
                print(f"  {rank:>2}. {label:<20} {entry['score']:.4f}")
    return partial_status(failed, len(paths))
