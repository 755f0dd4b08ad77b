"""The residual unit as a function of tensors (`unit_forward`), which the unit and
stage layers run on their variables. `conv` and `bn_relu` pick TensorFlow's faster
kernels (`tf_kernels`) and `conv` JAX's (`jax_kernels`), which give the same values."""

import math

import keras
from keras import ops
from keras import random as keras_random

from keras_preact.layers.variants import get_unit

BN_FIELDS = ("gamma", "beta", "moving_mean", "moving_variance")


class UnitSpec:
    """Static description of one unit: its convs, BNs, shortcut and variables. Without
    `has_projection` a strided unit subsamples its identity; `options` are the unit's
    resolved parameters."""

    def __init__(self, block, in_channels, filters, strides, expansion, bottleneck_stride,
                 has_projection, shared_preact, *, unit="full_preact", options=None,
                 conv_bias=False):
        self.unit, self.variant = unit, get_unit(unit)
        self.options = dict(options or {})
        self.block, self.in_channels, self.filters = block, in_channels, filters
        self.strides = strides
        self.has_projection, self.shared_preact = has_projection, shared_preact
        self.conv_bias = bool(conv_bias)
        if block == "basic":  # (name, kernel size, in, out, stride)
            self.convs = (("conv1", 3, in_channels, filters, strides),
                          ("conv2", 3, filters, filters, 1))
        else:
            width = filters // expansion
            s1, s2 = (strides, 1) if bottleneck_stride == "first" else (1, strides)
            self.convs = (("conv1", 1, in_channels, width, s1), ("conv2", 3, width, width, s2),
                          ("conv3", 1, width, filters, 1))
        n = len(self.convs)
        if self.variant.bn_before_conv:  # "preact_bn" (shared with the shortcut), bn2, bn3
            self.bns = ("preact_bn",) + tuple(f"bn{i}" for i in range(2, n + 1))
            self.bn_channels = tuple(c[2] for c in self.convs)
        else:  # "bn{i}" after conv{i}; Fig. 4b moves the last one after the addition
            self.bns = tuple(None if self.variant.bn_after_addition and i == n else f"bn{i}"
                             for i in range(1, n + 1))
            self.bn_channels = tuple(c[3] for c in self.convs)

    def variable_specs(self):
        """(name, shape, kind) of every variable, kind "kernel", "bias", "gate_bias" or
        one of `BN_FIELDS`, in an order frozen because weights files match by it: each
        BN and conv as they run, the last conv's bias, the projection (its bias or BN),
        then "add_bn" (Fig. 4b) or the gate's "gate_kernel" and "gate_bias"."""
        v, specs = self.variant, []

        def bn(name, channels):
            return [(f"{name}_{field}", (channels,), field) for field in BN_FIELDS]

        for bn_name, channels, (conv, k, cin, cout, _) in zip(self.bns, self.bn_channels,
                                                                self.convs):
            kernel = [(f"{conv}_kernel", (k, k, cin, cout), "kernel")]
            norm = bn(bn_name, channels) if bn_name else []
            specs += norm + kernel if v.bn_before_conv else kernel + norm
        if self.conv_bias:
            specs.append((f"{self.convs[-1][0]}_bias", (self.filters,), "bias"))
        one_by_one = (1, 1, self.in_channels, self.filters)
        if self.has_projection:
            specs.append(("shortcut_kernel", one_by_one, "kernel"))
            if self.conv_bias:
                specs.append(("shortcut_bias", (self.filters,), "bias"))
            if v.projection_bn:
                specs += bn("shortcut_bn", self.filters)
        if v.bn_after_addition:
            specs += bn("add_bn", self.filters)
        if v.gated:
            specs += [("gate_kernel", one_by_one, "kernel"),
                      ("gate_bias", (self.filters,), "gate_bias")]
        return specs

    def macs(self, height, width):
        """Multiply-adds of the convs for one example."""
        total, h, w = 0, height, width
        for _, k, cin, cout, s in self.convs:
            h, w = math.ceil(h / s), math.ceil(w / s)
            total += h * w * k * k * cin * cout
        one_by_one = (math.ceil(height / self.strides) * math.ceil(width / self.strides)
                      * self.in_channels * self.filters)
        return int(total + one_by_one * (self.has_projection + self.variant.gated))


