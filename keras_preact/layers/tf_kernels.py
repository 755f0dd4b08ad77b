"""TensorFlow-only kernels for the training hot path (imported only on that backend).

Measured on 2 CPU cores (x86-64 with AVX2/FMA, TF 2.21, batch 128, channels_last).

**oneDNN.** TensorFlow enables its oneDNN kernels by default only on CPUs with AVX-512
or AMX features; on an AVX2 CPU it runs its Eigen kernels unless
`TF_ENABLE_ONEDNN_OPTS=1` is set before TensorFlow is imported (importing
`keras_preact` first sets that default; see the package docstring). With oneDNN,
TensorFlow's own convolution gradients are fast (16 channels at 32x32, forward +
backward: 18.0 ms, against 23.2 ms for `conv2d` below and 39.7 ms for Eigen's gradient).

**`conv2d`** (used only where oneDNN is off). Eigen's gradient of a stride-1
convolution brings forward + backward to 5-8x the forward pass. Both halves of that
gradient are themselves convolutions that the forward kernel runs much faster:

* the input gradient is the output gradient convolved with the kernel flipped in
  space and transposed in channels;
* the kernel gradient is a convolution of the padded input, with batch and channels
  swapped, by the output gradient; for a 1x1 kernel it is one matrix product.

`conv2d` uses those forms through `tf.custom_gradient`. The forward pass is
TensorFlow's own op, so outputs are bit-identical; the gradients are the same sums
in another order (equal to float32 rounding; a test compares both paths).
Set `KERAS_PREACT_FAST_CONV_GRAD=0` to use TensorFlow's registered gradient. With oneDNN
on, the transposes it needs cost more than they save, so it is not used.

**`batch_norm_relu`**: training-mode BatchNorm + ReLU as TensorFlow's fused kernel.
Differentiating Keras' arithmetic (`tf.nn.moments`, `tf.nn.batch_normalization`,
ReLU) materialises each mean's broadcast gradient with a full-size `Tile` and runs a
dozen elementwise passes. Forward + backward at 16 channels, 32x32: 10.8 ms -> 6.0 ms with
oneDNN (PyTorch: 8.3 ms), 16.1 ms -> 11.1 ms without. Outputs and statistics equal Keras'
to float32 rounding. Set `KERAS_PREACT_FUSED_BN=0` to use Keras' arithmetic.
"""

import os

import tensorflow as tf


def enabled():
    """Whether `conv2d` may be used: the environment switch (read at each trace), and
    only without oneDNN, whose own gradient is faster."""
    return os.environ.get("KERAS_PREACT_FAST_CONV_GRAD", "1") != "0" and not onednn_enabled()


def bn_enabled():
    """Whether `batch_norm_relu` may be used (the environment switch, read at each trace)."""
    return os.environ.get("KERAS_PREACT_FUSED_BN", "1") != "0"


def onednn_enabled():
    """Whether this TensorFlow process runs its oneDNN kernels (fixed at its import)."""
    from keras_preact import private_api

    try:
        return private_api.onednn_enabled()
    except (ImportError, AttributeError):  # a TensorFlow without the query
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "") in ("1", "true", "True")


_warned_onednn_off = False


def warn_if_onednn_off():
    """Warns once a process when a model trains on TensorFlow's Eigen CPU kernels because
    TensorFlow was imported before keras_preact could choose oneDNN (1.5-1.9x slower
    training on an AVX2 CPU). Silent when the user set `TF_ENABLE_ONEDNN_OPTS`
    either way, when oneDNN is on, and when a GPU is visible."""
    global _warned_onednn_off
    if _warned_onednn_off or "TF_ENABLE_ONEDNN_OPTS" in os.environ or onednn_enabled():
        return
    _warned_onednn_off = True
    if tf.config.list_physical_devices("GPU"):
        return
    import warnings

    warnings.warn(
        "TensorFlow's oneDNN CPU kernels are off in this process (TensorFlow turns them on "
        "by itself only on CPUs with AVX-512/AMX), so keras_preact models train on its "
        "slower Eigen kernels (1.5-1.9x slower training on an AVX2 CPU). Import keras_preact "
        "before keras or tensorflow, or set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is "
        "imported; TF_ENABLE_ONEDNN_OPTS=0 keeps the Eigen kernels and silences this.",
        UserWarning,
        stacklevel=2,
    )


def supports(kernel_shape, strides, data_format):
    """The fast gradient covers stride-1, odd-sized, "same"-padded NHWC convs."""
    kh, kw = kernel_shape[0], kernel_shape[1]
    return strides == 1 and data_format == "channels_last" and kh % 2 == 1 and kw % 2 == 1


@tf.custom_gradient
def conv2d(x, kernel):
    """A stride-1 "same" convolution (NHWC, odd kernel) with a faster gradient."""
    y = tf.nn.conv2d(x, kernel, 1, "SAME")

    def grad(dy):
        kh, kw, cin, cout = kernel.shape
        if kh == 1 and kw == 1:
            dx = tf.nn.conv2d(dy, tf.transpose(kernel, [0, 1, 3, 2]), 1, "SAME")
            dk = tf.matmul(tf.reshape(x, [-1, cin]), tf.reshape(dy, [-1, cout]), transpose_a=True)
            return dx, tf.reshape(dk, [1, 1, cin, cout])
        flipped = tf.transpose(tf.reverse(kernel, [0, 1]), [0, 1, 3, 2])
        dx = tf.nn.conv2d(dy, flipped, 1, "SAME")
        ph, pw = (kh - 1) // 2, (kw - 1) // 2
        xp = tf.pad(x, [[0, 0], [ph, ph], [pw, pw], [0, 0]])
        # [cin, H + kh - 1, W + kw - 1, N] "images" by [H, W, N, cout] "kernels":
        # out[c, i, j, o] = sum_{n, h, w} x[n, h + i, w + j, c] * dy[n, h, w, o].
        dk = tf.nn.conv2d(tf.transpose(xp, [3, 1, 2, 0]), tf.transpose(dy, [1, 2, 0, 3]), 1, "VALID")
        return dx, tf.transpose(dk, [1, 2, 0, 3])

    return y, grad


def batch_norm_relu(x, gamma, beta, epsilon):
    """``relu(batch_norm(x))`` with batch statistics (training), channels last.

    TensorFlow's fused kernel (`FusedBatchNormV3`), which Grappler fuses with the ReLU
    (`_FusedBatchNormEx`) and differentiates with `FusedBatchNormGradV3`.

    Args:
        x: float32 tensor, channels last.
        gamma, beta: float32 vectors of the channel count.
        epsilon: float added to the variance.

    Returns:
        (y, mean, variance): the activation and the batch statistics. The variance is
        the biased one that Keras' BatchNormalization averages (the kernel returns
        the Bessel-corrected one, rescaled here by (n - 1) / n).
    """
    empty = tf.zeros([0], x.dtype)
    # The raw op: `tf.compat.v1.nn.fused_batch_norm` would raise epsilon to 1.001e-5.
    y, mean, variance = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=epsilon,
        exponential_avg_factor=1.0, data_format="NHWC", is_training=True,
    )[:3]
    n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), variance.dtype)
    variance = tf.where(n > 1.0, variance * ((n - 1.0) / n), tf.zeros_like(variance))
    return tf.nn.relu(y), tf.stop_gradient(mean), tf.stop_gradient(variance)
