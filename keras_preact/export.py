"""Exports for serving: SavedModel (TF Serving), LiteRT and ONNX, each with a model card.

TensorFlow-only: this module imports TensorFlow and is never imported by
``import keras_preact``; import it as ``from keras_preact import export``.

Every export goes through one Keras "serving model" (`build_serving_model`): it takes
raw ``uint8`` images ``[batch, height, width, channels]`` (any batch size, the model's
input size), applies the model's own preprocessing, and returns named outputs:

- ``probabilities``: ``float32 [batch, classes]`` (softmax applied when the model
  returns logits);
- ``top_k_classes``: ``int32 [batch, k]`` and ``top_k_scores``: ``float32 [batch, k]``;
- ``features``: ``float32 [batch, width]``, the pooled features (the layer named
  "pool"), when asked for with ``include_features=True``.

The SavedModel is written with `keras.export.ExportArchive` (not
`tf.saved_model.save`, which in Keras 3 loses the input names and dtypes) in the
versioned layout TF Serving expects (``path/<version>/``) and carries these
signatures:

- ``serving_default``: ``images`` uint8 -> the outputs above, plus ``top_k_labels``
  (strings) when class names are given;
- ``serve_preprocessed``: ``inputs`` float32, already preprocessed -> the same;
- ``serve_encoded`` (``accept_encoded=True``): ``image_bytes`` JPEG/PNG strings
  ``[batch]`` -> the same; each image must decode to the model's input size;
- ``metadata``: no input -> ``class_names`` and ``model_card`` (the card as JSON).

LiteRT (``.tflite``, optionally float16 or dynamic-range quantised) and ONNX exports
are converted from the same serving model by Keras' own exporters
(``model.export(format="litert")``, ``format="onnx"`` via tf2onnx), so they take the
same uint8 input and give the same named outputs (no ``top_k_labels``: class names
are in ``class_names.txt`` and the model card).

Every export is checked against the Keras model before it is put in place (the
parity check: the largest absolute difference of ``probabilities`` on a batch of
images must stay under `PARITY_TOLERANCES`), then moved into place with
`os.replace` from a temporary folder beside the target: a failure half-way leaves no
partial export, and an existing export is only replaced with ``overwrite=True``.
A model card (``model_card.json`` and ``model_card.md``) is written beside every
export.

Example:
    >>> import keras_preact as kp
    >>> from keras_preact import export
    >>> model = kp.preact_resnet20(preprocessing="cifar10")
    >>> export.export_saved_model(model, "/tmp/resnet20", class_names=[str(i) for i in range(10)])
    '/tmp/resnet20/1'
    >>> served = export.load_export("/tmp/resnet20")
    >>> served.predict(images_uint8)["top_k_classes"]
"""

import contextlib
import datetime
import json
import logging
import os
import platform
import shutil
import tempfile
import uuid
import warnings

import numpy as np

import keras
import tensorflow as tf

from keras_preact.files import file_hash

logger = logging.getLogger(__name__)

#: The export formats.
FORMATS = ("saved_model", "litert", "onnx")
#: LiteRT quantisation modes: None (float32 weights), "float16" (float16 weights,
#: float32 compute where the runtime has no float16 kernels) and "dynamic_range"
#: (int8 weights, activations quantised on the fly).
QUANTIZATIONS = (None, "float16", "dynamic_range")
#: Largest absolute difference of `probabilities` (in [0, 1]) allowed between an
#: export and the Keras model by the parity check. Float32 conversions only reorder
#: float arithmetic (measured here: below 1e-6 up to ResNet-110); float16 weights
#: keep about 3 significant digits; int8 weights move probabilities by up to a few
#: hundredths (their accuracy drop is what matters: see the tests on digits).
PARITY_TOLERANCES = {
    "saved_model": 1e-5,
    "onnx": 1e-5,
    "litert": 1e-5,
    "litert_float16": 1e-2,
    "litert_dynamic_range": 0.1,
}
MODEL_CARD_JSON = "model_card.json"
MODEL_CARD_MD = "model_card.md"
CLASS_NAMES_FILE = "class_names.txt"
LITERT_FILE = "model.tflite"
ONNX_FILE = "model.onnx"
#: The signatures of a SavedModel export.
SIGNATURE_RAW = "serving_default"
SIGNATURE_PREPROCESSED = "serve_preprocessed"
SIGNATURE_ENCODED = "serve_encoded"
SIGNATURE_METADATA = "metadata"
#: Layer names the serving model looks for (those of `keras_preact.PreActResNet`).
PREPROCESSING_LAYER = "preprocessing"
FEATURES_LAYER = "pool"
AUTO = "auto"
#: `top_k` when none is given (fewer for models with fewer classes).
DEFAULT_TOP_K = 5
#: Images the parity check runs when none are given (seeded, so repeatable).
PARITY_BATCH = 8


#: How to install the optional exporters and runtimes, at the versions tested.
EXPORT_EXTRA = 'pip install "keras-preact[export]"'


class ExportParityError(RuntimeError):
    """An export's outputs differ from the Keras model's beyond the tolerance."""


# ----------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------


def _model_input_shape(model):
    """(height, width, channels) of a model's single 4D image input (NHWC view)."""
    if not isinstance(model, keras.Model):
        raise ValueError(
            "`model` must be a keras.Model (e.g. a keras_preact.PreActResNet). "
            f"Received: model={type(model).__name__}"
        )
    if not model.built or not getattr(model, "inputs", None):
        raise ValueError(
            "`model` must be a built functional model with a known input shape. "
            f"Received: model={model.name!r} (built={model.built})"
        )
    if len(model.inputs) != 1 or len(model.inputs[0].shape) != 4:
        raise ValueError(
            "`model` must have one 4D image input [batch, height, width, channels]. "
            f"Received inputs: {[tuple(t.shape) for t in model.inputs]}"
        )
    if len(model.outputs) != 1 or len(model.outputs[0].shape) != 2:
        raise ValueError(
            "`model` must output class scores [batch, classes] (a classifier, e.g. "
            "include_top=True). Received outputs: "
            f"{[tuple(t.shape) for t in model.outputs]}"
        )
    shape = tuple(model.inputs[0].shape[1:])
    if _data_format(model) == "channels_first":
        shape = (shape[1], shape[2], shape[0])
    if shape[-1] is None:
        raise ValueError(
            f"`model` must have a known channel count. Received input shape {shape}"
        )
    return tuple(None if d is None else int(d) for d in shape)


def _data_format(model):
    fmt = getattr(model, "data_format", None)
    if fmt is None:
        layer = _find_layer(model, PREPROCESSING_LAYER)
        fmt = getattr(layer, "data_format", None)
    return fmt or "channels_last"


def _find_layer(model, name):
    for layer in model.layers:
        if layer.name == name:
            return layer
    return None


def _num_classes(model):
    return int(model.outputs[0].shape[-1])


def _check_top_k(top_k, classes):
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(
            f"`top_k` must be a positive integer. Received: top_k={top_k!r}"
        )
    if top_k > classes:
        raise ValueError(
            f"`top_k` must be at most the number of classes ({classes}). "
            f"Received: top_k={top_k}"
        )


def _check_class_names(class_names, classes):
    if class_names is None:
        return None
    if isinstance(class_names, str) or not hasattr(class_names, "__len__"):
        raise ValueError(
            "`class_names` must be a list of strings, one per class. "
            f"Received: class_names={class_names!r}"
        )
    names = list(class_names)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(
            "`class_names` must be strings. Received types: "
            f"{sorted({type(n).__name__ for n in names})}"
        )
    if len(names) != classes:
        raise ValueError(
            f"`class_names` must have one name per class ({classes}). Received "
            f"{len(names)} names: {names[:5]}{'...' if len(names) > 5 else ''}"
        )
    return names


def _check_json(name, value):
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict or None. Received: {name}={value!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"`{name}` must be JSON-serialisable ({err}). Received: {name}={value!r}"
        ) from None
    return dict(value)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _check_path(name, path):
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"`{name}` must be a folder path. Received: {name}={path!r}")
    return os.path.abspath(os.fspath(path))


