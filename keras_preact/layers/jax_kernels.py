"""A JAX-only kernel for the training hot path, picked by `functional.conv`;
tests/test_jax_kernels.py checks it equals the plain path.

`conv2d`: a stride-1 NHWC convolution whose gradients are written as canonical
convolutions (batch first, features last). Inside a `lax.scan` (the looped stages) XLA:CPU
keeps the autodiff gradients' transposed forms (the filter gradient as
``f01b_i01o->01bf``) and runs them on a naive loop, not its fast convolution: a looped
stage trained many times slower than an unrolled one. Outside a loop XLA rewrites them to
these same forms itself: there the gradients agree to float32 rounding and the speed
is unchanged."""

import jax
from jax import lax

_DIMS = ("NHWC", "HWIO", "NHWC")


def applies(kernel_shape, strides, data_format):
    """Stride 1, NHWC and an odd kernel (symmetric "same" padding)."""
    return strides == 1 and data_format == "channels_last" and kernel_shape[0] % 2 == 1


@jax.custom_vjp
def conv2d(x, kernel):
    """``ops.conv(x, kernel, padding="same")`` for NHWC `x` and an HWIO `kernel`."""
    return lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=_DIMS)


def _forward(x, kernel):
    return conv2d(x, kernel), (x, kernel)


def _backward(residuals, dy):
    x, kernel = residuals
    # The input's gradient: dy through the spatially flipped kernel, in and out swapped.
    dx = conv2d(dy, kernel[::-1, ::-1].transpose(0, 1, 3, 2))
    # The kernel's: x's channels as the batch and its batch as the features, so that the
    # result (in, kh, kw, out) is a canonical convolution's output.
    pad = [((k - 1) // 2, (k - 1) // 2) for k in kernel.shape[:2]]
    dk = lax.conv_general_dilated(x.transpose(3, 1, 2, 0), dy.transpose(1, 2, 0, 3), (1, 1), pad,
                                  dimension_numbers=_DIMS)
    return dx, dk.transpose(1, 2, 0, 3)


conv2d.defvjp(_forward, _backward)
