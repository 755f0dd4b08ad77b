"""Pre-activation residual units and stages as Keras layers (He et al., "Identity
Mappings in Deep Residual Networks", ECCV 2016, arXiv:1603.05027); the arithmetic is
`unit_ops.unit_forward`, the stacked variables of a stage `fast_stage`."""

import math

import keras
from keras import ops

from keras_preact.architecture import DEFAULTS
from keras_preact.checks import check_bool, check_choice, check_int, pop_deprecated
from keras_preact.layers import fast_stage, variants
from keras_preact.layers import unit_ops as F
from keras_preact.layers.initializers import HostInitializer
from keras_preact.layers import remat as remat_lib
from keras_preact.layers.shapes import normalize_data_format, spatial_shape

#: A strided bottleneck strides on its 3x3 conv ("middle": pytorchcv, timm, torchvision
#: v1.5, the published CIFAR weights) or its first 1x1 conv ("first": the paper's code).
BOTTLENECK_STRIDES = ("middle", "first")
BLOCK_TYPES = ("basic", "bottleneck")
#: The strided unit of a stage: "first" (the paper) or "last" (keras.applications V2).
STRIDE_POSITIONS = ("first", "last")
#: The shortcut of a strided unit that keeps its width: a strided 1x1 conv (the paper)
#: or every s-th pixel (keras.applications' ``MaxPooling2D(1, strides=s)``).
STRIDED_SHORTCUTS = ("projection", "subsample")

# Torch's BatchNorm defaults (momentum 0.1 on the new statistic, eps 1e-5), which the
# paper's code and the published weights used; Keras' momentum weighs the old one.
BN_MOMENTUM, BN_EPSILON = DEFAULTS["bn_momentum"], DEFAULTS["bn_epsilon"]

_INITIALIZERS = {"gamma": "ones", "beta": "zeros", "moving_mean": "zeros",
                 "moving_variance": "ones", "bias": "zeros"}
_TRAINABLE_KINDS = ("kernel", "gamma", "beta", "gate_bias", "bias")
_AUTOCAST_KINDS = ("kernel", "gate_bias", "bias")


def check_unit_arguments(*, strides, bottleneck_stride, bn_momentum, bn_epsilon, synchronized,
                         unit, strided_shortcut, conv_bias, **unit_options):
    """Checks the arguments of every unit and stage; returns `resolve_unit_options`'."""
    check_int("strides", strides, minimum=1)
    check_choice("bottleneck_stride", bottleneck_stride, BOTTLENECK_STRIDES)
    if not 0.0 <= float(bn_momentum) < 1.0:
        raise ValueError(f"`bn_momentum` must be in [0, 1). Received: bn_momentum={bn_momentum!r}")
    if not float(bn_epsilon) > 0.0:
        raise ValueError(f"`bn_epsilon` must be > 0. Received: bn_epsilon={bn_epsilon!r}")
    check_bool("synchronized", synchronized)
    if synchronized and keras.backend.backend() != "tensorflow":
        raise ValueError("`synchronized=True` (cross-replica BatchNorm statistics) needs "
                         f"TensorFlow. Received: synchronized=True on {keras.backend.backend()!r}")
    options = variants.resolve_unit_options(unit, **unit_options)
    check_choice("strided_shortcut", strided_shortcut, STRIDED_SHORTCUTS)
    check_bool("conv_bias", conv_bias)
    if conv_bias and not variants.get_unit(unit).bn_before_conv:
        raise ValueError(f"`conv_bias=True` is supported with unit={variants.DEFAULT_UNIT!r} "
                         f"only. Received: conv_bias=True with unit={unit!r}")
    return options


#: The arguments a stage passes on to each of its units.
_UNIT_ARGUMENTS = (
    "bottleneck_stride", "kernel_initializer", "kernel_regularizer", "bn_momentum", "bn_epsilon",
    "synchronized", "data_format", "unit", "shortcut_scale", "residual_scale", "gate_bias",
    "dropout_rate", "strided_shortcut", "conv_bias")


