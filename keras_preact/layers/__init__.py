"""Pre-activation residual units, the paper's variant units (`UNIT_TYPES`) and helper
layers (keras.layers / keras.ops only)."""

from keras_preact.layers.blocks import (
    BOTTLENECK_STRIDES, PreActBasicBlock, PreActBottleneckBlock, PreActStage)
from keras_preact.layers.preprocessing import ImageNormalization
from keras_preact.layers.variants import resolve_unit_options, UNIT_TYPES

__all__ = [
    "BOTTLENECK_STRIDES",
    "ImageNormalization",
    "PreActBasicBlock",
    "PreActBottleneckBlock",
    "PreActStage",
    "UNIT_TYPES",
    "resolve_unit_options"]
