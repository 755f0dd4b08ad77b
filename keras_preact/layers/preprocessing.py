"""Input preprocessing built into a model, so exports and weights carry it."""

import keras
from keras import ops

from keras_preact.layers.shapes import normalize_data_format

#: ``(scale, mean, std)``, applied as ``(x * scale - mean) / std`` to [0, 255] pixels.
PRESETS = {
    # [-1, 1] (keras.applications ResNetV2's "tf" mode).
    "symmetric": (1.0 / 127.5, (1.0,), (1.0,)),
    "unit": (1.0 / 255.0, (0.0,), (1.0,)),
    # The training sets' statistics as pytorchcv's CIFAR models use them.
    "cifar10": (1.0 / 255.0, (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": (1.0 / 255.0, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    # ImageNet statistics (torchvision / keras.applications "torch" mode).
    "imagenet": (1.0 / 255.0, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))}


def resolve_preprocessing(preprocessing):
    """Turns a `preprocessing` argument (None, a name of `PRESETS`, or a dict with
    per-channel "mean" and "std" in units of ``x * scale`` and an optional "scale",
    default 1/255) into ``(scale, mean, std)`` or None; ValueError if malformed."""
    if preprocessing is None or isinstance(preprocessing, str) and preprocessing in PRESETS:
        return PRESETS.get(preprocessing)  # None: no preprocessing
    if isinstance(preprocessing, str):
        raise ValueError(f"Unknown `preprocessing` preset. Received: preprocessing="
                         f"{preprocessing!r}. Valid: None, a dict with 'mean' and 'std', or one "
                         f"of {sorted(PRESETS)}")
    if not isinstance(preprocessing, dict):
        raise ValueError("`preprocessing` must be None, a preset name or a dict. "
                         f"Received: preprocessing={preprocessing!r}")
    if set(preprocessing) - {"mean", "std", "scale"} or not {"mean", "std"} <= set(preprocessing):
        raise ValueError("A `preprocessing` dict needs the keys 'mean' and 'std' and may have "
                         f"'scale'. Received: preprocessing={preprocessing!r}")
    mean, std = (_as_tuple(f"preprocessing[{k!r}]", preprocessing[k]) for k in ("mean", "std"))
    if any(s <= 0 for s in std):
        raise ValueError(f"preprocessing['std'] must be positive. Received: {std}")
    if len(mean) != len(std) and 1 not in (len(mean), len(std)):
        raise ValueError("preprocessing['mean'] and ['std'] must have the same length. "
                         f"Received: mean={mean}, std={std}")
    return float(preprocessing.get("scale", 1.0 / 255.0)), mean, std


def _as_tuple(name, value):
    value = (value,) if isinstance(value, (int, float)) else value
    try:
        return tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be numbers. Received: {value!r}") from None


@keras.saving.register_keras_serializable(package="keras_preact")
class ImageNormalization(keras.layers.Layer):
    """Per-channel ``(x * scale - mean) / std`` (one value or one per channel); accepts
    integer images:

        >>> layer = ImageNormalization(scale=1 / 127.5, mean=(1.0,), std=(1.0,))
        >>> float(layer(keras.ops.full((1, 2, 2, 3), 255.0))[0, 0, 0, 0])
        1.0
    """

    def __init__(self, scale=1.0 / 255.0, mean=(0.0,), std=(1.0,), data_format=None, **kwargs):
        super().__init__(**kwargs)
        self.scale, self.mean = float(scale), _as_tuple("mean", mean)
        self.std = _as_tuple("std", std)
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive. Received: std={self.std}")
        self.data_format = normalize_data_format(data_format)

    def build(self, input_shape):
        channels = input_shape[-1 if self.data_format == "channels_last" else 1]
        for name, values in (("mean", self.mean), ("std", self.std)):
            if channels is not None and len(values) not in (1, channels):
                raise ValueError(f"`{name}` has {len(values)} values for an input with {channels} "
                                 f"channels. Received: {name}={values}, input_shape="
                                 f"{tuple(input_shape)}")

    def _broadcast(self, values):
        shape = (1, 1, 1, -1) if self.data_format == "channels_last" else (1, -1, 1, 1)
        return ops.reshape(ops.convert_to_tensor(values, dtype=self.compute_dtype), shape)

    def call(self, inputs):
        x = ops.cast(inputs, self.compute_dtype) * ops.cast(self.scale, self.compute_dtype)
        return (x - self._broadcast(self.mean)) / self._broadcast(self.std)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        return {**super().get_config(), "scale": self.scale, "mean": list(self.mean),
                "std": list(self.std), "data_format": self.data_format}