class _UnitConfigMixin:
    """Argument validation, config and BN settings shared by units and stages."""

    _CONFIG = ("filters", "strides", "bn_momentum", "bn_epsilon", "synchronized", "data_format",
               "unit", "shortcut_scale", "residual_scale", "gate_bias", "dropout_rate", "seed",
               "strided_shortcut", "conv_bias", "drop_path")

    def _init_common(self, *, filters, expansion, kernel_initializer, kernel_regularizer,
                     data_format, seed, **unit_args):
        check_int("filters", filters, minimum=1)
        check_int("expansion", expansion, minimum=1)
        self.unit_options = check_unit_arguments(**unit_args)
        self.variant = variants.get_unit(unit_args["unit"])
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"`seed` must be None or an int. Received: seed={seed!r}")
        if seed is not None and self.variant.shortcut != "dropout":
            raise ValueError("`seed` is used only by unit='dropout_shortcut'. "
                             f"Received: seed={seed!r} with unit={unit_args['unit']!r}")
        for name, value in unit_args.items():  # as given (None: the paper's), for get_config
            setattr(self, name, value)
        self.filters, self.expansion, self.seed = filters, expansion, seed
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bn_momentum, self.bn_epsilon = float(self.bn_momentum), float(self.bn_epsilon)
        self.data_format = normalize_data_format(data_format)
        self._channel_axis = -1 if self.data_format == "channels_last" else 1
        self.seed_generator = None  # made in `build`, for the dropout unit only
        if filters % expansion:
            raise ValueError("`filters` must be divisible by `expansion` (the inner width is "
                             f"filters // expansion). Received: filters={filters}, "
                             f"expansion={expansion}")

    def _init_drop_path(self, drop_path, units):
        """Keeps `drop_path`, a stochastic depth rate or one per unit, as `drop_rates`."""
        rates = tuple(drop_path) if isinstance(drop_path, (list, tuple)) else (drop_path,) * units
        if len(rates) != units or not all(isinstance(r, (int, float)) and not isinstance(r, bool)
                                          and 0 <= r < 1 for r in rates):
            raise ValueError(f"`drop_path` must be a rate in [0, 1) or a list of {units} (one "
                             f"per unit). Received: drop_path={drop_path!r}")
        self.drop_path, self.drop_rates = drop_path, tuple(float(r) for r in rates)

    def _build_seed_generator(self):
        """The generator of the dropout unit or of stochastic depth, made in `build` under the
        layer's name scope: each unit's generator state gets its own variable path."""
        dropout = self.variant.shortcut == "dropout"
        if dropout or any(self.drop_rates):
            self.seed_generator = keras.random.SeedGenerator(
                self.seed, name="shortcut_dropout_seed" if dropout else "drop_path_seed")

    def _add_variables(self, specs, units=None):
        """Creates the variables of `UnitSpec.variable_specs` (stacked `units` times)."""
        out = {}
        for name, shape, kind in specs:
            base = (self.kernel_initializer if kind == "kernel"
                    else keras.initializers.Constant(self.unit_options["gate_bias"])
                    if kind == "gate_bias" else _INITIALIZERS[kind])
            init = HostInitializer(base, key=f"{self.path}/{name}", stacked=units is not None)
            out[name] = self.add_weight(
                name=name, shape=tuple(shape) if units is None else (units,) + tuple(shape),
                initializer=init, regularizer=self.kernel_regularizer if kind == "kernel" else None,
                trainable=kind in _TRAINABLE_KINDS, autocast=kind in _AUTOCAST_KINDS)
        return out

    def _spec(self, in_channels, strides, has_projection, shared_preact):
        return F.UnitSpec(self.block, in_channels, self.filters, strides, self.expansion,
                          self.bottleneck_stride, has_projection, shared_preact, unit=self.unit,
                          options=self.unit_options, conv_bias=self.conv_bias)

    def _check_input(self, input_shape):
        if len(input_shape) != 4 or input_shape[self._channel_axis] is None:
            raise ValueError(f"{type(self).__name__} expects a 4D input (batch, height, width, "
                             "channels) with a known channel dimension. "
                             f"Received: input_shape={tuple(input_shape)}")
        return int(input_shape[self._channel_axis])

    def _run_kwargs(self, training):
        kwargs = dict(training=bool(training) and self.trainable, momentum=self.bn_momentum,
                      epsilon=self.bn_epsilon, data_format=self.data_format,
                      synchronized=self.synchronized)
        if self.seed_generator is not None:
            # Dropout follows `training` even in a frozen layer, as keras' Dropout.
            kwargs.update(seed_generator=self.seed_generator, dropout_training=bool(training))
        return kwargs

    def _assign_stats(self, variables, new_stats):
        for bn, (mean, variance) in new_stats.items():
            variables[f"{bn}_moving_mean"].assign(mean)
            variables[f"{bn}_moving_variance"].assign(variance)

    def compute_output_shape(self, input_shape):
        out = list(input_shape)
        for axis in (1, 2) if self.data_format == "channels_last" else (2, 3):
            if out[axis] is not None:
                out[axis] = int(math.ceil(out[axis] / self.strides))
        out[self._channel_axis] = self.filters
        return tuple(out)

    def get_config(self):
        return {**super().get_config(), **{key: getattr(self, key) for key in self._CONFIG},
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer)}


