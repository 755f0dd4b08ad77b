"""The paper's variant units (Fig. 2 / Table 1, Fig. 4 / Table 2): equations, stages,
models, serialisation on every backend, and bad input."""

import os

import numpy as np
import pytest

import keras

import keras_preact as kp
from keras_preact.layers import PreActBasicBlock
from keras_preact.layers import PreActBottleneckBlock
from keras_preact.layers import PreActStage
from keras_preact.layers import UNIT_TYPES
from tests.helpers import to_numpy

# Parameters that differ from each other and from 1, so a scale or gate applied in the
# wrong place shows up.
PARAMS = {
    "constant_scaling": dict(shortcut_scale=0.3, residual_scale=0.7),
    "exclusive_gating": dict(gate_bias=-1.0),
    "shortcut_only_gating": dict(gate_bias=0.5),
    "dropout_shortcut": dict(dropout_rate=0.3),
}
EPS = 1e-5


def _randomize(layer, seed=0):
    """Non-trivial values for every BN variable and gate bias (inference mode is then
    really tested)."""
    rng = np.random.RandomState(seed)
    ranges = {"gamma": (0.5, 1.5), "beta": (-0.5, 0.5), "moving_mean": (-0.5, 0.5),
              "moving_variance": (0.5, 2.0), "gate_bias": (-1.0, 1.0)}
    for w in layer.weights:
        for field, (lo, hi) in ranges.items():
            if w.name.endswith(field):
                w.assign(rng.uniform(lo, hi, tuple(w.shape)).astype("float32"))


# --- the equations, written out from the paper's figures ---------------------------
def _conv(x, kernel, stride):
    """NHWC conv with symmetric (k - 1) // 2 padding."""
    kh, kw, _, cout = kernel.shape
    p = (kh - 1) // 2
    xp = np.pad(x, [(0, 0), (p, p), (p, p), (0, 0)])
    n, h, w, _ = x.shape
    oh, ow = (h + 2 * p - kh) // stride + 1, (w + 2 * p - kw) // stride + 1
    out = np.zeros((n, oh, ow, cout))
    for i in range(kh):
        for j in range(kw):
            out += xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :] @ kernel[i, j]
    return out


