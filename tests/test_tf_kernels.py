"""The TensorFlow-only kernels (`keras_preact.layers.tf_kernels`) against the plain
path: the fast conv gradient against TensorFlow's own (identical outputs, gradients
equal to float32 rounding), the fused BatchNorm + ReLU against Keras' arithmetic, and a
whole model with both against neither."""


import keras
import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="TensorFlow-only kernels"
)


def _conv_grads(x, k, fast):
    import tensorflow as tf

    from keras_preact.layers import tf_kernels

    x = tf.constant(x)
    k = tf.constant(k)
    conv = tf_kernels.conv2d if fast else (lambda x, k: tf.nn.conv2d(x, k, 1, "SAME"))

    @tf.function
    def step(x, k):
        with tf.GradientTape() as tape:
            tape.watch([x, k])
            y = conv(x, k)
            loss = tf.reduce_sum(y * tf.sin(y))
        return y, tape.gradient(loss, [x, k])

    y, (dx, dk) = step(x, k)
    return y.numpy(), dx.numpy(), dk.numpy()


@pytest.mark.parametrize("ksize,cin,cout,size",
                         [(3, 4, 6, 7), (3, 8, 8, 8), (1, 6, 10, 5), (5, 3, 4, 9)])
def test_fast_conv_gradient_matches_tensorflow(ksize, cin, cout, size):
    rng = np.random.RandomState(ksize + cin)
    x = rng.randn(3, size, size, cin).astype("float32")
    k = (rng.randn(ksize, ksize, cin, cout) * 0.3).astype("float32")
    ref = _conv_grads(x, k, False)
    got = _conv_grads(x, k, True)
    np.testing.assert_array_equal(got[0], ref[0])  # the forward op is TensorFlow's own
    for a, b in zip(got[1:], ref[1:]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


@pytest.fixture(autouse=True)
def _fused_bn_on(monkeypatch):
    """The fused BN path is on (the default) unless a test switches it off."""
    monkeypatch.setenv("KERAS_PREACT_FUSED_BN", "1")


def test_fast_path_is_taken_and_can_be_switched_off(monkeypatch):
    from keras_preact.layers import tf_kernels

    monkeypatch.setattr(tf_kernels, "onednn_enabled", lambda: False)
    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "1")
    assert tf_kernels.fast_conv_applies((3, 3, 4, 4), 1, "channels_last")
    # strided: TF's gradient
    assert not tf_kernels.fast_conv_applies((3, 3, 4, 4), 2, "channels_last")
    assert not tf_kernels.fast_conv_applies((3, 3, 4, 4), 1, "channels_first")
    assert not tf_kernels.fast_conv_applies((2, 2, 4, 4), 1, "channels_last")  # even kernel
    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "0")
    assert not tf_kernels.fast_conv_applies((3, 3, 4, 4), 1, "channels_last")
    # oneDNN's own conv gradient is faster than the custom one: not used then.
    monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", "1")
    monkeypatch.setattr(tf_kernels, "onednn_enabled", lambda: True)
    assert not tf_kernels.fast_conv_applies((3, 3, 4, 4), 1, "channels_last")


def test_fused_bn_is_taken_and_can_be_switched_off(monkeypatch):
    from keras_preact.layers import tf_kernels

    monkeypatch.setenv("KERAS_PREACT_FUSED_BN", "1")
    assert tf_kernels.fused_bn_applies("channels_last", False)
    # synchronized: Keras' cross-replica moments
    assert not tf_kernels.fused_bn_applies("channels_last", True)
    assert not tf_kernels.fused_bn_applies("channels_first", False)
    # the kernel is float32
    assert not tf_kernels.fused_bn_applies("channels_last", False, "float64")
    monkeypatch.setenv("KERAS_PREACT_FUSED_BN", "0")
    assert not tf_kernels.fused_bn_applies("channels_last", False)


