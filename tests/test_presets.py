"""Preset folders in keras-hub's layout: `save_preset`, `from_preset` and ``weights=<folder>``."""

import importlib
import json
import os

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.weights import presets
from tests.helpers import to_numpy

IMAGES = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("float32")


@pytest.fixture
def saved(tmp_path):
    # Arguments a factory does not default to, so that only the preset can restore them.
    model = kp.preact_resnet20(classes=7, first_shared_preact=False, preprocessing="cifar10")
    return model, kp.save_preset(model, tmp_path / "preset")


@pytest.mark.multibackend
def test_a_preset_round_trips(saved):
    model, folder = saved
    assert sorted(os.listdir(folder)) == ["config.json", "metadata.json", "model.weights.h5"]
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)
    assert config["class_name"] == "PreActResNet" and config["config"]["classes"] == 7
    with open(os.path.join(folder, "metadata.json")) as f:
        assert json.load(f)["parameter_count"] == model.count_params()
    expected = to_numpy(model(IMAGES))
    np.testing.assert_array_equal(to_numpy(kp.from_preset(folder)(IMAGES)), expected)
    built = kp.preact_resnet20(weights=folder)
    assert (built.classes, built.first_shared_preact) == (7, False)
    np.testing.assert_array_equal(to_numpy(built(IMAGES)), expected)


def test_a_preset_gives_its_backbone(saved):
    model, folder = saved
    expected = model.pyramid_outputs["P1"]
    reference = keras.Model(model.input, expected)(IMAGES)
    for backbone in (kp.from_preset(folder, features=True),
                     kp.preact_resnet20(weights=folder, features=True)):
        np.testing.assert_array_equal(to_numpy(backbone(IMAGES)["P1"]), to_numpy(reference))


def test_a_preset_is_not_overwritten_without_asking(saved):
    model, folder = saved
    before = {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)}
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        kp.save_preset(kp.preact_resnet20(), folder)
    assert {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)} == before
    kp.save_preset(kp.preact_resnet20(), folder, overwrite=True)
    assert kp.from_preset(folder).classes == 10


def test_a_folder_of_other_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for target in (tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(ValueError, match="a file or a folder of other files"):
            kp.save_preset(kp.preact_resnet20(), target)
    assert os.listdir(tmp_path) == ["notes.txt"]


def test_a_folder_that_is_not_a_preset_is_one_line(tmp_path):
    with pytest.raises(ValueError, match="Not a preset: .*config.json' does not exist"):
        kp.from_preset(tmp_path)


def test_a_preset_of_another_depth_is_refused(saved):
    with pytest.raises(ValueError, match="stage_blocks=.* Nothing was loaded"):
        kp.preact_resnet56(weights=saved[1])


@pytest.mark.parametrize("handle, module, call", [
    ("hf://keras-preact/r20", "huggingface_hub",
     ("hf_hub_download", {"repo_id": "keras-preact/r20", "filename": "config.json"})),
    ("kaggle://org/r20/keras/v1", "kagglehub", ("model_download", ("org/r20/keras/v1",
                                                                    "config.json"))),
])
def test_remote_handles_are_fetched_by_the_hub_libraries(saved, monkeypatch, handle, module,
                                                        call):
    # No network here: the hub library's download function is replaced by a local copy.
    hub = importlib.import_module(module)  # installed by the `hub` extra
    seen = []

    def download(*args, **kwargs):
        seen.append(kwargs or args)
        name = kwargs.get("filename") or args[1]
        return os.path.join(saved[1], name)

    monkeypatch.setattr(hub, call[0], download)
    model = kp.from_preset(handle)
    assert seen[0] == call[1] and len(seen) == 2
    np.testing.assert_array_equal(to_numpy(model(IMAGES)), to_numpy(saved[0](IMAGES)))
    assert presets.preset_file(handle, "config.json").endswith("config.json")
