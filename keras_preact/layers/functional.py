"""The unit equations as functions of tensors, shared by the unit and stage layers.

Keeping the arithmetic in one place means a stage of stacked units and a chain of
single-unit layers compute exactly the same thing (a test checks it).
"""

import math

import keras
from keras import ops
from keras import random as keras_random

from keras_preact.layers.variants import DEFAULT_UNIT
from keras_preact.layers.variants import GATING_UNITS
from keras_preact.layers.variants import POST_RELU_UNITS
from keras_preact.layers.variants import PREACTIVATION_UNITS

BN_FIELDS = ("gamma", "beta", "moving_mean", "moving_variance")


class UnitSpec:
    """Static description of one pre-activation unit: its convs and shortcut.

    Args:
        block: "basic" or "bottleneck".
        in_channels: int.
        filters: output channels.
        strides: int.
        expansion: bottleneck ratio (ignored for basic units).
        bottleneck_stride: "middle" or "first".
        has_projection: bool, a 1x1 projection shortcut.
        shares_preact: bool, the shortcut takes the pre-activated input (units with
            a pre-activation only).
        unit: one of `keras_preact.layers.variants.UNIT_TYPES`.
        options: the unit's resolved parameters (shortcut/residual scale, gate bias,
            dropout rate).
        conv_bias: bool, default False. A bias on the convs no BatchNorm follows:
            the unit's last conv and its projection shortcut (keras.applications
            ResNetV2). Full pre-activation units only.

    A strided unit without a projection (``has_projection=False``, ``strides > 1``)
    subsamples its identity shortcut: every ``strides``-th pixel of the raw input,
    what keras.applications' ``MaxPooling2D(1, strides)`` shortcut computes.
    """

    def __init__(self, block, in_channels, filters, strides, expansion, bottleneck_stride,
                 has_projection, shares_preact, *, unit=DEFAULT_UNIT, options=None,
                 conv_bias=False):
        self.unit = unit
        self.conv_bias = bool(conv_bias)
        # Resolved parameters of the variant (`variants.resolve_unit_options`).
        self.options = dict(options or {})
        self.block = block
        self.in_channels = in_channels
        self.filters = filters
        self.strides = strides
        self.has_projection = has_projection
        self.shares_preact = shares_preact
        if block == "basic":
            # (name, kernel size, in, out, stride); each conv is preceded by a BN.
            self.convs = (
                ("conv1", 3, in_channels, filters, strides),
                ("conv2", 3, filters, filters, 1),
            )
        else:
            width = filters // expansion
            s1, s2 = (strides, 1) if bottleneck_stride == "first" else (1, strides)
            self.convs = (
                ("conv1", 1, in_channels, width, s1),
                ("conv2", 3, width, width, s2),
                ("conv3", 1, width, filters, 1),
            )
        # The BN before each conv: "preact_bn" (shared with the shortcut), bn2, bn3.
        self.bns = ("preact_bn",) + tuple(f"bn{i}" for i in range(2, len(self.convs) + 1))
        self.bn_channels = tuple(c[2] for c in self.convs)
        if unit != "full_preact":
            # Every other unit puts its BN *after* each conv ("bn1" follows "conv1"),
            # except Fig. 4b, which moves the last one after the addition ("add_bn").
            n = len(self.convs)
            self.bns = tuple(
                None if (unit == "bn_after_addition" and i == n) else f"bn{i}"
                for i in range(1, n + 1)
            )
            self.bn_channels = tuple(c[3] for c in self.convs)

    def variable_specs(self):
        """(name, shape, kind) of every variable, in the frozen creation order.

        kind is "kernel", "gate_bias" or one of `BN_FIELDS`. The default unit's order
        (BN then conv, then the projection) is frozen: weights files depend on it.
        The other units list each conv then the BN after it, then the projection,
        then "add_bn" (Fig. 4b) or the gate's "gate_kernel" and "gate_bias".
        With ``conv_bias`` the last conv's bias follows its kernel ("conv3_bias" /
        "conv2_bias") and "shortcut_bias" follows "shortcut_kernel".
        """
        if self.unit != "full_preact":
            return self._variant_variable_specs()
        specs = []
        for bn, channels, (conv, k, cin, cout, _) in zip(self.bns, self.bn_channels, self.convs):
            for field in BN_FIELDS:
                specs.append((f"{bn}_{field}", (channels,), field))
            specs.append((f"{conv}_kernel", (k, k, cin, cout), "kernel"))
        if self.conv_bias:
            specs.append((f"{self.convs[-1][0]}_bias", (self.filters,), "bias"))
        if self.has_projection:
            specs.append(("shortcut_kernel", (1, 1, self.in_channels, self.filters), "kernel"))
            if self.conv_bias:
                specs.append(("shortcut_bias", (self.filters,), "bias"))
        return specs

    def _variant_variable_specs(self):
        specs = []
        for bn, channels, (conv, k, cin, cout, _) in zip(self.bns, self.bn_channels, self.convs):
            specs.append((f"{conv}_kernel", (k, k, cin, cout), "kernel"))
            if bn is not None:
                for field in BN_FIELDS:
                    specs.append((f"{bn}_{field}", (channels,), field))
        if self.has_projection:
            specs.append(("shortcut_kernel", (1, 1, self.in_channels, self.filters), "kernel"))
            if self.unit not in PREACTIVATION_UNITS:
                for field in BN_FIELDS:
                    specs.append((f"shortcut_bn_{field}", (self.filters,), field))
        if self.unit == "bn_after_addition":
            for field in BN_FIELDS:
                specs.append((f"add_bn_{field}", (self.filters,), field))
        if self.unit in GATING_UNITS:
            specs.append(("gate_kernel", (1, 1, self.in_channels, self.filters), "kernel"))
            specs.append(("gate_bias", (self.filters,), "gate_bias"))
        return specs

    def macs(self, height, width):
        """Multiply-adds of the convs for one example of spatial size (height, width)."""
        total = 0
        h, w = height, width
        for _, k, cin, cout, s in self.convs:
            h, w = math.ceil(h / s), math.ceil(w / s)
            total += h * w * k * k * cin * cout
        # The 1x1 projection, and the 1x1 gate of the gating units.
        for present in (self.has_projection, self.unit in GATING_UNITS):
            if present:
                total += math.ceil(height / self.strides) * math.ceil(width / self.strides) * (
                    self.in_channels * self.filters
                )
        return int(total)


