"""The JAX-only convolution (`keras_preact.layers.jax_kernels`) against the plain path:
the same outputs and gradients, and inside a looped stage only canonical convolutions in
XLA's compiled gradient (what keeps the loop on XLA:CPU's fast convolution)."""

import re

import numpy as np
import pytest

import keras

from keras_preact.layers import PreActStage

pytestmark = [pytest.mark.multibackend,
              pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX-only kernel")]


@pytest.mark.parametrize("kernel_size", [1, 3, 5])
def test_conv2d_equals_the_plain_convolution_and_its_gradients(kernel_size):
    import jax
    from jax import lax

    from keras_preact.layers import jax_kernels

    rng = np.random.default_rng(kernel_size)
    x = rng.standard_normal((3, 9, 7, 4)).astype("float32")
    kernel = rng.standard_normal((kernel_size, kernel_size, 4, 6)).astype("float32")
    weights = rng.standard_normal((3, 9, 7, 6)).astype("float32")

    def plain(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def loss(conv):
        return jax.grad(lambda x, k: (conv(x, k) * weights).sum(), argnums=(0, 1))

    np.testing.assert_allclose(jax_kernels.conv2d(x, kernel), plain(x, kernel), rtol=1e-5, atol=1e-5)
    for got, want in zip(loss(jax_kernels.conv2d)(x, kernel), loss(plain)(x, kernel)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _compiled_gradient_convolutions(stage, shape):
    import jax

    def loss(trainable, non_trainable, x):
        y, non_trainable = stage.stateless_call(trainable, non_trainable, x, training=True)
        return jax.numpy.sum(y * y), non_trainable

    values = [[v.value for v in vs] for vs in (stage.trainable_variables,
                                                stage.non_trainable_variables)]
    text = jax.jit(jax.grad(loss, has_aux=True)).lower(
        *values, np.zeros(shape, "float32")).compile().as_text()
    assert " while(" in text  # the stage is looped
    return re.findall(r"convolution\(.*?dim_labels=(\S+?),", text)


def test_a_looped_stage_gradient_runs_only_canonical_convolutions(monkeypatch):
    from keras_preact.layers import jax_kernels

    shape = (2, 6, 6, 8)
    stage = PreActStage("basic", 8, num_blocks=5)
    assert stage.plain_loop_min_units <= 4  # JAX loops every stage
    stage.build(shape)
    labels = _compiled_gradient_convolutions(stage, shape)
    assert labels and set(labels) == {"b01f_01io->b01f"}, labels
    # Autodiff's own gradient keeps transposed forms inside the loop.
    monkeypatch.setattr(jax_kernels, "applies", lambda *args: False)
    plain = PreActStage("basic", 8, num_blocks=5)
    plain.build(shape)
    assert set(_compiled_gradient_convolutions(plain, shape)) - {"b01f_01io->b01f"}
