"""The TensorFlow fast conv gradient (`keras_preact.layers.tf_kernels`) against
TensorFlow's own: identical outputs, gradients equal to float32 rounding."""


import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow-only kernels"
)


def _conv_grads(x, k, fast, monkeypatch):
    import tensorflow as tf

    from keras_preact.layers import functional as F

    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "1" if fast else "0")
    x = tf.constant(x)
    k = tf.constant(k)

    @tf.function
    def step(x, k):
        with tf.GradientTape() as tape:
            tape.watch([x, k])
            y = F.conv(x, k, 1, "channels_last")
            loss = tf.reduce_sum(y * tf.sin(y))
        return y, tape.gradient(loss, [x, k])

    y, (dx, dk) = step(x, k)
    return y.numpy(), dx.numpy(), dk.numpy()


@pytest.mark.parametrize("ksize,cin,cout,size", [(3, 4, 6, 7), (3, 8, 8, 8), (1, 6, 10, 5), (5, 3, 4, 9)])
def test_fast_conv_gradient_matches_tensorflow(ksize, cin, cout, size, monkeypatch):
    rng = np.random.RandomState(ksize + cin)
    x = rng.randn(3, size, size, cin).astype("float32")
    k = (rng.randn(ksize, ksize, cin, cout) * 0.3).astype("float32")
    ref = _conv_grads(x, k, False, monkeypatch)
    got = _conv_grads(x, k, True, monkeypatch)
    np.testing.assert_array_equal(got[0], ref[0])  # the forward op is TensorFlow's own
    for a, b in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_fast_path_is_taken_and_can_be_switched_off(monkeypatch):
    from keras_preact.layers import functional as F

    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "1")
    assert F._fast_conv_grad((3, 3, 4, 4), 1, "channels_last")
    assert not F._fast_conv_grad((3, 3, 4, 4), 2, "channels_last")  # strided: TF's gradient
    assert not F._fast_conv_grad((3, 3, 4, 4), 1, "channels_first")
    assert not F._fast_conv_grad((2, 2, 4, 4), 1, "channels_last")  # even kernel
    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "0")
    assert not F._fast_conv_grad((3, 3, 4, 4), 1, "channels_last")


@pytest.mark.parametrize("name", ["preact_resnet20", "preact_resnet164"])
def test_model_outputs_and_one_step_gradients_equal_the_unoptimised_path(name, monkeypatch):
    import tensorflow as tf

    import keras_preact as kp

    keras.utils.set_random_seed(1)
    model = kp.get_model(name, input_shape=(16, 16, 3), classifier_activation=None)
    weights = model.get_weights()
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    y = rng.randint(0, 10, (4,))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    results = []
    for flag in ("0", "1"):
        monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", flag)
        model.set_weights(weights)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = loss_fn(y, out)
            return out, tape.gradient(loss, model.trainable_variables)

        out, grads = step(x, y)
        results.append((out.numpy(), [g.numpy() for g in grads],
                        [v.numpy() for v in model.non_trainable_variables]))
    (out0, g0, s0), (out1, g1, s1) = results
    np.testing.assert_array_equal(out1, out0)
    np.testing.assert_array_equal(np.concatenate([s.ravel() for s in s1]),
                                  np.concatenate([s.ravel() for s in s0]))
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(np.abs(b).max(), 1e-6))
