"""The serving model every export is made from, the argument checks and the parity check."""

import json
import os

import numpy as np

import keras
from keras import ops

from keras_preact.architecture import POOL_LAYER, PREPROCESSING_LAYER
from keras_preact.checks import check_bool, check_int
from keras_preact.file_io import user_path
from keras_preact.layers.preprocessing import ImageNormalization, resolve_preprocessing

FORMATS = ("saved_model", "litert", "onnx")
#: LiteRT: None (float32), float16 weights, int8 weights ("dynamic_range") or full "int8".
QUANTIZATIONS = (None, "float16", "dynamic_range", "int8")
ONNX_QUANTIZATIONS = (None, "int8")  # int8: static, calibrated (onnxruntime.quantization)
#: Largest |difference| of `probabilities` between an export and the Keras model.
PARITY_TOLERANCES = {"saved_model": 1e-5, "onnx": 1e-5, "litert": 1e-5, "litert_float16": 1e-2,
                     "litert_dynamic_range": 0.1, "litert_int8": 0.25, "onnx_int8": 0.25}
AUTO = "auto"  # preprocessing: the model's own layer
EXPORT_EXTRA = 'pip install "keras-preact[export]"'


class ExportParityError(RuntimeError):
    """An export's outputs differ from the Keras model's beyond the tolerance."""


def check_path(name, path):
    """The absolute path of a folder argument."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"`{name}` must be a folder path. Received: {name}={path!r}")
    return user_path(path)


def check_json(name, value):
    """A copy of an optional JSON-serialisable dict argument."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"`{name}` must be a dict or None. Received: {name}={value!r}")
    try:
        json.dumps(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be JSON-serialisable ({err}). "
                         f"Received: {name}={value!r}") from None
    return dict(value)


def check_class_names(class_names, classes):
    """`class_names` as a list of `classes` strings, or None."""
    if class_names is None:
        return None
    is_list = hasattr(class_names, "__len__") and not isinstance(class_names, str)
    names = list(class_names) if is_list else []
    if not is_list or not all(isinstance(n, str) for n in names):
        raise ValueError("`class_names` must be a list of strings, one per class. "
                         f"Received: class_names={class_names!r}")
    if len(names) != classes:
        raise ValueError(f"`class_names` must have one name per class ({classes}). Received "
                         f"{len(names)} names: {names[:5]}{'...' if len(names) > 5 else ''}")
    if len(set(names)) != len(names):
        raise ValueError("`class_names` must name each class differently. Received "
                         f"{sorted({n for n in names if names.count(n) > 1})[:5]} more than once.")
    return names


def _model_input_shape(model):
    """(height, width, channels) of a classifier's one 4D image input."""
    if not isinstance(model, keras.Model):
        raise ValueError("`model` must be a keras.Model (e.g. a keras_preact.PreActResNet). "
                         f"Received: model={type(model).__name__}")
    inputs = getattr(model, "inputs", None) if model.built else None
    if not inputs or len(inputs) != 1 or len(inputs[0].shape) != 4:
        shapes = [tuple(t.shape) for t in inputs or ()]
        raise ValueError("`model` must be built, with one 4D image input [batch, H, W, C]. "
                         f"Received: model={model.name!r} with inputs {shapes}")
    if len(model.outputs) != 1 or len(model.outputs[0].shape) != 2:
        raise ValueError("`model` must be a classifier (include_top=True): scores [batch, classes]."
                         f" Received outputs: {[tuple(t.shape) for t in model.outputs]}")
    shape = tuple(None if d is None else int(d) for d in inputs[0].shape[1:])
    return (shape[1], shape[2], shape[0]) if _data_format(model) == "channels_first" else shape


def _find_layer(model, name):
    return next((layer for layer in model.layers if layer.name == name), None)


def _data_format(model):
    layer_format = getattr(_find_layer(model, PREPROCESSING_LAYER), "data_format", None)
    return getattr(model, "data_format", None) or layer_format or "channels_last"


