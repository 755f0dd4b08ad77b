"""Names that changed keep working for one release, with a FutureWarning that
names the new spelling, and give the same result as the new name."""

import warnings

import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers import PreActStage


def _outputs(layer_or_model, shape, seed=0):
    x = np.random.default_rng(seed).normal(size=shape).astype("float32")
    return np.asarray(layer_or_model(x, training=False))


def test_stage_units_is_num_blocks():
    new = PreActStage("basic", 8, num_blocks=3, name="stage")
    with pytest.warns(FutureWarning, match="`units` of PreActStage .* use `num_blocks`"):
        old = PreActStage("basic", 8, units=3, name="stage")
    assert old.num_blocks == 3 and old.get_config()["num_blocks"] == 3
    _outputs(new, (2, 8, 8, 8))
    _outputs(old, (2, 8, 8, 8))
    old.set_weights(new.get_weights())
    np.testing.assert_array_equal(_outputs(old, (2, 8, 8, 8)), _outputs(new, (2, 8, 8, 8)))
    # A config saved before the rename still deserialises.
    config = {**new.get_config(), "units": 3}
    del config["num_blocks"]
    with pytest.warns(FutureWarning):
        assert PreActStage.from_config(config).num_blocks == 3


def test_first_unit_shared_preact_is_first_shared_preact(tmp_path):
    new = kp.preact_resnet20(first_shared_preact=False, input_shape=(16, 16, 3))
    with pytest.warns(FutureWarning, match="use `first_shared_preact`"):
        old = kp.preact_resnet20(first_unit_shared_preact=False, input_shape=(16, 16, 3))
    with pytest.warns(FutureWarning, match="use `first_shared_preact`"):
        direct = kp.PreActResNet(first_unit_shared_preact=False, input_shape=(16, 16, 3))
    assert old.first_shared_preact is False and direct.first_shared_preact is False
    assert "first_unit_shared_preact" not in old.get_config()
    old.set_weights(new.get_weights())
    np.testing.assert_array_equal(_outputs(old, (2, 16, 16, 3)), _outputs(new, (2, 16, 16, 3)))
    # Keras' saver reads every attribute: the models carry no alias attribute that warns.
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        old.save(tmp_path / "old.keras")


def test_catalog_input_size_is_input_shape():
    from keras_preact.weights import catalog, get_entry

    entry = get_entry("preact_resnet20.cifar10")
    with pytest.warns(FutureWarning, match="use `input_shape`"):
        assert entry.input_size == entry.input_shape == (32, 32, 3)
    fields = {"model": "preact_resnet20", "tag": "mine", "url": "https://h/f.h5",
              "hash": {"algorithm": "sha256", "value": "0" * 64}, "converter": "keras_weights"}
    with pytest.warns(FutureWarning, match="use `input_shape`"):
        old = catalog.validate_entry({**fields, "input_size": [24, 24, 3]}, strict=False)
    assert old == catalog.validate_entry({**fields, "input_shape": [24, 24, 3]}, strict=False)


def test_compare_units_input_size_is_input_shape():
    from keras_preact import diagnostics

    kwargs = dict(units=["full_preact"], batch_size=2, seed=0)
    new = diagnostics.compare_units("preact_resnet20", input_shape=(8, 8, 3), **kwargs)
    with pytest.warns(FutureWarning, match="use `input_shape`"):
        old = diagnostics.compare_units("preact_resnet20", input_size=8, **kwargs)
    assert old[0].rows == new[0].rows


def test_dataset_info_old_keys():
    from keras_preact.data import dataset_info

    info = dataset_info("digits")
    for old, new in (("num_classes", "classes"), ("image_shape", "input_shape")):
        with pytest.warns(FutureWarning, match=f"use `{new}`"):
            assert info[old] == info[new]
    with pytest.raises(KeyError):
        info["nope"]
