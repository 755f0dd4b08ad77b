"""The factories' `weights=`: tags, files, `.keras`, URLs; wrong architectures fail loudly."""

import hashlib
import json
import os
import socket

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import weights as W
from keras_preact.weights import local
from tests.helpers import to_numpy

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "preact_resnet20_variable_layout.json")


def _x(shape=(16, 16, 3), n=2):
    return (np.random.RandomState(0).rand(n, *shape) * 255).astype("float32")


@pytest.fixture
def no_network(monkeypatch):
    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            raise AssertionError("a socket was opened")

    monkeypatch.setattr(socket, "socket", NoSocket)


@pytest.fixture
def offline_catalog(tmp_path, monkeypatch):
    """The real `preact_resnet20.cifar10` entry, resolved offline from an admin folder
    holding a converted file (random weights of the entry's architecture)."""
    admin = tmp_path / "admin"
    admin.mkdir()
    entry = W.get_entry("preact_resnet20.cifar10")
    source = kp.preact_resnet20(**entry.architecture)
    W.save_weights_file(source, str(admin / "preact_resnet20.cifar10.weights.h5"))
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(admin))
    monkeypatch.setenv("KERAS_PREACT_OFFLINE", "1")
    return entry, source


def test_catalog_tag_loads_with_its_architecture_and_preprocessing(offline_catalog, no_network):
    entry, source = offline_catalog
    model = kp.preact_resnet20(weights="cifar10")
    assert model.first_shared_preact is entry.architecture["first_shared_preact"]
    assert model.preprocessing == entry.preprocessing == "cifar10"
    assert model.classes == 10 and model.input_shape == (None, 32, 32, 3)
    # The source had no preprocessing: normalise by hand to compare.
    x = _x((32, 32, 3))
    from keras_preact.layers.preprocessing import resolve_preprocessing

    scale, mean, std = resolve_preprocessing("cifar10")
    normalised = (x * scale - np.array(mean, "float32")) / np.array(std, "float32")
    np.testing.assert_allclose(to_numpy(model(x)), to_numpy(source(normalised)), atol=1e-5)
    # Same weights by key and by DEFAULT; an explicit preprocessing wins.
    again = kp.preact_resnet20(weights="preact_resnet20.cifar10", preprocessing=None)
    assert again.preprocessing is None
    np.testing.assert_allclose(to_numpy(again(normalised)), to_numpy(source(normalised)), atol=1e-5)
    assert kp.preact_resnet20(weights="DEFAULT", include_top=False).output_shape == (None, 8, 8, 64)


def test_a_fetched_file_loads_as_its_tag_does(offline_catalog, no_network):
    """`weights=fetch_weights(key)` builds the entry's architecture and preprocessing
    from the file alone (it used to raise for first_shared_preact, or to load
    without the normalisation)."""
    entry, _ = offline_catalog
    path = W.fetch_weights("preact_resnet20.cifar10", build=kp.get_model)
    by_tag = kp.preact_resnet20(weights="cifar10")
    by_path = kp.preact_resnet20(weights=path)
    assert by_path.first_shared_preact is False
    assert by_path.preprocessing == entry.preprocessing
    x = _x((32, 32, 3))
    np.testing.assert_array_equal(to_numpy(by_path(x)), to_numpy(by_tag(x)))
    # The caller's preprocessing wins; a conflicting architecture argument says what to pass.
    assert kp.preact_resnet20(weights=path, preprocessing=None).preprocessing is None
    with pytest.raises(ValueError, match=r"made for first_shared_preact=False\. Received: "
                                         r"first_shared_preact=True"
                                         r".*Pass first_shared_preact=False"):
        kp.preact_resnet20(weights=path, first_shared_preact=True)
    with pytest.raises(ValueError, match=r"made for stage_blocks=\[3, 3, 3\], the model has"):
        kp.preact_resnet56(weights=path)