def validate_images(images, input_shape, *, name="images"):
    """Checks a batch of raw images against an export's input before it runs.

    Args:
        images: numpy array, uint8, ``[batch, height, width, channels]`` or one image
            ``[height, width, channels]``.
        input_shape: ``(height, width, channels)`` the export takes (None entries
            accept any size).
        name: the argument name used in error messages.

    Returns:
        The images as a 4D uint8 numpy array.

    Raises:
        ValueError: for a wrong dtype, rank, channel count or image size; the message
            names the argument, what was received and what is valid.

    Example:
        >>> validate_images(np.zeros((32, 32, 3), np.uint8), (32, 32, 3)).shape
        (1, 32, 32, 3)
    """
    height, width, channels = input_shape
    if not isinstance(images, np.ndarray):
        if hasattr(images, "numpy"):
            images = images.numpy()
        else:
            images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(
            f"`{name}` must be uint8 pixels in 0..255. Received: dtype={images.dtype}. "
            "Convert 8-bit images with .astype('uint8'); already normalised floats "
            "go to `predict_preprocessed` instead."
        )
    if images.ndim == 3:
        images = images[None]
    if images.ndim != 4:
        raise ValueError(
            f"`{name}` must be [batch, height, width, channels] or one image "
            f"[height, width, channels]. Received: shape={images.shape}"
        )
    if images.shape[-1] != channels:
        raise ValueError(
            f"`{name}` must have {channels} channels (channels last). Received: "
            f"shape={images.shape} ({images.shape[-1]} channels)"
        )
    if (height is not None and images.shape[1] != height) or (
        width is not None and images.shape[2] != width
    ):
        raise ValueError(
            f"`{name}` must be {height}x{width} (height x width), the model's input "
            f"size. Received: shape={images.shape} ({images.shape[1]}x{images.shape[2]})"
        )
    if images.shape[0] == 0:
        raise ValueError(f"`{name}` is an empty batch. Received: shape={images.shape}")
    return images


# ----------------------------------------------------------------------------------
# The serving model
# ----------------------------------------------------------------------------------


def _resolve_serving_preprocessing(model, preprocessing):
    """Returns (layer or None, description dict) for the raw-image path."""
    from keras_preact.layers.preprocessing import ImageNormalization
    from keras_preact.layers.preprocessing import resolve_preprocessing

    own = _find_layer(model, PREPROCESSING_LAYER)
    if own is not None:
        if preprocessing != AUTO:
            raise ValueError(
                "The model already has its own preprocessing layer "
                f"({PREPROCESSING_LAYER!r}); giving `preprocessing` too would normalise "
                f"twice. Received: preprocessing={preprocessing!r}. Leave it 'auto'."
            )
        return own, {
            "source": f"the model's {PREPROCESSING_LAYER!r} layer",
            "scale": getattr(own, "scale", None),
            "mean": list(getattr(own, "mean", ()) or ()),
            "std": list(getattr(own, "std", ()) or ()),
        }
    if preprocessing == AUTO:
        raise ValueError(
            f"The model has no preprocessing layer (named {PREPROCESSING_LAYER!r}), so "
            "the export cannot know how to turn raw pixels into its inputs. Pass "
            "`preprocessing`: a preset name ('symmetric', 'unit', 'cifar10', "
            "'cifar100', 'imagenet'), a dict with 'mean' and 'std', or None to feed "
            "the raw 0..255 values as floats. Received: preprocessing='auto'"
        )
    resolved = resolve_preprocessing(preprocessing)
    if resolved is None:
        return None, {"source": "none: raw 0..255 values as float32"}
    scale, mean, std = resolved
    layer = ImageNormalization(
        scale=scale,
        mean=mean,
        std=std,
        data_format=_data_format(model),
        name="serving_preprocessing",
    )
    return layer, {
        "source": f"export argument {preprocessing!r}",
        "scale": scale,
        "mean": list(mean),
        "std": list(std),
    }


def _needs_softmax(model):
    # A PreActResNet built with classifier_activation=None returns logits; serving
    # clients expect probabilities.
    return getattr(model, "classifier_activation", "softmax") in (None, "linear")


class _ServingParts:
    """The Keras pieces every exporter shares."""

    def __init__(self, model, *, preprocessing, top_k, include_features):
        self.input_shape = _model_input_shape(model)
        self.classes = _num_classes(model)
        if top_k is None:
            top_k = min(DEFAULT_TOP_K, self.classes)
        _check_top_k(top_k, self.classes)
        _check_bool("include_features", include_features)
        self.top_k = top_k
        self.include_features = include_features
        self.data_format = _data_format(model)
        self.softmax = _needs_softmax(model)
        own = _find_layer(model, PREPROCESSING_LAYER)
        self.preprocessing_layer, self.preprocessing = _resolve_serving_preprocessing(
            model, preprocessing
        )
        outputs = {"probabilities": model.outputs[0]}
        if include_features:
            pool = _find_layer(model, FEATURES_LAYER)
            if pool is None or len(pool.output.shape) != 2:
                raise ValueError(
                    "`include_features=True` needs a layer named "
                    f"{FEATURES_LAYER!r} with a pooled [batch, width] output (as in "
                    f"PreActResNet). Model {model.name!r} has none."
                )
            outputs["features"] = pool.output
        # The float endpoint starts after the model's own preprocessing layer.
        start = own.output if own is not None else model.inputs[0]
        self.core = keras.Model(start, outputs, name=f"{model.name}_core")
        self.preprocessed = self._preprocessed_model(name=f"{model.name}_preprocessed")
        height, width, channels = self.input_shape
        images = keras.Input((height, width, channels), dtype="uint8", name="images")
        self.raw = keras.Model(
            images, self.preprocessed(self.normalize(images)), name=f"{model.name}_serving"
        )

    def normalize(self, images):
        """uint8 NHWC images -> the float NHWC input of `self.preprocessed`."""
        from keras import ops

        x = ops.cast(images, "float32")
        if self.preprocessing_layer is None:
            return x
        if self.data_format == "channels_first":
            x = ops.transpose(x, (0, 3, 1, 2))
            return ops.transpose(self.preprocessing_layer(x), (0, 2, 3, 1))
        return self.preprocessing_layer(x)

    def _preprocessed_model(self, *, name):
        from keras import ops

        height, width, channels = self.input_shape
        inputs = keras.Input((height, width, channels), dtype="float32", name="inputs")
        x = inputs
        if self.data_format == "channels_first":
            # Serving clients send channels-last images whatever the model's layout.
            x = ops.transpose(x, (0, 3, 1, 2))
        out = self.core(x)
        probabilities = out["probabilities"]
        if self.softmax:
            probabilities = ops.softmax(probabilities, axis=-1)
        scores, classes = ops.top_k(probabilities, self.top_k)
        result = {
            "probabilities": probabilities,
            "top_k_classes": classes,
            "top_k_scores": scores,
        }
        if self.include_features:
            # float32 whatever the model's dtype policy (e.g. mixed_bfloat16).
            result["features"] = ops.cast(out["features"], "float32")
        return keras.Model(inputs, result, name=name)

    def describe_outputs(self, class_names=None):
        height, width, channels = self.input_shape
        k = self.top_k
        out = {
            "probabilities": {"dtype": "float32", "shape": [None, self.classes]},
            "top_k_classes": {"dtype": "int32", "shape": [None, k]},
            "top_k_scores": {"dtype": "float32", "shape": [None, k]},
        }
        if self.include_features:
            width = int(self.core.output["features"].shape[-1])
            out["features"] = {"dtype": "float32", "shape": [None, width]}
        if class_names is not None:
            out["top_k_labels"] = {"dtype": "string", "shape": [None, k]}
        return out


def build_serving_model(model, *, preprocessing=AUTO, top_k=None, include_features=False):
    """The Keras model every export is made from: raw uint8 images -> named outputs.

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        preprocessing: "auto" (default): use the model's own ImageNormalization layer
            (named "preprocessing"); a model without one needs a preset name, a dict
            with "mean"/"std"/"scale" (see `keras_preact.layers.preprocessing`) or None
            (raw 0..255 values as floats).
        top_k: int, at most the number of classes; None (default) means 5, or
            the number of classes when there are fewer.
        include_features: bool, default False: also return the pooled features
            (the layer named "pool").

    Returns:
        A functional `keras.Model` taking uint8 ``[batch, H, W, C]`` and returning a
        dict with "probabilities", "top_k_classes", "top_k_scores" (and "features").
        It shares the weights of `model`.

    Raises:
        ValueError: for a model that is not a single-input classifier, a bad
            `top_k`, a `preprocessing` that is missing or given twice.

    Example:
        >>> serving = build_serving_model(kp.preact_resnet20(preprocessing="cifar10"))
        >>> serving(np.zeros((2, 32, 32, 3), np.uint8))["top_k_classes"].shape
        TensorShape([2, 5])
    """
    parts = _ServingParts(
        model, preprocessing=preprocessing, top_k=top_k, include_features=include_features
    )
    return parts.raw


