"""Pre-activation units and the paper's variant units (Fig. 2 / Table 1, Fig. 4 / Table 2):
equations, stages, configs, bad input. Data formats, dtype policies and model round trips:
tests/harness.py, run by tests/test_models.py."""

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers import (
    UNIT_TYPES,
    ImageNormalization,
    PreActBasicBlock,
    PreActBottleneckBlock,
    PreActStage,
)
from tests.harness import UNIT_PARAMS as PARAMS
from tests.harness import randomize
from tests.helpers import to_numpy

LAYERS = {
    "basic": (PreActBasicBlock, dict(filters=8, strides=1)),
    "basic-s2": (PreActBasicBlock, dict(filters=16, strides=2)),
    "bottleneck": (PreActBottleneckBlock, dict(filters=16, strides=1)),
    "bottleneck-s2": (PreActBottleneckBlock, dict(filters=32, strides=2)),
    "bottleneck-s2-first": (PreActBottleneckBlock,
                            dict(filters=32, strides=2, bottleneck_stride="first")),
}
EPS = 1e-5


# --- the equations, written out from the paper's figures ---------------------------
def _conv(x, kernel, stride):
    """NHWC conv with Torch-style symmetric (k - 1) // 2 padding."""
    kh, kw, _, cout = kernel.shape
    p = (kh - 1) // 2
    xp = np.pad(x, [(0, 0), (p, p), (p, p), (0, 0)])
    n, h, w, _ = x.shape
    oh, ow = (h + 2 * p - kh) // stride + 1, (w + 2 * p - kw) // stride + 1
    out = np.zeros((n, oh, ow, cout))
    for i in range(kh):
        for j in range(kw):
            out += (xp[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :]
                    @ kernel[i, j])
    return out


def _relu(x):
    return np.maximum(x, 0.0)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _bn(layer, t, name):
    v = lambda f: to_numpy(layer.get_variable(f"{name}_{f}")).astype(np.float64)  # noqa: E731
    return (t - v("moving_mean")) / np.sqrt(v("moving_variance") + EPS) * v("gamma") + v("beta")


def _np_unit(layer, x, unit, params, bottleneck_stride="middle"):
    v = lambda name: to_numpy(layer.get_variable(name)).astype(np.float64)  # noqa: E731
    bn = lambda t, name: _bn(layer, t, name)  # noqa: E731
    s = layer.strides
    if isinstance(layer, PreActBasicBlock):
        convs = [("conv1", s), ("conv2", 1)]
    elif bottleneck_stride == "first":
        convs = [("conv1", s), ("conv2", 1), ("conv3", 1)]
    else:
        convs = [("conv1", 1), ("conv2", s), ("conv3", 1)]  # stride on the 3x3 conv
    projects = s != 1 or x.shape[-1] != layer.filters or unit == "conv_shortcut"
    n = len(convs)

    if unit == "full_preact":  # Fig. 4e: (BN-ReLU-conv) x n, nothing after the addition
        a = _relu(bn(x, "preact_bn"))  # the projection shares the pre-activation
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




# JAX compiles every new shape: the full pre-activation unit runs in every layout on every
# backend, the other units as a basic unit there and as a strided bottleneck on TensorFlow.
EQUATIONS = [pytest.param(unit, layer, id=f"{unit}-{layer}", marks=[pytest.mark.multibackend]
                          if unit == "full_preact" or layer == "basic" else [])
             for unit in UNIT_TYPES
             for layer in (LAYERS if unit == "full_preact" else ("basic", "bottleneck-s2"))]


