"""A JAX-only kernel for the training hot path, picked by `unit_ops.conv`;
tests/test_jax_kernels.py checks it equals the plain path.

`conv2d`: a stride-1 convolution whose gradients are written as canonical convolutions (batch
first, features last); used on XLA:CPU only (GPUs have their own convolution libraries), and
reverse-mode only (`jax.custom_vjp`: no `jax.jvp` through it). Inside a `lax.scan` (the looped
stages) XLA:CPU keeps the autodiff gradients' transposed forms (the filter gradient as
``f01b_i01o->01bf``) and runs them on a naive loop, not its fast convolution. Outside a loop XLA
rewrites them to these same forms itself: there the gradients agree to float32 rounding."""

import functools

import jax
from jax import lax

_DIMS = {"channels_last": ("NHWC", "HWIO", "NHWC"), "channels_first": ("NCHW", "HWIO", "NCHW")}
#: Axes that bring an input to (channels, height, width, batch) and a gradient to
#: (height, width, batch, channels), per data format.
_TO_CHWB = {"channels_last": ((3, 1, 2, 0), (1, 2, 0, 3)),
            "channels_first": ((1, 2, 3, 0), (2, 3, 0, 1))}


def applies(kernel_shape, strides, data_format):
    """Stride 1, odd kernel sides (symmetric "same" padding), on a CPU."""
    return (strides == 1 and kernel_shape[0] % 2 == 1 and kernel_shape[1] % 2 == 1
            and jax.default_backend() == "cpu")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def conv2d(x, kernel, data_format="channels_last"):
    """``ops.conv(x, kernel, padding="same", data_format=data_format)``, HWIO `kernel`."""
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME",
                                    dimension_numbers=_DIMS[data_format])


def _forward(x, kernel, data_format):
    return conv2d(x, kernel, data_format), (x, kernel)


def _backward(data_format, residuals, dy):
    x, kernel = residuals
    # The input's gradient: dy through the spatially flipped kernel, in and out swapped.
    dx = conv2d(dy, kernel[::-1, ::-1].transpose(0, 1, 3, 2), data_format)
    # The kernel's: x's channels as the batch and its batch as the features, so that the
    # result (in, kh, kw, out) is a canonical convolution's output.
    to_x, to_dy = _TO_CHWB[data_format]
    pad = [((k - 1) // 2, (k - 1) // 2) for k in kernel.shape[:2]]
    dk = lax.conv_general_dilated(x.transpose(to_x), dy.transpose(to_dy), (1, 1), pad,
                                  dimension_numbers=_DIMS["channels_last"])
    return dx, dk.transpose(1, 2, 0, 3)


conv2d.defvjp(_forward, _backward)
