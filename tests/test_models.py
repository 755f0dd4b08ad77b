"""The registry's models: structure, exact parameter counts, training, saving."""

import functools
import json
import os

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers import UNIT_TYPES
from keras_preact.zoo_catalog import load_json
from tests import harness
from tests.helpers import to_numpy

# Trainable parameters of the published pytorchcv CIFAR-10 and ImageNet-1k models of
# the same layout.
PUBLISHED_PARAMS = {
    "preact_resnet20": 272_282,
    "preact_resnet56": 855_578,
    "preact_resnet110": 1_730_522,
    "preact_resnet164": 1_703_258,
    "preact_resnet272": 2_816_090,
    "preact_resnet542": 5_598_170,
    "preact_resnet1001": 10_327_706,
    "preact_resnet1202": 19_423_834,
    "preact_resnet18": 11_687_848,
    "preact_resnet34": 21_796_008,
    "preact_resnet50": 25_549_480,
    "preact_resnet101": 44_541_608,
    "preact_resnet152": 60_185_256,
    "preact_resnet200": 64_666_280,
}

ALL = kp.list_models()
CIFAR = kp.list_models(family="cifar")
IMAGENET = kp.list_models(family="imagenet")
SMALL = [n for n in CIFAR if kp.model_info(n)["depth"] <= 56]


def _images(n=4, size=32, seed=0):
    return np.random.RandomState(seed).uniform(0, 1, (n, size, size, 3)).astype("float32")


def test_registry_lists_the_paper_networks():
    expected = {f"preact_resnet{d}" for d in (20, 32, 44, 56, 110, 164, 272, 542, 1001, 1202)}
    assert expected == set(CIFAR)
    assert set(IMAGENET) < set(PUBLISHED_PARAMS)
    assert ALL == CIFAR + IMAGENET
    for family in (CIFAR, IMAGENET):
        assert ([kp.model_info(n)["depth"] for n in family]
                == sorted(kp.model_info(n)["depth"] for n in family))
    assert kp.list_models("preact_resnet1*", family="cifar") == [
        "preact_resnet110", "preact_resnet164", "preact_resnet1001", "preact_resnet1202"
    ]
    assert kp.list_models("preact_resnet1*", family="imagenet") == [
        "preact_resnet18", "preact_resnet101", "preact_resnet152"
    ]


def test_catalog_table_agrees_with_the_registry():
    table = load_json("models.json")["models"]
    assert list(table) == ALL  # in order: the weights catalog lists its entries so
    for name, row in table.items():
        info = kp.model_info(name)
        assert (row["depth"], row["block"]) == (info["depth"], info["block"])
        # The parameter counts are stored once, in the weights catalog.
        if name in PUBLISHED_PARAMS:
            tag = "cifar10" if info["family"] == "cifar" else "imagenet"
            assert kp.weights.get_entry(f"{name}.{tag}").params == PUBLISHED_PARAMS[name]


@pytest.mark.parametrize(
    "depth,block,units",
    [(20, "basic", 3), (110, "basic", 18), (1202, "basic", 200), (164, "bottleneck", 18),
     (272, "bottleneck", 30), (542, "bottleneck", 60), (1001, "bottleneck", 111),
     (56, "basic", 9), (29, "basic", None)],
)
def test_auto_block_rule(depth, block, units):
    if units is None:  # 29 = 9*3 + 2 but < 164 -> basic, and 27 is not divisible by 6
        with pytest.raises(ValueError, match="6n\\+2"):
            kp.models.cifar_units_per_stage(depth)
        assert kp.models.cifar_units_per_stage(depth, "bottleneck") == ("bottleneck", 3)
        return
    assert kp.models.cifar_units_per_stage(depth) == (block, units)


# --- the harness (tests/harness.py) over the registry and the architecture's variants ---
TINY = dict(stage_blocks=(1, 1, 1), stage_filters=(8, 16, 32), stem_filters=8, classes=3)
BOTTLENECK = dict(TINY, block="bottleneck", stage_filters=(16, 32, 64))
REMAT = dict(stage_blocks=(4, 3), stage_strides=(1, 2), stem_filters=8, classes=5,
             bn_momentum=0.7, remat="segment")