@pytest.mark.parametrize("unit,layer", EQUATIONS)
def test_unit_forward_matches_numpy_equation(unit, layer):
    cls, kwargs = LAYERS[layer]
    x = np.random.RandomState(1).randn(2, 8, 8, 8).astype("float32")
    params = PARAMS.get(unit, {})
    layer = cls(**kwargs, unit=unit, **params, data_format="channels_last")
    layer.build(x.shape)
    randomize(layer)
    want = _np_unit(layer, x.astype(np.float64), unit, params,
                    kwargs.get("bottleneck_stride", "middle"))
    np.testing.assert_allclose(to_numpy(layer(x, training=False)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.multibackend
def test_projection_is_fed_by_the_shared_preactivation():
    layer = PreActBasicBlock(16, strides=2)
    layer.build((None, 8, 8, 8))
    assert layer.has_projection and layer.spec.shared_preact
    assert tuple(layer.get_variable("shortcut_kernel").shape) == (1, 1, 8, 16)
    # Forced on an identity unit: with a zero residual, y = relu(bn(x)), not x.
    layer = PreActBasicBlock(8, shared_preact=True)
    layer.build((None, 8, 8, 8))
    assert not layer.has_projection and layer.spec.shared_preact
    layer.get_variable("conv2_kernel").assign(np.zeros((3, 3, 8, 8), "float32"))
    x = np.random.RandomState(2).randn(1, 8, 8, 8).astype("float32")
    np.testing.assert_allclose(to_numpy(layer(x, training=False)),
                               _relu(_bn(layer, x, "preact_bn")), atol=1e-5)


@pytest.mark.multibackend
def test_identity_unit_keeps_raw_shortcut_and_has_no_projection():
    layer = PreActBasicBlock(8)
    layer.build((None, 8, 8, 8))
    assert not layer.has_projection and not layer.spec.shared_preact
    assert "shortcut_kernel" not in [w.name for w in layer.weights]
    # With the residual branch zeroed, y == x exactly: the identity path is clean.
    layer.get_variable("conv2_kernel").assign(np.zeros((3, 3, 8, 8), "float32"))
    x = np.random.RandomState(2).randn(1, 8, 8, 8).astype("float32")
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)


@pytest.mark.multibackend
def test_training_mode_updates_moving_statistics_once():
    layer = PreActBasicBlock(8)
    x = np.random.RandomState(6).randn(4, 8, 8, 8).astype("float32") + 3.0
    layer.build(x.shape)
    before = to_numpy(layer.get_variable("preact_bn_moving_mean")).copy()
    layer(x, training=True)
    after = to_numpy(layer.get_variable("preact_bn_moving_mean"))
    batch_mean = x.mean(axis=(0, 1, 2))
    np.testing.assert_allclose(after, 0.9 * before + 0.1 * batch_mean, atol=1e-5)


# The units with extra stacked variables (projection + BN, gate, add_bn, seed) run on every
# backend; the full pre-activation unit also in training mode.
_STACKED_ON_ALL = ("bn_after_addition", "exclusive_gating", "conv_shortcut", "dropout_shortcut")
CHAINS = [pytest.param("full_preact", block, training, marks=pytest.mark.multibackend)
          for block in ("basic", "bottleneck") for training in (False, True)] + [
    pytest.param(u, "basic", False,
                 marks=[pytest.mark.multibackend] if u in _STACKED_ON_ALL else [])
    for u in UNIT_TYPES if u != "full_preact"]


@pytest.mark.parametrize("unit,block,training", CHAINS)
def test_stage_equals_chain_of_unit_layers_and_round_trips(unit, block, training):
    """A stage with stacked variables (units 2..n) computes what its units would, one by one,
    updates each moving statistic once in training mode, costs what they cost, and
    round-trips through its config."""
    x = np.random.RandomState(8).randn(2, 8, 8, 8).astype("float32")
    params = PARAMS.get(unit, {})
    filters, cls = (16, PreActBasicBlock) if block == "basic" else (32, PreActBottleneckBlock)
    stage = PreActStage(block, filters, num_blocks=3, strides=2, unit=unit, name="stage",
                        **params)
    stage.build(x.shape)
    randomize(stage)
    stat = next(name for name in stage.unit1._vars if name.endswith("moving_mean"))
    initial = to_numpy(stage.get_variable(stat)).copy()
    units = [stage.unit1] + [cls(filters, unit=unit, **params) for _ in range(2)]
    shape = stage.compute_output_shape(x.shape)
    for i, u in enumerate(units[1:]):
        u.build(shape)
        for name, var in u._vars.items():
            var.assign(to_numpy(stage.get_variable(name))[i])
    saved = [to_numpy(w).copy() for w in stage.unit1.weights]  # the chain updates unit1 too
    y_ref = x
    for u in units:
        y_ref = to_numpy(u(y_ref, training=training))
    ref_stats = np.stack([to_numpy(u.get_variable(stat)) for u in units[1:]])
    for w, value in zip(stage.unit1.weights, saved):
        w.assign(value)
    np.testing.assert_allclose(to_numpy(stage(x, training=training)), y_ref, rtol=1e-5,
                               atol=1e-5)
    stats = to_numpy(stage.get_variable(stat))
    np.testing.assert_allclose(stats, ref_stats, rtol=1e-5, atol=1e-6)
    assert np.allclose(stats, initial) != training  # training moved them once, inference not
    assert stage.count_params() == sum(u.count_params() for u in units)
    assert stage.compute_macs(x.shape) == sum(
        u.compute_macs(s) for u, s in zip(units, [x.shape, shape, shape]))
    clone = PreActStage.from_config(stage.get_config())
    assert clone.get_config() == stage.get_config()
    clone.build(x.shape)
    clone.set_weights(stage.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(stage(x)), atol=1e-6)


@pytest.mark.multibackend
@pytest.mark.parametrize("layer", LAYERS)
def test_unit_config_round_trip_and_shapes(layer):
    cls, kwargs = LAYERS[layer]
    unit = cls(**kwargs, name="unit")
    x = np.random.RandomState(3).randn(2, 8, 8, 8).astype("float32")
    unit.build(x.shape)
    randomize(unit)
    config = unit.get_config()
    clone = cls.from_config(config)
    assert clone.get_config() == config
    clone.build(x.shape)
    clone.set_weights(unit.get_weights())
    np.testing.assert_allclose(to_numpy(clone(x)), to_numpy(unit(x)), atol=1e-6)
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(unit))
    assert type(revived) is cls and revived.get_config() == config
    # Symbolic and eager calls agree with compute_output_shape.
    symbolic = cls(**kwargs)(keras.Input((8, 8, 8)))
    assert tuple(symbolic.shape)[1:] == tuple(unit(x).shape)[1:] == (
        unit.compute_output_shape((None, 8, 8, 8))[1:])