def test_a_saved_file_rebuilds_its_model_in_python_and_from_keras_files(tmp_path):
    source = kp.preact_resnet20(first_shared_preact=False, preprocessing="cifar10",
                                bottleneck_stride="first", input_shape=(16, 16, 3), classes=3)
    x = _x()
    source.save_weights(str(tmp_path / "plain_api.weights.h5"))  # Keras' own API records too
    for path in (W.save_weights_file(source, str(tmp_path / "r20.weights.h5")),
                 str(tmp_path / "plain_api.weights.h5"), str(tmp_path / "r20.keras")):
        if path.endswith(".keras"):
            source.save(path)
        model = kp.preact_resnet20(weights=path)
        assert (model.first_shared_preact, model.preprocessing, model.classes) == (
            False, "cifar10", 3)
        assert model.input_shape == (None, 16, 16, 3)
        np.testing.assert_array_equal(to_numpy(model(x)), to_numpy(source(x)))


def test_tag_errors_come_before_any_layer_or_download(built_convs, no_network):
    with pytest.raises(ValueError, match=r"weights='imagenet'.*cifar10.*cifar100.*svhn"):
        kp.preact_resnet20(weights="imagenet")
    with pytest.raises(ValueError, match="10 classes. Received: classes=100"):
        kp.preact_resnet20(weights="cifar10", classes=100)
    with pytest.raises(ValueError, match="are for 'preact_resnet110', not 'preact_resnet20'"):
        kp.preact_resnet20(weights="preact_resnet110.cifar10")
    with pytest.raises(ValueError, match="made for first_shared_preact=False"):
        kp.preact_resnet20(weights="cifar10", first_shared_preact=True)
    with pytest.raises(ValueError, match="3-channel input"):
        kp.preact_resnet20(weights="cifar10", input_shape=(32, 32, 1))
    with pytest.raises(ValueError, match="needs its hash"):
        kp.preact_resnet20(weights="https://example.invalid/a.weights.h5")
    # Other bad arguments also fail before the download (no socket is opened).
    with pytest.raises(ValueError, match="too small"):
        kp.preact_resnet20(weights="cifar10", input_shape=(4, 4, 3))
    with pytest.raises(ValueError, match="Unknown `classifier_activation`"):
        kp.preact_resnet20(weights="https://example.invalid/a.weights.h5#md5=" + "0" * 32,
                           classifier_activation="nope")
    assert built_convs == []


