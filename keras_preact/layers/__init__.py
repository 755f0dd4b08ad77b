"""Pre-activation residual units and helper layers (keras.layers / keras.ops only)."""

from keras_preact.layers.blocks import BOTTLENECK_STRIDES
from keras_preact.layers.blocks import PreActBasicBlock
from keras_preact.layers.blocks import PreActBottleneckBlock
from keras_preact.layers.blocks import PreActStage
from keras_preact.layers.preprocessing import ImageNormalization

__all__ = [
    "BOTTLENECK_STRIDES",
    "ImageNormalization",
    "PreActBasicBlock",
    "PreActBottleneckBlock",
    "PreActStage",
]