def _moving_stats(params, mean, variance, momentum):
    """The moving averages after one training batch, as Keras' BatchNormalization."""
    return (
        params["moving_mean"] * momentum + mean * (1.0 - momentum),
        params["moving_variance"] * momentum + variance * (1.0 - momentum),
    )


def batch_norm(x, params, *, training, momentum, epsilon, channel_axis, synchronized=False):
    """Batch normalisation with Keras' arithmetic: statistics in float32, or in
    float64 for float64 inputs (as `keras.layers.BatchNormalization`).

    Args:
        x: 4D tensor.
        params: dict with `BN_FIELDS` tensors.
        training: bool; batch statistics are used (and returned) when True.

    Returns:
        (y, (new_moving_mean, new_moving_variance) or None).
    """
    out_dtype = x.dtype
    is_float64 = keras.backend.standardize_dtype(x.dtype) == "float64"
    xf = ops.cast(x, "float64" if is_float64 else "float32")
    if training:
        axes = [a for a in range(4) if a != channel_axis % 4]
        if synchronized:
            mean, variance = ops.moments(xf, axes, synchronized=True)
        else:
            mean, variance = ops.moments(xf, axes)
        new_stats = _moving_stats(params, mean, variance, momentum)
    else:
        mean, variance = params["moving_mean"], params["moving_variance"]
        new_stats = None
    y = ops.batch_normalization(
        xf, mean, variance, axis=channel_axis, offset=params["beta"], scale=params["gamma"],
        epsilon=epsilon,
    )
    return ops.cast(y, out_dtype), new_stats


def _fused_bn(data_format, synchronized, dtype="float32"):
    """Whether training BN + ReLU of a `dtype` tensor runs as TensorFlow's fused kernel
    (`tf_kernels.batch_norm_relu`; float32 statistics, so not for float64)."""
    if keras.backend.backend() != "tensorflow":
        return False
    from keras_preact.layers import tf_kernels

    tf_kernels.warn_if_onednn_off()  # asked once a training trace: the kernels are chosen now
    if synchronized or data_format != "channels_last" or dtype == "float64":
        return False
    return tf_kernels.bn_enabled()