def test_url_with_hash_forms(tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_PREACT_OFFLINE", raising=False)
    source = kp.preact_resnet20(input_shape=(16, 16, 3), classes=4)
    path = W.save_weights_file(source, str(tmp_path / "pub" / "r20.weights.h5"))
    data = open(path, "rb").read()
    url = "file://" + path
    x = _x()
    by_fragment = kp.preact_resnet20(weights=f"{url}#sha256={hashlib.sha256(data).hexdigest()}")
    assert by_fragment.classes == 4 and by_fragment.input_shape == (None, 16, 16, 3)
    np.testing.assert_allclose(to_numpy(by_fragment(x)), to_numpy(source(x)), atol=1e-6)
    by_dict = kp.preact_resnet20(
        weights={"url": url, "hash": "md5:" + hashlib.md5(data).hexdigest()})
    np.testing.assert_allclose(to_numpy(by_dict(x)), to_numpy(source(x)), atol=1e-6)
    with pytest.raises(ValueError, match="4 classes. Received: classes=10"):
        kp.preact_resnet20(weights={"url": url, "hash": "md5:" + hashlib.md5(data).hexdigest()},
                           classes=10)


def test_wrong_depth_unit_and_head_fail_loudly(tmp_path):
    source = kp.preact_resnet20(input_shape=(16, 16, 3))
    path = W.save_weights_file(source, str(tmp_path / "r20.weights.h5"))
    plain = str(tmp_path / "plain.weights.h5")
    source.save_weights(plain)  # a plain Keras file: no recorded layout
    for weights in (path, plain):
        with pytest.raises(ValueError, match="does not match the architecture"):
            kp.preact_resnet32(weights=weights)  # another depth
        with pytest.raises(ValueError, match="does not match the architecture"):
            kp.preact_resnet_cifar(20, block="bottleneck", weights=weights)  # another unit
        with pytest.raises(ValueError, match="10 classes. Received: classes=5"):
            kp.preact_resnet20(weights=weights, classes=5)  # another head
    # Same shapes, other meaning: recorded architecture arguments are compared, by the
    # factory (which says what to pass) and by the loader itself.
    with pytest.raises(ValueError, match="made for first_shared_preact=True. Received: "
                                         "first_shared_preact=False"):
        kp.preact_resnet20(weights=path, first_shared_preact=False)
    other = kp.preact_resnet20(first_shared_preact=False, input_shape=(16, 16, 3))
    with pytest.raises(ValueError, match="made for first_shared_preact=True, the model has "
                                         "first_shared_preact=False"):
        W.load_weights_file(other, path)
    # A headless file into a model with a head.
    headless = W.save_weights_file(kp.preact_resnet20(include_top=False, input_shape=(16, 16, 3)),
                                   str(tmp_path / "features.weights.h5"))
    with pytest.raises(ValueError, match="no classifier head"):
        kp.preact_resnet20(weights=headless)
    features = kp.preact_resnet20(weights=path, include_top=False, pooling="avg")
    assert features.output_shape == (None, 64)
    with pytest.raises(ValueError, match="3-channel input.*1 channels"):
        kp.preact_resnet20(weights=plain, input_shape=(16, 16, 1))
    with pytest.raises(ValueError, match="ending in '.weights.h5'"):
        kp.preact_resnet20(weights=str(tmp_path / "model.keras"))
    (tmp_path / "text.weights.h5").write_text("not hdf5")
    with pytest.raises(ValueError, match="not an HDF5 file"):
        kp.preact_resnet20(weights=str(tmp_path / "text.weights.h5"))


class _Chain(keras.Model):
    """Two equally shaped Dense layers held in a list, always applied a then b."""

    def __init__(self, order, **kwargs):
        super().__init__(**kwargs)
        self.blocks = [keras.layers.Dense(4, name=name) for name in order]

    def call(self, x):
        by_name = {layer.name: layer for layer in self.blocks}
        return by_name["b"](by_name["a"](x))


def test_reordered_layers_with_equal_shapes_are_detected(tmp_path):
    x = np.random.RandomState(1).rand(3, 4).astype("float32")
    saved = _Chain("ab")
    saved(x)
    path = W.save_weights_file(saved, str(tmp_path / "ab.weights.h5"))
    # Plain Keras matches by creation order: layers created in the other order load
    # silently wrong.
    keras_loaded = _Chain("ba")
    keras_loaded(x)
    keras_loaded.load_weights(path)
    assert np.abs(to_numpy(keras_loaded(x)) - to_numpy(saved(x))).max() > 1e-3
    reordered = _Chain("ba")
    reordered(x)
    with pytest.raises(ValueError,
                       match=r"first difference is variable 0 .*'b/kernel'.*'a/kernel'"):
        W.load_weights_file(reordered, path)
    same = _Chain("ab")
    same(x)
    W.load_weights_file(same, path)
    np.testing.assert_allclose(to_numpy(same(x)), to_numpy(saved(x)), atol=1e-6)


def test_recorded_variable_layout_is_frozen(tmp_path):
    model = kp.preact_resnet20()
    path = W.save_weights_file(model, str(tmp_path / "r20.weights.h5"))
    layout, architecture, _ = local.read_recorded(path)
    with open(GOLDEN) as f:
        golden = json.load(f)
    assert layout == golden["layout"]
    assert architecture == golden["architecture"]


def test_keras_files_load_safely_and_refuse_lambda(tmp_path):
    source = kp.preact_resnet20(input_shape=(16, 16, 3), preprocessing="unit", classes=3)
    path = str(tmp_path / "r20.keras")
    source.save(path)
    model = kp.preact_resnet20(weights=path)
    assert model.classes == 3 and model.preprocessing == "unit"
    np.testing.assert_allclose(to_numpy(model(_x())), to_numpy(source(_x())), atol=1e-6)
    with pytest.raises(ValueError, match="does not match the architecture"):
        kp.preact_resnet32(weights=path, input_shape=(16, 16, 3))
    with pytest.raises(ValueError, match="3 classes. Received: classes=10"):
        kp.preact_resnet20(weights=path, classes=10)

    inputs = keras.Input((16, 16, 3))
    lam = keras.Model(inputs, keras.layers.Lambda(lambda t: t * 2.0, name="double")(inputs))
    lam_path = str(tmp_path / "lambda.keras")
    lam.save(lam_path)
    with pytest.raises(ValueError, match="Lambda layer \\('double'\\).*safe_mode=True"):
        kp.preact_resnet20(weights=lam_path)
    with pytest.raises(ValueError, match="safe_mode"):
        kp.load_model(lam_path)