# ----------------------------------------------------------------------------------
# Atomic folders
# ----------------------------------------------------------------------------------


def _is_our_export(path):
    return os.path.isfile(os.path.join(path, MODEL_CARD_JSON))


def _check_target(target, *, overwrite, argument):
    if not os.path.lexists(target):
        return
    if not os.path.isdir(target) or not _is_our_export(target):
        # Never delete what we did not write (e.g. --out pointing at $HOME); checked
        # first, so that no message suggests an `overwrite` that would be refused.
        raise ValueError(
            f"Refusing to write over {target!r}: it exists and is not a keras-preact "
            f"export (no {MODEL_CARD_JSON}); choose another path. Received: "
            f"{argument}={target!r}"
        )
    if not overwrite:
        raise FileExistsError(
            f"An export already exists at {target!r}; pass overwrite=True "
            "(--overwrite) to replace it."
        )


@contextlib.contextmanager
def _staged_folder(target, *, overwrite, argument="path"):
    """Yields a temporary folder beside `target`, renamed onto it on success.

    Nothing is written at `target` until everything inside the temporary folder is
    complete; an exception removes the temporary folder and leaves `target` as it
    was. An existing `target` (only replaced with `overwrite`) is moved aside first
    and restored if the final rename fails.
    """
    _check_target(target, overwrite=overwrite, argument=argument)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-", dir=parent)
        # mkdtemp makes the folder private (0700); an export must be readable by the
        # server (e.g. TF Serving in a container under another user), as any folder.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)
    except OSError as err:
        raise ValueError(
            f"Cannot write an export under {parent!r}: {err.strerror or err}. "
            f"Received: {argument}={target!r}"
        ) from None
    try:
        yield staging
        _commit(staging, target, overwrite=overwrite, argument=argument)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _commit(staging, target, *, overwrite, argument):
    _check_target(target, overwrite=overwrite, argument=argument)  # it may have appeared
    if not os.path.lexists(target):
        os.replace(staging, target)
        return
    backup = os.path.join(
        os.path.dirname(target), f".{os.path.basename(target)}.replaced-{uuid.uuid4().hex[:8]}"
    )
    os.replace(target, backup)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(backup, target)
        raise
    shutil.rmtree(backup, ignore_errors=True)


# ----------------------------------------------------------------------------------
# Model cards
# ----------------------------------------------------------------------------------


def _versions(extra=()):
    import keras_preact

    out = {
        "keras_preact": keras_preact.__version__,
        "keras": keras.__version__,
        "tensorflow": tf.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }
    for module in extra:
        try:
            mod = __import__(module)
            out[module] = getattr(mod, "__version__", "unknown")
        except ImportError:
            pass
    return out


def _architecture(model):
    from keras_preact.models.costs import count_macs
    from keras_preact.models.costs import count_params

    try:
        macs = count_macs(model)
    except ValueError:
        macs = None  # free input size
    arch = {
        "name": model.name,
        "class": type(model).__name__,
        "parameters": count_params(model),
        "parameters_total": count_params(model, trainable_only=False),
        "multiply_adds": macs,
        "input_shape": list(model.inputs[0].shape[1:]),
        "classes": _num_classes(model),
    }
    if hasattr(model, "depth"):
        arch["depth"] = model.depth
    if hasattr(model, "block"):
        arch["block"] = model.block
    try:
        arch["config"] = json.loads(json.dumps(model.get_config(), default=str))
    except (NotImplementedError, TypeError, ValueError):
        # A subclassed model without a serialisable config: the card keeps the
        # architecture fields above and omits "config".
        pass
    return arch


def _model_card(
    model,
    parts,
    *,
    export_format,
    class_names,
    weights_info,
    metrics,
    serving,
    parity,
    extra_versions=(),
):
    height, width, channels = parts.input_shape
    return {
        "model_card_version": 1,
        "format": export_format,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "architecture": _architecture(model),
        "paper": "He, Zhang, Ren, Sun. Identity Mappings in Deep Residual Networks. "
        "ECCV 2016 (arXiv:1603.05027)",
        "weights": weights_info,
        "preprocessing": parts.preprocessing,
        "input": {
            "name": "images",
            "dtype": "uint8",
            "shape": [None, height, width, channels],
            "layout": "NHWC (batch, height, width, channels)",
            "range": "0..255",
        },
        "outputs": parts.describe_outputs(class_names if export_format == "saved_model" else None),
        "top_k": parts.top_k,
        "class_names": class_names,
        "metrics": metrics,
        "serving": serving,
        "parity": parity,
        "versions": _versions(extra_versions),
    }


def _fmt(value):
    if value is None:
        return "not given"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_model_card(card):
    """Renders a model card dict as Markdown (the ``model_card.md`` beside an export).

    Args:
        card: dict, as written to ``model_card.json``.

    Returns:
        str.
    """
    arch = card["architecture"]
    lines = [
        f"# Model card: {arch['name']} ({card['format']})",
        "",
        f"Pre-activation ResNet; {card['paper']}.",
        "",
        "## Architecture",
        "",
        "| | |",
        "|---|---|",
        f"| class | {arch['class']} |",
    ]
    for key in ("depth", "block"):
        if key in arch:
            lines.append(f"| {key} | {_fmt(arch[key])} |")
    lines += [
        f"| parameters (trainable) | {_fmt(arch['parameters'])} |",
        f"| parameters (all) | {_fmt(arch['parameters_total'])} |",
        f"| multiply-adds per image | {_fmt(arch['multiply_adds'])} |",
        f"| input shape | {arch['input_shape']} |",
        f"| classes | {arch['classes']} |",
        "",
        "## Weights",
        "",
    ]
    weights = card.get("weights")
    if weights:
        lines += [f"- {k}: {_fmt(v)}" for k, v in weights.items()]
    else:
        lines.append("- not given")
    lines += ["", "## Preprocessing (inside the export)", ""]
    lines += [f"- {k}: {_fmt(v)}" for k, v in card["preprocessing"].items()]
    inp = card["input"]
    lines += [
        "",
        "## Input and outputs",
        "",
        f"- input `{inp['name']}`: {inp['dtype']} {inp['shape']}, {inp['layout']}, {inp['range']}",
    ]
    lines += [
        f"- output `{name}`: {spec['dtype']} {spec['shape']}"
        for name, spec in card["outputs"].items()
    ]
    if card.get("class_names"):
        names = card["class_names"]
        shown = ", ".join(names[:20]) + (" ..." if len(names) > 20 else "")
        lines.append(f"- class names ({len(names)}): {shown}")
    lines += ["", "## Metrics", ""]
    if card.get("metrics"):
        lines += [f"- {k}: {_fmt(v)}" for k, v in card["metrics"].items()]
    else:
        lines.append("- not given")
    lines += ["", "## Serving", ""]
    lines += [f"- {k}: {json.dumps(v)}" for k, v in (card.get("serving") or {}).items()]
    parity = card.get("parity")
    lines += ["", "## Parity with the Keras model", ""]
    if parity:
        lines += [f"- {k}: {_fmt(v)}" for k, v in parity.items()]
    else:
        lines.append("- not checked")
    lines += ["", "## Versions", ""]
    lines += [f"- {k}: {v}" for k, v in card["versions"].items()]
    lines += ["", f"Created {card['created']}.", ""]
    return "\n".join(lines)


def _write_model_card(folder, card):
    with open(os.path.join(folder, MODEL_CARD_JSON), "w", encoding="utf-8") as f:
        json.dump(card, f, indent=2, sort_keys=False)
        f.write("\n")
    with open(os.path.join(folder, MODEL_CARD_MD), "w", encoding="utf-8") as f:
        f.write(render_model_card(card))