class _PreActUnit(_UnitConfigMixin, keras.layers.Layer):
    """One unit with its own variables, in `UnitSpec.variable_specs`' frozen order. A
    frozen layer (``trainable=False``) runs BN in inference mode, as Keras' BN does."""

    block = None

    def __init__(self, filters, strides=1, projection=None, shared_preact=None,
                 expansion=1, bottleneck_stride="middle", kernel_initializer="he_normal",
                 kernel_regularizer=None, bn_momentum=BN_MOMENTUM, bn_epsilon=BN_EPSILON,
                 synchronized=False, data_format=None, unit=variants.DEFAULT_UNIT,
                 shortcut_scale=None, residual_scale=None, gate_bias=None, dropout_rate=None,
                 seed=None, strided_shortcut="projection", conv_bias=False, drop_path=0.0,
                 **kwargs):
        args = {k: v for k, v in locals().items() if k not in (
            "self", "kwargs", "__class__", "projection", "shared_preact", "drop_path")}
        super().__init__(**kwargs)
        self._init_common(**args)
        self._init_drop_path(drop_path, 1)
        check_bool("projection", projection, allow_none=True)
        check_bool("shared_preact", shared_preact, allow_none=True)
        if self.variant.shortcut == "conv" and projection is False:
            raise ValueError(f"unit={unit!r} has a 1x1 conv on every shortcut (paper Fig. 2e). "
                             "Received: projection=False")
        if shared_preact and not self.variant.preactivation:
            preact = [n for n, u in variants.UNITS.items() if u.preactivation]
            raise ValueError(f"`shared_preact` needs a unit with a pre-activation {preact}. "
                             f"Received: shared_preact=True with unit={unit!r}")
        self.projection, self.shared_preact = projection, shared_preact

    def _make_spec(self, in_channels):
        # A stride alone needs a projection unless the shortcut subsamples.
        needed = in_channels != self.filters or (
            self.strides != 1 and self.strided_shortcut == "projection")
        if self.projection is False and needed:
            raise ValueError(f"{self.name}: an identity shortcut cannot change the shape "
                             f"(in_channels={in_channels}, filters={self.filters}, "
                             f"strides={self.strides}). Received: projection=False")
        has_projection = self.variant.shortcut == "conv" or (
            needed if self.projection is None else self.projection)
        shared = has_projection if self.shared_preact is None else self.shared_preact
        # Without a pre-activation the shortcut sees x.
        return self._spec(in_channels, self.strides, has_projection,
                          shared and self.variant.preactivation)

    def build(self, input_shape):
        self._build_seed_generator()
        self.spec = self._make_spec(self._check_input(input_shape))
        self._vars = self._add_variables(self.spec.variable_specs())

    @property
    def has_projection(self):
        """Whether the built unit's shortcut is a 1x1 conv."""
        return self.spec.has_projection

    def get_variable(self, name):
        """The variable `name` (e.g. "conv1_kernel", "preact_bn_gamma")."""
        return self._vars[name]

    def call(self, inputs, training=None):
        params = {name: ops.convert_to_tensor(v) for name, v in self._vars.items()}
        y, updates = F.unit_forward(inputs, params, self.spec, **self._run_kwargs(training),
                                    drop_path=self.drop_rates[0])
        self._assign_stats(self._vars, updates)
        return y

    def compute_macs(self, input_shape):
        """Multiply-adds of the convs for one example (as the paper and pytorchcv count)."""
        input_shape = (None,) * (4 - len(input_shape)) + tuple(input_shape)  # batch axis
        spec = self.spec if self.built else self._make_spec(self._check_input(input_shape))
        return spec.macs(*spatial_shape(input_shape, self.data_format))

    def get_config(self):
        keys = ("projection", "shared_preact") + (
            ("expansion", "bottleneck_stride") if self.block == "bottleneck" else ())
        return {**super().get_config(), **{key: getattr(self, key) for key in keys}}


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActBasicBlock(_PreActUnit):
    """Full pre-activation basic unit (paper Fig. 4e): ``y = h(x) + conv3x3(relu(bn(conv3x3(a))))``
    with ``a = relu(bn(x))``; ``h`` is the identity, or a 1x1 projection of ``a`` when the
    shape changes.

    Args:
        projection: None (a projection exactly when the shape changes), True or False
            (an error if the shape changes).
        shared_preact: whether the shortcut takes ``a`` instead of ``x`` (None: True
            exactly when it projects).
        bn_momentum, bn_epsilon: Torch's defaults 0.9 (Keras' convention), 1e-5.
        synchronized: cross-replica BN statistics (TensorFlow only).
        unit: a name of `UNIT_TYPES`, the paper's units of Fig. 2 and 4 (`variants`).
        shortcut_scale, residual_scale, gate_bias, dropout_rate, seed: the unit's
            parameters (None: the paper's; see `variants.resolve_unit_options`).
        strided_shortcut: see `STRIDED_SHORTCUTS`; a width change always projects.
        conv_bias: biases on the convs no BN follows ("conv2_bias"/"conv3_bias",
            "shortcut_bias"), as keras.applications ResNetV2; "full_preact" only.
        drop_path: stochastic depth, F's drop rate in training (`unit_ops.unit_forward`).

    Example:
        >>> tuple(PreActBasicBlock(32, strides=2)(keras.ops.zeros((1, 16, 16, 16))).shape)
        (1, 8, 8, 32)
    """

    block = "basic"

    def __init__(self, filters, strides=1, **kwargs):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("expansion", "bottleneck_stride")}
        super().__init__(filters, strides=strides, **kwargs)


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActBottleneckBlock(_PreActUnit):
    """Full pre-activation bottleneck unit (paper Fig. 4e with 1x1, 3x3, 1x1 convs) of
    inner width ``filters // expansion``; see `BOTTLENECK_STRIDES`, `PreActBasicBlock`:

        >>> tuple(PreActBottleneckBlock(64)(keras.ops.zeros((1, 8, 8, 16))).shape)
        (1, 8, 8, 64)
    """

    block = "bottleneck"

    def __init__(self, filters, strides=1, expansion=4, bottleneck_stride="middle", **kwargs):
        super().__init__(filters, strides=strides, expansion=expansion,
                         bottleneck_stride=bottleneck_stride, **kwargs)