ROUND_TRIPS = ("config", "keras")
#: name -> (PreActResNet arguments or a registered name, input shape, harness cases).
HARNESS = {
    "preact_resnet20": ("preact_resnet20", (32, 32, 3), harness.CASES),
    **{n: (n, (32, 32, 3), ("keras", "train")) for n in SMALL if n != "preact_resnet20"},
    "tiny_basic": (TINY, (16, 16, 3), harness.CASES),
    "tiny_bottleneck": (BOTTLENECK, (16, 16, 3), harness.CASES),
    "tiny_bottleneck_first": (dict(BOTTLENECK, bottleneck_stride="first"), (16, 16, 3),
                              ("config", "data_format", "precision")),
    "tiny_preprocessing": (dict(TINY, preprocessing="cifar10"), (16, 16, 3), ROUND_TRIPS),
    "tiny_imagenet_stem": (dict(BOTTLENECK, stem="imagenet", stage_blocks=(1, 1),
                                stage_filters=(16, 32), stage_strides=(1, 2)), (32, 32, 3),
                           ("config", "keras", "data_format")),
    "keras_applications_layout": (dict(
        block="bottleneck", stage_blocks=(2, 3), stage_filters=(32, 64), stage_strides=(2, 1),
        stem="imagenet_preact", stem_kernel_size=7, stem_strides=2, stem_filters=8,
        stride_position="last", strided_shortcut="subsample", conv_bias=True,
        bottleneck_stride="middle", bn_epsilon=1.001e-5, classes=3), (32, 32, 3),
        ("config", "keras", "data_format")),
    "backbone": (dict(TINY, features=True), (16, 16, 3), ("config", "keras", "data_format")),
    "remat_basic": (dict(REMAT, stage_filters=(8, 16)), (8, 8, 3), ROUND_TRIPS),
    "remat_bottleneck": (dict(REMAT, block="bottleneck", stage_filters=(16, 32)), (8, 8, 3),
                         ROUND_TRIPS),
    **{f"unit_{u}": (dict(stage_blocks=(1, 2), stage_filters=(8, 16), stage_strides=(1, 2),
                          stem_filters=8, unit=u, **harness.UNIT_PARAMS.get(u, {})), (8, 8, 3),
                     ROUND_TRIPS) for u in UNIT_TYPES},
}


@pytest.mark.multibackend
@pytest.mark.parametrize("name", HARNESS)
def test_harness(name, tmp_path):
    keras.utils.set_random_seed(0)
    model, input_shape, cases = HARNESS[name]
    if isinstance(model, str):
        make = functools.partial(kp.get_model, model)
    else:
        make = functools.partial(kp.PreActResNet, **model)
    harness.run_model_test(make, input_shape, tmp_path, cases)


@pytest.mark.multibackend
def test_feature_extractor_modes(tiny_model_kwargs):
    x = _images(2, size=16)
    fmap = kp.PreActResNet(include_top=False, **tiny_model_kwargs)
    assert to_numpy(fmap(x)).shape == (2, 4, 4, 32)
    for pooling in ("avg", "max"):
        vec = kp.PreActResNet(include_top=False, pooling=pooling, **tiny_model_kwargs)
        assert to_numpy(vec(x)).shape == (2, 32)
    logits = kp.PreActResNet(classifier_activation=None, **tiny_model_kwargs)
    assert not np.allclose(to_numpy(logits(x)).sum(axis=1), 1.0)


@pytest.mark.multibackend
def test_preprocessing_is_built_in(tiny_model_kwargs):
    raw = np.random.RandomState(1).randint(0, 256, (2, 16, 16, 3)).astype("float32")
    with_pre = kp.PreActResNet(preprocessing="cifar10", **tiny_model_kwargs)
    without = kp.PreActResNet(**tiny_model_kwargs)
    assert len(without.weights) == len(with_pre.weights)
    without.set_weights(with_pre.get_weights())
    mean = np.array([0.4914, 0.4822, 0.4465], "float32")
    std = np.array([0.2023, 0.1994, 0.2010], "float32")
    np.testing.assert_allclose(
        to_numpy(with_pre(raw)), to_numpy(without((raw / 255.0 - mean) / std)), atol=1e-5
    )
    sym = kp.PreActResNet(preprocessing="symmetric", **tiny_model_kwargs)
    assert sym.get_layer("preprocessing").get_config()["scale"] == pytest.approx(1 / 127.5)
    custom = kp.PreActResNet(preprocessing={"mean": [0.5], "std": [0.25]}, **tiny_model_kwargs)
    assert custom.get_config()["preprocessing"] == {"mean": [0.5], "std": [0.25]}


# --- every registered model: build, exact parameter count, a small forward ------
@pytest.mark.parametrize(
    "name", [n if n in SMALL else pytest.param(n, marks=pytest.mark.slow) for n in ALL])
def test_every_registered_model_builds_with_exact_params_and_runs(name):
    info = kp.model_info(name)
    imagenet = info["family"] == "imagenet"
    model = kp.get_model(name)
    assert model.input_shape == ((None, 224, 224, 3) if imagenet else (None, 32, 32, 3))
    assert model.depth == info["depth"]
    if name in PUBLISHED_PARAMS:
        assert kp.count_params(model) == PUBLISHED_PARAMS[name]
    # The costs `keras-preact list` and the docs show without building the model.
    recorded = load_json("models.json")["models"][name]
    assert (recorded["params"], recorded["macs"]) == (kp.count_params(model), kp.count_macs(model))
    if imagenet:
        # The same weights run on a small input: 64x64 leaves a 2x2 map before pooling.
        model = kp.get_model(name, input_shape=(64, 64, 3), classes=5)
    # Batch statistics (training=True): at initialisation the moving variance is 1,
    # and inference mode overflows through hundreds of un-normalised units.
    out = to_numpy(model(_images(1, size=model.input_shape[1]), training=True))
    assert out.shape == (1, 5 if imagenet else 10) and np.all(np.isfinite(out))
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)


