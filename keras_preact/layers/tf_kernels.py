"""TensorFlow-only kernels for the training hot path, picked by `unit_ops.conv` and
`unit_ops.bn_relu`; tests/test_tf_kernels.py checks they equal the plain path, and
`benchmarks/` times them (docs/performance.md).

- oneDNN: TensorFlow enables it by itself only with AVX-512/AMX; importing `keras_preact`
  first sets `TF_ENABLE_ONEDNN_OPTS=1` by default.
- `conv2d` (oneDNN off only; `KERAS_PREACT_FAST_CONV_GRAD=0` disables): Eigen's stride-1
  conv gradient as two forward convs (a matmul for 1x1); forward bit-identical,
  gradients equal to float32 rounding.
- `batch_norm_relu` (`KERAS_PREACT_FUSED_BN=0` disables): training BN + ReLU as the fused
  kernel instead of Keras' moments arithmetic."""

import os

import tensorflow as tf

from keras_preact.checks import env_flag


def enabled():
    """The environment switch (read at each trace); off with oneDNN, whose gradient is faster."""
    return env_flag("KERAS_PREACT_FAST_CONV_GRAD", True) and not onednn_enabled()


def bn_enabled():
    return env_flag("KERAS_PREACT_FUSED_BN", True)


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN kernels (fixed at its import)."""
    from keras_preact import private_api
    try:
        return private_api.onednn_enabled()
    except (ImportError, AttributeError):  # a TensorFlow without the query
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "") in ("1", "true", "True")


_warned_onednn_off = False


def warn_if_onednn_off():
    """Warns once when training runs on the Eigen CPU kernels because TensorFlow was
    imported before keras_preact could choose oneDNN; silent when the user set
    `TF_ENABLE_ONEDNN_OPTS` or a GPU is visible."""
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
        "slower Eigen kernels (see docs/performance.md). Import keras_preact "
        "before keras or tensorflow, or set TF_ENABLE_ONEDNN_OPTS=1 before TensorFlow is "
        "imported; TF_ENABLE_ONEDNN_OPTS=0 keeps the Eigen kernels and silences this.",
        UserWarning, stacklevel=2)


def fast_conv_applies(kernel_shape, strides, data_format):
    odd = kernel_shape[0] % 2 == 1 and kernel_shape[1] % 2 == 1
    return enabled() and strides == 1 and data_format == "channels_last" and odd


def fused_bn_applies(data_format, synchronized, dtype="float32"):
    """Whether training BN + ReLU runs as `batch_norm_relu` (float32 statistics: not
    float64). Warns here when oneDNN is off, as the kernels are chosen at this trace."""
    warn_if_onednn_off()
    plain = not synchronized and data_format == "channels_last" and dtype != "float64"
    return plain and bn_enabled()


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
        dk = tf.nn.conv2d(tf.transpose(xp, [3, 1, 2, 0]), tf.transpose(dy, [1, 2, 0, 3]), 1,
                          "VALID")
        return dx, tf.transpose(dk, [1, 2, 0, 3])

    return y, grad


def batch_norm_relu(x, gamma, beta, epsilon):
    """Training ``relu(batch_norm(x))`` of float32 or bfloat16 NHWC `x` (statistics in
    float32, the dtype of `gamma`) as `FusedBatchNormV3`, which
    Grappler fuses with the ReLU (`_FusedBatchNormEx`). Returns (y, mean, variance), the
    variance the biased one Keras' BN averages (the kernel's Bessel-corrected one rescaled
    by (n - 1) / n)."""
    empty = tf.zeros([0], gamma.dtype)
    # The raw op: `tf.compat.v1.nn.fused_batch_norm` would raise epsilon to 1.001e-5.
    y, mean, variance = tf.raw_ops.FusedBatchNormV3(
        x=x, scale=gamma, offset=beta, mean=empty, variance=empty, epsilon=epsilon,
        exponential_avg_factor=1.0, data_format="NHWC", is_training=True)[:3]
    n = tf.cast(tf.reduce_prod(tf.shape(x)[:-1]), variance.dtype)
    variance = tf.where(n > 1.0, variance * ((n - 1.0) / n), tf.zeros_like(variance))
    return tf.nn.relu(y), tf.stop_gradient(mean), tf.stop_gradient(variance)
