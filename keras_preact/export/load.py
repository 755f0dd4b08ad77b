"""Running exports (`load_export`), the model `keras-preact export` takes, images from files."""

import dataclasses
import os
import warnings

import numpy as np
import tensorflow as tf
from PIL import Image, UnidentifiedImageError

import keras_preact as kp
from keras_preact.checks import is_int, shorten
from keras_preact.export.card import locate_export, read_model_card
from keras_preact.export.saved_model import SIGNATURE_METADATA
from keras_preact.export.serving import AUTO, ServingParts, check_class_names, validate_images
from keras_preact.export.formats import RUNTIMES
from keras_preact.export.destination import logger
from keras_preact.file_io import file_hash
from keras_preact.weights.local import keras_file_info, load_keras_file

#: Pillow modes read as they are (8 bits a channel), those converted on reading, and the mode
#: of each channel count (``resize``).
_8BIT_MODES = ("L", "LA", "RGB", "RGBA", "CMYK")
_CONVERTED_MODES = {"1": "L", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB"}
_CHANNEL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


@dataclasses.dataclass
class ExportedModel:
    """A loaded export (or `.keras` model) predicting from uint8 images (`load_export`): `kind`
    "saved_model", "litert", "onnx" or "keras"; `input_shape` (height, width, channels);
    `class_names` and `model_card` may be None."""

    kind: str
    path: str
    input_shape: tuple
    class_names: list
    model_card: dict
    runner: object = dataclasses.field(repr=False)

    def predict(self, images):
        """Runs the export on `images` (checked by `validate_images`); returns numpy arrays
        "probabilities", "top_k_classes", "top_k_scores" (and "features" if exported)."""
        out = self.runner(validate_images(images, self.input_shape))
        return {k: np.asarray(v) for k, v in out.items() if k != "top_k_labels"}


def expected_input_shape(path):
    """(height, width, channels) an export or `.keras` file at `path` takes, read without
    loading it; None when only loading it would tell."""
    kind, folder, target = locate_export(path)
    if kind != "keras":
        card = read_model_card(folder)
        return None if card is None else tuple(card["input"]["shape"][1:])
    info = keras_file_info(target) or {}  # None: not a PreActResNet
    if not (shape := info.get("input_shape")) or len(shape) != 3:
        return None
    return tuple(shape[1:] + shape[:1] if info["data_format"] == "channels_first" else shape)


def load_export(path, *, preprocessing=AUTO, top_k=None):
    """Loads an export (or a `.keras` model) as an `ExportedModel`.

    Args:
        path: a SavedModel base folder (its latest version) or version folder, a LiteRT or
            ONNX export folder or file, or a ``.keras`` model file.
        preprocessing, top_k: for a ``.keras`` file, as in `build_serving_model`.

    Raises ValueError if `path` is none of these, ImportError if the runtime for a LiteRT or
    ONNX file is not installed."""
    if not (top_k is None or is_int(top_k, 1)):
        raise ValueError(f"`top_k` must be None or an integer >= 1. Received: top_k={top_k!r}")
    kind, folder, target = locate_export(path)
    if kind == "keras":
        parts = ServingParts(load_keras_file(target), preprocessing=preprocessing, top_k=top_k,
                             include_features=False)
        return ExportedModel(kind, target, parts.input_shape, None, None,
                             lambda x: parts.raw(x, training=False))
    card = read_model_card(folder)
    class_names = (card or {}).get("class_names")
    try:
        shape, runner = RUNTIMES[kind](target)
    except ImportError:
        raise
    except Exception as err:  # noqa: BLE001 - each runtime has its own errors for a bad file
        raise ValueError(f"The {kind} export {target} cannot be loaded ({shorten(err)}): it is "
                         "damaged or incomplete; export it again.") from None
    if card is None and kind == "saved_model":  # no card beside it: ask the export
        if SIGNATURE_METADATA in (signatures := tf.saved_model.load(target).signatures):
            names = signatures[SIGNATURE_METADATA]()["class_names"].numpy()
            class_names = [n.decode("utf-8") for n in names] or None
    return ExportedModel(kind, target, shape, class_names, card, runner)


def load_model_to_export(name_or_path, *, classes=10, preprocessing=AUTO):
    """``(model, described)``: a model to export, by registered name (random initialisation)
    or `.keras` file, and its `export_model` arguments ``preprocessing``, ``weights_info`` and
    ``metrics`` (None: `keras_preact.training.workdir.run_metrics` reads a training run's).

    Args:
        name_or_path: a name of `keras_preact.list_models()` or a ``.keras`` file.
        classes: the classes of a model built by name.
        preprocessing: a built model's own layer ("auto": "cifar10" for the CIFAR family,
            else "imagenet"); for a ``.keras`` file, the exporter's argument.

    Raises ValueError for an unknown name or a `.keras` file that does not exist."""
    if name_or_path in kp.list_models():
        if preprocessing == AUTO:
            family = kp.model_info(name_or_path)["family"]
            preprocessing = "cifar10" if family == "cifar" else "imagenet"
        logger.warning("Building %s with random initialisation (no weights loaded) and "
                       "preprocessing=%r.", name_or_path, preprocessing)
        model = kp.get_model(name_or_path, classes=classes, preprocessing=preprocessing)
        weights_info = {"tag": None, "initialization": "random (He normal), no weights loaded"}
        return model, {"preprocessing": AUTO, "weights_info": weights_info, "metrics": None}
    if not str(name_or_path).endswith(".keras"):
        raise ValueError("`name_or_path` must be a registered model name or a .keras file. "
                         f"Received: name_or_path={name_or_path!r}. "
                         f"Models: {', '.join(kp.list_models())}")
    model = load_keras_file(name_or_path)  # ValueError for a missing or damaged file
    weights_info = {"file": os.path.basename(name_or_path), "sha256": file_hash(name_or_path)}
    return model, {"preprocessing": preprocessing, "weights_info": weights_info, "metrics": None}


def read_image_file(path, input_shape, *, resize=False):
    """``[(name, uint8 [H, W, C] array)]``, the images of the file `path` (one Pillow reads,
    or a ``.npy`` uint8 array ``[H, W]``, ``[H, W, C]`` or ``[N, H, W, C]``, whose images are
    named ``path[i]``) fitted to `input_shape` by `fit_image`. ValueError naming the file:
    missing, unreadable, not 8-bit, or not fitting."""
    if not os.path.isfile(path):
        raise ValueError(f"image {path!r} " + ("is not a file" if os.path.exists(path)
                                               else "does not exist"))
    if path.endswith(".npy"):
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"image {path!r} is not a readable .npy array ({err})") from None
        if array.dtype != np.uint8:
            raise ValueError(f"image {path!r} has dtype {array.dtype}; the model takes uint8 "
                             "pixels (0..255)")
    else:
        array = _read_with_pillow(path)
    if array.ndim not in (2, 3, 4):
        raise ValueError(f"image {path!r} has shape {array.shape}; expected [H, W], [H, W, C] "
                         "or [N, H, W, C]")
    named = ([(path, np.atleast_3d(array))] if array.ndim < 4  # [H, W]: one channel
             else [(f"{path}[{i}]", image) for i, image in enumerate(array)])
    return [(n, fit_image(a, input_shape, resize=resize, name=n)) for n, a in named]


