"""Pre-activation residual units and stages (He et al., "Identity Mappings in Deep
Residual Networks", ECCV 2016, arXiv 1603.05027).

Each unit computes ``y = x + F(x)`` with nothing after the addition (Section 4,
Fig. 4e). ``F`` is a stack of BN -> ReLU -> conv. Where the unit changes the shape
(a stride or a new width) the shortcut is a 1x1 projection, and it is fed by the same
pre-activated tensor as the residual branch, so the first BN-ReLU is shared by both
paths.

`PreActStage` holds a whole stage: its first unit as a `PreActBasicBlock` /
`PreActBottleneckBlock` layer, and the identical units after it as *stacked*
variables (a leading axis of one entry per unit). A ResNet-1001 is then a few dozen
variables instead of ~5,000, which is what makes it build, save and load in seconds;
the arithmetic is the same function (`keras_preact.layers.functional.unit_forward`)
either way.

The layers use ``keras.layers`` and ``keras.ops`` only, so they run on the TensorFlow,
JAX and PyTorch backends.
"""

import math

import keras
from keras import ops

from keras_preact import private_api
from keras_preact.layers import functional as F
from keras_preact.layers import remat as remat_lib
from keras_preact.layers import variants
from keras_preact.layers.utils import normalize_data_format

#: Where a strided bottleneck puts its stride.
#: ``"middle"``: on the 3x3 conv (pytorchcv, timm, torchvision "ResNet v1.5"; the layout
#: of the published CIFAR pre-activation weights). ``"first"``: on the first 1x1 conv,
#: as in the paper's official Torch code.
BOTTLENECK_STRIDES = ("middle", "first")
BLOCK_TYPES = ("basic", "bottleneck")
#: Which unit of a stage carries the stage's stride. ``"first"``: the first unit (the
#: paper, its official code, pytorchcv, timm). ``"last"``: the last unit
#: (keras.applications ResNet50V2/101V2/152V2).
STRIDE_POSITIONS = ("first", "last")
#: The shortcut of a strided unit whose width does not change. ``"projection"``: a
#: strided 1x1 conv (the paper's rule: a projection wherever the shape changes).
#: ``"subsample"``: an identity that keeps every s-th pixel of the raw input
#: (keras.applications' ``MaxPooling2D(1, strides=s)`` shortcut).
STRIDED_SHORTCUTS = ("projection", "subsample")

# Torch's BatchNorm defaults (momentum 0.1 on the new statistic, eps 1e-5), which the
# paper's code and the published weights were trained with. Keras' momentum is the
# weight of the old statistic, hence 0.9.
BN_MOMENTUM = 0.9
BN_EPSILON = 1e-5

_INITIALIZERS = {
    "gamma": "ones",
    "beta": "zeros",
    "moving_mean": "zeros",
    "moving_variance": "ones",
    "bias": "zeros",
}


_TRAINABLE_KINDS = ("kernel", "gamma", "beta", "gate_bias", "bias")
_AUTOCAST_KINDS = ("kernel", "gate_bias", "bias")


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def _check_optional_bool(name, value):
    if value is not None and not isinstance(value, bool):
        raise ValueError(
            f"`{name}` must be None (automatic), True or False. Received: {name}={value!r}"
        )


def _strided_shape(input_shape, strides, channels, data_format):
    out = list(input_shape)
    h_axis, w_axis = (1, 2) if data_format == "channels_last" else (2, 3)
    for axis in (h_axis, w_axis):
        if out[axis] is not None:
            out[axis] = int(math.ceil(out[axis] / strides))
    out[-1 if data_format == "channels_last" else 1] = channels
    return tuple(out)


def check_layout(*, strided_shortcut, conv_bias, unit):
    """Validates the layout options `strided_shortcut` and `conv_bias` for `unit`."""
    if strided_shortcut not in STRIDED_SHORTCUTS:
        raise ValueError(
            f"`strided_shortcut` must be one of {STRIDED_SHORTCUTS}. "
            f"Received: strided_shortcut={strided_shortcut!r}"
        )
    if not isinstance(conv_bias, bool):
        raise ValueError(f"`conv_bias` must be True or False. Received: conv_bias={conv_bias!r}")
    if conv_bias and unit != variants.DEFAULT_UNIT:
        raise ValueError(
            f"`conv_bias=True` is supported with unit={variants.DEFAULT_UNIT!r} only. "
            f"Received: conv_bias=True with unit={unit!r}"
        )