def _bn_relu(x, gamma, beta, fused, dtype="float32"):
    import tensorflow as tf

    from keras_preact.layers import tf_kernels
    from keras_preact.layers import unit_ops as F

    # The fused kernel runs where it applies; the reference is the readable path.
    assert tf_kernels.fused_bn_applies("channels_last", False, dtype)
    weights = tf.constant(np.random.RandomState(7).randn(*x.shape).astype("float32"))
    x = tf.cast(tf.constant(x), dtype)
    params = {"gamma": tf.constant(gamma), "beta": tf.constant(beta),
              "moving_mean": tf.zeros_like(gamma), "moving_variance": tf.ones_like(gamma)}

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch([x, params["gamma"], params["beta"]])
            if fused:
                y, stats = F.bn_relu(x, params, training=True, momentum=0.0, epsilon=1e-5,
                                     data_format="channels_last")
            else:
                y, stats = F.batch_norm(x, params, training=True, momentum=0.0,
                                        epsilon=1e-5, channel_axis=-1)
                y = tf.nn.relu(y)
            loss = tf.reduce_sum(tf.cast(y, "float32") * weights)
        grads = tape.gradient(loss, [x, params["gamma"], params["beta"]])
        return y, stats, grads

    y, stats, grads = step(x)
    return (np.asarray(y, "float32"), [np.asarray(s) for s in stats],
            [np.asarray(g, "float32") for g in grads])


@pytest.mark.parametrize("shape", [(16, 6, 6, 5), (3, 4, 4, 8), (1, 1, 1, 3), (2, 1, 1, 4)])
def test_fused_bn_relu_matches_keras_arithmetic(shape):
    rng = np.random.RandomState(sum(shape))
    x = (rng.randn(*shape) * 3 + 2).astype("float32")
    gamma = (rng.rand(shape[-1]) + 0.5).astype("float32")
    beta = rng.randn(shape[-1]).astype("float32")
    (y0, s0, g0), (y1, s1, g1) = (_bn_relu(x, gamma, beta, fused) for fused in (False, True))
    np.testing.assert_allclose(y1, y0, rtol=1e-5, atol=1e-5)
    # The moving statistics (momentum 0: the batch's own; the variance the biased one).
    for a, b in zip(s1, s0):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(np.abs(b).max(), 1.0))


def test_fused_bn_relu_under_mixed_precision():
    rng = np.random.RandomState(0)
    x = (rng.randn(8, 5, 5, 4) * 2).astype("float32")
    gamma = np.ones(4, "float32")
    beta = np.zeros(4, "float32")
    (y0, s0, g0), (y1, s1, g1) = (_bn_relu(x, gamma, beta, f, "float16") for f in (False, True))
    np.testing.assert_allclose(y1, y0, rtol=2e-3, atol=2e-3)
    for a, b in zip(s1, s0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_fused_bn_relu_takes_bfloat16_without_float32_copies():
    """mixed_bfloat16: the activation goes into the fused kernel as it is (no Cast of it
    to float32 and back, forward or backward) and gives the readable path's values."""
    import tensorflow as tf

    from keras_preact.layers import unit_ops as F

    rng = np.random.RandomState(0)
    x = (rng.randn(8, 5, 5, 4) * 2).astype("float32")
    gamma, beta = np.ones(4, "float32"), np.zeros(4, "float32")
    (y0, s0, g0), (y1, s1, g1) = (_bn_relu(x, gamma, beta, f, "bfloat16") for f in (False, True))
    np.testing.assert_allclose(y1, y0, rtol=2e-2, atol=2e-2)
    for a, b in zip(s1, s0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    params = {k: tf.constant(v) for k, v in
              dict(gamma=gamma, beta=beta, moving_mean=gamma * 0, moving_variance=gamma).items()}
    xb = tf.cast(tf.constant(x), "bfloat16")

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = F.bn_relu(x, params, training=True, momentum=0.0, epsilon=1e-5,
                          data_format="channels_last")[0]
        return tape.gradient(tf.reduce_sum(y), x)

    graph = tf.function(step).get_concrete_function(xb).graph
    big_casts = [op for op in graph.get_operations()
                 if op.type == "Cast" and op.outputs[0].shape.num_elements() == x.size]
    assert not big_casts, [op.name for op in big_casts]


def _rel_err(a, b):
    """Largest difference of each array pair, relative to that array's largest value."""
    return max(float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-12)) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["preact_resnet20", "preact_resnet164"])
