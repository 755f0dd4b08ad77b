"""Pre-activation residual units, the paper's variant units (`UNIT_TYPES`) and helper
layers (keras.layers / keras.ops only)."""

from keras_preact.layers.blocks import BOTTLENECK_STRIDES
from keras_preact.layers.blocks import PreActBasicBlock
from keras_preact.layers.blocks import PreActBottleneckBlock
from keras_preact.layers.blocks import PreActStage
from keras_preact.layers.preprocessing import ImageNormalization
from keras_preact.layers.variants import UNIT_TYPES
from keras_preact.layers.variants import resolve_unit_options

__all__ = [
    "BOTTLENECK_STRIDES",
    "ImageNormalization",
    "PreActBasicBlock",
    "PreActBottleneckBlock",
    "PreActStage",
    "UNIT_TYPES",
    "resolve_unit_options",
]
