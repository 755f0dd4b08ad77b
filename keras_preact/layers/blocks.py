"""Pre-activation residual units (He et al., "Identity Mappings in Deep Residual
Networks", ECCV 2016, arXiv 1603.05027).

Each unit computes ``y = x + F(x)`` with nothing after the addition (Section 4,
Fig. 4e). ``F`` is a stack of BN -> ReLU -> conv. Where the unit changes the shape
(a stride or a new width) the shortcut is a 1x1 projection, and it is fed by the same
pre-activated tensor as the residual branch, so the first BN-ReLU is shared by both
paths (the paper's Section 4.1 / official code "both_preact").

The layers use ``keras.layers`` and ``keras.ops`` only, so they run on the TensorFlow,
JAX and PyTorch backends.
"""

import math

import keras
from keras import ops

from keras_preact.layers.utils import conv_macs
from keras_preact.layers.utils import normalize_data_format

#: Where a strided bottleneck puts its stride.
#: ``"middle"``: on the 3x3 conv (pytorchcv, timm, torchvision "ResNet v1.5"; the layout
#: of the published CIFAR pre-activation weights). ``"first"``: on the first 1x1 conv,
#: as in the paper's official Torch code.
BOTTLENECK_STRIDES = ("middle", "first")

# Torch's BatchNorm defaults (momentum 0.1 on the new statistic, eps 1e-5), which the
# paper's code and the published weights were trained with. Keras' momentum is the
# weight of the old statistic, hence 0.9.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"`{name}` must be a positive integer. Received: {name}={value!r}"
        )


