"""The JAX-only convolution (`keras_preact.layers.jax_kernels`) against the plain path:
the same outputs and gradients, and inside a looped stage only canonical convolutions in
XLA's compiled gradient (what keeps the loop on XLA:CPU's fast convolution)."""

import re

import keras
import numpy as np
import pytest

from keras_preact.layers import PreActStage

pytestmark = [pytest.mark.multibackend,
              pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX-only kernel")]


@pytest.mark.parametrize("data_format", ["channels_last", "channels_first"])
@pytest.mark.parametrize("kernel_size", [(1, 1), (3, 3), (5, 3)])
def test_conv2d_equals_the_plain_convolution_and_its_gradients(kernel_size, data_format):
    import jax

    from keras_preact.layers import jax_kernels

    rng = np.random.default_rng(kernel_size)
    last = data_format == "channels_last"
    x = rng.standard_normal((3, 9, 7, 4) if last else (3, 4, 9, 7)).astype("float32")
    kernel = rng.standard_normal(kernel_size + (4, 6)).astype("float32")
    weights = rng.standard_normal((3, 9, 7, 6) if last else (3, 6, 9, 7)).astype("float32")
    assert jax_kernels.applies(kernel.shape, 1, data_format)

    def plain(x, k, data_format):
        return keras.ops.conv(x, k, padding="same", data_format=data_format)

    def grads(conv):
        return jax.grad(lambda x, k: (conv(x, k, data_format) * weights).sum(), argnums=(0, 1))

    np.testing.assert_allclose(jax_kernels.conv2d(x, kernel, data_format),
                               plain(x, kernel, data_format), rtol=1e-5, atol=1e-5)
    for got, want in zip(grads(jax_kernels.conv2d)(x, kernel), grads(plain)(x, kernel)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_conv2d_applies_to_stride_1_and_odd_sides_only():
    from keras_preact.layers import jax_kernels

    assert not jax_kernels.applies((3, 3, 4, 4), 2, "channels_last")
    assert not jax_kernels.applies((3, 2, 4, 4), 1, "channels_last")
    assert not jax_kernels.applies((2, 3, 4, 4), 1, "channels_first")


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
