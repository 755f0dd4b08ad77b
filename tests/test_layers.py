"""Pre-activation units: equations, configs, data formats, dtype policies."""

import numpy as np
import pytest

import keras

from keras_preact.layers import ImageNormalization
from keras_preact.layers import PreActBasicBlock
from keras_preact.layers import PreActBottleneckBlock
from keras_preact.layers import PreActStage
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
    """Gives every BN variable non-trivial values so inference mode is really tested."""
    rng = np.random.RandomState(seed)
    ranges = {"gamma": (0.5, 1.5), "beta": (-0.5, 0.5), "moving_mean": (-0.5, 0.5),
              "moving_variance": (0.5, 2.0)}
    for w in layer.weights:
        for field, (lo, hi) in ranges.items():
            if w.name.endswith(field):
                w.assign(rng.uniform(lo, hi, tuple(w.shape)).astype("float32"))


# --- direct NumPy computation of the paper's equations ------------------------
def _np_bn_relu(x, unit, bn):
    g, b, m, v = (to_numpy(unit.get_variable(f"{bn}_{f}"))
                  for f in ("gamma", "beta", "moving_mean", "moving_variance"))
    return np.maximum((x - m) / np.sqrt(v + unit.bn_epsilon) * g + b, 0.0)


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


def _np_unit(unit, x, bottleneck_stride="middle"):
    """The paper's full pre-activation unit, written out from its definition."""
    a = _np_bn_relu(x, unit, "preact_bn")
    k = lambda name: to_numpy(unit.get_variable(f"{name}_kernel"))
    s = unit.strides
    if isinstance(unit, PreActBasicBlock):
        r = _np_conv(a, k("conv1"), s)
        r = _np_conv(_np_bn_relu(r, unit, "bn2"), k("conv2"), 1)
    else:
        s1, s2 = (s, 1) if bottleneck_stride == "first" else (1, s)
        r = _np_conv(a, k("conv1"), s1)
        r = _np_conv(_np_bn_relu(r, unit, "bn2"), k("conv2"), s2)
        r = _np_conv(_np_bn_relu(r, unit, "bn3"), k("conv3"), 1)
    in_channels = x.shape[-1]
    if s != 1 or in_channels != unit.filters:  # projection of the shared pre-activation
        shortcut = _np_conv(a, k("shortcut"), s)
    else:
        shortcut = x
    return shortcut + r  # nothing after the addition


@pytest.mark.parametrize("cls,kwargs", UNITS, ids=IDS)
def test_forward_matches_numpy_equation(cls, kwargs):
    x = np.random.RandomState(1).randn(2, 8, 8, 8).astype("float32")
    layer = cls(**kwargs, data_format="channels_last")
    layer.build(x.shape)
    _randomize_bn(layer)
    got = to_numpy(layer(x, training=False))
    want = _np_unit(layer, x.astype(np.float64), kwargs.get("bottleneck_stride", "middle"))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_identity_unit_keeps_raw_shortcut_and_has_no_projection():
    layer = PreActBasicBlock(8)
    layer.build((None, 8, 8, 8))
    assert not layer.has_projection and not layer.spec.shared_preact
    assert "shortcut_kernel" not in [w.name for w in layer.weights]
    # With the residual branch zeroed, y == x exactly: the identity path is clean.
    layer.get_variable("conv2_kernel").assign(np.zeros((3, 3, 8, 8), "float32"))
    x = np.random.RandomState(2).randn(1, 8, 8, 8).astype("float32")
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)


def test_shape_change_uses_projection_fed_by_preactivation():
    layer = PreActBasicBlock(16, strides=2)
    layer.build((None, 8, 8, 8))
    assert layer.has_projection and layer.spec.shared_preact
    assert tuple(layer.get_variable("shortcut_kernel").shape) == (1, 1, 8, 16)


def test_shared_preact_can_be_forced_on_identity_units():
    layer = PreActBasicBlock(8, shared_preact=True)
    layer.build((None, 8, 8, 8))
    assert not layer.has_projection and layer.spec.shared_preact
    # Zero residual: y = relu(bn(x)), not x.
    layer.get_variable("conv2_kernel").assign(np.zeros((3, 3, 8, 8), "float32"))
    x = np.random.RandomState(2).randn(1, 8, 8, 8).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(x, training=False)), _np_bn_relu(x, layer, "preact_bn"), atol=1e-5)


def test_bottleneck_stride_placement():
    x = np.random.RandomState(7).randn(1, 8, 8, 16).astype("float32")
    first = PreActBottleneckBlock(32, strides=2, bottleneck_stride="first")
    middle = PreActBottleneckBlock(32, strides=2, bottleneck_stride="middle")
    first.build(x.shape)
    middle.build(x.shape)
    middle.set_weights(first.get_weights())
    assert first.count_params() == middle.count_params()
    # Same weights, different function.
    assert not np.allclose(to_numpy(first(x, training=False)), to_numpy(middle(x, training=False)))