class _UnitConfigMixin:
    """Argument validation and config shared by units and stages."""

    def _init_common(self, *, filters, strides, expansion, bottleneck_stride,
                     kernel_initializer, kernel_regularizer, bn_momentum, bn_epsilon,
                     synchronized, data_format):
        _check_positive_int("filters", filters)
        _check_positive_int("strides", strides)
        _check_positive_int("expansion", expansion)
        if bottleneck_stride not in BOTTLENECK_STRIDES:
            raise ValueError(
                f"`bottleneck_stride` must be one of {BOTTLENECK_STRIDES}. "
                f"Received: bottleneck_stride={bottleneck_stride!r}"
            )
        if not 0.0 <= float(bn_momentum) < 1.0:
            raise ValueError(f"`bn_momentum` must be in [0, 1). Received: bn_momentum={bn_momentum!r}")
        if not float(bn_epsilon) > 0.0:
            raise ValueError(f"`bn_epsilon` must be > 0. Received: bn_epsilon={bn_epsilon!r}")
        if not isinstance(synchronized, bool):
            raise ValueError(f"`synchronized` must be True or False. Received: synchronized={synchronized!r}")
        if synchronized and keras.backend.backend() != "tensorflow":
            raise ValueError(
                "`synchronized=True` (cross-replica BatchNorm statistics) needs the "
                f"TensorFlow backend. Received: synchronized=True on {keras.backend.backend()!r}"
            )
        self.filters = filters
        self.strides = strides
        self.expansion = expansion
        self.bottleneck_stride = bottleneck_stride
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bn_momentum = float(bn_momentum)
        self.bn_epsilon = float(bn_epsilon)
        self.synchronized = synchronized
        self.data_format = normalize_data_format(data_format)
        self._channel_axis = -1 if self.data_format == "channels_last" else 1

    def _init_unit(self, *, unit, shortcut_scale, residual_scale, gate_bias, dropout_rate, seed):
        self.unit = variants.check_unit_name(unit)
        self.unit_options = variants.resolve_unit_options(
            unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
            gate_bias=gate_bias, dropout_rate=dropout_rate,
        )
        # The arguments as given (None = the paper's value), for get_config.
        self.shortcut_scale = shortcut_scale
        self.residual_scale = residual_scale
        self.gate_bias = gate_bias
        self.dropout_rate = dropout_rate
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"`seed` must be None or an int. Received: seed={seed!r}")
        if seed is not None and unit != "dropout_shortcut":
            raise ValueError(
                "`seed` is used only by unit='dropout_shortcut'. "
                f"Received: seed={seed!r} with unit={unit!r}"
            )
        self.seed = seed
        # Only the dropout unit gets a generator: its state is a variable, and the
        # other units' variable lists must stay as they are.
        self.seed_generator = (
            keras.random.SeedGenerator(seed, name="shortcut_dropout_seed")
            if unit == "dropout_shortcut" else None
        )

    def _init_layout(self, *, strided_shortcut, conv_bias):
        """The shortcut form of strided units and the conv biases (call after
        `_init_unit`)."""
        check_layout(strided_shortcut=strided_shortcut, conv_bias=conv_bias, unit=self.unit)
        self.strided_shortcut = strided_shortcut
        self.conv_bias = conv_bias

    def _layout_config(self):
        return {"strided_shortcut": self.strided_shortcut, "conv_bias": self.conv_bias}

    def _spec_kwargs(self):
        return dict(unit=self.unit, options=self.unit_options, conv_bias=self.conv_bias)

    def _unit_config(self):
        return {
            "unit": self.unit,
            "shortcut_scale": self.shortcut_scale,
            "residual_scale": self.residual_scale,
            "gate_bias": self.gate_bias,
            "dropout_rate": self.dropout_rate,
            "seed": self.seed,
        }

    def _check_input(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(
                f"{type(self).__name__} expects a 4D input (batch, height, width, "
                f"channels). Received: input_shape={tuple(input_shape)}"
            )
        channels = input_shape[self._channel_axis]
        if channels is None:
            raise ValueError(
                f"{type(self).__name__} needs a known channel dimension. "
                f"Received: input_shape={tuple(input_shape)}"
            )
        return int(channels)

    def _run_kwargs(self, training):
        kwargs = dict(
            training=bool(training) and self.trainable,
            momentum=self.bn_momentum,
            epsilon=self.bn_epsilon,
            data_format=self.data_format,
            synchronized=self.synchronized,
        )
        if self.seed_generator is not None:
            # Dropout follows `training` even in a frozen layer, as keras' Dropout.
            kwargs.update(seed_generator=self.seed_generator, dropout_training=bool(training))
        return kwargs

    def _common_config(self):
        return {
            "filters": self.filters,
            "strides": self.strides,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer)
            if self.kernel_regularizer is not None
            else None,
            "bn_momentum": self.bn_momentum,
            "bn_epsilon": self.bn_epsilon,
            "synchronized": self.synchronized,
            "data_format": self.data_format,
        }


