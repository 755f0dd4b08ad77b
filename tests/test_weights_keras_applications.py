"""The keras.applications ResNetV2 converter and layout, end to end without the network.

The reference is keras.applications' own ResNet50V2 (random weights, random BatchNorm
statistics and biases), written in the publisher's legacy `.h5` format (as Keras 2's
``save_weights`` wrote it; Keras itself loads the file back), served from 127.0.0.1
with its MD5 and resolved through the catalog entry pointed at that server. Small
inputs (64x64) keep it fast; the deeper networks are built for their parameter counts
only (slow).
"""

import dataclasses
import hashlib
import os

import h5py
import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers import PreActBottleneckBlock, PreActStage
from keras_preact.weights import catalog, fetch_weights
from keras_preact.weights.converters import keras_applications as conv
from keras_preact.weights.download import WeightsIntegrityError
from tests import references as ref
from tests.helpers import serve_directory, to_numpy

BOUND = 1e-4  # the largest allowed output difference
SIZE = (64, 64, 3)
KEYS = sorted(k for k, e in catalog.load_catalog().items() if e.converter == "keras_applications")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A static file server on 127.0.0.1 (free port) over a temporary folder."""
    root = tmp_path_factory.mktemp("keras_release")
    with serve_directory(root) as url:
        yield root, url


@pytest.fixture(scope="module")
def resnet50v2():
    """keras.applications' ResNet50V2 (64x64, logits) with random weights."""
    return ref.keras_reference(50, input_shape=SIZE, seed=0)


def _md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


def _served_entry(key, server, net, *, wrong_hash=False, subfolder="ok"):
    """The catalog entry `key` pointed at `net` published on the local server."""
    root, base = server
    entry = catalog.get_entry(key)
    name = os.path.basename(entry.url)  # the publisher's file name
    folder = root / subfolder
    folder.mkdir(exist_ok=True)
    path = ref.save_legacy_h5(net, str(folder / name))
    digest = "0" * 32 if wrong_hash else _md5(path)
    return dataclasses.replace(entry, url=f"{base}/{subfolder}/{name}",
                               hash=catalog.Hash("md5", digest)), path


def _patch_catalog(monkeypatch, entry):
    """Makes the catalog return `entry` (pointed at the local server) under its key."""
    real = catalog.load_catalog()
    patched = {**real, entry.key: entry}
    monkeypatch.setattr(catalog, "load_catalog", lambda: patched)


def test_published_format_loads_in_keras_itself(resnet50v2, tmp_path):
    path = ref.save_legacy_h5(resnet50v2, str(tmp_path / "r50.h5"))
    with h5py.File(path, "r") as f:
        assert f.attrs["keras_version"] == b"2.2.4"
        assert f["conv1_conv"].attrs["weight_names"].tolist() == [b"conv1_conv/kernel:0",
                                                                  b"conv1_conv/bias:0"]
    again = keras.applications.ResNet50V2(weights=path, input_shape=SIZE,
                                          classifier_activation=None)
    x = np.random.RandomState(0).uniform(-1, 1, (2, *SIZE)).astype("float32")
    np.testing.assert_array_equal(to_numpy(again(x)), to_numpy(resnet50v2(x)))


