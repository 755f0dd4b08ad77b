"""Pre-activation units: equations, configs, data formats, dtype policies."""

import numpy as np
import pytest

import keras

from keras_preact.layers import ImageNormalization
from keras_preact.layers import PreActBasicBlock
from keras_preact.layers import PreActBottleneckBlock
from tests.helpers import to_numpy

pytestmark = pytest.mark.multibackend

UNITS = [
    (PreActBasicBlock, dict(filters=8, strides=1)),
    (PreActBasicBlock, dict(filters=16, strides=2)),
    (PreActBottleneckBlock, dict(filters=16, strides=1)),
    (PreActBottleneckBlock, dict(filters=32, strides=2)),
    (PreActBottleneckBlock, dict(filters=32, strides=2, bottleneck_stride="first")),
]
IDS = ["basic", "basic-s2", "bottleneck", "bottleneck-s2", "bottleneck-s2-first"]


def _randomize_bn(layer, seed=0):
    """Gives every BN non-trivial statistics so inference mode is really tested."""
    rng = np.random.RandomState(seed)
    for sub in layer._flatten_layers(include_self=False):
        if isinstance(sub, keras.layers.BatchNormalization):
            n = sub.gamma.shape[0]
            sub.gamma.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
            sub.beta.assign(rng.uniform(-0.5, 0.5, n).astype("float32"))
            sub.moving_mean.assign(rng.uniform(-0.5, 0.5, n).astype("float32"))
            sub.moving_variance.assign(rng.uniform(0.5, 2.0, n).astype("float32"))


# --- direct NumPy computation of the paper's equations ------------------------
def _np_bn_relu(x, bn):
    g, b, m, v = (to_numpy(w) for w in (bn.gamma, bn.beta, bn.moving_mean, bn.moving_variance))
    return np.maximum((x - m) / np.sqrt(v + bn.epsilon) * g + b, 0.0)


def _np_conv(x, kernel, stride):
    """NHWC conv, Torch-style symmetric padding (k - 1) // 2."""
    kh, kw, cin, cout = kernel.shape
    p = (kh - 1) // 2
    xp = np.pad(x, [(0, 0), (p, p), (p, p), (0, 0)])
    n, h, w, _ = x.shape
    oh, ow = (h + 2 * p - kh) // stride + 1, (w + 2 * p - kw) // stride + 1
    out = np.zeros((n, oh, ow, cout), dtype=np.float64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :]
            out += patch @ kernel[i, j]
    return out


def _np_unit(layer, x):
    a = _np_bn_relu(x, layer.preact_bn)
    convs = layer._residual_convs()
    strides = [layer._conv_strides[c.name] for c in convs]
    bns = [layer.bn2] + ([layer.bn3] if hasattr(layer, "bn3") else [])
    r = _np_conv(a, to_numpy(convs[0].kernel), strides[0])
    for bn, conv, s in zip(bns, convs[1:], strides[1:]):
        r = _np_conv(_np_bn_relu(r, bn), to_numpy(conv.kernel), s)
    shortcut = a if layer._shares_preact else x
    if layer.shortcut_conv is not None:
        shortcut = _np_conv(shortcut, to_numpy(layer.shortcut_conv.kernel), layer.strides)
    return shortcut + r  # nothing after the addition


@pytest.mark.parametrize("cls,kwargs", UNITS, ids=IDS)
def test_forward_matches_numpy_equation(cls, kwargs):
    x = np.random.RandomState(1).randn(2, 8, 8, 8).astype("float32")
    layer = cls(**kwargs, data_format="channels_last")
    layer.build(x.shape)
    _randomize_bn(layer)
    got = to_numpy(layer(x, training=False))
    want = _np_unit(layer, x.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_identity_unit_keeps_raw_shortcut_and_has_no_projection():
    layer = PreActBasicBlock(8)
    layer.build((None, 8, 8, 8))
    assert layer.shortcut_conv is None and not layer._shares_preact
    # y - F(x) == x exactly: the identity path carries x untouched.
    x = np.random.RandomState(2).randn(1, 8, 8, 8).astype("float32")
    y = to_numpy(layer(x, training=False))
    a = to_numpy(keras.ops.relu(layer.preact_bn(x, training=False)))
    f = to_numpy(layer._residual(keras.ops.convert_to_tensor(a), False))
    np.testing.assert_allclose(y - f, x, atol=1e-5)


def test_shape_change_uses_projection_fed_by_preactivation():
    layer = PreActBasicBlock(16, strides=2)
    layer.build((None, 8, 8, 8))
    assert layer.shortcut_conv is not None and layer._shares_preact
    assert tuple(layer.shortcut_conv.kernel.shape) == (1, 1, 8, 16)


def test_shared_preact_can_be_forced_on_identity_units():
    layer = PreActBasicBlock(8, shared_preact=True)
    layer.build((None, 8, 8, 8))
    assert layer.shortcut_conv is None and layer._shares_preact


def test_bottleneck_stride_placement():
    first = PreActBottleneckBlock(32, strides=2, bottleneck_stride="first")
    middle = PreActBottleneckBlock(32, strides=2, bottleneck_stride="middle")
    for layer in (first, middle):
        layer.build((None, 8, 8, 16))
    assert first._conv_strides["conv1"] == 2 and first._conv_strides["conv2"] == 1
    assert middle._conv_strides["conv1"] == 1 and middle._conv_strides["conv2"] == 2
    # Same parameter count, different function.
    assert first.count_params() == middle.count_params()


@pytest.mark.parametrize("cls,kwargs", UNITS, ids=IDS)
def test_config_round_trip(cls, kwargs):
    layer = cls(**kwargs, name="unit")
    x = np.random.RandomState(3).randn(2, 8, 8, 8).astype("float32")
    layer.build(x.shape)
    _randomize_bn(layer)
    config = layer.get_config()
    clone = cls.from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape)
    clone.set_weights(layer.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(layer(x)), atol=1e-6)
    # Serialisation by registered name.
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(revived) is cls and revived.get_config() == config