def _read_with_pillow(path):
    try:
        with warnings.catch_warnings():
            # Pillow warns above 89M pixels (and refuses twice that, below): a big photo.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()
                if getattr(image, "n_frames", 1) > 1:
                    logger.warning("image %r has %d frames: the first is classified.", path,
                                   image.n_frames)
                palette = "RGBA" if "transparency" in image.info else "RGB"
                if convert := {**_CONVERTED_MODES, "P": palette}.get(image.mode):
                    image = image.convert(convert)
                # Read inside the block: closing the file releases the pixels.
                array = np.asarray(image, dtype=np.uint8) if image.mode in _8BIT_MODES else None
    except Image.DecompressionBombError as err:
        raise ValueError(f"image {path!r} is too large to read safely ({err}); make it "
                         "smaller first") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ValueError(f"image {path!r} cannot be read as an image ({err})") from None
    if array is None:
        raise ValueError(f"image {path!r} has {image.mode!r} pixels (not 8-bit); the model takes "
                         "8-bit (uint8) images")
    return array


def fit_image(array, input_shape, *, resize=False, name="image"):
    """One uint8 ``[H, W, C]`` `array` fitted to `input_shape`, (height, width, channels):
    with `resize`, a mismatch is converted (Pillow's grey / RGB / RGBA) and resized (bilinear);
    `name` names it in messages. ValueError for a mismatch without `resize`, or channels that
    cannot be converted."""
    height, width, channels = input_shape
    h, w, c = array.shape
    if c == channels and height in (None, h) and width in (None, w):
        return array
    if not resize and c != channels:
        layout = "RGB" if channels == 3 else "channels last"
        raise ValueError(f"image {name!r} has {c} channel(s); the model takes {channels} "
                         f"({layout}): pass resize=True (--resize) to convert it")
    if not resize:
        raise ValueError(f"image {name!r} is {h}x{w} (height x width); the model takes "
                         f"{height}x{width}: pass resize=True (--resize) to resize it")
    if c not in _CHANNEL_MODES or channels not in (1, 3, 4):
        raise ValueError(f"image {name!r} has {c} channel(s) and the model takes {channels}; "
                         "resizing converts 1 to 4 channels into 1, 3 or 4")
    image = Image.fromarray(array[..., 0] if c == 1 else array).convert(_CHANNEL_MODES[channels])
    image = image.resize((width or w, height or h), Image.Resampling.BILINEAR)
    return np.atleast_3d(np.asarray(image, dtype=np.uint8))  # grey: [H, W] -> [H, W, 1]


def top_k_predictions(outputs, *, top_k=None, class_names=None):
    """Per image of `ExportedModel.predict` `outputs`, its `top_k` classes (1 to the
    export's top-k; None: all of them) best first, as ``{"class": int, "score": float}``
    with a ``"label"`` from `class_names`. ValueError for a `top_k` out of range or class
    names not one per class."""
    exported_k = outputs["top_k_classes"].shape[-1]
    k = exported_k if top_k is None else top_k
    if not 1 <= k <= exported_k:
        raise ValueError(f"`top_k` must be 1 to the export's top-k ({exported_k}). "
                         f"Received: top_k={top_k}")
    class_names = check_class_names(class_names, outputs["probabilities"].shape[-1])
    top = zip(outputs["top_k_classes"][:, :k], outputs["top_k_scores"][:, :k])
    return [[{"class": int(i), "score": float(s),
              **({} if class_names is None else {"label": class_names[i]})}
             for i, s in zip(indices, scores)] for indices, scores in top]