def test_model_outputs_and_one_step_gradients_equal_the_unoptimised_path(name, monkeypatch):
    """Both kernels on against both off, in one training step. Training-mode BN on a
    few values makes a deep network amplify float32 rounding (ResNet-164 here turns an
    input change of 1e-7 into ~5e-5 at the output), so the tolerance is that
    amplification, measured: the plain path run again on the input rounded differently."""
    import tensorflow as tf

    import keras_preact as kp

    keras.utils.set_random_seed(1)
    model = kp.get_model(name, input_shape=(16, 16, 3), classifier_activation=None)
    weights = model.get_weights()
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    x_rounded = x * (1 + 1e-7 * rng.randn(*x.shape)).astype("float32")
    y = rng.randint(0, 10, (4,))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    results = []
    for flag, inputs in (("0", x), ("0", x_rounded), ("1", x)):
        monkeypatch.setenv("KERAS_PREACT_FAST_CONV_GRAD", flag)
        monkeypatch.setenv("KERAS_PREACT_FUSED_BN", flag)
        model.set_weights(weights)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                out = model(x, training=True)
                loss = loss_fn(y, out)
            return out, tape.gradient(loss, model.trainable_variables)

        out, grads = step(inputs, y)
        results.append(([out.numpy()], [g.numpy() for g in grads],
                        [v.numpy() for v in model.non_trainable_variables]))
    plain, rounded, fast = results
    for part in range(3):  # outputs, gradients, moving statistics
        noise = _rel_err(rounded[part], plain[part])
        err = _rel_err(fast[part], plain[part])
        assert err <= 4 * noise + 2e-5, (part, err, noise)


def _run_python(code, onednn_preset, **env_extra):
    """Runs `code` in a fresh interpreter with TF_ENABLE_ONEDNN_OPTS unset (None) or set."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update(env_extra)
    if onednn_preset is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = onednn_preset
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("preset,expected", [(None, True), ("0", False)])
def test_importing_keras_preact_first_turns_on_onednn_unless_told_not_to(preset, expected):
    code = (
        "import keras_preact\n"
        "from keras_preact.layers import tf_kernels\n"
        "print('ONEDNN', tf_kernels.onednn_enabled())\n"
    )
    assert f"ONEDNN {expected}" in _run_python(code, preset)


@pytest.mark.parametrize("preset,warns", [(None, True), ("0", False)])
def test_training_on_eigen_kernels_warns_once_unless_chosen(preset, warns):
    """Keras imported first: TensorFlow loads before keras_preact can choose oneDNN."""
    code = (
        "import warnings\n"
        "import keras\n"
        "import numpy as np\n"
        "import keras_preact as kp\n"
        "from keras_preact.layers import tf_kernels\n"
        "if tf_kernels.onednn_enabled():\n"
        "    print('ONEDNN ON BY DEFAULT')\n"
        "m = kp.get_model('preact_resnet20', input_shape=(8, 8, 3), classes=3)\n"
        "m.compile('sgd', 'sparse_categorical_crossentropy')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    for _ in range(2):\n"
        "        m.fit(np.zeros((4, 8, 8, 3)), np.zeros(4), epochs=1, verbose=0)\n"
        "print('WARNINGS', sum('oneDNN CPU kernels are off' in str(w.message) for w in caught))\n"
    )
    stdout = _run_python(code, preset, CUDA_VISIBLE_DEVICES="")
    if "ONEDNN ON BY DEFAULT" in stdout:  # an AVX-512/AMX CPU: nothing to warn about
        assert "WARNINGS 0" in stdout
    else:
        assert f"WARNINGS {1 if warns else 0}" in stdout, stdout