def test_served_file_resolves_through_the_catalog_and_matches_logits(
        resnet50v2, server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_PREACT_OFFLINE", raising=False)
    monkeypatch.delenv("KERAS_PREACT_WEIGHTS_DIR", raising=False)
    entry, _ = _served_entry("preact_resnet50.keras_imagenet", server, resnet50v2)
    path = fetch_weights(entry, progress=False, build=kp.get_model)
    model = kp.get_model("preact_resnet50", **entry.architecture, input_shape=SIZE,
                         classifier_activation=None)
    model.load_weights(path)
    assert [layer.name for layer in model.layers][:5] == [
        "images", "stem_pad", "stem_conv", "stem_pool_pad", "stem_pool"]
    x = np.random.RandomState(1).uniform(-1, 1, (2, *SIZE)).astype("float32")
    diff = np.abs(to_numpy(model(x, training=False)) - to_numpy(resnet50v2(x, training=False)))
    assert float(diff.max()) <= BOUND
    # The parameter counts are keras.applications' (BN statistics included) and the
    # catalog's; the documented 25,613,800 holds at any input size.
    assert model.count_params() == resnet50v2.count_params() == 25_613_800
    assert kp.count_params(model) == entry.params
    assert entry.converter_max_abs_diff <= BOUND

    # The factory with the tag: the keras layout and "symmetric" preprocessing come
    # from the entry; raw [0, 255] pixels in.
    _patch_catalog(monkeypatch, entry)
    pretrained = kp.preact_resnet50(weights="keras_imagenet", input_shape=SIZE,
                                    classifier_activation=None)
    assert pretrained.stride_position == "last" and pretrained.conv_bias is True
    assert pretrained.preprocessing == "symmetric"
    raw = np.random.RandomState(2).randint(0, 256, (2, *SIZE)).astype("float32")
    expected = to_numpy(resnet50v2(keras.applications.resnet_v2.preprocess_input(raw.copy())))
    assert float(np.abs(to_numpy(pretrained(raw)) - expected).max()) <= BOUND
    # Features from the same entry (the head is skipped).
    features = kp.preact_resnet50(weights="keras_imagenet", input_shape=SIZE,
                                  include_top=False, pooling="avg")
    assert features.output_shape == (None, 2048)
    # Batch statistics too (last: training mode moves both models' moving statistics).
    diff = np.abs(to_numpy(model(x, training=True)) - to_numpy(resnet50v2(x, training=True)))
    assert float(diff.max()) <= BOUND


def test_notop_file_loads_without_head(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_PREACT_OFFLINE", raising=False)
    monkeypatch.delenv("KERAS_PREACT_WEIGHTS_DIR", raising=False)
    net = ref.keras_reference(50, include_top=False, input_shape=SIZE, seed=3)
    entry, _ = _served_entry("preact_resnet50.keras_imagenet_notop", server, net, subfolder="notop")
    _patch_catalog(monkeypatch, entry)
    with pytest.raises(ValueError, match="no classifier head.*include_top=False"):
        kp.preact_resnet50(weights="keras_imagenet_notop")  # before any download
    model = kp.preact_resnet50(weights="keras_imagenet_notop", include_top=False,
                               input_shape=SIZE, preprocessing=None)
    x = np.random.RandomState(4).uniform(-1, 1, (2, *SIZE)).astype("float32")
    assert float(np.abs(to_numpy(model(x)) - to_numpy(net(x))).max()) <= BOUND
    assert model.count_params() == net.count_params()


def test_another_depth_a_missing_layer_and_a_wrong_hash_are_refused(
        resnet50v2, server, tmp_path):
    cache = tmp_path / "cache"
    # A ResNet101V2 file published under the ResNet50V2 entry: the hash is right,
    # the depth is not.
    deeper = ref.keras_reference(101, input_shape=SIZE, seed=0)
    entry, path101 = _served_entry("preact_resnet50.keras_imagenet", server, deeper,
                                   subfolder="r101")
    with pytest.raises(ValueError, match="does not match the architecture") as err:
        fetch_weights(entry, cache_dir=str(cache), progress=False, build=kp.get_model)
    message = str(err.value)
    assert "ResNet50V2 layout" in message and "conv4_block7" in message
    assert path101.split(os.sep)[-1] in message  # names the file
    assert not list(cache.glob("*.weights.h5"))
    # The other way round: the missing blocks are named.
    small = kp.preact_resnet101(**conv.KERAS_LAYOUT, input_shape=SIZE)
    _, path50 = _served_entry("preact_resnet50.keras_imagenet", server, resnet50v2, subfolder="r50")
    with pytest.raises(ValueError, match=r"missing from the file.*conv4_block10"):
        conv.load_weights(small, conv.read_legacy_h5(path50), source=path50)

    # A file without one layer: named, with nothing loaded.
    broken = tmp_path / "broken.h5"
    ref.save_legacy_h5(resnet50v2, str(broken))
    with h5py.File(broken, "a") as f:
        names = [n for n in f.attrs["layer_names"] if n != b"conv3_block2_1_bn"]
        f.attrs["layer_names"] = names
        del f["conv3_block2_1_bn"]
    model = kp.preact_resnet50(**conv.KERAS_LAYOUT, input_shape=SIZE)
    before = [to_numpy(w).copy() for w in model.weights]
    with pytest.raises(ValueError, match=r"conv3_block2_1_bn.*Nothing was loaded.*broken\.h5"):
        conv.convert(str(broken), model, {})
    assert all(np.array_equal(b, to_numpy(w)) for b, w in zip(before, model.weights))
    # Another shape (a 100-class head) names the layer and both shapes.
    other = kp.preact_resnet50(**conv.KERAS_LAYOUT, input_shape=SIZE, classes=100)
    with pytest.raises(ValueError,
                       match=r"predictions/kernel: file \(2048, 1000\), model \(2048, 100\)"):
        conv.load_weights(other, conv.read_legacy_h5(path50))

    # A wrong publisher hash: deleted, nothing cached.
    bad, _ = _served_entry("preact_resnet50.keras_imagenet", server, resnet50v2,
                           wrong_hash=True, subfolder="bad")
    with pytest.raises(WeightsIntegrityError, match="md5 hash"):
        fetch_weights(bad, cache_dir=str(cache), progress=False, build=kp.get_model)
    assert not list(cache.glob("*.weights.h5"))


def test_converter_refuses_other_layouts_and_formats(resnet50v2, tmp_path):
    path = ref.save_legacy_h5(resnet50v2, str(tmp_path / "r50.h5"))
    weights = conv.read_legacy_h5(path)
    with pytest.raises(ValueError, match=r"not built in the keras.applications ResNetV2 layout"
                                         r".*stem='imagenet'"):
        conv.load_weights(kp.preact_resnet50(input_shape=SIZE), weights)
    keras3 = tmp_path / "model.weights.h5"
    kp.preact_resnet20().save_weights(str(keras3))
    with pytest.raises(ValueError, match="not a legacy Keras HDF5 weights file"):
        conv.read_legacy_h5(str(keras3))
    junk = tmp_path / "junk.h5"
    junk.write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        conv.read_legacy_h5(str(junk))


@pytest.mark.parametrize("key", KEYS)
def test_catalog_entry_is_the_keras_source(key):
    from keras.src.applications import resnet

    e = catalog.get_entry(key)
    depth = int(e.model[len("preact_resnet"):])
    notop = e.architecture.get("include_top") is False
    name = f"resnet{depth}v2_weights_tf_dim_ordering_tf_kernels{'_notop' if notop else ''}.h5"
    assert e.url == resnet.BASE_WEIGHTS_PATH + name
    assert e.hash == catalog.Hash("md5", resnet.WEIGHTS_HASHES[f"resnet{depth}v2"][notop])
    assert {k: e.architecture[k] for k in conv.KERAS_LAYOUT} == conv.KERAS_LAYOUT
    assert e.preprocessing == "symmetric" and e.default is False
    assert e.converter_max_abs_diff is not None and e.converter_max_abs_diff <= BOUND
    assert e.metrics.top1_error == pytest.approx(
        {50: 24.0, 101: 22.8, 152: 22.0}[depth])


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_catalog_entry_has_keras_parameter_counts(key):
    e = catalog.get_entry(key)
    depth = int(e.model[len("preact_resnet"):])
    model = kp.get_model(e.model, **e.architecture)
    reference = getattr(keras.applications, conv.UPSTREAM_NAMES[depth])(
        weights=None, include_top=e.architecture.get("include_top", True))
    assert model.count_params() == reference.count_params() == e.params_keras_count_params
    del model, reference
    keras.utils.clear_session()


def test_there_are_six_keras_entries():
    assert len(KEYS) == 6


# --- the layout options themselves (every backend) ---------------------------------


@pytest.mark.multibackend
@pytest.mark.parametrize("training", [False, True])
def test_stride_on_the_last_unit_equals_a_chain_of_units(training):
    """A stage with the stride on its last unit computes what its units do one by one,
    and updates each moving statistic once."""
    x = np.random.RandomState(8).randn(2, 9, 9, 16).astype("float32")
    layout = dict(strided_shortcut="subsample", conv_bias=True)
    stage = PreActStage("bottleneck", 16, units=4, strides=2, stride_position="last", **layout)
    stage.build(x.shape)
    rng = np.random.RandomState(0)
    for w in stage.weights:
        low = 0.5 if w.name.endswith(("gamma", "variance")) else -0.5
        w.assign(rng.uniform(low, low + 1.0, tuple(w.shape)).astype("float32"))
    assert stage.num_stacked == 2 and stage.unit1.strides == 1 and stage.unit_last.strides == 2
    assert not stage.unit_last.has_projection  # the subsampled identity
    units = [PreActBottleneckBlock(16, **layout) for _ in range(2)]
    for i, unit in enumerate(units):
        unit.build((None, 9, 9, 16))
        for w in unit.weights:
            w.assign(to_numpy(stage.get_variable(w.name))[i])
    saved = [to_numpy(w).copy() for w in stage.unit1.weights + stage.unit_last.weights]
    y_ref = x
    for unit in [stage.unit1] + units + [stage.unit_last]:
        y_ref = to_numpy(unit(y_ref, training=training))
    ref_stats = np.stack([to_numpy(u.get_variable("bn3_moving_mean")) for u in units])
    last_stats = to_numpy(stage.unit_last.get_variable("bn3_moving_mean")).copy()
    for w, v in zip(stage.unit1.weights + stage.unit_last.weights, saved):
        w.assign(v)
    y, inputs = stage(x, training=training, return_unit_inputs=True)
    assert len(inputs) == 4 and tuple(y.shape) == (2, 5, 5, 16)
    np.testing.assert_allclose(to_numpy(y), y_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(stage.get_variable("bn3_moving_mean")), ref_stats,
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(stage.unit_last.get_variable("bn3_moving_mean")),
                               last_stats, rtol=1e-5, atol=1e-6)
    # The subsampled shortcut: every second pixel of the raw input, exactly what
    # keras.applications' MaxPooling2D(1, strides=2) keeps (odd size included).
    from keras_preact.layers.unit_ops import subsample

    np.testing.assert_array_equal(to_numpy(subsample(x, 2, "channels_last")),
                                  to_numpy(keras.layers.MaxPooling2D(1, strides=2)(x)))


@pytest.mark.multibackend
def test_keras_layout_checks_its_options(tmp_path):
    """(Its round trips: test_models.py::test_harness[keras_applications_layout].)"""
    tiny = dict(block="bottleneck", stage_blocks=(2, 3), stage_filters=(32, 64),
                stage_strides=(2, 1), stem="imagenet_preact", stem_kernel_size=7,
                stem_strides=2, stem_filters=8, stride_position="last",
                strided_shortcut="subsample", conv_bias=True, bottleneck_stride="middle",
                bn_epsilon=1.001e-5, input_shape=(32, 32, 3), classes=3)
    model = kp.PreActResNet(**tiny)
    assert model.get_layer("stage1").unit_last is not None
    assert model.get_layer("stage2").unit_last is None  # stride 1: all stacked
    assert model.get_layer("stem_conv").use_bias
    # A weights file of the keras layout does not load into the paper's layout.
    weights = str(tmp_path / "tiny.weights.h5")
    from keras_preact.weights import local

    local.save_weights_file(model, weights)
    with pytest.raises(ValueError, match="does not match the architecture"):
        local.load_weights_file(kp.PreActResNet(**{**tiny, "stride_position": "first",
                                                  "stage_strides": (1, 2)}), weights)
    for change, match in (
        ({"stride_position": "middle"}, "stride_position"),
        ({"strided_shortcut": "pool"}, "strided_shortcut"),
        ({"conv_bias": 1}, "conv_bias"),
        ({"conv_bias": True, "unit": "original"}, "conv_bias=True"),
        ({"stage_blocks": (1, 3)}, "at least 2 units"),
    ):
        with pytest.raises(ValueError, match=match):
            kp.PreActResNet(**{**tiny, **change})