class _PreActUnit(_UnitConfigMixin, keras.layers.Layer):
    """One pre-activation unit with its own variables (not public; see subclasses).

    Variables are created in a frozen order (`UnitSpec.variable_specs`):
    ``preact_bn_{gamma,beta,moving_mean,moving_variance}``, ``conv1_kernel``, ``bn2_*``,
    ``conv2_kernel`` [, ``bn3_*``, ``conv3_kernel``] [, ``shortcut_kernel``].
    `.weights.h5` files match variables by creation order, so it must never change.
    BN runs in inference mode when the layer is frozen (``trainable=False``), as
    Keras' own BatchNormalization does.
    """

    block_type = None

    def __init__(self, filters, strides=1, projection=None, shared_preact=None,
                 expansion=1, bottleneck_stride="middle", kernel_initializer="he_normal",
                 kernel_regularizer=None, bn_momentum=BN_MOMENTUM, bn_epsilon=BN_EPSILON,
                 synchronized=False, data_format=None, unit=variants.DEFAULT_UNIT,
                 shortcut_scale=None, residual_scale=None, gate_bias=None, dropout_rate=None,
                 seed=None, strided_shortcut="projection", conv_bias=False, **kwargs):
        super().__init__(**kwargs)
        self._init_common(
            filters=filters, strides=strides, expansion=expansion,
            bottleneck_stride=bottleneck_stride, kernel_initializer=kernel_initializer,
            kernel_regularizer=kernel_regularizer, bn_momentum=bn_momentum,
            bn_epsilon=bn_epsilon, synchronized=synchronized, data_format=data_format,
        )
        self._init_unit(unit=unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
                        gate_bias=gate_bias, dropout_rate=dropout_rate, seed=seed)
        self._init_layout(strided_shortcut=strided_shortcut, conv_bias=conv_bias)
        _check_optional_bool("projection", projection)
        _check_optional_bool("shared_preact", shared_preact)
        if unit == "conv_shortcut" and projection is False:
            raise ValueError(
                "unit='conv_shortcut' has a 1x1 conv on every shortcut (paper Fig. 2e). "
                "Received: projection=False"
            )
        if shared_preact and unit not in variants.PREACTIVATION_UNITS:
            raise ValueError(
                f"`shared_preact` needs a unit with a pre-activation "
                f"{list(variants.PREACTIVATION_UNITS)}. Received: shared_preact=True "
                f"with unit={unit!r}"
            )
        self.projection = projection
        self.shared_preact = shared_preact

    def _make_spec(self, in_channels):
        # A stride alone needs a projection unless the shortcut subsamples.
        needed = in_channels != self.filters or (
            self.strides != 1 and self.strided_shortcut == "projection"
        )
        if self.projection is False and needed:
            raise ValueError(
                f"{self.name}: an identity shortcut cannot change the shape "
                f"(in_channels={in_channels}, filters={self.filters}, "
                f"strides={self.strides}). Received: projection=False"
            )
        has_projection = needed if self.projection is None else self.projection
        if self.unit == "conv_shortcut":
            has_projection = True
        shares = has_projection if self.shared_preact is None else self.shared_preact
        if self.unit not in variants.PREACTIVATION_UNITS:
            shares = False  # nothing precedes the first conv: the shortcut sees x
        return F.UnitSpec(self.block_type, in_channels, self.filters, self.strides,
                          self.expansion, self.bottleneck_stride, has_projection, shares,
                          **self._spec_kwargs())

    def build(self, input_shape):
        self.spec = self._make_spec(self._check_input(input_shape))
        self._vars = {}
        for name, shape, kind in self.spec.variable_specs():
            if kind == "kernel":
                init = self.kernel_initializer
            elif kind == "gate_bias":
                init = keras.initializers.Constant(self.unit_options["gate_bias"])
            else:
                init = _INITIALIZERS[kind]
            self._vars[name] = self.add_weight(
                name=name,
                shape=shape,
                initializer=init,
                regularizer=self.kernel_regularizer if kind == "kernel" else None,
                trainable=kind in _TRAINABLE_KINDS,
                autocast=kind in _AUTOCAST_KINDS,
            )

    # Read-only views used by tests, converters and diagnostics.
    @property
    def has_projection(self):
        return self.spec.has_projection

    @property
    def shares_preact(self):
        return self.spec.shares_preact

    def get_variable(self, name):
        """The variable `name` (e.g. "conv1_kernel", "preact_bn_gamma")."""
        return self._vars[name]

    def call(self, inputs, training=None):
        params = {name: ops.convert_to_tensor(v) for name, v in self._vars.items()}
        y, updates = F.unit_forward(inputs, params, self.spec, **self._run_kwargs(training))
        for bn, (mean, var) in updates.items():
            self._vars[f"{bn}_moving_mean"].assign(mean)
            self._vars[f"{bn}_moving_variance"].assign(var)
        return y

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, self.strides, self.filters, self.data_format)

    def compute_macs(self, input_shape):
        """Multiply-adds of the convs for one example of `input_shape` (BN, ReLU and
        the addition not counted, as in the paper and pytorchcv)."""
        if len(input_shape) == 3:
            input_shape = (None,) + tuple(input_shape)
        spec = self.spec if self.built else self._make_spec(self._check_input(input_shape))
        h, w = (input_shape[1], input_shape[2]) if self.data_format == "channels_last" else (input_shape[2], input_shape[3])
        return spec.macs(h, w)

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        config.update({"projection": self.projection, "shared_preact": self.shared_preact})
        config.update(self._unit_config())
        config.update(self._layout_config())
        return config


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
        synchronized: bool, default False. Cross-replica BN statistics under
            `tf.distribute` (TensorFlow backend only).
        data_format: "channels_last" or "channels_first"; None uses
            `keras.config.image_data_format()`.
        unit: default "full_preact" (this docstring). Any name in
            `keras_preact.layers.UNIT_TYPES` makes this layer that unit of the paper
            (Fig. 2, Fig. 4; see `keras_preact.layers.variants`): e.g. "original",
            ``relu(h(x) + F(x))``. Units without a BN pre-activation give their
            1x1 projection a BN (conv-BN, as in the 2015 ResNet) and ignore
            `shared_preact` (True is an error).
        shortcut_scale, residual_scale: the lambdas of "constant_scaling"
            (None: 0.5, 0.5).
        gate_bias: initial gate bias b_g of "exclusive_gating" and
            "shortcut_only_gating" (None: -6).
        dropout_rate: shortcut drop rate of "dropout_shortcut" (None: 0.5);
            classic dropout (a 0/1 mask in training, the scale 1 - rate at
            inference), as the paper reads it.
        seed: optional int, the dropout seed ("dropout_shortcut" only).
        strided_shortcut: "projection" (default) or "subsample": the shortcut of a
            strided unit that keeps its width. "projection" is a strided 1x1 conv
            (the paper's rule); "subsample" keeps every `strides`-th pixel of the
            raw input ``x``, what keras.applications ResNetV2's
            ``MaxPooling2D(1, strides)`` shortcut computes. A width change always
            gets a projection.
        conv_bias: bool, default False. True gives a bias to the convs that no
            BatchNorm follows: the unit's last conv and its projection shortcut
            (keras.applications ResNetV2); "full_preact" units only. The biases
            are created after the kernel they follow ("conv2_bias" / "conv3_bias",
            "shortcut_bias").
        **kwargs: base Layer arguments (`name`, `dtype`, `trainable`).

    Example:
        >>> block = PreActBasicBlock(32, strides=2)
        >>> original = PreActBasicBlock(32, strides=2, unit="original")
        >>> block(keras.ops.zeros((1, 16, 16, 16))).shape
        (1, 8, 8, 32)
    """

    block_type = "basic"

    def __init__(self, filters, strides=1, **kwargs):
        kwargs.pop("expansion", None)
        kwargs.pop("bottleneck_stride", None)
        super().__init__(filters, strides=strides, **kwargs)


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
        bn_momentum, bn_epsilon, synchronized, data_format, unit, shortcut_scale,
        residual_scale, gate_bias, dropout_rate, seed, strided_shortcut, conv_bias,
        **kwargs: as in `PreActBasicBlock`.

    Example:
        >>> block = PreActBottleneckBlock(64)
        >>> block(keras.ops.zeros((1, 8, 8, 16))).shape
        (1, 8, 8, 64)
    """

    block_type = "bottleneck"

    def __init__(self, filters, strides=1, expansion=4, bottleneck_stride="middle", **kwargs):
        super().__init__(filters, strides=strides, expansion=expansion,
                         bottleneck_stride=bottleneck_stride, **kwargs)
        if filters % expansion:
            raise ValueError(
                "`filters` must be divisible by `expansion` (the inner width is "
                f"filters // expansion). Received: filters={filters}, expansion={expansion}"
            )

    def get_config(self):
        config = super().get_config()
        config.update({"expansion": self.expansion, "bottleneck_stride": self.bottleneck_stride})
        return config


UNIT_CLASSES = {"basic": PreActBasicBlock, "bottleneck": PreActBottleneckBlock}


class _StackedInitializer:
    """Initialises a [units, ...] variable as `units` independent draws of `base`.

    Variance-scaling initialisers (He, Glorot, LeCun) get their fans from one unit's
    shape, not the stacked one, so each slice has exactly the distribution a single
    unit's kernel would have.
    """

    def __init__(self, base, units):
        self.base = base
        self.units = units

    def __call__(self, shape, dtype=None):
        base = self.base
        if isinstance(base, keras.initializers.VarianceScaling):
            # The stacked shape multiplies both fans by `units`; the scale compensates.
            stacked = keras.initializers.VarianceScaling(
                scale=base.scale * self.units, mode=base.mode,
                distribution=base.distribution, seed=private_api.initializer_seed(base),
            )
            return stacked(shape, dtype=dtype)
        slices = [
            keras.initializers.get(keras.initializers.serialize(base))(shape[1:], dtype=dtype)
            for _ in range(self.units)
        ]
        return ops.stack(slices)


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActStage(_UnitConfigMixin, keras.layers.Layer):
    """A stage of `units` pre-activation units: a strided/projecting first unit and
    `units - 1` identical identity units.

    The first unit is a `PreActBasicBlock` / `PreActBottleneckBlock` sub-layer named
    "unit1". The others share one set of *stacked* variables (leading axis
    ``units - 1``: slice ``i`` belongs to unit ``i + 2``), named like a unit's
    variables. Moving BN statistics are updated once per call, for all units at once.
    With ``stride_position="last"`` and a stride the last unit is a sub-layer of its
    own, "unit_last", after the stacked units (which are then units 2..units-1).

    Args:
        block: "basic" or "bottleneck".
        filters: int, output channels of every unit.
        units: int >= 1, number of units (>= 2 for a strided stage with
            ``stride_position="last"``).
        strides: int, the stage's stride (default 1), on the unit that
            `stride_position` names.
        first_shared_preact: bool or None, the first unit's `shared_preact`
            (None: the paper's rule, shared exactly when it projects).
        expansion, bottleneck_stride, kernel_initializer, kernel_regularizer,
        bn_momentum, bn_epsilon, synchronized, data_format, **kwargs: as in the units.
        unit, shortcut_scale, residual_scale, gate_bias, dropout_rate, seed: the
            residual unit of every unit of the stage (see `PreActBasicBlock`); the
            stacked units get the same variables a unit layer would.
        stride_position: "first" (default: the first unit strides, as in the
            paper) or "last" (the last unit strides, as in keras.applications
            ResNetV2; the first unit keeps the size).
        strided_shortcut, conv_bias: as in `PreActBasicBlock`, for every unit.
        remat: rematerialisation of the stacked units in training (see
            `keras_preact.layers.remat`): None/False (off, default), True or
            "segment" (segments of ceil(sqrt(n)) units), "unit" (one unit a
            segment) or an int (units per segment). Outputs, gradients and moving
            statistics are those of the plain path; the backward pass recomputes
            each segment instead of keeping its activations. The equal segments
            run as one loop of the backend, so the traced training step does not
            grow with depth. Not with unit="dropout_shortcut". Without remat, a
            stage of at least `plain_loop_min_units` (64) stacked units trains
            them as a loop too (one unit an iteration); inference is unrolled.

    Example:
        >>> stage = PreActStage("basic", 32, units=18, strides=2)
        >>> stage(keras.ops.zeros((1, 32, 32, 16))).shape
        (1, 16, 16, 32)
    """

    # Run a rematerialised stage's equal segments (and a very deep plain stage's
    # units, below) as one backend loop (see `_remat_stacked_units`); False unrolls
    # them, as a reference for tests and benchmarks.
    remat_loop = True
    # Without remat, a training call runs the stacked units as a backend loop (one
    # unit an iteration) from this many stacked units on: the 1000-layer models
    # (110 and 199 stacked units a stage), whose unrolled training step takes
    # minutes and gigabytes to trace. Shallower stages stay unrolled.
    plain_loop_min_units = 64

    def __init__(self, block, filters, units, strides=1, first_shared_preact=None,
                 expansion=4, bottleneck_stride="middle", kernel_initializer="he_normal",
                 kernel_regularizer=None, bn_momentum=BN_MOMENTUM, bn_epsilon=BN_EPSILON,
                 synchronized=False, data_format=None, unit=variants.DEFAULT_UNIT,
                 shortcut_scale=None, residual_scale=None, gate_bias=None, dropout_rate=None,
                 seed=None, stride_position="first", strided_shortcut="projection",
                 conv_bias=False, remat=None, **kwargs):
        super().__init__(**kwargs)
        if block not in BLOCK_TYPES:
            raise ValueError(f"Unknown `block`. Received: block={block!r}. Valid: {list(BLOCK_TYPES)}")
        _check_positive_int("units", units)
        _check_optional_bool("first_shared_preact", first_shared_preact)
        if block == "basic":
            expansion = 1
        self._init_common(
            filters=filters, strides=strides, expansion=expansion,
            bottleneck_stride=bottleneck_stride, kernel_initializer=kernel_initializer,
            kernel_regularizer=kernel_regularizer, bn_momentum=bn_momentum,
            bn_epsilon=bn_epsilon, synchronized=synchronized, data_format=data_format,
        )
        if block == "bottleneck" and filters % expansion:
            raise ValueError(
                "`filters` must be divisible by `expansion`. "
                f"Received: filters={filters}, expansion={expansion}"
            )
        self._init_unit(unit=unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
                        gate_bias=gate_bias, dropout_rate=dropout_rate, seed=seed)
        self._init_layout(strided_shortcut=strided_shortcut, conv_bias=conv_bias)
        if stride_position not in STRIDE_POSITIONS:
            raise ValueError(
                f"`stride_position` must be one of {STRIDE_POSITIONS}. "
                f"Received: stride_position={stride_position!r}"
            )
        if stride_position == "last" and strides > 1 and units < 2:
            raise ValueError(
                "stride_position='last' puts the stride on a unit of its own after "
                f"the first, so the stage needs units >= 2. Received: units={units}, "
                f"strides={strides}"
            )
        self.block = block
        self.units = units
        self.first_shared_preact = first_shared_preact
        self.stride_position = stride_position
        self.remat = remat_lib.check_remat(remat, unit)
        unit_kwargs = dict(
            kernel_initializer=self.kernel_initializer, kernel_regularizer=self.kernel_regularizer,
            bn_momentum=bn_momentum, bn_epsilon=bn_epsilon, synchronized=synchronized,
            data_format=self.data_format, dtype=self.dtype_policy,
        )
        if block == "bottleneck":
            unit_kwargs.update(expansion=expansion, bottleneck_stride=bottleneck_stride)
        if unit != variants.DEFAULT_UNIT:
            # The first unit's dropout draws from its own seed (seed + 1) so that it
            # does not repeat the stacked units' masks.
            unit_kwargs.update(
                unit=unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
                gate_bias=gate_bias, dropout_rate=dropout_rate,
                seed=None if seed is None else seed + 1,
            )
        unit_kwargs.update(self._layout_config())
        # With stride_position="last" the first unit keeps the size and a unit of
        # its own, "unit_last", strides after the stacked ones (keras.applications).
        self.unit1 = UNIT_CLASSES[block](
            filters, strides=strides if stride_position == "first" else 1,
            shared_preact=first_shared_preact, name="unit1", **unit_kwargs
        )
        self.unit_last = None
        if stride_position == "last" and strides > 1:
            if unit_kwargs.get("seed") is not None:
                unit_kwargs["seed"] = seed + 2
            self.unit_last = UNIT_CLASSES[block](filters, strides=strides, name="unit_last",
                                                 **unit_kwargs)

    def build(self, input_shape):
        self._check_input(input_shape)
        self.unit1.build(input_shape)
        self.repeat_spec = self._repeat_spec()
        self._stacked = {}
        n = self.num_stacked
        if n:
            for name, shape, kind in self.repeat_spec.variable_specs():
                if kind == "kernel":
                    init = _StackedInitializer(self.kernel_initializer, n)
                elif kind == "gate_bias":
                    init = keras.initializers.Constant(self.unit_options["gate_bias"])
                else:
                    init = keras.initializers.get(_INITIALIZERS[kind])
                self._stacked[name] = self.add_weight(
                    name=name,
                    shape=(n,) + tuple(shape),
                    initializer=init,
                    regularizer=self.kernel_regularizer if kind == "kernel" else None,
                    trainable=kind in _TRAINABLE_KINDS,
                    autocast=kind in _AUTOCAST_KINDS,
                )
        if self.unit_last is not None:
            self.unit_last.build(self.unit1.compute_output_shape(input_shape))

    @property
    def num_stacked(self):
        """How many units share the stacked variables: all but "unit1" (and
        "unit_last" when the stride is on the last unit)."""
        return self.units - 1 - (self.unit_last is not None)

    def _repeat_spec(self):
        # Units 2..n keep the shape; only the 1x1-conv-shortcut unit projects there.
        return F.UnitSpec(self.block, self.filters, self.filters, 1, self.expansion,
                          self.bottleneck_stride, self.unit == "conv_shortcut", False,
                          **self._spec_kwargs())

    def get_variable(self, name):
        """The stacked variable `name` of units 2..units (leading axis: unit - 2)."""
        return self._stacked[name]

    def unit_params(self, index):
        """Tensors of unit `index` (1-based) of this stage, keyed like a unit's variables."""
        if index == 1:
            return {k: ops.convert_to_tensor(v) for k, v in self.unit1._vars.items()}
        if self.unit_last is not None and index == self.units:
            return {k: ops.convert_to_tensor(v) for k, v in self.unit_last._vars.items()}
        return {k: ops.convert_to_tensor(v)[index - 2] for k, v in self._stacked.items()}

    def call(self, inputs, training=None, return_unit_inputs=False):
        unit_inputs = [inputs]
        x = self.unit1(inputs, training=training)
        if self.num_stacked:
            kwargs = self._run_kwargs(training)
            if self.remat is not None and kwargs["training"] and not return_unit_inputs:
                x, new_stats = self._remat_stacked_units(x, kwargs)
            elif (kwargs["training"] and not return_unit_inputs and self._loopable()
                  and self.num_stacked >= self.plain_loop_min_units):
                x, new_stats = self._remat_stacked_units(x, kwargs, checkpointed=False)
            else:
                x, new_stats = self._stacked_units(x, kwargs, unit_inputs=unit_inputs)
            # One update per moving statistic per step, for all units at once.
            for bn, (means, variances) in new_stats.items():
                self._stacked[f"{bn}_moving_mean"].assign(means)
                self._stacked[f"{bn}_moving_variance"].assign(variances)
        if self.unit_last is not None:
            # The strided last unit (stride_position="last"): its own variables,
            # updated once by its own call.
            unit_inputs.append(x)
            x = self.unit_last(x, training=training)
        if return_unit_inputs:
            return x, unit_inputs
        return x

    def _stacked_units(self, x, kwargs, stacked=None, unit_inputs=None):
        """Runs stacked units: all of them, or those of `stacked` (name -> tensor
        with a leading unit axis). Returns (x, {bn: (means, variances)}), the new
        moving statistics stacked like the variables; nothing is assigned here."""
        if stacked is None:
            stacked = {k: ops.convert_to_tensor(v) for k, v in self._stacked.items()}
        length = next(iter(stacked.values())).shape[0]
        # Read each stacked tensor once, then slice per unit.
        slices = {k: ops.unstack(t, num=length, axis=0) for k, t in stacked.items()}
        new_stats = {}
        for i in range(length):
            if unit_inputs is not None:
                unit_inputs.append(x)
            params = {k: s[i] for k, s in slices.items()}
            x, updates = F.unit_forward(x, params, self.repeat_spec, **kwargs)
            for bn, stats in updates.items():
                new_stats.setdefault(bn, []).append(stats)
        return x, {
            bn: (ops.stack([m for m, _ in stats]), ops.stack([v for _, v in stats]))
            for bn, stats in new_stats.items()
        }

    def _loopable(self):
        """Whether training may run the stacked units as a backend loop. Not with
        synchronized BatchNorm (its cross-replica all-reduce cannot run inside a
        `tf.while_loop` under MirroredStrategy) nor with dropout (a seed generator
        advanced inside a loop body leaks the loop's traced state)."""
        return self.remat_loop and not self.synchronized and self.seed_generator is None

    def _remat_stacked_units(self, x, kwargs, checkpointed=True):
        """`_stacked_units` in checkpointed segments (`keras_preact.layers.remat`);
        with ``checkpointed=False``, in plain segments of one unit (the looped
        training path of very deep stages).

        Each segment is a pure function of its input and its slice of the stacked
        variables. It returns its output and its units' new moving statistics, which
        are assigned once, after the forward pass: the recomputation in the backward
        pass cannot update them twice.
        """
        names = sorted(self._stacked)
        bns = [name[: -len("_moving_mean")] for name, _, kind in
               self.repeat_spec.variable_specs() if kind == "moving_mean"]

        def segment(x, *tensors):
            # Positional tensors in, a flat tuple out: what every backend's
            # checkpoint accepts.
            y, stats = self._stacked_units(x, kwargs, dict(zip(names, tensors)))
            return (y,) + tuple(t for bn in bns for t in stats[bn])

        run = remat_lib.checkpoint(segment) if checkpointed else segment
        stacked = [ops.convert_to_tensor(self._stacked[name]) for name in names]
        lengths = remat_lib.segment_lengths(self.num_stacked,
                                            self.remat if checkpointed else "unit")
        size, count = lengths[0], lengths.count(lengths[0])
        pieces = {bn: ([], []) for bn in bns}

        def collect(stats, looped=False):
            # Statistics of looped segments come as (count, size, channels).
            for j, bn in enumerate(bns):
                for k in (0, 1):
                    t = stats[2 * j + k]
                    if looped:
                        t = ops.reshape(t, (-1,) + tuple(t.shape[2:]))
                    pieces[bn][k].append(t)

        if count > 1 and self._loopable():
            # The equal segments run as one loop over a (count, size, ...) view of
            # the stacked variables: the traced graph holds one segment, not
            # `count` copies (what keeps ResNet-1001's train step small).
            def body(x, tensors):
                out = run(x, *tensors)
                return out[0], out[1:]

            views = [ops.reshape(t[: count * size], (count, size) + tuple(t.shape[1:]))
                     for t in stacked]
            # The new statistics are shaped like the old ones.
            stats_like = [views[names.index(f"{bn}_moving_{field}")]
                          for bn in bns for field in ("mean", "variance")]
            x, stats = remat_lib.scan(body, x, views, stats_like)
            collect(stats, looped=True)
            start = count * size
        else:
            start = 0
            for _ in range(count):
                out = run(x, *[t[start:start + size] for t in stacked])
                x = out[0]
                collect(out[1:])
                start += size
        if start < self.num_stacked:
            out = run(x, *[t[start:] for t in stacked])
            x = out[0]
            collect(out[1:])
        return x, {
            bn: (ops.concatenate(means, axis=0), ops.concatenate(variances, axis=0))
            for bn, (means, variances) in pieces.items()
        }

    def compute_output_shape(self, input_shape):
        return _strided_shape(input_shape, self.strides, self.filters, self.data_format)

    def compute_macs(self, input_shape):
        """Multiply-adds of the stage's convs for one example of `input_shape`."""
        if len(input_shape) == 3:
            input_shape = (None,) + tuple(input_shape)
        total = self.unit1.compute_macs(input_shape)
        # The stacked units run at the first unit's output size.
        out = self.unit1.compute_output_shape(input_shape)
        h, w = (out[1], out[2]) if self.data_format == "channels_last" else (out[2], out[3])
        total += self.num_stacked * self._repeat_spec().macs(h, w)
        if self.unit_last is not None:
            total += self.unit_last.compute_macs(out)
        return int(total)

    def get_config(self):
        config = super().get_config()
        config.update(self._common_config())
        config.update({
            "block": self.block,
            "units": self.units,
            "first_shared_preact": self.first_shared_preact,
            "expansion": self.expansion,
            "bottleneck_stride": self.bottleneck_stride,
            "stride_position": self.stride_position,
            "remat": self.remat,
        })
        config.update(self._unit_config())
        config.update(self._layout_config())
        return config