def _moving_stats(params, mean, variance, momentum):
    return (params["moving_mean"] * momentum + mean * (1.0 - momentum),
            params["moving_variance"] * momentum + variance * (1.0 - momentum))


def batch_norm(x, params, *, training, momentum, epsilon, channel_axis, synchronized=False):
    """Batch normalisation with Keras' arithmetic (statistics in float32, or float64
    for float64 inputs); returns (y, new moving (mean, variance) or None)."""
    is_float64 = keras.backend.standardize_dtype(x.dtype) == "float64"
    xf = ops.cast(x, "float64" if is_float64 else "float32")
    if training:
        axes = [a for a in range(4) if a != channel_axis % 4]
        mean, variance = ops.moments(xf, axes, synchronized=synchronized)
        new_stats = _moving_stats(params, mean, variance, momentum)
    else:
        mean, variance, new_stats = params["moving_mean"], params["moving_variance"], None
    y = ops.batch_normalization(xf, mean, variance, axis=channel_axis, offset=params["beta"],
                                scale=params["gamma"], epsilon=epsilon)
    return ops.cast(y, x.dtype), new_stats


def _tf_kernels():
    if keras.backend.backend() == "tensorflow":
        from keras_preact.layers import tf_kernels
        return tf_kernels


def bn_relu(x, params, *, training, momentum, epsilon, data_format, synchronized=False):
    """``relu(batch_norm(x))``, TensorFlow's fused kernel where it applies."""
    kernels = _tf_kernels() if training else None
    dtype = keras.backend.standardize_dtype(x.dtype)
    if kernels is not None and kernels.fused_bn_applies(data_format, synchronized, dtype):
        y, mean, variance = kernels.batch_norm_relu(  # bfloat16 in and out: no casts
            x if dtype == "bfloat16" else ops.cast(x, "float32"),
            ops.cast(params["gamma"], "float32"), ops.cast(params["beta"], "float32"), epsilon)
        return ops.cast(y, x.dtype), _moving_stats(params, mean, variance, momentum)
    y, stats = batch_norm(x, params, training=training, momentum=momentum, epsilon=epsilon,
                          channel_axis=-1 if data_format == "channels_last" else 1,
                          synchronized=synchronized)
    return ops.relu(y), stats