class _PreActUnit(keras.layers.Layer):
    """Shared machinery of the pre-activation units (not registered, not public).

    Subclasses create the residual branch in ``_build_residual`` and run it in
    ``_residual``. Sub-layer creation order is frozen: ``preact_bn``, the residual
    branch in order, then ``shortcut_conv``. ``.weights.h5`` files match variables by
    creation order, so this order must never change.
    """

    #: Channels out / channels of the widest inner conv (1 for basic units).
    expansion = 1

    def __init__(
        self,
        filters,
        strides=1,
        projection=None,
        shared_preact=None,
        kernel_initializer="he_normal",
        kernel_regularizer=None,
        bn_momentum=BN_MOMENTUM,
        bn_epsilon=BN_EPSILON,
        data_format=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_positive_int("filters", filters)
        _check_positive_int("strides", strides)
        if projection is not None and not isinstance(projection, bool):
            raise ValueError(
                "`projection` must be None (automatic), True or False. "
                f"Received: projection={projection!r}"
            )
        if shared_preact is not None and not isinstance(shared_preact, bool):
            raise ValueError(
                "`shared_preact` must be None (automatic), True or False. "
                f"Received: shared_preact={shared_preact!r}"
            )
        if not 0.0 <= float(bn_momentum) < 1.0:
            raise ValueError(
                f"`bn_momentum` must be in [0, 1). Received: bn_momentum={bn_momentum!r}"
            )
        if not float(bn_epsilon) > 0.0:
            raise ValueError(
                f"`bn_epsilon` must be > 0. Received: bn_epsilon={bn_epsilon!r}"
            )
        self.filters = filters
        self.strides = strides
        self.projection = projection
        self.shared_preact = shared_preact
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bn_momentum = float(bn_momentum)
        self.bn_epsilon = float(bn_epsilon)
        self.data_format = normalize_data_format(data_format)
        self._channel_axis = -1 if self.data_format == "channels_last" else 1
        self._conv_strides = {}

    # -- helpers --------------------------------------------------------------
    def _bn(self, name):
        return keras.layers.BatchNormalization(
            axis=self._channel_axis,
            momentum=self.bn_momentum,
            epsilon=self.bn_epsilon,
            dtype=self.dtype_policy,
            name=name,
        )

    def _conv(self, filters, kernel_size, strides, name):
        # Strided convs pad symmetrically, as Torch and Caffe do; Keras' "same" pads
        # only bottom/right when the input size is even, which shifts the sampling
        # grid and would make converted weights compute something else.
        # A strided 1x1 conv is run as "take every s-th pixel, then a stride-1 1x1
        # conv": the same numbers, less work, and it avoids TensorFlow's missing
        # strided NCHW kernel on CPU.
        padding = "valid" if strides > 1 and kernel_size > 1 else "same"
        conv = keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=1 if kernel_size == 1 else strides,
            padding=padding,
            use_bias=False,
            kernel_initializer=self.kernel_initializer,
            kernel_regularizer=self.kernel_regularizer,
            data_format=self.data_format,
            dtype=self.dtype_policy,
            name=name,
        )
        self._conv_strides[name] = strides
        return conv

    def _apply_conv(self, conv, x):
        stride = self._conv_strides[conv.name]
        kernel_size = conv.kernel_size[0]
        if stride > 1 and kernel_size == 1:
            if self.data_format == "channels_last":
                x = x[:, ::stride, ::stride, :]
            else:
                x = x[:, :, ::stride, ::stride]
        elif stride > 1:
            p = (kernel_size - 1) // 2
            if self.data_format == "channels_last":
                pad = [[0, 0], [p, p], [p, p], [0, 0]]
            else:
                pad = [[0, 0], [0, 0], [p, p], [p, p]]
            x = ops.pad(x, pad)
        return conv(x)

    def _conv_output_shape(self, conv, input_shape):
        return _strided_shape(
            input_shape, self._conv_strides[conv.name], conv.filters, self.data_format
        )

    def _conv_input_shape(self, conv, input_shape):
        """The shape the Conv2D itself sees (after subsampling for strided 1x1)."""
        stride = self._conv_strides[conv.name]
        if stride > 1 and conv.kernel_size[0] == 1:
            in_channels = input_shape[self._channel_axis]
            return _strided_shape(input_shape, stride, in_channels, self.data_format)
        return tuple(input_shape)

    def _in_channels(self, input_shape):
        channels = input_shape[self._channel_axis]
        if channels is None:
            raise ValueError(
                f"{type(self).__name__} needs a known channel dimension. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        return int(channels)

    def _uses_projection(self, in_channels):
        needed = self.strides != 1 or in_channels != self.filters
        if self.projection is None:
            return needed
        if needed and not self.projection:
            raise ValueError(
                f"{self.name}: an identity shortcut cannot change the shape "
                f"(in_channels={in_channels}, filters={self.filters}, "
                f"strides={self.strides}). Received: projection=False"
            )
        return bool(self.projection)

    # -- Layer API ------------------------------------------------------------
    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"{type(self).__name__} expects a 4D input (batch, height, width, "
                f"channels). Received: input_shape={tuple(input_shape)}"
            )
        in_channels = self._in_channels(input_shape)
        self._has_projection = self._uses_projection(in_channels)
        self._shares_preact = (
            self._has_projection if self.shared_preact is None else self.shared_preact
        )
        self.preact_bn = self._bn("preact_bn")
        self.preact_bn.build(input_shape)
        self._build_residual(input_shape, in_channels)
        if self._has_projection:
            self.shortcut_conv = self._conv(self.filters, 1, self.strides, "shortcut_conv")
            self.shortcut_conv.build(self._conv_input_shape(self.shortcut_conv, input_shape))
        else:
            self.shortcut_conv = None

    def call(self, inputs, training=None):
        preact = ops.relu(self.preact_bn(inputs, training=training))
        shortcut = preact if self._shares_preact else inputs
        if self.shortcut_conv is not None:
            shortcut = self._apply_conv(self.shortcut_conv, shortcut)
        return ops.add(shortcut, self._residual(preact, training))

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, self.strides, self.filters, self.data_format)

    def compute_macs(self, input_shape):
        """Multiply-adds of one forward pass for one example of `input_shape`.

        Args:
            input_shape: the input shape, with or without the batch dimension.

        Returns:
            int: the multiply-adds of the convolutions (BN and ReLU not counted, as
            in the paper and pytorchcv).
        """
        if len(input_shape) == 3:
            input_shape = (None,) + tuple(input_shape)
        if not self.built:
            self.build(input_shape)
        total = 0
        shape = tuple(input_shape)
        for conv in self._residual_convs():
            total += conv_macs(conv, self._conv_input_shape(conv, shape), self.data_format)
            shape = self._conv_output_shape(conv, shape)
        if self.shortcut_conv is not None:
            conv = self.shortcut_conv
            total += conv_macs(conv, self._conv_input_shape(conv, input_shape), self.data_format)
        return total

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "filters": self.filters,
                "strides": self.strides,
                "projection": self.projection,
                "shared_preact": self.shared_preact,
                "kernel_initializer": keras.initializers.serialize(
                    self.kernel_initializer
                ),
                "kernel_regularizer": keras.regularizers.serialize(
                    self.kernel_regularizer
                )
                if self.kernel_regularizer is not None
                else None,
                "bn_momentum": self.bn_momentum,
                "bn_epsilon": self.bn_epsilon,
                "data_format": self.data_format,
            }
        )
        return config