UNIT_CLASSES = {"basic": PreActBasicBlock, "bottleneck": PreActBottleneckBlock}


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActStage(_UnitConfigMixin, keras.layers.Layer):
    """A stage: a unit sub-layer "unit1" and ``num_blocks - 1`` identical units whose
    variables are stacked (slice ``i`` is unit ``i + 2``; `fast_stage`), their moving
    statistics updated once per call. With ``stride_position="last"`` and a stride the
    last unit is a sub-layer of its own, "unit_last".

    Args:
        block: "basic" or "bottleneck".
        num_blocks: the number of units (``units=`` is a deprecated alias).
        first_shared_preact: the first unit's `shared_preact` (None: the paper's rule).
        remat: rematerialisation in training (`remat`): None/False, True or "segment", "unit"
            or an int; not with random masks. Without it, training loops over
            `plain_loop_min_units` or more units too.
        drop_path: a stochastic depth rate for every unit, or a list of one per unit.
        (the rest, **kwargs): as in the units, for every unit.

    Example:
        >>> stage = PreActStage("basic", 32, num_blocks=18, strides=2)
        >>> tuple(stage(keras.ops.zeros((1, 32, 32, 16))).shape)
        (1, 16, 16, 32)
    """

    # False unrolls the looped paths (a reference for tests and benchmarks).
    remat_loop = True
    # Without remat, training loops from this many stacked units on. TensorFlow: the
    # 1000-layer models (110 and 199 a stage), whose unrolled step is slow to trace.
    # JAX: every stage; XLA compiles the loop sooner and runs it faster.
    plain_loop_min_units = 2 if keras.backend.backend() == "jax" else 64

    def __init__(self, block, filters, num_blocks=None, strides=1, first_shared_preact=None,
                 expansion=4, bottleneck_stride="middle", kernel_initializer="he_normal",
                 kernel_regularizer=None, bn_momentum=BN_MOMENTUM, bn_epsilon=BN_EPSILON,
                 synchronized=False, data_format=None, unit=variants.DEFAULT_UNIT,
                 shortcut_scale=None, residual_scale=None, gate_bias=None, dropout_rate=None,
                 seed=None, stride_position="first", strided_shortcut="projection",
                 conv_bias=False, remat=None, drop_path=0.0, **kwargs):
        units = pop_deprecated(kwargs, "units", "num_blocks", "PreActStage")
        num_blocks = num_blocks if units is None else units
        super().__init__(**kwargs)
        check_choice("block", block, BLOCK_TYPES)
        check_int("num_blocks", num_blocks, minimum=1)
        check_bool("first_shared_preact", first_shared_preact, allow_none=True)
        expansion = 1 if block == "basic" else expansion
        unit_args = {k: v for k, v in locals().items() if k in _UNIT_ARGUMENTS}
        self._init_common(filters=filters, strides=strides, expansion=expansion, seed=seed,
                          **unit_args)
        check_stride_position(stride_position, (num_blocks,), (strides,))
        self.block, self.num_blocks = block, num_blocks
        self.first_shared_preact, self.stride_position = first_shared_preact, stride_position
        self._init_drop_path(drop_path, num_blocks)
        self.remat = remat_lib.check_remat(remat, unit, max(self.drop_rates))
        unit_args.update(kernel_initializer=self.kernel_initializer, dtype=self.dtype_policy,
                         kernel_regularizer=self.kernel_regularizer,
                         data_format=self.data_format, expansion=expansion)
        # The sub-layers' own seeds (seed + 1, seed + 2) keep their dropout masks apart.
        seeds = (None, None) if seed is None else (seed + 1, seed + 2)
        last = stride_position == "last" and strides > 1
        self.unit1 = UNIT_CLASSES[block](filters, strides=1 if last else strides,
                                         shared_preact=first_shared_preact, name="unit1",
                                         seed=seeds[0], drop_path=self.drop_rates[0], **unit_args)
        self.unit_last = (UNIT_CLASSES[block](filters, strides=strides, name="unit_last",
                                              seed=seeds[1], drop_path=self.drop_rates[-1],
                                              **unit_args) if last else None)

    def build(self, input_shape):
        self._check_input(input_shape)
        self._build_seed_generator()
        self.unit1.build(input_shape)
        self.repeat_spec = self._repeat_spec()
        self._stacked = (self._add_variables(self.repeat_spec.variable_specs(), self.num_stacked)
                         if self.num_stacked else {})
        if self.unit_last is not None:
            self.unit_last.build(self.unit1.compute_output_shape(input_shape))

    @property
    def num_stacked(self):
        """All units but "unit1" and "unit_last"."""
        return self.num_blocks - 1 - (self.unit_last is not None)

    def _repeat_spec(self):
        # Units 2..n keep the shape: only the conv-shortcut unit projects.
        return self._spec(self.filters, 1, self.variant.shortcut == "conv", False)

    def get_variable(self, name):
        """The stacked variable `name` of units 2..num_blocks (leading axis: unit - 2)."""
        return self._stacked[name]

    def _loopable(self):
        # Not with synchronized BN (its all-reduce cannot run in a `tf.while_loop` under
        # MirroredStrategy) nor random masks (a seed generator in a loop body leaks).
        return (self.remat_loop and not self.synchronized and self.variant.shortcut != "dropout"
                and not any(self.drop_rates))

    def call(self, inputs, training=None, return_unit_inputs=False):
        unit_inputs = [inputs]
        x = self.unit1(inputs, training=training)
        if self.num_stacked:
            kwargs = self._run_kwargs(training)
            stacked = {k: ops.convert_to_tensor(v) for k, v in self._stacked.items()}
            looped = kwargs["training"] and not return_unit_inputs and (
                self.remat is not None
                or (self._loopable() and self.num_stacked >= self.plain_loop_min_units))
            if looped:
                x, new_stats = fast_stage.segmented_units(
                    x, stacked, self.repeat_spec, kwargs, remat=self.remat, loop=self._loopable())
            else:
                x, new_stats = fast_stage.stacked_units(
                    x, stacked, self.repeat_spec, kwargs, unit_inputs=unit_inputs,
                    drop_paths=self.drop_rates[1:1 + self.num_stacked])
            self._assign_stats(self._stacked, new_stats)
        if self.unit_last is not None:
            unit_inputs.append(x)
            x = self.unit_last(x, training=training)
        return (x, unit_inputs) if return_unit_inputs else x

    def compute_macs(self, input_shape):
        input_shape = (None,) * (4 - len(input_shape)) + tuple(input_shape)  # batch axis
        total = self.unit1.compute_macs(input_shape)
        out = self.unit1.compute_output_shape(input_shape)  # the stacked units' size
        total += self.num_stacked * self._repeat_spec().macs(*spatial_shape(out, self.data_format))
        if self.unit_last is not None:
            total += self.unit_last.compute_macs(out)
        return int(total)

    def get_config(self):
        return {**super().get_config(), **{key: getattr(self, key) for key in (
            "block", "num_blocks", "first_shared_preact", "expansion", "bottleneck_stride",
            "stride_position", "remat")}}


def check_stride_position(stride_position, stage_blocks, stage_strides):
    check_choice("stride_position", stride_position, STRIDE_POSITIONS)
    short = [i + 1 for i, (n, s) in enumerate(zip(stage_blocks, stage_strides)) if s > 1 and n < 2]
    if stride_position == "last" and short:
        raise ValueError("stride_position='last' strides in a unit after the first, so every "
                         "strided stage needs at least 2 units. Received: stage_blocks="
                         f"{tuple(stage_blocks)}, stage_strides={tuple(stage_strides)} "
                         f"(stages {short})")