def conv(x, kernel, strides, data_format):
    """A bias-free conv with Torch's symmetric padding (Keras' "same" pads only
    bottom/right of an even input, which shifts a strided conv's grid). A strided 1x1
    conv is "every s-th pixel, then a 1x1 conv": the same numbers, less work."""
    k = kernel.shape[0]
    if strides > 1 and k == 1:
        x, strides = subsample(x, strides, data_format), 1
    kernels = _tf_kernels()
    if kernels is not None and kernels.fast_conv_applies(kernel.shape, strides, data_format):
        return kernels.conv2d(x, ops.cast(kernel, x.dtype))
    if keras.backend.backend() == "jax":
        from keras_preact.layers import jax_kernels
        if jax_kernels.applies(kernel.shape, strides, data_format):
            return jax_kernels.conv2d(x, ops.cast(kernel, x.dtype), data_format)
    if strides > 1:
        p = [[(k - 1) // 2] * 2] * 2
        x = ops.pad(x, [[0, 0]] + p + [[0, 0]] if data_format == "channels_last"
                    else [[0, 0]] * 2 + p)
    return ops.conv(x, ops.cast(kernel, x.dtype), strides=strides,
                    padding="valid" if strides > 1 else "same", data_format=data_format)


def add_bias(x, bias, data_format):
    bias = ops.cast(bias, x.dtype)
    return ops.add(x, bias if data_format == "channels_last" else ops.reshape(bias, (1, -1, 1, 1)))


def subsample(x, strides, data_format):
    """The strided identity shortcut (keras.applications' ``MaxPooling2D(1, strides)``)."""
    if strides == 1:  # no slice op in the graph: every identity unit calls this
        return x
    s = slice(None, None, strides)
    return x[:, s, s, :] if data_format == "channels_last" else x[:, :, s, s]


def unit_forward(x, params, spec, *, training, momentum, epsilon, data_format, synchronized=False,
                 seed_generator=None, dropout_training=None, drop_path=0.0):
    """One residual unit, ``y = f(h(x) + F(x))`` (He et al. 2016, arXiv:1603.05027, Eqs. 1-2).

    The default (Fig. 4e, Eq. 3) is ``y = h(x) + F(x)`` with F = (BN-ReLU-conv) x 2
    (basic) or x 3 (bottleneck); `spec.variant` (a `variants.Unit`) selects the other
    placements of Fig. 4 and the shortcuts of Fig. 2. `params` are named as in
    `UnitSpec.variable_specs`; `seed_generator` and `dropout_training` (None:
    `training`) drive the shortcut dropout of Fig. 2f and stochastic depth: F dropped for
    each example with probability `drop_path`, else divided by ``1 - drop_path`` (Huang et
    al. 2016, arXiv:1603.09382, per example as timm's DropPath).
    Returns (y, updates): BN name -> new moving statistics."""
    v, fmt, updates = spec.variant, data_format, {}
    bn_args = dict(training=training, momentum=momentum, epsilon=epsilon,
                   synchronized=synchronized)

    def bn(t, name, relu=False):
        bn_params = {f: params[f"{name}_{f}"] for f in BN_FIELDS}
        if relu:
            t, stats = bn_relu(t, bn_params, data_format=fmt, **bn_args)
        else:
            t, stats = batch_norm(t, bn_params, channel_axis=-1 if fmt == "channels_last" else 1,
                                  **bn_args)
        if stats is not None:
            updates[name] = stats
        return t

    # F(x), Fig. 4: the activation before each conv (4d, 4e) or after it (4a-c).
    pre = (bn(x, "preact_bn", relu=True) if v.bn_before_conv
           else ops.relu(x) if v.preactivation else x)
    r = pre
    for i, (bn_name, (name, _, _, _, s)) in enumerate(zip(spec.bns, spec.convs)):
        if i and v.preactivation:
            r = bn(r, bn_name, relu=True) if v.bn_before_conv else ops.relu(r)
        r = conv(r, params[f"{name}_kernel"], s, fmt)
        if bn_name is not None and not v.bn_before_conv:
            r = bn(r, bn_name)
        if i < len(spec.convs) - 1 and not v.preactivation:
            r = ops.relu(r)
    if spec.conv_bias:
        r = add_bias(r, params[f"{spec.convs[-1][0]}_bias"], fmt)
    # h(x): identity, or a 1x1 projection where the shape changes.
    h = pre if spec.shared_preact else x
    if spec.has_projection:
        h = conv(h, params["shortcut_kernel"], spec.strides, fmt)
        if spec.conv_bias:
            h = add_bias(h, params["shortcut_bias"], fmt)
        if v.projection_bn:  # conv-BN, the 2015 projection (fb.resnet.torch option B)
            h = bn(h, "shortcut_bn")
    else:
        h = subsample(h, spec.strides, fmt)
    dropout_training = training if dropout_training is None else dropout_training
    h, r = _mix(v, h, r, x, params, spec, fmt, seed_generator, dropout_training)
    if drop_path and dropout_training:
        r = keras_random.dropout(r, drop_path, noise_shape=(None, 1, 1, 1), seed=seed_generator)
    y = ops.add(h, r)
    if v.bn_after_addition:
        y = bn(y, "add_bn")
    return (ops.relu(y) if v.relu_after_addition else y), updates


def _mix(v, h, r, x, params, spec, fmt, seed_generator, dropout_training):
    """The shortcuts of Fig. 2 (b-d, f) and Fig. 4c's ReLU on F."""
    opts = spec.options
    if v.shortcut == "scaling":
        return h * opts["shortcut_scale"], r * opts["residual_scale"]
    if v.gated:  # g(x) = sigmoid(conv1x1(x) + b_g)
        g = ops.sigmoid(add_bias(conv(x, params["gate_kernel"], spec.strides, fmt),
                                 params["gate_bias"], fmt))
        return (1.0 - g) * h, (g * r if v.shortcut == "exclusive_gate" else r)
    if v.shortcut == "dropout":
        # Classic dropout as the paper reads it (Section 3.1): a 0/1 mask in training,
        # the expected scale 1 - rate at inference; Keras' inverted form divides by it.
        rate = opts["dropout_rate"]
        if dropout_training and rate > 0:
            h = keras_random.dropout(h, rate, seed=seed_generator)
        return h * (1.0 - rate), r
    return h, (ops.relu(r) if v.relu_before_addition else r)