def _write_class_names(folder, class_names):
    if class_names is None:
        return
    with open(os.path.join(folder, CLASS_NAMES_FILE), "w", encoding="utf-8") as f:
        f.write("\n".join(class_names) + "\n")


def read_model_card(path):
    """Reads the ``model_card.json`` of an export.

    Args:
        path: an export folder (a SavedModel base or version folder, a LiteRT or ONNX
            export folder) or a file inside one.

    Returns:
        dict, or None when there is no card.
    """
    folder = _resolve_export(path, must_exist=False)[1]
    if folder is None:
        return None
    card_path = os.path.join(folder, MODEL_CARD_JSON)
    if not os.path.isfile(card_path):
        return None
    with open(card_path, encoding="utf-8") as f:
        return json.load(f)


# ----------------------------------------------------------------------------------
# Parity
# ----------------------------------------------------------------------------------


def _parity_images(input_shape, images):
    height, width, channels = input_shape
    if images is not None:
        return validate_images(images, input_shape, name="parity_images")
    if height is None or width is None:
        height = height or 32
        width = width or 32
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(PARITY_BATCH, height, width, channels), dtype=np.uint8)


def _reference_probabilities(model, parts, images):
    """The Keras model's probabilities, computed without the serving model."""
    x = images.astype("float32")
    own = _find_layer(model, PREPROCESSING_LAYER)
    if own is None and parts.preprocessing_layer is not None:
        layer = parts.preprocessing_layer
        scale, mean, std = layer.scale, np.asarray(layer.mean), np.asarray(layer.std)
        x = (x * np.float32(scale) - mean.astype("float32")) / std.astype("float32")
        x = x.astype("float32")
    if parts.data_format == "channels_first":
        x = np.transpose(x, (0, 3, 1, 2))
    out = np.asarray(model.predict(x, verbose=0, batch_size=len(x)))
    if parts.softmax:
        out = np.asarray(keras.ops.convert_to_numpy(keras.ops.softmax(out, axis=-1)))
    return out


def _compare(name, reference, outputs, tolerance):
    got = np.asarray(outputs["probabilities"])
    if got.shape != reference.shape:
        raise ExportParityError(
            f"The {name} export returns probabilities of shape {got.shape}; the Keras "
            f"model {reference.shape}."
        )
    diff = float(np.max(np.abs(got - reference)))
    agree = float(np.mean(np.argmax(got, -1) == np.argmax(reference, -1)))
    result = {
        "max_abs_diff": diff,
        "tolerance": tolerance,
        "top1_agreement": agree,
        "images": int(len(reference)),
    }
    if not diff <= tolerance:
        raise ExportParityError(
            f"The {name} export differs from the Keras model: max |difference| of "
            f"probabilities {diff:.3g} > tolerance {tolerance:.3g} on {len(reference)} "
            "images. Nothing was written."
        )
    return result


# ----------------------------------------------------------------------------------
# Exporters
# ----------------------------------------------------------------------------------


class _Progress:
    """A Progbar over an export's stages, shown only when asked for."""

    def __init__(self, verbose, stages):
        self.bar = keras.utils.Progbar(stages, unit_name="stage") if verbose else None
        self.done = 0

    def step(self):
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.done)


def _common_checks(model, path, *, class_names, weights_info, metrics, overwrite, check_parity):
    _check_bool("overwrite", overwrite)
    _check_bool("check_parity", check_parity)
    target = _check_path("path", path)
    _model_input_shape(model)
    names = _check_class_names(class_names, _num_classes(model))
    return (
        target,
        names,
        _check_json("weights_info", weights_info),
        _check_json("metrics", metrics),
    )


def export_saved_model(
    model,
    path,
    *,
    version=1,
    top_k=None,
    include_features=False,
    accept_encoded=False,
    preprocessing=AUTO,
    class_names=None,
    weights_info=None,
    metrics=None,
    overwrite=False,
    check_parity=True,
    parity_images=None,
    verbose=False,
):
    """Exports a classifier as a SavedModel for TF Serving, with a model card.

    Built on `keras.export.ExportArchive`. The export is written to
    ``path/<version>/`` (the layout TF Serving scans) with the signatures described in
    this module's docstring; ``path`` may hold other versions, which are left alone.

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        path: str or PathLike, the model's base folder (TF Serving's
            ``--model_base_path``).
        version: int >= 1, default 1: the version folder name.
        top_k: int, how many classes `top_k_classes` / `top_k_scores` hold; None
            (default): 5, or the number of classes when there are fewer.
        include_features: bool, default False: add a `features` output (the pooled
            features, the layer named "pool").
        accept_encoded: bool, default False: add the ``serve_encoded`` signature
            taking JPEG/PNG strings.
        preprocessing: "auto" (default, the model's own "preprocessing" layer), or for
            a model without one a preset name, a mean/std dict or None; see
            `build_serving_model`.
        class_names: optional list of str, one per class (embedded as the
            `top_k_labels` output, the `metadata` signature, ``class_names.txt`` under
            ``assets.extra/`` and the model card).
        weights_info: optional dict describing the weights (e.g. {"tag": ..., "sha256":
            ...}), copied into the model card.
        metrics: optional dict of evaluation results for the model card.
        overwrite: bool, default False: replace an existing export of this version.
        check_parity: bool, default True: reload the SavedModel and compare it with
            the Keras model (tolerance `PARITY_TOLERANCES["saved_model"]`) before
            putting it in place.
        parity_images: optional uint8 images for the parity check (default: 8 seeded
            random images).
        verbose: bool, default False: show a progress bar over the stages.

    Returns:
        str, the version folder written (``path/<version>``).

    Raises:
        ValueError: for an invalid argument or an unwritable path.
        FileExistsError: if the version exists and `overwrite` is False.
        ExportParityError: if the reloaded export does not match the model.

    Example:
        >>> export_saved_model(kp.preact_resnet20(preprocessing="cifar10"), "/tmp/r20")
        '/tmp/r20/1'
        >>> serve = tf.saved_model.load("/tmp/r20/1").signatures["serving_default"]
        >>> serve(images=tf.zeros((7, 32, 32, 3), tf.uint8))["top_k_classes"].shape
        TensorShape([7, 5])
    """
    base, names, weights_info, metrics = _common_checks(
        model, path, class_names=class_names, weights_info=weights_info,
        metrics=metrics, overwrite=overwrite, check_parity=check_parity,
    )
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(
            f"`version` must be an integer >= 1 (TF Serving's version folder). "
            f"Received: version={version!r}"
        )
    _check_bool("accept_encoded", accept_encoded)
    if base is not None and os.path.exists(base) and not os.path.isdir(base):
        raise ValueError(f"`path` must be a folder. Received: path={path!r} (a file)")
    parts = _ServingParts(
        model, preprocessing=preprocessing, top_k=top_k, include_features=include_features
    )
    target = os.path.join(base, str(version))
    _check_target(target, overwrite=overwrite, argument="path")
    progress = _Progress(verbose, 4)
    height, width, channels = parts.input_shape
    labels = tf.constant(names, dtype=tf.string) if names is not None else None

    def with_labels(out):
        out = dict(out)
        if labels is not None:
            out["top_k_labels"] = tf.gather(labels, out["top_k_classes"])
        return out

    pre_model = parts.preprocessed

    # Every signature calls this one traced function, so the network is traced and
    # stored once (for ResNet-1001 tracing dominates the export time).
    @tf.function(
        input_signature=[tf.TensorSpec([None, height, width, channels], tf.float32, name="inputs")],
        autograph=False,
    )
    def network(inputs):
        return pre_model(inputs, training=False)

    def serve_images(images):
        return with_labels(network(parts.normalize(images)))

    def serve_preprocessed(inputs):
        return with_labels(network(inputs))

    def decode(image_bytes):
        image = tf.io.decode_image(image_bytes, channels=channels, expand_animations=False)
        size = tf.shape(image)[:2]
        checks = []
        if height is not None and width is not None:
            checks.append(
                tf.debugging.assert_equal(
                    size,
                    tf.constant([height, width], tf.int32),
                    message=f"serve_encoded: every image must decode to {height}x{width} "
                    "(height x width), the model's input size",
                )
            )
        with tf.control_dependencies(checks):
            image = tf.identity(image)
        image.set_shape([height, width, channels])
        return image

    def serve_encoded(image_bytes):
        images = tf.map_fn(
            decode,
            image_bytes,
            fn_output_signature=tf.TensorSpec([height, width, channels], tf.uint8),
        )
        return serve_images(images)

    signatures = {
        SIGNATURE_RAW: {"inputs": {"images": {"dtype": "uint8", "shape": [None, height, width, channels]}}},
        SIGNATURE_PREPROCESSED: {"inputs": {"inputs": {"dtype": "float32", "shape": [None, height, width, channels]}}},
    }
    if accept_encoded:
        signatures[SIGNATURE_ENCODED] = {"inputs": {"image_bytes": {"dtype": "string", "shape": [None], "content": "JPEG, PNG, GIF or BMP bytes"}}}
    signatures[SIGNATURE_METADATA] = {"inputs": {}, "outputs": ["class_names", "model_card"]}
    serving = {
        "version": version,
        "layout": "TF Serving: <model_base_path>/<version>/saved_model.pb",
        "signatures": signatures,
    }
    card = _model_card(
        model, parts, export_format="saved_model", class_names=names,
        weights_info=weights_info, metrics=metrics, serving=serving, parity=None,
    )

    with _staged_folder(target, overwrite=overwrite) as staging:
        archive = keras.export.ExportArchive()
        # No archive.track(model): the endpoints already capture every variable, and
        # tracking makes write_out walk (and re-trace) every layer's tf.functions,
        # which tripled the export time of ResNet-110 here. The serving model holds
        # no lookup tables, the one thing tracking is needed for.
        archive.add_endpoint(
            SIGNATURE_RAW,
            serve_images,
            input_signature=[tf.TensorSpec([None, height, width, channels], tf.uint8, name="images")],
        )
        archive.add_endpoint(
            SIGNATURE_PREPROCESSED,
            serve_preprocessed,
            input_signature=[tf.TensorSpec([None, height, width, channels], tf.float32, name="inputs")],
        )
        if accept_encoded:
            archive.add_endpoint(
                SIGNATURE_ENCODED,
                serve_encoded,
                input_signature=[tf.TensorSpec([None], tf.string, name="image_bytes")],
            )
        progress.step()
        # The card is embedded without the parity figures (measured after writing);
        # model_card.json beside the export has them.
        card_json = json.dumps(card, default=str)
        class_tensor = labels if labels is not None else tf.constant([], dtype=tf.string)

        def metadata():
            return {"class_names": class_tensor, "model_card": tf.constant(card_json)}

        archive.add_endpoint(SIGNATURE_METADATA, metadata, input_signature=[])
        archive.write_out(staging, verbose=False)
        progress.step()
        if check_parity:
            images = _parity_images(parts.input_shape, parity_images)
            reference = _reference_probabilities(model, parts, images)
            loaded = tf.saved_model.load(staging)
            outputs = loaded.signatures[SIGNATURE_RAW](images=tf.constant(images))
            card["parity"] = _compare(
                "SavedModel",
                reference,
                {k: v.numpy() for k, v in outputs.items()},
                PARITY_TOLERANCES["saved_model"],
            )
            del loaded
        progress.step()
        if names is not None:
            extra = os.path.join(staging, "assets.extra")
            os.makedirs(extra, exist_ok=True)
            _write_class_names(extra, names)
        _write_model_card(staging, card)
        progress.step()
    logger.info("Exported SavedModel to %s", target)
    return target