def validate_images(images, input_shape, *, name="images"):
    """`images` (uint8 ``[batch, H, W, C]`` or one ``[H, W, C]``) as a 4D uint8 array;
    `input_shape` is the export's ``(height, width, channels)`` (None: any size), `name` the
    argument's name in messages. ValueError for a wrong dtype, rank, channel count or size."""
    height, width, channels = input_shape
    if (images := np.asarray(images)).dtype != np.uint8:
        raise ValueError(f"`{name}` must be uint8 pixels in 0..255 (.astype('uint8')). "
                         f"Received: dtype={images.dtype}")
    images = images[None] if images.ndim == 3 else images
    if images.ndim != 4:
        raise ValueError(f"`{name}` must be [batch, height, width, channels] or one image "
                         f"[height, width, channels]. Received: shape={images.shape}")
    if images.shape[-1] != channels:
        raise ValueError(f"`{name}` must have {channels} channels (channels last). Received: "
                         f"shape={images.shape} ({images.shape[-1]} channels)")
    if height not in (None, images.shape[1]) or width not in (None, images.shape[2]):
        raise ValueError(f"`{name}` must be {height}x{width} (height x width), the model's input "
                         f"size. Received: shape={images.shape}")
    if images.shape[0] == 0:
        raise ValueError(f"`{name}` is an empty batch. Received: shape={images.shape}")
    return images


def _resolve_preprocessing(model, preprocessing):
    """(layer or None, the model card's description) of the raw-image path."""
    if (layer := _find_layer(model, PREPROCESSING_LAYER)) is not None:
        if preprocessing != AUTO:
            raise ValueError(
                f"The model already has its own preprocessing layer ({PREPROCESSING_LAYER!r}); "
                "giving `preprocessing` too would normalise twice. "
                f"Received: preprocessing={preprocessing!r}. Leave it 'auto'.")
        source = f"the model's {PREPROCESSING_LAYER!r} layer"
    elif preprocessing == AUTO:
        raise ValueError(
            f"The model has no preprocessing layer (named {PREPROCESSING_LAYER!r}) to turn raw "
            "pixels into its inputs: pass `preprocessing`, a preset ('symmetric', 'unit', "
            "'cifar10', 'cifar100', 'imagenet'), a dict with 'mean' and 'std', or None (the raw "
            "0..255 values as floats). Received: preprocessing='auto'")
    elif (resolved := resolve_preprocessing(preprocessing)) is None:
        return None, {"source": "none: raw 0..255 values as float32"}
    else:
        source = f"export argument {preprocessing!r}"
        layer = ImageNormalization(*resolved, data_format=_data_format(model),
                                   name="serving_preprocessing")
    return layer, {"source": source, "scale": getattr(layer, "scale", None),
                   **{key: list(getattr(layer, key, ()) or ()) for key in ("mean", "std")}}