def _fast_batch_norm_relu(x, params, *, momentum, epsilon):
    """`batch_norm` (training) + ReLU through `tf_kernels.batch_norm_relu`: the same
    values to float32 rounding, in fewer passes over the tensor."""
    from keras_preact.layers import tf_kernels

    out_dtype = x.dtype
    y, mean, variance = tf_kernels.batch_norm_relu(
        ops.cast(x, "float32"), ops.cast(params["gamma"], "float32"),
        ops.cast(params["beta"], "float32"), epsilon,
    )
    new_stats = _moving_stats(params, mean, variance, momentum)
    # ReLU before the cast: the same values (a cast keeps signs and zeros).
    return ops.cast(y, out_dtype), new_stats


def _fast_conv_grad(kernel_shape, strides, data_format):
    """Whether the TensorFlow-only fast conv gradient applies (`tf_kernels`)."""
    if keras.backend.backend() != "tensorflow":
        return False
    from keras_preact.layers import tf_kernels

    return tf_kernels.enabled() and tf_kernels.supports(kernel_shape, strides, data_format)


def conv(x, kernel, strides, data_format):
    """A bias-free conv with Torch/Caffe-style symmetric padding.

    Keras' "same" padding pads only bottom/right when the input size is even, which
    shifts the sampling grid of a strided conv and would make converted weights
    compute something else. A strided 1x1 conv is "every s-th pixel, then a 1x1 conv":
    the same numbers with less work.
    """
    k = kernel.shape[0]
    if strides > 1 and k == 1:
        if data_format == "channels_last":
            x = x[:, ::strides, ::strides, :]
        else:
            x = x[:, :, ::strides, ::strides]
        strides = 1
    if _fast_conv_grad(kernel.shape, strides, data_format):
        from keras_preact.layers import tf_kernels

        return tf_kernels.conv2d(x, ops.cast(kernel, x.dtype))
    padding = "same"
    if strides > 1:
        p = (k - 1) // 2
        pad = [[0, 0], [p, p], [p, p], [0, 0]]
        if data_format == "channels_first":
            pad = [[0, 0], [0, 0], [p, p], [p, p]]
        x = ops.pad(x, pad)
        padding = "valid"
    return ops.conv(
        x, ops.cast(kernel, x.dtype), strides=strides, padding=padding, data_format=data_format
    )


def add_bias(x, bias, data_format):
    """Adds a per-channel bias, as Keras' Conv2D does."""
    bias = ops.cast(bias, x.dtype)
    if data_format == "channels_first":
        bias = ops.reshape(bias, (1, -1, 1, 1))
    return ops.add(x, bias)


def subsample(x, strides, data_format):
    """Every `strides`-th pixel from the first: the strided identity shortcut
    (keras.applications' ``MaxPooling2D(1, strides)``, "valid" padding)."""
    if strides == 1:
        return x
    if data_format == "channels_last":
        return x[:, ::strides, ::strides, :]
    return x[:, :, ::strides, ::strides]


def unit_forward(x, params, spec, *, training, momentum, epsilon, data_format, synchronized=False,
                 seed_generator=None, dropout_training=None):
    """One residual unit. The default is the full pre-activation unit:
    ``y = s(x) + F(x)``, nothing after the addition; `spec.unit` selects a variant
    (see `keras_preact.layers.variants`).

    Args:
        x: 4D input tensor.
        params: dict name -> tensor, with the names of `UnitSpec.variable_specs`.
        spec: a `UnitSpec`.
        training: bool, BatchNorm uses (and updates) batch statistics.
        seed_generator: a `keras.random.SeedGenerator` (``dropout_shortcut`` only).
        dropout_training: bool, whether the shortcut dropout is active; None: as
            `training`.

    Returns:
        (y, updates) where updates maps a BN name to its new moving statistics
        (empty when not training).
    """
    if spec.unit != "full_preact":
        return _variant_forward(
            x, params, spec, training=training, momentum=momentum, epsilon=epsilon,
            data_format=data_format, synchronized=synchronized, seed_generator=seed_generator,
            dropout_training=training if dropout_training is None else dropout_training,
        )
    channel_axis = -1 if data_format == "channels_last" else 1
    updates = {}

    def bn_relu(t, name):
        bn_params = {f: params[f"{name}_{f}"] for f in BN_FIELDS}
        if training and _fused_bn(data_format, synchronized, keras.backend.standardize_dtype(t.dtype)):
            y, stats = _fast_batch_norm_relu(t, bn_params, momentum=momentum, epsilon=epsilon)
            updates[name] = stats
            return y
        y, stats = batch_norm(
            t, bn_params, training=training,
            momentum=momentum, epsilon=epsilon, channel_axis=channel_axis,
            synchronized=synchronized,
        )
        if stats is not None:
            updates[name] = stats
        return ops.relu(y)

    preact = bn_relu(x, "preact_bn")
    r = preact
    for i, (bn, (name, _, _, _, s)) in enumerate(zip(spec.bns, spec.convs)):
        if i:
            r = bn_relu(r, bn)
        r = conv(r, params[f"{name}_kernel"], s, data_format)
    if spec.conv_bias:
        r = add_bias(r, params[f"{spec.convs[-1][0]}_bias"], data_format)
    shortcut = preact if spec.shares_preact else x
    if spec.has_projection:
        shortcut = conv(shortcut, params["shortcut_kernel"], spec.strides, data_format)
        if spec.conv_bias:
            shortcut = add_bias(shortcut, params["shortcut_bias"], data_format)
    else:
        shortcut = subsample(shortcut, spec.strides, data_format)
    return ops.add(shortcut, r), updates