def _convert_with_keras(serving_model, filename, export_format, **kwargs):
    """Runs Keras' own exporter (`model.export(format=...)`) quietly."""
    if not getattr(serving_model, "_called", True):
        # Keras' ONNX exporter refuses a model that was never called.
        height, width, channels = serving_model.inputs[0].shape[1:]
        serving_model(np.zeros((1, height or 32, width or 32, channels), np.uint8), training=False)
    with warnings.catch_warnings():
        # tf2onnx's numpy-2 shim and the LiteRT converter warn about deprecations
        # that are not ours to fix.
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        serving_model.export(filename, format=export_format, verbose=False, **kwargs)


def _litert_converter_kwargs(quantization):
    if quantization is None:
        return {}
    if quantization == "float16":
        return {
            "optimizations": [tf.lite.Optimize.DEFAULT],
            "target_spec": {"supported_types": [tf.float16]},
        }
    # Dynamic range: int8 weights, no representative data set needed.
    return {"optimizations": [tf.lite.Optimize.DEFAULT]}


def _litert_interpreter(model_path):
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise ModuleNotFoundError(
            "Running a LiteRT export needs the `ai-edge-litert` package "
            f"({EXPORT_EXTRA}); tf.lite.Interpreter is deprecated."
        ) from None
    return Interpreter(model_path=model_path)


def _run_litert(interpreter, images):
    runner = interpreter.get_signature_runner("serving_default")
    return runner(images=images)


def _onnx_session(model_path):
    try:
        import onnxruntime
    except ImportError:
        raise ModuleNotFoundError(
            f"Running an ONNX export needs the `onnxruntime` package ({EXPORT_EXTRA})."
        ) from None
    return onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])


def _run_onnx(session, images):
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"images": images})))


def _export_single_file(
    model,
    path,
    *,
    export_format,
    filename,
    converter_kwargs,
    quantization,
    top_k,
    include_features,
    preprocessing,
    class_names,
    weights_info,
    metrics,
    overwrite,
    check_parity,
    parity_images,
    parity_tolerance,
    verbose,
    extra_versions,
):
    target, names, weights_info, metrics = _common_checks(
        model, path, class_names=class_names, weights_info=weights_info,
        metrics=metrics, overwrite=overwrite, check_parity=check_parity,
    )
    parts = _ServingParts(
        model, preprocessing=preprocessing, top_k=top_k, include_features=include_features
    )
    key = export_format if quantization is None else f"{export_format}_{quantization}"
    if parity_tolerance is None:
        parity_tolerance = PARITY_TOLERANCES[key]
    elif not isinstance(parity_tolerance, (int, float)) or isinstance(parity_tolerance, bool) or parity_tolerance < 0:
        raise ValueError(
            "`parity_tolerance` must be a non-negative number or None. "
            f"Received: parity_tolerance={parity_tolerance!r}"
        )
    _check_target(target, overwrite=overwrite, argument="path")
    progress = _Progress(verbose, 3)
    height, width, channels = parts.input_shape
    serving = {
        "file": filename,
        "quantization": quantization,
        "inputs": {"images": {"dtype": "uint8", "shape": [None, height, width, channels]}},
        "outputs": sorted(parts.describe_outputs()),
    }
    card = _model_card(
        model, parts, export_format=export_format, class_names=names,
        weights_info=weights_info, metrics=metrics, serving=serving, parity=None,
        extra_versions=extra_versions,
    )
    with _staged_folder(target, overwrite=overwrite) as staging:
        file_path = os.path.join(staging, filename)
        _convert_with_keras(parts.raw, file_path, export_format, **converter_kwargs)
        progress.step()
        if check_parity:
            images = _parity_images(parts.input_shape, parity_images)
            reference = _reference_probabilities(model, parts, images)
            if export_format == "litert":
                outputs = _run_litert(_litert_interpreter(file_path), images)
            else:
                outputs = _run_onnx(_onnx_session(file_path), images)
            card["parity"] = _compare(key, reference, outputs, float(parity_tolerance))
        progress.step()
        card["serving"]["bytes"] = os.path.getsize(file_path)
        card["serving"]["sha256"] = file_hash(file_path)
        _write_class_names(staging, names)
        _write_model_card(staging, card)
        progress.step()
    logger.info("Exported %s to %s", key, target)
    return target