@pytest.mark.multibackend
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


def _tiny(unit, **kwargs):
    return kp.PreActResNet(unit=unit, stage_blocks=(1, 2), stage_filters=(8, 16),
                           stage_strides=(1, 2), stem_filters=8, input_shape=(8, 8, 3),
                           **PARAMS.get(unit, {}), **kwargs)


def test_the_graph_follows_the_unit_family():
    """He et al. 2015's conv-BN-ReLU stem for the post-activation units; a final BN-ReLU
    after the last addition for the pre-activation ones."""
    for unit in UNIT_TYPES:
        names = {layer.name for layer in _tiny(unit).layers}
        assert ("stem_bn" in names) == (unit not in ("full_preact", "relu_only_preact")), unit
        assert ("post_bn" in names) == (unit == "full_preact"), unit
        assert ("post_relu" in names) == (unit in ("full_preact", "relu_only_preact")), unit


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
    ] + ["conv1_kernel"] + [
        f"bn2_{f}" for f in ("gamma", "beta", "moving_mean", "moving_variance")
    ] + ["conv2_kernel"] + [
        f"bn3_{f}" for f in ("gamma", "beta", "moving_mean", "moving_variance")
    ] + ["conv3_kernel", "shortcut_kernel"]
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


@pytest.mark.multibackend
@pytest.mark.parametrize("build,match", [
    (lambda: PreActBasicBlock(0), "filters"),
    (lambda: PreActBasicBlock(8, strides=0), "strides"),
    (lambda: PreActBasicBlock(8, projection="yes"), "projection"),
    (lambda: PreActBasicBlock(8, shared_preact=1), "shared_preact"),
    (lambda: PreActBasicBlock(8, data_format="nhwc"), "data_format"),
    (lambda: PreActBasicBlock(8, bn_momentum=1.5), "bn_momentum"),
    (lambda: PreActBottleneckBlock(30), "divisible by `expansion`"),
    (lambda: PreActBottleneckBlock(32, bottleneck_stride="last"), "bottleneck_stride"),
    (lambda: PreActBasicBlock(16, projection=False).build((None, 8, 8, 8)), "projection=False"),
    (lambda: PreActStage("basic", 16, num_blocks=0), "num_blocks"),
    (lambda: PreActStage("wide", 16, num_blocks=2), "block='wide'"),
    (lambda: PreActBasicBlock(8, unit="conv_shortcut", projection=False),
     "conv_shortcut.*projection=False"),
    (lambda: PreActBasicBlock(8, unit="original", shared_preact=True),
     "shared_preact.*unit='original'"),
    (lambda: PreActBasicBlock(8, unit="original", seed=1), "seed.*dropout_shortcut"),
])
def test_bad_arguments_name_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()