def _relu(x):
    return np.maximum(x, 0.0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _np_unit(layer, x, unit, params):
    v = lambda name: to_numpy(layer.get_variable(name)).astype(np.float64)

    def bn(t, name):
        g, b, m, var = (v(f"{name}_{f}") for f in ("gamma", "beta", "moving_mean", "moving_variance"))
        return (t - m) / np.sqrt(var + EPS) * g + b

    s = layer.strides
    if isinstance(layer, PreActBasicBlock):
        convs = [("conv1", s), ("conv2", 1)]
    else:
        convs = [("conv1", 1), ("conv2", s), ("conv3", 1)]  # stride on the 3x3 conv
    projects = s != 1 or x.shape[-1] != layer.filters or unit == "conv_shortcut"
    n = len(convs)

    if unit == "full_preact":  # Fig. 4e: (BN-ReLU-conv) x n, nothing after the addition
        a = _relu(bn(x, "preact_bn"))
        r = a
        for i, (c, st) in enumerate(convs):
            if i:
                r = _relu(bn(r, f"bn{i + 1}"))
            r = _conv(r, v(f"{c}_kernel"), st)
        return (_conv(a, v("shortcut_kernel"), s) if projects else x) + r
    if unit == "relu_only_preact":  # Fig. 4d: (ReLU-conv-BN) x n
        a = _relu(x)
        r = a
        for i, (c, st) in enumerate(convs):
            r = bn(_conv(_relu(r) if i else r, v(f"{c}_kernel"), st), f"bn{i + 1}")
        return (_conv(a, v("shortcut_kernel"), s) if projects else x) + r

    # The original residual branch (Fig. 4a): conv-BN-ReLU-...-conv-BN.
    def residual(last_bn=True):
        r = x
        for i, (c, st) in enumerate(convs):
            r = _conv(r, v(f"{c}_kernel"), st)
            if i < n - 1:
                r = _relu(bn(r, f"bn{i + 1}"))
            elif last_bn:
                r = bn(r, f"bn{i + 1}")
        return r

    h = bn(_conv(x, v("shortcut_kernel"), s), "shortcut_bn") if projects else x
    if unit in ("exclusive_gating", "shortcut_only_gating"):
        g = _sigmoid(_conv(x, v("gate_kernel"), s) + v("gate_bias"))
    if unit in ("original", "conv_shortcut"):
        return _relu(h + residual())
    if unit == "bn_after_addition":  # Fig. 4b
        return _relu(bn(h + residual(last_bn=False), "add_bn"))
    if unit == "relu_before_addition":  # Fig. 4c
        return h + _relu(residual())
    if unit == "constant_scaling":  # Fig. 2b
        return _relu(params["shortcut_scale"] * h + params["residual_scale"] * residual())
    if unit == "exclusive_gating":  # Fig. 2c
        return _relu((1 - g) * h + g * residual())
    if unit == "shortcut_only_gating":  # Fig. 2d
        return _relu((1 - g) * h + residual())
    if unit == "dropout_shortcut":  # Fig. 2f at inference: the expected scale 1 - rate
        return _relu((1 - params["dropout_rate"]) * h + residual())
    raise AssertionError(unit)


# JAX compiles every new shape: the basic case runs on every backend, the strided
# bottleneck on TensorFlow.
LAYERS = [
    pytest.param(PreActBasicBlock, dict(filters=8, strides=1), id="basic",
                 marks=pytest.mark.multibackend),
    pytest.param(PreActBottleneckBlock, dict(filters=16, strides=2), id="bottleneck-s2"),
]


@pytest.mark.parametrize("cls,kwargs", LAYERS)
@pytest.mark.parametrize("unit", UNIT_TYPES)
def test_unit_forward_matches_numpy_equation(unit, cls, kwargs):
    x = np.random.RandomState(1).randn(2, 6, 6, 8).astype("float32")
    params = PARAMS.get(unit, {})
    layer = cls(**kwargs, unit=unit, **params, data_format="channels_last")
    layer.build(x.shape)
    _randomize(layer)
    got = to_numpy(layer(x, training=False))
    want = _np_unit(layer, x.astype(np.float64), unit, params)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.multibackend
def test_dropout_shortcut_drops_whole_elements_in_training_only():
    """With the residual branch silenced (last BN gamma = beta = 0), y = relu(m * x)
    for a 0/1 mask m in training and (1 - rate) * x at inference."""
    x = np.abs(np.random.RandomState(2).randn(4, 8, 8, 8)).astype("float32") + 0.1
    layer = PreActBasicBlock(8, unit="dropout_shortcut", dropout_rate=0.5, seed=3)
    layer.build(x.shape)
    layer.get_variable("bn2_gamma").assign(np.zeros(8, "float32"))
    np.testing.assert_allclose(to_numpy(layer(x, training=False)), 0.5 * x, rtol=1e-6)
    y1 = to_numpy(layer(x, training=True))
    y2 = to_numpy(layer(x, training=True))
    for y in (y1, y2):
        kept = np.isclose(y, x, rtol=1e-6)
        assert np.all(kept | (y == 0))
        assert 0.4 < 1 - kept.mean() < 0.6  # about half dropped
    assert not np.array_equal(y1, y2)  # a new mask per call


# The units with extra stacked variables (projection + BN, gate, add_bn, seed) run on
# every backend.
_STACKED_ON_ALL = ("bn_after_addition", "exclusive_gating", "conv_shortcut", "dropout_shortcut")


@pytest.mark.parametrize("unit", [
    pytest.param(u, marks=pytest.mark.multibackend) if u in _STACKED_ON_ALL else u
    for u in UNIT_TYPES if u != "full_preact"
])
def test_stage_equals_chain_of_unit_layers(unit):
    """Stacked variables (units 2..n) compute what separate unit layers compute."""
    x = np.random.RandomState(8).randn(2, 8, 8, 8).astype("float32")
    params = PARAMS.get(unit, {})
    stage = PreActStage("basic", 16, num_blocks=3, strides=2, unit=unit, **params)
    stage.build(x.shape)
    _randomize(stage)
    units = [stage.unit1] + [PreActBasicBlock(16, unit=unit, **params) for _ in range(2)]
    shape = stage.compute_output_shape(x.shape)
    for i, u in enumerate(units[1:]):
        u.build(shape)
        for name, var in u._vars.items():
            var.assign(to_numpy(stage.get_variable(name))[i])
    y_ref = x
    for u in units:
        y_ref = u(y_ref, training=False)
    np.testing.assert_allclose(to_numpy(stage(x, training=False)), to_numpy(y_ref), rtol=1e-5, atol=1e-5)
    assert stage.count_params() == sum(u.count_params() for u in units)
    assert stage.compute_macs(x.shape) == sum(
        u.compute_macs(s) for u, s in zip(units, [x.shape, shape, shape])
    )


def _tiny(unit, **kwargs):
    return kp.PreActResNet(unit=unit, stage_blocks=(1, 2), stage_filters=(8, 16), stage_strides=(1, 2), stem_filters=8,
                           input_shape=(8, 8, 3), **PARAMS.get(unit, {}), **kwargs)


@pytest.mark.multibackend
@pytest.mark.parametrize("unit", UNIT_TYPES)
def test_model_saves_and_loads_with_equal_outputs(unit, tmp_path):
    keras.utils.set_random_seed(0)
    model = _tiny(unit)
    x = np.random.RandomState(4).rand(2, 8, 8, 3).astype("float32")
    # One training-mode call moves BN statistics off their initial values.
    assert np.all(np.isfinite(to_numpy(model(x, training=True))))
    y = to_numpy(model(x, training=False))
    path = str(tmp_path / f"{unit}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_config() == model.get_config()
    assert loaded.get_config()["unit"] == unit
    np.testing.assert_allclose(to_numpy(loaded(x, training=False)), y, rtol=1e-5, atol=1e-6)
    # The graph follows the unit family (He et al. 2015 stem for post-activation units).
    names = {layer.name for layer in model.layers}
    assert ("stem_bn" in names) == (unit not in ("full_preact", "relu_only_preact"))
    assert ("post_bn" in names) == (unit == "full_preact")
    assert ("post_relu" in names) == (unit in ("full_preact", "relu_only_preact"))


def test_every_trainable_variable_gets_a_gradient():
    import tensorflow as tf

    x = np.random.RandomState(5).rand(4, 8, 8, 3).astype("float32")
    y = np.arange(4) % 10
    for unit in UNIT_TYPES:
        model = _tiny(unit)
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        missing = [v.path for v, g in zip(model.trainable_variables, grads)
                   if g is None or not np.any(to_numpy(g))]
        assert not missing, (unit, missing)


def test_default_unit_keeps_its_variables_and_adds_only_defaulted_keys():
    """The default unit's layout is frozen (weights files and converters use it)."""
    layer = PreActBottleneckBlock(32, strides=2)
    layer.build((None, 8, 8, 16))
    assert list(layer._vars) == [
        f"preact_bn_{f}" for f in ("gamma", "beta", "moving_mean", "moving_variance")
    ] + ["conv1_kernel"] + [f"bn2_{f}" for f in ("gamma", "beta", "moving_mean", "moving_variance")] + [
        "conv2_kernel"] + [f"bn3_{f}" for f in ("gamma", "beta", "moving_mean", "moving_variance")] + [
        "conv3_kernel", "shortcut_kernel"]
    config = kp.preact_resnet20().get_config()
    assert {k: config[k] for k in ("unit", "shortcut_scale", "residual_scale", "gate_bias",
                                   "dropout_rate")} == {
        "unit": "full_preact", "shortcut_scale": None, "residual_scale": None,
        "gate_bias": None, "dropout_rate": None}
    # A config without the new keys (saved before they existed) builds the same model.
    old = {k: v for k, v in config.items() if k not in ("unit", "shortcut_scale", "residual_scale",
                                                        "gate_bias", "dropout_rate")}
    assert kp.PreActResNet.from_config(old).get_config() == config


def test_factories_and_registry_take_a_unit():
    assert "original" in kp.layers.UNIT_TYPES and kp.layers.UNIT_TYPES[0] == "full_preact"
    m = kp.preact_resnet_cifar(20, unit="exclusive_gating", gate_bias=-7, input_shape=(8, 8, 3))
    assert m.get_config()["gate_bias"] == -7
    bias = to_numpy(m.get_layer("stage2").get_variable("gate_bias"))
    np.testing.assert_array_equal(bias, np.full_like(bias, -7.0))
    m = kp.get_model("preact_resnet20", unit="original", input_shape=(8, 8, 3))
    assert m.get_layer("stage1").unit == "original"


def test_gate_bias_initialiser_and_dropout_are_real_options():
    layer = PreActBasicBlock(8, unit="shortcut_only_gating")
    layer.build((None, 4, 4, 8))
    np.testing.assert_array_equal(to_numpy(layer.get_variable("gate_bias")), np.full(8, -6.0))
    assert layer.unit_options == {"gate_bias": -6.0}
    assert PreActBasicBlock(8, unit="dropout_shortcut").unit_options == {"dropout_rate": 0.5}
    assert PreActBasicBlock(8, unit="constant_scaling").unit_options == {
        "shortcut_scale": 0.5, "residual_scale": 0.5}


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(unit="preact"), r"Unknown `unit`.*unit='preact'.*'full_preact', 'original'"),
        (dict(unit=None), r"Unknown `unit`.*Valid"),
        (dict(unit="constant_scaling", shortcut_scale=-0.5), r"shortcut_scale.*>= 0.*-0.5"),
        (dict(unit="constant_scaling", residual_scale=float("nan")), r"residual_scale.*finite"),
        (dict(unit="constant_scaling", shortcut_scale="half"), r"shortcut_scale.*'half'"),
        (dict(unit="exclusive_gating", gate_bias=float("inf")), r"gate_bias.*finite.*inf"),
        (dict(unit="shortcut_only_gating", gate_bias=True), r"gate_bias.*True"),
        (dict(unit="dropout_shortcut", dropout_rate=1.0), r"dropout_rate.*\[0, 1\).*1.0"),
        (dict(unit="dropout_shortcut", dropout_rate=-0.1), r"dropout_rate.*-0.1"),
        (dict(unit="original", gate_bias=-6), r"gate_bias.*applies only.*unit='original'"),
        (dict(dropout_rate=0.5), r"dropout_rate.*applies only.*full_preact"),
    ],
)
def test_bad_unit_arguments_are_clear_errors(kwargs, match):
    for build in (
        lambda: PreActBasicBlock(8, **kwargs),
        lambda: PreActStage("basic", 8, num_blocks=2, **kwargs),
        lambda: kp.PreActResNet(**kwargs),
        lambda: kp.preact_resnet_cifar(20, **kwargs),
    ):
        with pytest.raises(ValueError, match=match):
            build()


def test_other_bad_unit_combinations():
    with pytest.raises(ValueError, match="conv_shortcut.*projection=False"):
        PreActBasicBlock(8, unit="conv_shortcut", projection=False)
    with pytest.raises(ValueError, match="shared_preact.*unit='original'"):
        PreActBasicBlock(8, unit="original", shared_preact=True)
    with pytest.raises(ValueError, match="seed.*dropout_shortcut"):
        PreActBasicBlock(8, unit="original", seed=1)