def export_litert(
    model,
    path,
    *,
    quantization=None,
    top_k=None,
    include_features=False,
    preprocessing=AUTO,
    class_names=None,
    weights_info=None,
    metrics=None,
    overwrite=False,
    check_parity=True,
    parity_images=None,
    parity_tolerance=None,
    verbose=False,
):
    """Exports a classifier as LiteRT (TFLite), with a model card.

    Converted by Keras' ``model.export(format="litert")`` from the serving model
    (`build_serving_model`), so the ``.tflite`` takes uint8 images and has the
    ``serving_default`` signature with named outputs. Run it with `ai-edge-litert`'s
    interpreter (`load_export` does).

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        path: str or PathLike: the export folder; it gets ``model.tflite``,
            ``model_card.json``, ``model_card.md`` and ``class_names.txt``.
        quantization: None (float32, default), "float16" (float16 weights) or
            "dynamic_range" (int8 weights, float activations).
        top_k, include_features, preprocessing, class_names, weights_info, metrics,
        overwrite, check_parity, parity_images, verbose: as in `export_saved_model`.
        parity_tolerance: optional float overriding `PARITY_TOLERANCES`
            ("litert", "litert_float16", "litert_dynamic_range").

    Returns:
        str, the export folder.

    Raises:
        ValueError: for an invalid argument or an unwritable path.
        FileExistsError: if the folder exists and `overwrite` is False.
        ExportParityError: if the converted model does not match within tolerance.
        ImportError: for the parity check without `ai-edge-litert`.

    Example:
        >>> export_litert(model, "/tmp/r20_litert", quantization="float16")
        '/tmp/r20_litert'
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"Unknown `quantization`. Received: quantization={quantization!r}. "
            f"Valid: {list(QUANTIZATIONS)}"
        )
    return _export_single_file(
        model, path, export_format="litert", filename=LITERT_FILE,
        converter_kwargs=_litert_converter_kwargs(quantization), quantization=quantization,
        top_k=top_k, include_features=include_features, preprocessing=preprocessing,
        class_names=class_names, weights_info=weights_info, metrics=metrics,
        overwrite=overwrite, check_parity=check_parity, parity_images=parity_images,
        parity_tolerance=parity_tolerance, verbose=verbose,
        extra_versions=("ai_edge_litert",),
    )


def export_onnx(
    model,
    path,
    *,
    opset_version=None,
    top_k=None,
    include_features=False,
    preprocessing=AUTO,
    class_names=None,
    weights_info=None,
    metrics=None,
    overwrite=False,
    check_parity=True,
    parity_images=None,
    parity_tolerance=None,
    verbose=False,
):
    """Exports a classifier as ONNX, with a model card.

    Converted by Keras' ``model.export(format="onnx")`` (tf2onnx on the TensorFlow
    backend) from the serving model, so the graph takes the uint8 input ``images``
    and has the named outputs. Run it with `onnxruntime` (`load_export` does).

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        path: str or PathLike: the export folder; it gets ``model.onnx`` and the
            model card.
        opset_version: optional int, the ONNX opset (default: tf2onnx's).
        top_k, include_features, preprocessing, class_names, weights_info, metrics,
        overwrite, check_parity, parity_images, verbose: as in `export_saved_model`.
        parity_tolerance: optional float overriding `PARITY_TOLERANCES["onnx"]`.

    Returns:
        str, the export folder.

    Raises:
        ValueError: for an invalid argument or an unwritable path.
        FileExistsError: if the folder exists and `overwrite` is False.
        ExportParityError: if the converted model does not match within tolerance.
        ImportError: without `tf2onnx` (conversion) or `onnxruntime` (parity).

    Example:
        >>> export_onnx(model, "/tmp/r20_onnx")
        '/tmp/r20_onnx'
    """
    if opset_version is not None and (
        isinstance(opset_version, bool) or not isinstance(opset_version, int) or opset_version < 1
    ):
        raise ValueError(
            f"`opset_version` must be None or a positive int. Received: opset_version={opset_version!r}"
        )
    try:
        import tf2onnx  # noqa: F401
    except ImportError:
        raise ModuleNotFoundError(
            "ONNX export on the TensorFlow backend needs `tf2onnx` and `onnx` "
            f"({EXPORT_EXTRA})."
        ) from None
    kwargs = {} if opset_version is None else {"opset_version": opset_version}
    return _export_single_file(
        model, path, export_format="onnx", filename=ONNX_FILE, converter_kwargs=kwargs,
        quantization=None, top_k=top_k, include_features=include_features,
        preprocessing=preprocessing, class_names=class_names, weights_info=weights_info,
        metrics=metrics, overwrite=overwrite, check_parity=check_parity,
        parity_images=parity_images, parity_tolerance=parity_tolerance, verbose=verbose,
        extra_versions=("onnx", "tf2onnx", "onnxruntime"),
    )


def export_model(model, path, *, format="saved_model", **kwargs):
    """Exports in one of `FORMATS`; keyword arguments go to that format's exporter.

    Args:
        model: a built classifier, e.g. a `PreActResNet`.
        path: the export folder (for "saved_model": the base folder holding
            version folders).
        format: "saved_model" (default), "litert" or "onnx".
        **kwargs: see `export_saved_model`, `export_litert`, `export_onnx`.

    Returns:
        str, the folder written.

    Raises:
        ValueError: for an unknown format or an argument that format does not take.

    Example:
        >>> export_model(model, "/tmp/r20_onnx", format="onnx")
    """
    exporters = {"saved_model": export_saved_model, "litert": export_litert, "onnx": export_onnx}
    if format not in exporters:
        raise ValueError(f"Unknown export `format`. Received: format={format!r}. Valid: {list(FORMATS)}")
    import inspect

    fn = exporters[format]
    accepted = set(inspect.signature(fn).parameters) - {"model", "path"}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        raise ValueError(
            f"The {format!r} exporter takes no argument {unknown[0]!r}. Received: "
            f"{unknown}. Valid: {sorted(accepted)}"
        )
    return fn(model, path, **kwargs)


def export_demo_model(
    model,
    out_dir,
    *,
    class_names=None,
    metrics=None,
    weights_info=None,
    formats=("saved_model",),
    overwrite=False,
):
    """Exports a trained model at the end of a demo or a training run.

    Writes ``out_dir/saved_model/1/`` (TF Serving layout) and, when asked,
    ``out_dir/litert/`` and ``out_dir/onnx/``, each with its model card.

    Args:
        model: a trained classifier; it must carry its preprocessing layer.
        out_dir: str or PathLike.
        class_names: optional list of str, one per class.
        metrics: optional dict (e.g. {"test_accuracy": 0.95}) for the model cards.
        weights_info: optional dict for the model cards.
        formats: iterable of `FORMATS`, default ("saved_model",).
        overwrite: bool, default False.

    Returns:
        dict: format -> folder written.

    Raises:
        ValueError: for an unknown format or any invalid argument.

    Example:
        >>> export_demo_model(model, "runs/demo/export", class_names=[str(i) for i in range(10)],
        ...                   metrics={"test_accuracy": 0.97})
        {'saved_model': 'runs/demo/export/saved_model/1'}
    """
    formats = [formats] if isinstance(formats, str) else list(formats)
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ValueError(f"Unknown export `formats`. Received: formats={formats!r}. Valid: {list(FORMATS)}")
    root = _check_path("out_dir", out_dir)
    common = dict(class_names=class_names, metrics=metrics, weights_info=weights_info, overwrite=overwrite)
    return {f: export_model(model, os.path.join(root, f), format=f, **common) for f in formats}


def run_metrics(model_path):
    """The held-out metrics a training run measured for its model file, or None.

    `keras-preact train` writes ``metrics.json`` (``dataset``, ``test_accuracy``,
    ``test_loss``) beside its final ``model.keras``; a model card carries them.

    Args:
        model_path: a `.keras` file.

    Returns:
        dict of the metrics found, or None when the file is not a run's model.

    Raises:
        ValueError: if that ``metrics.json`` is not valid JSON.
    """
    from keras_preact.training.workdir import METRICS_JSON
    from keras_preact.training.workdir import read_json

    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), METRICS_JSON)
    if not os.path.isfile(path):
        return None
    final = read_json(path)
    # Metrics that name another model file (a checkpoint exported by hand) are not its.
    if final.get("model_path", os.path.basename(model_path)) != os.path.basename(model_path):
        return None
    return {k: final[k] for k in ("dataset", "test_accuracy", "test_loss") if k in final} or None


def export_demo(*, workdir, model_path, dataset="digits"):
    """The offline demo's last step: exports its trained model for serving.

    Writes ``workdir/export/saved_model/1/`` with the dataset's class names and the
    run's held-out metrics in the model card. The folder belongs to the demo, so a
    rerun of the demo replaces its own earlier export (never a folder without a model
    card; see `export_saved_model`).

    Args:
        workdir: the demo's training folder (holds ``metrics.json``).
        model_path: the trained ``.keras`` model.
        dataset: the dataset name, for the class names (default "digits").

    Returns:
        dict: format -> folder written.
    """
    from keras_preact.data import dataset_info

    model = keras.saving.load_model(model_path)
    class_names = [str(c) for c in dataset_info(dataset)["class_names"]]
    return export_demo_model(
        model,
        os.path.join(workdir, "export"),
        class_names=class_names,
        metrics=run_metrics(model_path),
        weights_info={"path": os.path.abspath(model_path), "sha256": file_hash(model_path)},
        overwrite=True,
    )


# ----------------------------------------------------------------------------------
# Loading an export
# ----------------------------------------------------------------------------------


def _latest_version(folder):
    versions = [
        int(name)
        for name in os.listdir(folder)
        if name.isdigit() and os.path.isfile(os.path.join(folder, name, "saved_model.pb"))
    ]
    return max(versions) if versions else None


def _resolve_export(path, *, must_exist=True):
    """Returns (kind, folder holding the card, file or folder to load)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a path. Received: path={path!r}")
    path = os.path.abspath(os.fspath(path))
    valid = (
        "a SavedModel export (its base folder or a version folder), a LiteRT or ONNX "
        "export folder, a .tflite or .onnx file, or a .keras model file"
    )
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            return "saved_model", path, path
        version = _latest_version(path)
        if version is not None:
            folder = os.path.join(path, str(version))
            return "saved_model", folder, folder
        if os.path.isfile(os.path.join(path, LITERT_FILE)):
            return "litert", path, os.path.join(path, LITERT_FILE)
        if os.path.isfile(os.path.join(path, ONNX_FILE)):
            return "onnx", path, os.path.join(path, ONNX_FILE)
    elif os.path.isfile(path):
        for suffix, kind in ((".tflite", "litert"), (".onnx", "onnx"), (".keras", "keras")):
            if path.endswith(suffix):
                return kind, os.path.dirname(path), path
    if not must_exist:
        return None, None, None
    what = "does not exist" if not os.path.exists(path) else "is not an export"
    raise ValueError(f"The path {what}. Received: path={path!r}. Valid: {valid}")


class ExportedModel:
    """A loaded export (or `.keras` model) that predicts from raw uint8 images.

    Use `load_export` to make one. Inputs are validated in NumPy before anything
    reaches the runtime.

    Attributes:
        kind: "saved_model", "litert", "onnx" or "keras".
        path: what was loaded.
        input_shape: (height, width, channels).
        class_names: list of str or None.
        model_card: dict or None.
    """

    def __init__(self, kind, path, input_shape, class_names, model_card, runner):
        self.kind = kind
        self.path = path
        self.input_shape = tuple(input_shape)
        self.class_names = class_names
        self.model_card = model_card
        self._runner = runner

    def predict(self, images):
        """Runs the export on raw images.

        Args:
            images: uint8 numpy array ``[batch, H, W, C]`` or one ``[H, W, C]`` image.

        Returns:
            dict of numpy arrays: "probabilities", "top_k_classes", "top_k_scores"
            (and "features" when exported with them).

        Raises:
            ValueError: for a wrong dtype, channel count or image size.
        """
        images = validate_images(images, self.input_shape)
        out = self._runner(images)
        return {
            k: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
            for k, v in out.items()
            if k != "top_k_labels"
        }


def _expected_keras_input_shape(path):
    """Reads a `.keras` file's input shape from its config, without building it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            config = json.loads(zf.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError, OSError) as err:
        raise ValueError(
            f"Not a readable .keras model file ({err}). Received: path={path!r}"
        ) from None
    inner = config.get("config", {})
    shape = inner.get("input_shape")
    if shape is None:
        for layer in inner.get("layers", []):
            if layer.get("class_name") == "InputLayer":
                shape = (layer.get("config", {}).get("batch_shape") or [None])[1:]
                break
    if not shape or len(shape) != 3:
        return None
    if inner.get("data_format") == "channels_first":
        shape = [shape[1], shape[2], shape[0]]
    return tuple(shape)


def expected_input_shape(path):
    """(height, width, channels) an export or `.keras` file takes, read without TF.

    Returns None when it cannot be known without loading the model.
    """
    kind, folder, target = _resolve_export(path)
    if kind == "keras":
        return _expected_keras_input_shape(target)
    card = read_model_card(folder)
    if card is None:
        return None
    return tuple(card["input"]["shape"][1:])


def load_export(path, *, preprocessing=AUTO, top_k=None):
    """Loads an export (or a `.keras` model) for prediction on raw uint8 images.

    Args:
        path: a SavedModel base folder (the latest version is used) or version
            folder, a LiteRT or ONNX export folder, a ``.tflite`` / ``.onnx`` file, or
            a ``.keras`` model file.
        preprocessing: for ``.keras`` files only: see `build_serving_model`.
        top_k: for ``.keras`` files only: see `build_serving_model`.

    Returns:
        An `ExportedModel`.

    Raises:
        ValueError: if `path` is none of these.
        ImportError: if the runtime for a LiteRT or ONNX file is not installed.

    Example:
        >>> served = load_export("/tmp/r20")
        >>> served.predict(np.zeros((1, 32, 32, 3), np.uint8))["top_k_classes"]
    """
    kind, folder, target = _resolve_export(path)
    card = read_model_card(folder) if kind != "keras" else None
    class_names = card.get("class_names") if card else None
    if kind == "keras":
        from keras_preact.weights.local import load_keras_file

        model = load_keras_file(target)
        serving = build_serving_model(model, preprocessing=preprocessing, top_k=top_k)
        shape = _model_input_shape(model)
        return ExportedModel(kind, target, shape, None, None, lambda x: serving(x, training=False))
    if kind == "saved_model":
        loaded = tf.saved_model.load(target)
        fn = loaded.signatures[SIGNATURE_RAW]
        spec = fn.structured_input_signature[1]["images"]
        shape = tuple(spec.shape[1:])
        if class_names is None and SIGNATURE_METADATA in loaded.signatures:
            names = loaded.signatures[SIGNATURE_METADATA]()["class_names"].numpy()
            class_names = [n.decode("utf-8") for n in names] or None

        def runner(images, fn=fn, loaded=loaded):
            return fn(images=tf.constant(images))

        return ExportedModel(kind, target, shape, class_names, card, runner)
    if kind == "litert":
        interpreter = _litert_interpreter(target)
        details = interpreter.get_signature_runner("serving_default").get_input_details()
        shape = tuple(int(d) if d > 0 else None for d in details["images"]["shape_signature"][1:])
        return ExportedModel(kind, target, shape, class_names, card, lambda x: _run_litert(interpreter, x))
    session = _onnx_session(target)
    dims = session.get_inputs()[0].shape[1:]
    shape = tuple(d if isinstance(d, int) else None for d in dims)
    return ExportedModel(kind, target, shape, class_names, card, lambda x: _run_onnx(session, x))


# ----------------------------------------------------------------------------------
# What to export, and inputs from files (the `keras-preact export` and `predict` inputs)
# ----------------------------------------------------------------------------------


def load_model_to_export(name_or_path, *, classes=10, preprocessing=AUTO):
    """A model to export, by registered name (random initialisation) or `.keras` file.

    Args:
        name_or_path: a name from `keras_preact.list_models()` or a ``.keras`` file
            (e.g. a training run's ``model.keras``).
        classes: int, default 10: classes of a model built by name.
        preprocessing: "auto" (default), None or a preset name. For a model built by
            name it becomes the model's own layer ("auto": "cifar10" for the CIFAR
            family, else "imagenet", as no weights say otherwise); for a `.keras`
            file it goes to the exporter (see `build_serving_model`).

    Returns:
        ``(model, described)``: the model, and the `export_model` arguments that
        describe it: ``preprocessing``, ``weights_info`` (for the model card) and
        ``metrics`` (a training run's held-out metrics, or None).

    Raises:
        ValueError: for an unknown name or a `.keras` file that does not exist.

    Example:
        >>> model, described = load_model_to_export("runs/r20/model.keras")
        >>> export_model(model, "/tmp/r20", **described)
    """
    import keras_preact as kp

    if name_or_path in kp.list_models():
        if preprocessing == AUTO:
            preprocessing = "cifar10" if kp.model_info(name_or_path)["family"] == "cifar" else "imagenet"
        logger.warning("Building %s with random initialisation (no weights loaded) and "
                       "preprocessing=%r.", name_or_path, preprocessing)
        model = kp.get_model(name_or_path, classes=classes, preprocessing=preprocessing)
        weights_info = {"tag": None, "initialization": "random (He normal), no weights loaded"}
        return model, {"preprocessing": AUTO, "weights_info": weights_info, "metrics": None}
    if not str(name_or_path).endswith(".keras"):
        raise ValueError(
            "`name_or_path` must be a registered model name or a .keras file. Received: "
            f"name_or_path={name_or_path!r}. Models: {', '.join(kp.list_models())}"
        )
    if not os.path.isfile(name_or_path):
        raise ValueError(f"The model file does not exist. Received: name_or_path={name_or_path!r}")
    from keras_preact.weights.local import load_keras_file

    weights_info = {"file": os.path.basename(name_or_path), "sha256": file_hash(name_or_path)}
    return load_keras_file(name_or_path), {
        "preprocessing": preprocessing, "weights_info": weights_info,
        "metrics": run_metrics(name_or_path),
    }


def read_class_names(path):
    """Class names from a file: one a line, or a JSON list of strings (``.json``).

    Raises:
        OSError: if the file cannot be read.
        ValueError: for a ``.json`` file that does not hold a list of strings.
    """
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not str(path).endswith(".json"):
        return [line.strip() for line in text.splitlines() if line.strip()]
    try:
        names = json.loads(text)
    except ValueError as err:
        raise ValueError(f"The class names file {path!r} is not valid JSON ({err})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"The class names file {path!r} must hold a JSON list of strings")
    return names


#: Channels of the Pillow modes read as they are.
_MODE_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "CMYK": 4}
#: Pillow modes converted on reading (palette images: to RGB, or RGBA if transparent).
_CONVERTED_MODES = {"1": "L", "YCbCr": "RGB", "LAB": "RGB", "HSV": "RGB"}
#: The Pillow mode of each channel count, for ``resize=True``.
_CHANNEL_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def read_image_file(path, input_shape, *, resize=False):
    """The images of one file, in the model's size and channels.

    Args:
        path: an image file Pillow reads (PNG, JPEG, BMP, GIF, ...) or a ``.npy`` file
            holding a uint8 array ``[H, W]``, ``[H, W, C]`` or ``[N, H, W, C]``.
        input_shape: the model's ``(height, width, channels)``, e.g.
            `ExportedModel.input_shape` or `expected_input_shape`.
        resize: see `fit_image`.

    Returns:
        list of ``(name, uint8 [H, W, C] array)``: one for an image, ``N`` for a
        ``.npy`` batch, named ``path[i]``.

    Raises:
        ValueError: naming the file, for a missing or unreadable file, pixels that
            are not 8-bit or an image the model cannot take.
    """
    array = _read_pixels(path)
    if array.ndim == 3:
        return [(path, fit_image(array, input_shape, resize=resize, name=path))]
    names = [f"{path}[{i}]" for i in range(len(array))]
    return [(n, fit_image(a, input_shape, resize=resize, name=n)) for n, a in zip(names, array)]


def _read_pixels(path):
    """One image file (or `.npy` array) as uint8 ``[H, W, C]`` or ``[N, H, W, C]``."""
    if not os.path.exists(path):
        raise ValueError(f"image {path!r} does not exist")
    if not os.path.isfile(path):
        raise ValueError(f"image {path!r} is not a file")
    if path.endswith(".npy"):
        try:
            array = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"image {path!r} is not a readable .npy array ({err})") from None
        if array.dtype != np.uint8:
            raise ValueError(f"image {path!r} has dtype {array.dtype}; the model takes uint8 pixels (0..255)")
    else:
        array = _read_with_pillow(path)
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim not in (3, 4):
        raise ValueError(f"image {path!r} has shape {array.shape}; expected [H, W], [H, W, C] or [N, H, W, C]")
    return array


def _read_with_pillow(path):
    from PIL import Image
    from PIL import UnidentifiedImageError

    try:
        with Image.open(path) as image:
            image.load()
            if image.mode == "P":
                image = image.convert("RGBA" if "transparency" in image.info else "RGB")
            elif image.mode in _CONVERTED_MODES:
                image = image.convert(_CONVERTED_MODES[image.mode])
            mode = image.mode
            # Read inside the block: closing the file releases the pixels.
            array = np.asarray(image, dtype=np.uint8) if mode in _MODE_CHANNELS else None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise ValueError(f"image {path!r} cannot be read as an image ({err})") from None
    if array is None:
        raise ValueError(f"image {path!r} has {mode!r} pixels (not 8-bit); the model takes 8-bit (uint8) images")
    return array


def fit_image(array, input_shape, *, resize=False, name="image"):
    """One uint8 ``[H, W, C]`` image in the model's channels and size.

    Args:
        array: uint8 ``[H, W, C]``.
        input_shape: the model's ``(height, width, channels)``; a None height or
            width takes any.
        resize: bool, default False: convert the channels (Pillow's grey / RGB / RGBA
            conversions) and resize (bilinear) instead of refusing a mismatch.
        name: the image's name in messages.

    Returns:
        The image, converted when `resize` is set.

    Raises:
        ValueError: naming the image, for a mismatch without `resize` or channels
            that cannot be converted.
    """
    height, width, channels = input_shape
    h, w, c = array.shape
    if c == channels and height in (None, h) and width in (None, w):
        return array
    if not resize:
        if c != channels:
            raise ValueError(
                f"image {name!r} has {c} channel(s); the model takes {channels} "
                f"({'RGB' if channels == 3 else 'channels last'}): pass resize=True "
                "(--resize) to convert it"
            )
        raise ValueError(
            f"image {name!r} is {h}x{w} (height x width); the model takes "
            f"{height}x{width}: pass resize=True (--resize) to resize it"
        )
    if c not in _CHANNEL_MODES or channels not in (1, 3, 4):
        raise ValueError(
            f"image {name!r} has {c} channel(s) and the model takes {channels}; resizing "
            "converts 1 to 4 channels into 1, 3 or 4"
        )
    from PIL import Image

    image = Image.fromarray(array[..., 0] if c == 1 else array).convert(_CHANNEL_MODES[channels])
    image = image.resize((width or w, height or h), Image.Resampling.BILINEAR)
    out = np.asarray(image, dtype=np.uint8)
    return out[..., None] if out.ndim == 2 else out


def top_k_predictions(outputs, *, top_k=None, class_names=None):
    """Each image's top classes from `ExportedModel.predict` outputs.

    Args:
        outputs: the dict `ExportedModel.predict` returns.
        top_k: optional int, 1 to the export's top-k (default: the export's).
        class_names: optional list of str, one per class, for the ``label`` entries.

    Returns:
        list, one per image, of lists of ``{"class": int, "score": float}`` dicts
        (with ``"label"`` when class names are given), best first.

    Raises:
        ValueError: for a `top_k` out of range, or class names that do not match
            the classes.
    """
    exported_k = outputs["top_k_classes"].shape[-1]
    k = exported_k if top_k is None else top_k
    if not 1 <= k <= exported_k:
        raise ValueError(f"`top_k` must be 1 to the export's top-k ({exported_k}). Received: top_k={top_k}")
    classes = outputs["probabilities"].shape[-1]
    if class_names is not None and len(class_names) != classes:
        raise ValueError(
            f"`class_names` has {len(class_names)} names; the model has {classes} classes. "
            f"Received: class_names={class_names!r}"
        )
    results = []
    for indices, scores in zip(outputs["top_k_classes"][:, :k], outputs["top_k_scores"][:, :k]):
        top = [{"class": int(i), "score": float(s)} for i, s in zip(indices, scores)]
        if class_names is not None:
            for entry in top:
                entry["label"] = class_names[entry["class"]]
        results.append(top)
    return results