def _strided_shape(input_shape, strides, channels, data_format):
    out = list(input_shape)
    h_axis, w_axis = (1, 2) if data_format == "channels_last" else (2, 3)
    for axis in (h_axis, w_axis):
        if out[axis] is not None:
            out[axis] = int(math.ceil(out[axis] / strides))
    out[-1 if data_format == "channels_last" else 1] = channels
    return tuple(out)


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActBasicBlock(_PreActUnit):
    """Full pre-activation basic unit (paper Fig. 4e, two 3x3 convs).

    ``y = s(x) + conv3x3(relu(bn(conv3x3(a))))`` with ``a = relu(bn(x))``; ``s`` is
    the identity, or a 1x1 projection of ``a`` when the shape changes. Nothing
    follows the addition.

    Args:
        filters: int, output channels (both convs have this width).
        strides: int, default 1. Stride of the first 3x3 conv and of the projection.
        projection: bool or None, default None. None uses a 1x1 projection exactly
            when the shape changes; True forces one; False forbids one (an error if
            the shape changes).
        shared_preact: bool or None, default None. Whether the shortcut takes the
            pre-activated input ``a`` (True) or the raw input ``x`` (False). None:
            True exactly when the shortcut is a projection (the paper's rule).
        kernel_initializer: default "he_normal" (He et al. 2015, as in the paper).
        kernel_regularizer: optional regularizer for the conv kernels.
        bn_momentum: float, default 0.9 (Torch's 0.1 in Keras' convention).
        bn_epsilon: float, default 1e-5 (Torch's default).
        data_format: "channels_last" or "channels_first"; None uses
            `keras.config.image_data_format()`.
        **kwargs: base Layer arguments (`name`, `dtype`, `trainable`).

    Example:
        >>> block = PreActBasicBlock(32, strides=2)
        >>> block(keras.ops.zeros((1, 16, 16, 16))).shape
        (1, 8, 8, 32)
    """

    def _build_residual(self, input_shape, in_channels):
        self.conv1 = self._conv(self.filters, 3, self.strides, "conv1")
        self.conv1.build(input_shape)
        mid_shape = self._conv_output_shape(self.conv1, tuple(input_shape))
        self.bn2 = self._bn("bn2")
        self.bn2.build(mid_shape)
        self.conv2 = self._conv(self.filters, 3, 1, "conv2")
        self.conv2.build(mid_shape)

    def _residual_convs(self):
        return (self.conv1, self.conv2)

    def _residual(self, preact, training):
        x = self._apply_conv(self.conv1, preact)
        x = ops.relu(self.bn2(x, training=training))
        return self._apply_conv(self.conv2, x)


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActBottleneckBlock(_PreActUnit):
    """Full pre-activation bottleneck unit (paper Fig. 4e with 1x1, 3x3, 1x1 convs).

    The inner width is ``filters // expansion``; each conv is preceded by BN-ReLU and
    nothing follows the addition.

    Args:
        filters: int, output channels; must be divisible by `expansion`.
        strides: int, default 1.
        expansion: int, default 4 (the paper's bottleneck ratio).
        bottleneck_stride: "middle" (default) puts the stride on the 3x3 conv, as
            pytorchcv, timm and the published CIFAR weights do; "first" puts it on
            the first 1x1 conv, as the paper's official Torch code does.
        projection, shared_preact, kernel_initializer, kernel_regularizer,
        bn_momentum, bn_epsilon, data_format, **kwargs: as in `PreActBasicBlock`.

    Example:
        >>> block = PreActBottleneckBlock(64)
        >>> block(keras.ops.zeros((1, 8, 8, 16))).shape
        (1, 8, 8, 64)
    """

    def __init__(self, filters, strides=1, expansion=4, bottleneck_stride="middle", **kwargs):
        super().__init__(filters, strides=strides, **kwargs)
        _check_positive_int("expansion", expansion)
        if filters % expansion:
            raise ValueError(
                "`filters` must be divisible by `expansion` (the inner width is "
                f"filters // expansion). Received: filters={filters}, "
                f"expansion={expansion}"
            )
        if bottleneck_stride not in BOTTLENECK_STRIDES:
            raise ValueError(
                f"`bottleneck_stride` must be one of {BOTTLENECK_STRIDES}. "
                f"Received: bottleneck_stride={bottleneck_stride!r}"
            )
        self.expansion = expansion
        self.bottleneck_stride = bottleneck_stride

    def _build_residual(self, input_shape, in_channels):
        width = self.filters // self.expansion
        s1, s2 = (self.strides, 1) if self.bottleneck_stride == "first" else (1, self.strides)
        shape = tuple(input_shape)
        self.conv1 = self._conv(width, 1, s1, "conv1")
        self.conv1.build(self._conv_input_shape(self.conv1, shape))
        shape = self._conv_output_shape(self.conv1, shape)
        self.bn2 = self._bn("bn2")
        self.bn2.build(shape)
        self.conv2 = self._conv(width, 3, s2, "conv2")
        self.conv2.build(shape)
        shape = self._conv_output_shape(self.conv2, shape)
        self.bn3 = self._bn("bn3")
        self.bn3.build(shape)
        self.conv3 = self._conv(self.filters, 1, 1, "conv3")
        self.conv3.build(shape)

    def _residual_convs(self):
        return (self.conv1, self.conv2, self.conv3)

    def _residual(self, preact, training):
        x = self._apply_conv(self.conv1, preact)
        x = ops.relu(self.bn2(x, training=training))
        x = self._apply_conv(self.conv2, x)
        x = ops.relu(self.bn3(x, training=training))
        return self._apply_conv(self.conv3, x)

    def get_config(self):
        config = super().get_config()
        config.update(
            {"expansion": self.expansion, "bottleneck_stride": self.bottleneck_stride}
        )
        return config
