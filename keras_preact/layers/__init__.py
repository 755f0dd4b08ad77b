"""Pre-activation residual units, the paper's variant units (`UNIT_TYPES`) and helper
layers, in Keras 3; the training hot path picks a backend's kernels (`tf_kernels`,
`jax_kernels`) where they are faster, with the plain Keras path as the reference."""

from keras_preact.layers.blocks import (
    BOTTLENECK_STRIDES, PreActBasicBlock, PreActBottleneckBlock, PreActStage)
from keras_preact.layers.preprocessing import ImageNormalization
from keras_preact.layers.variants import resolve_unit_options, UNIT_TYPES

__all__ = ["BOTTLENECK_STRIDES", "ImageNormalization", "PreActBasicBlock", "PreActBottleneckBlock",
           "PreActStage", "UNIT_TYPES", "resolve_unit_options"]