@pytest.mark.parametrize("cls,kwargs", UNITS, ids=IDS)
def test_symbolic_and_eager_calls_agree_on_shape(cls, kwargs):
    layer = cls(**kwargs)
    symbolic = layer(keras.Input((8, 8, 8)))
    eager = layer(np.zeros((3, 8, 8, 8), "float32"))
    assert tuple(symbolic.shape)[1:] == tuple(eager.shape)[1:]
    assert tuple(symbolic.shape)[1:] == layer.compute_output_shape((None, 8, 8, 8))[1:]


@pytest.mark.parametrize("cls,kwargs", UNITS, ids=IDS)
def test_channels_first_equals_channels_last(cls, kwargs):
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            pytest.skip(
                "TensorFlow's CPU kernels implement NHWC convolution only (also for "
                "keras.layers.Conv2D); channels_first is tested on JAX and PyTorch"
            )
    x = np.random.RandomState(4).randn(2, 8, 8, 8).astype("float32")
    last = cls(**kwargs, data_format="channels_last")
    last.build(x.shape)
    _randomize_bn(last)
    first = cls(**kwargs, data_format="channels_first")
    first.build((2, 8, 8, 8))
    first.set_weights(last.get_weights())
    y_last = to_numpy(last(x, training=False))
    y_first = to_numpy(first(np.transpose(x, (0, 3, 1, 2)), training=False))
    np.testing.assert_allclose(np.transpose(y_first, (0, 2, 3, 1)), y_last, atol=1e-5)
    assert first.compute_output_shape((2, 8, 8, 8)) == (2,) + tuple(y_first.shape[1:])


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("cls,kwargs", UNITS[:3], ids=IDS[:3])
def test_mixed_precision_policies(policy, cls, kwargs):
    layer = cls(**kwargs, dtype=policy)
    x = np.random.RandomState(5).randn(2, 8, 8, 8).astype("float32")
    y = layer(x)
    compute = policy.split("_")[1]
    assert keras.backend.standardize_dtype(y.dtype) == compute
    assert all(keras.backend.standardize_dtype(w.dtype) == "float32" for w in layer.weights)
    subs = list(layer._flatten_layers(include_self=False))
    assert subs and all(s.dtype_policy.name == policy for s in subs)
    ref = cls(**kwargs)
    ref.build(x.shape)
    ref.set_weights(layer.get_weights())
    tol = 5e-2 if compute == "float16" else 2e-1
    np.testing.assert_allclose(to_numpy(y).astype("float32"), to_numpy(ref(x)), atol=tol, rtol=tol)


def test_training_mode_updates_moving_statistics_once():
    layer = PreActBasicBlock(8)
    x = np.random.RandomState(6).randn(4, 8, 8, 8).astype("float32") + 3.0
    layer.build(x.shape)
    before = to_numpy(layer.preact_bn.moving_mean).copy()
    layer(x, training=True)
    after = to_numpy(layer.preact_bn.moving_mean)
    batch_mean = x.mean(axis=(0, 1, 2))
    np.testing.assert_allclose(after, 0.9 * before + 0.1 * batch_mean, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(filters=0), "filters"),
        (dict(filters=8, strides=0), "strides"),
        (dict(filters=8, projection="yes"), "projection"),
        (dict(filters=8, shared_preact=1), "shared_preact"),
        (dict(filters=8, data_format="nhwc"), "data_format"),
        (dict(filters=8, bn_momentum=1.5), "bn_momentum"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PreActBasicBlock(**kwargs)


def test_bottleneck_bad_arguments():
    with pytest.raises(ValueError, match="divisible by `expansion`"):
        PreActBottleneckBlock(30)
    with pytest.raises(ValueError, match="bottleneck_stride"):
        PreActBottleneckBlock(32, bottleneck_stride="last")


def test_identity_cannot_change_shape():
    with pytest.raises(ValueError, match="projection=False"):
        PreActBasicBlock(16, projection=False).build((None, 8, 8, 8))


def test_image_normalization():
    layer = ImageNormalization(scale=1 / 255.0, mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 1.0))
    x = np.full((1, 2, 2, 3), 255, dtype="uint8")
    y = to_numpy(layer(x))
    np.testing.assert_allclose(y[0, 0, 0], [1.0, 3.0, 1.0], rtol=1e-6)
    clone = ImageNormalization.from_config(layer.get_config())
    np.testing.assert_allclose(to_numpy(clone(x)), y)
    with pytest.raises(ValueError, match="std"):
        ImageNormalization(std=(0.0,))
    with pytest.raises(ValueError, match="3 channels|channels"):
        ImageNormalization(mean=(0.1, 0.2)).build((None, 4, 4, 3))