def test_multiply_adds():
    # ResNet-20 by hand: stem + 3 stages of 3 basic units + projections + head.
    def conv(h, k, cin, cout):
        return h * h * k * k * cin * cout

    r20 = conv(32, 3, 3, 16)
    r20 += 6 * conv(32, 3, 16, 16)
    r20 += conv(16, 3, 16, 32) + 5 * conv(16, 3, 32, 32) + conv(16, 1, 16, 32)
    r20 += conv(8, 3, 32, 64) + 5 * conv(8, 3, 64, 64) + conv(8, 1, 32, 64)
    r20 += 64 * 10
    assert kp.count_macs(kp.preact_resnet20()) == r20
    macs110 = kp.count_macs(kp.preact_resnet110())
    assert abs(macs110 - 253e6) / 253e6 < 0.01  # "about 253M"
    with pytest.raises(ValueError, match="fixed input size"):
        kp.count_macs(kp.preact_resnet20(input_shape=(None, None, 3)))


def test_weights_file_layout_is_frozen(tmp_path):
    """`.weights.h5` matches by creation order: a silent reordering would load weights into
    wrong places (the round trip itself: tests/harness.py, case "weights")."""
    import h5py

    path = str(tmp_path / "r20.weights.h5")
    kp.preact_resnet20().save_weights(path)
    layout = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, obj: layout.append([n, list(obj.shape)])
                     if isinstance(obj, h5py.Dataset) else None)
    with open(os.path.join(os.path.dirname(__file__), "golden",
                           "preact_resnet20_weights_layout.json")) as f:
        assert layout == json.load(f)


@pytest.mark.slow
def test_default_recursion_limit_build_and_keras_round_trip_of_resnet1001():
    """Runs in a fresh interpreter, so the recursion limit is Python's default."""
    from tests.helpers import run_python

    code = """
import sys, os, tempfile, numpy as np, keras, keras_preact as kp
assert sys.getrecursionlimit() == 1000
m = kp.preact_resnet1001()
x = np.random.RandomState(0).rand(2, 32, 32, 3).astype("float32")
# Batch statistics: at initialisation (moving variance 1) inference mode overflows
# through 333 units, as it would in any framework.
y = keras.ops.convert_to_numpy(m(x, training=True))
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "m.keras")
    m.save(p)
    z = keras.ops.convert_to_numpy(keras.saving.load_model(p)(x, training=True))
assert np.isfinite(y).all()
print("DIFF", float(np.abs(y - z).max()), kp.count_params(m))
"""
    proc = run_python(code, env={"KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff, params = proc.stdout.split("DIFF")[1].split()
    assert float(diff) < 1e-5 and int(params) == PUBLISHED_PARAMS["preact_resnet1001"]



def test_imagenet_layout_and_feature_extraction():
    model = kp.preact_resnet50(input_shape=(64, 64, 3), include_top=False)
    names = [layer.name for layer in model.layers]
    assert names[:7] == ["images", "stem_pad", "stem_conv", "stem_bn", "stem_relu",
                         "stem_pool_pad", "stem_pool"]
    assert model.get_config()["stem"] == "imagenet"
    assert model.get_config()["bottleneck_stride"] == "first"  # the paper's code
    assert model.output_shape == (None, 2, 2, 2048)  # total stride 32
    pooled = kp.preact_resnet18(input_shape=(64, 64, 3), include_top=False, pooling="avg")
    assert pooled.output_shape == (None, 512)
    # 7x7 stride-2 stem + 3x3 stride-2 pool + stages: 1,820.6M multiply-adds at 224
    # for ResNet-18 in imgclsmob's table (which also counts the element-wise work).
    macs18 = kp.count_macs(kp.preact_resnet18())
    assert 1.78e9 < macs18 < 1.83e9
    with pytest.raises(ValueError, match="depth=19"):
        kp.preact_resnet_imagenet(19)
    with pytest.raises(ValueError, match="stem.*fixed by the registered model"):
        kp.preact_resnet18(stem="cifar")
    with pytest.raises(ValueError, match="stem='vgg'"):
        kp.PreActResNet(stem="vgg")


def test_head_dropout_drops_in_training_only_and_leaves_the_weights_alone(tmp_path):
    model = kp.preact_resnet20(head_dropout=0.5)
    x = np.random.RandomState(0).rand(4, 32, 32, 3).astype("float32")
    assert not np.allclose(model(x, training=True), model(x, training=False))
    assert kp.PreActResNet.from_config(model.get_config()).spec.head_dropout == 0.5
    path = str(tmp_path / "m.weights.h5")
    kp.weights.local.save_weights_file(model, path)
    np.testing.assert_array_equal(kp.preact_resnet20(weights=path)(x), model(x))
    with pytest.raises(ValueError, match=r"`head_dropout` must be None or a rate in \[0, 1\)"):
        kp.preact_resnet20(head_dropout=1.5)
