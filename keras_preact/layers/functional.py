"""The unit equations as functions of tensors, shared by the unit and stage layers.

Keeping the arithmetic in one place means a stage of stacked units and a chain of
single-unit layers compute exactly the same thing (a test checks it).
"""

import math

from keras import ops

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
        shares_preact: bool, the shortcut takes the pre-activated input.
    """

    def __init__(self, block, in_channels, filters, strides, expansion, bottleneck_stride,
                 has_projection, shares_preact):
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

    def variable_specs(self):
        """(name, shape, kind) of every variable, in the frozen creation order.

        kind is "kernel" or one of `BN_FIELDS`.
        """
        specs = []
        for bn, channels, (conv, k, cin, cout, _) in zip(self.bns, self.bn_channels, self.convs):
            for field in BN_FIELDS:
                specs.append((f"{bn}_{field}", (channels,), field))
            specs.append((f"{conv}_kernel", (k, k, cin, cout), "kernel"))
        if self.has_projection:
            specs.append(("shortcut_kernel", (1, 1, self.in_channels, self.filters), "kernel"))
        return specs

    def macs(self, height, width):
        """Multiply-adds of the convs for one example of spatial size (height, width)."""
        total = 0
        h, w = height, width
        for _, k, cin, cout, s in self.convs:
            h, w = math.ceil(h / s), math.ceil(w / s)
            total += h * w * k * k * cin * cout
        if self.has_projection:
            total += math.ceil(height / self.strides) * math.ceil(width / self.strides) * (
                self.in_channels * self.filters
            )
        return int(total)


def batch_norm(x, params, *, training, momentum, epsilon, channel_axis, synchronized=False):
    """Batch normalisation with Keras' arithmetic (float32 statistics).

    Args:
        x: 4D tensor.
        params: dict with `BN_FIELDS` tensors.
        training: bool; batch statistics are used (and returned) when True.

    Returns:
        (y, (new_moving_mean, new_moving_variance) or None).
    """
    out_dtype = x.dtype
    xf = ops.cast(x, "float32")
    if training:
        axes = [a for a in range(4) if a != channel_axis % 4]
        if synchronized:
            mean, variance = ops.moments(xf, axes, synchronized=True)
        else:
            mean, variance = ops.moments(xf, axes)
        new_stats = (
            params["moving_mean"] * momentum + mean * (1.0 - momentum),
            params["moving_variance"] * momentum + variance * (1.0 - momentum),
        )
    else:
        mean, variance = params["moving_mean"], params["moving_variance"]
        new_stats = None
    y = ops.batch_normalization(
        xf, mean, variance, axis=channel_axis, offset=params["beta"], scale=params["gamma"],
        epsilon=epsilon,
    )
    return ops.cast(y, out_dtype), new_stats


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


def unit_forward(x, params, spec, *, training, momentum, epsilon, data_format, synchronized=False):
    """One full pre-activation unit: ``y = s(x) + F(x)``, nothing after the addition.

    Args:
        x: 4D input tensor.
        params: dict name -> tensor, with the names of `UnitSpec.variable_specs`.
        spec: a `UnitSpec`.
        training: bool.

    Returns:
        (y, updates) where updates maps a BN name to its new moving statistics
        (empty when not training).
    """
    channel_axis = -1 if data_format == "channels_last" else 1
    updates = {}

    def bn_relu(t, name):
        y, stats = batch_norm(
            t, {f: params[f"{name}_{f}"] for f in BN_FIELDS}, training=training,
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
    shortcut = preact if spec.shares_preact else x
    if spec.has_projection:
        shortcut = conv(shortcut, params["shortcut_kernel"], spec.strides, data_format)
    return ops.add(shortcut, r), updates