class ServingParts:
    """What every exporter shares: `raw` (the serving model, uint8 NHWC images -> named
    outputs), `preprocessed` (the same from preprocessed float32 NHWC inputs), the
    checked arguments and the model card's `preprocessing`."""

    def __init__(self, model, *, preprocessing, top_k, include_features):
        self.input_shape = _model_input_shape(model)
        self.classes = int(model.outputs[0].shape[-1])
        self.top_k = min(5, self.classes) if top_k is None else top_k
        check_int("top_k", self.top_k, minimum=1)
        if self.top_k > self.classes:
            raise ValueError("`top_k` must be at most the number of classes "
                             f"({self.classes}). Received: top_k={top_k}")
        check_bool("include_features", include_features)
        self.include_features = include_features
        self.channels_first = _data_format(model) == "channels_first"
        # classifier_activation=None gives logits; serving clients expect probabilities.
        self.softmax = getattr(model, "classifier_activation", "softmax") in (None, "linear")
        self.preprocessing_layer, self.preprocessing = _resolve_preprocessing(model, preprocessing)
        own = _find_layer(model, PREPROCESSING_LAYER)
        self.added_preprocessing = own is None and self.preprocessing_layer is not None
        outputs = {"probabilities": model.outputs[0]}
        if include_features:
            if (pool := _find_layer(model, POOL_LAYER)) is None or len(pool.output.shape) != 2:
                raise ValueError(f"`include_features=True` needs a layer {POOL_LAYER!r} with a "
                                 f"pooled [batch, width] output. Model {model.name!r} has none.")
            outputs["features"] = pool.output
            self.features = int(pool.output.shape[-1])
        # The float endpoint starts after the model's own preprocessing layer.
        core = keras.Model(model.inputs[0] if own is None else own.output, outputs,
                           name=f"{model.name}_core")
        inputs = keras.Input(self.input_shape, dtype="float32", name="inputs")
        # Serving clients send channels-last images whatever the model's layout.
        out = core(self._to_model_layout(inputs))
        probabilities = ops.softmax(out["probabilities"]) if self.softmax else out["probabilities"]
        scores, classes = ops.top_k(probabilities, self.top_k)
        result = {"probabilities": probabilities, "top_k_classes": classes, "top_k_scores": scores}
        if include_features:
            # float32 whatever the model's dtype policy (e.g. mixed_bfloat16).
            result["features"] = ops.cast(out["features"], "float32")
        self.preprocessed = keras.Model(inputs, result, name=f"{model.name}_preprocessed")
        images = keras.Input(self.input_shape, dtype="uint8", name="images")
        self.raw = keras.Model(images, self.preprocessed(self.normalize(images)),
                               name=f"{model.name}_serving")

    def _to_model_layout(self, x):
        return ops.transpose(x, (0, 3, 1, 2)) if self.channels_first else x

    def normalize(self, images):
        """uint8 NHWC images -> the float NHWC input of `self.preprocessed`."""
        x = ops.cast(images, "float32")
        if self.preprocessing_layer is None:
            return x
        x = self.preprocessing_layer(self._to_model_layout(x))
        return ops.transpose(x, (0, 2, 3, 1)) if self.channels_first else x

    def describe_outputs(self, class_names=None):
        """Output name -> {"dtype", "shape"}, for the model card."""
        out = {"probabilities": ("float32", self.classes), "top_k_classes": ("int32", self.top_k),
               "top_k_scores": ("float32", self.top_k),
               **({"features": ("float32", self.features)} if self.include_features else {}),
               **({"top_k_labels": ("string", self.top_k)} if class_names is not None else {})}
        return {name: {"dtype": dtype, "shape": [None, n]} for name, (dtype, n) in out.items()}

    def parity_images(self, images):
        """`images` checked, or 8 seeded random ones."""
        if images is not None:
            return validate_images(images, self.input_shape, name="parity_images")
        height, width, channels = self.input_shape
        size = (8, height or 32, width or 32, channels)
        return np.random.default_rng(0).integers(0, 256, size=size, dtype=np.uint8)

    def reference_probabilities(self, model, images):
        """The Keras model's probabilities, computed without the serving model."""
        x = images.astype("float32")
        if self.added_preprocessing:
            layer = self.preprocessing_layer
            mean, std = (np.asarray(v).astype("float32") for v in (layer.mean, layer.std))
            x = ((x * np.float32(layer.scale) - mean) / std).astype("float32")
        x = np.transpose(x, (0, 3, 1, 2)) if self.channels_first else x
        out = np.asarray(model.predict(x, verbose=0, batch_size=len(x)))
        return ops.convert_to_numpy(ops.softmax(out, axis=-1)) if self.softmax else out


def compare(name, reference, outputs, tolerance, labels=None):
    """The parity record of an export's probabilities against the Keras model's `reference`
    (with `labels`, both accuracies); ExportParityError for another shape or a difference
    beyond `tolerance`."""
    if (got := np.asarray(outputs["probabilities"])).shape != reference.shape:
        raise ExportParityError(f"The {name} export returns probabilities of shape {got.shape}; "
                                f"the Keras model {reference.shape}.")
    if not (diff := float(np.max(np.abs(got - reference)))) <= tolerance:
        raise ExportParityError(f"The {name} export differs from the Keras model: max |difference| "
                                f"of probabilities {diff:.3g} > tolerance {tolerance:.3g} on "
                                f"{len(reference)} images. Nothing was written.")
    agreement = np.mean(np.argmax(got, -1) == np.argmax(reference, -1))
    return {"max_abs_diff": diff, "tolerance": tolerance, "top1_agreement": float(agreement),
            "images": int(len(reference)), **({} if labels is None else {"accuracy": {
                "keras": float(np.mean(np.argmax(reference, -1) == labels)),
                "export": float(np.mean(np.argmax(got, -1) == labels))}})}


def build_serving_model(model, *, preprocessing=AUTO, top_k=None, include_features=False):
    """The Keras model every export is made from, sharing `model`'s weights: uint8
    ``[batch, H, W, C]`` -> dict of "probabilities", "top_k_classes", "top_k_scores" (and
    "features").

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        preprocessing: "auto": the model's own layer named "preprocessing"; for a model
            without one, a preset, a dict (see `keras_preact.layers.preprocessing`) or None.
        top_k: at most the number of classes; None: 5, or fewer classes.
        include_features: also return the pooled features (the layer named "pool").

    Raises ValueError for a model that is not a single-input classifier, a bad `top_k`, a
    `preprocessing` that is missing or given twice."""
    return ServingParts(model, preprocessing=preprocessing, top_k=top_k,
                        include_features=include_features).raw