def _variant_forward(x, params, spec, *, training, momentum, epsilon, data_format, synchronized,
                     seed_generator, dropout_training):
    """Every unit but the default one, written as the paper's figures draw them."""
    channel_axis = -1 if data_format == "channels_last" else 1
    updates = {}
    unit = spec.unit
    opts = spec.options

    def bn(t, name):
        y, stats = batch_norm(
            t, {f: params[f"{name}_{f}"] for f in BN_FIELDS}, training=training,
            momentum=momentum, epsilon=epsilon, channel_axis=channel_axis,
            synchronized=synchronized,
        )
        if stats is not None:
            updates[name] = stats
        return y

    # Fig. 4d: a ReLU (no BN) before the first conv, shared with a projection.
    pre = ops.relu(x) if unit == "relu_only_preact" else x
    r = pre
    last = len(spec.convs) - 1
    for i, (bn_name, (name, _, _, _, s)) in enumerate(zip(spec.bns, spec.convs)):
        if i and unit == "relu_only_preact":
            r = ops.relu(r)
        r = conv(r, params[f"{name}_kernel"], s, data_format)
        if bn_name is not None:
            r = bn(r, bn_name)
        if i < last and unit != "relu_only_preact":
            r = ops.relu(r)
    shortcut = pre if (unit == "relu_only_preact" and spec.shares_preact) else x
    if spec.has_projection:
        shortcut = conv(shortcut, params["shortcut_kernel"], spec.strides, data_format)
        if unit not in PREACTIVATION_UNITS:
            # The 2015 projection shortcut is conv-BN (option B of fb.resnet.torch,
            # torchvision's `downsample`). Without the BN the growing scale of the
            # post-ReLU path would pass unnormalised into the next stage.
            shortcut = bn(shortcut, "shortcut_bn")
    else:
        shortcut = subsample(shortcut, spec.strides, data_format)

    if unit == "constant_scaling":
        shortcut = shortcut * opts["shortcut_scale"]
        r = r * opts["residual_scale"]
    elif unit in GATING_UNITS:
        # g(x) = sigmoid(W_g x + b_g), a 1x1 conv of the unit's input (Fig. 2c, 2d).
        gate = conv(x, params["gate_kernel"], spec.strides, data_format)
        bias = ops.cast(params["gate_bias"], gate.dtype)
        if data_format == "channels_first":
            bias = ops.reshape(bias, (1, -1, 1, 1))
        gate = ops.sigmoid(gate + bias)
        shortcut = (1.0 - gate) * shortcut
        if unit == "exclusive_gating":
            r = gate * r
    elif unit == "dropout_shortcut":
        # The paper reads dropout as a scale whose expectation is 1 - rate (Section
        # 3.1), i.e. classic dropout: a 0/1 mask in training and the expected scale
        # at inference. Keras' dropout is the inverted form (x / keep in training),
        # hence the factor.
        keep = 1.0 - opts["dropout_rate"]
        if dropout_training and opts["dropout_rate"] > 0:
            shortcut = keras_random.dropout(
                shortcut, opts["dropout_rate"], seed=seed_generator
            ) * keep
        else:
            shortcut = shortcut * keep
    elif unit == "relu_before_addition":
        r = ops.relu(r)

    y = ops.add(shortcut, r)
    if unit == "bn_after_addition":
        y = bn(y, "add_bn")
    if unit in POST_RELU_UNITS:
        y = ops.relu(y)
    return y, updates