@pytest.mark.parametrize("block,filters", [("basic", 16), ("bottleneck", 32)])
@pytest.mark.parametrize("training", [False, True])
def test_stage_equals_chain_of_unit_layers(block, filters, training):
    """A stage with stacked variables computes what its units would, one by one."""
    x = np.random.RandomState(8).randn(2, 8, 8, 8).astype("float32")
    stage = PreActStage(block, filters, num_blocks=4, strides=2)
    stage.build(x.shape)
    _randomize_bn(stage)
    initial = to_numpy(stage.get_variable("bn2_moving_mean")).copy()
    cls = PreActBasicBlock if block == "basic" else PreActBottleneckBlock
    units = [stage.unit1] + [cls(filters) for _ in range(3)]
    shape = stage.compute_output_shape(x.shape)
    for i, unit in enumerate(units[1:]):
        unit.build(shape)
        for w in unit.weights:
            w.assign(to_numpy(stage.get_variable(w.name))[i])
    # Reference chain first (unit1 is shared: reset its statistics afterwards).
    saved = [to_numpy(w).copy() for w in stage.unit1.weights]
    y_ref = x
    for unit in units:
        y_ref = to_numpy(unit(y_ref, training=training))
    ref_stats = [to_numpy(u.get_variable("bn2_moving_mean")) for u in units[1:]]
    for w, v in zip(stage.unit1.weights, saved):
        w.assign(v)
    y = to_numpy(stage(x, training=training))
    np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5)
    stats = to_numpy(stage.get_variable("bn2_moving_mean"))
    np.testing.assert_allclose(stats, np.stack(ref_stats), rtol=1e-5, atol=1e-6)
    # Training moved the statistics (exactly one update, as the chain did); inference did not.
    assert np.allclose(stats, initial) != training


def test_stage_stacked_kernels_have_single_unit_he_statistics():
    keras.utils.set_random_seed(0)
    stage = PreActStage("basic", 64, num_blocks=40)
    stage.build((None, 8, 8, 64))
    k = to_numpy(stage.get_variable("conv1_kernel"))
    assert k.shape == (39, 3, 3, 64, 64)
    fan_in = 3 * 3 * 64
    np.testing.assert_allclose(k.std(), np.sqrt(2.0 / fan_in), rtol=0.05)
    assert not np.allclose(k[0], k[1])  # independent draws per unit


def test_frozen_stage_runs_batchnorm_in_inference_mode():
    x = np.random.RandomState(9).randn(2, 8, 8, 8).astype("float32") + 2.0
    stage = PreActStage("basic", 8, num_blocks=3)
    stage.build(x.shape)
    stage.trainable = False
    before = [to_numpy(w).copy() for w in stage.non_trainable_weights]
    np.testing.assert_allclose(to_numpy(stage(x, training=True)), to_numpy(stage(x, training=False)), atol=1e-6)
    for w, b in zip(stage.non_trainable_weights, before):
        np.testing.assert_array_equal(to_numpy(w), b)


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
    ref = cls(**kwargs)
    ref.build(x.shape)
    ref.set_weights(layer.get_weights())
    tol = 5e-2 if compute == "float16" else 2e-1
    np.testing.assert_allclose(to_numpy(y).astype("float32"), to_numpy(ref(x)), atol=tol, rtol=tol)


def test_training_mode_updates_moving_statistics_once():
    layer = PreActBasicBlock(8)
    x = np.random.RandomState(6).randn(4, 8, 8, 8).astype("float32") + 3.0
    layer.build(x.shape)
    before = to_numpy(layer.get_variable("preact_bn_moving_mean")).copy()
    layer(x, training=True)
    after = to_numpy(layer.get_variable("preact_bn_moving_mean"))
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


@pytest.mark.parametrize("block,filters", [("basic", 16), ("bottleneck", 32)])
def test_stage_config_round_trip_and_costs(block, filters):
    x = np.random.RandomState(10).randn(2, 8, 8, 8).astype("float32")
    stage = PreActStage(block, filters, num_blocks=3, strides=2, name="stage")
    stage.build(x.shape)
    _randomize_bn(stage)
    config = stage.get_config()
    clone = PreActStage.from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape)
    clone.set_weights(stage.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(stage(x)), atol=1e-6)
    # Costs: the stage's multiply-adds are the sum of its units'.
    cls = PreActBasicBlock if block == "basic" else PreActBottleneckBlock
    unit2 = cls(filters)
    out_shape = stage.compute_output_shape(x.shape)
    unit2.build(out_shape)
    assert stage.compute_macs(x.shape) == stage.unit1.compute_macs(x.shape) + 2 * unit2.compute_macs(out_shape)
    assert stage.count_params() == stage.unit1.count_params() + 2 * unit2.count_params()


def test_stage_bad_arguments():
    with pytest.raises(ValueError, match="num_blocks"):
        PreActStage("basic", 16, num_blocks=0)
    with pytest.raises(ValueError, match="block='wide'"):
        PreActStage("wide", 16, num_blocks=2)
