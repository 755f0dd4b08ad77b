"""keras-hub native: `keras_preact.hub`'s classes through keras-hub's own test harness, and
presets that keras-hub's loaders and `kp.from_preset` take whole (local, ``hf://`` through a
stand-in Hub on 127.0.0.1, ``kaggle://``)."""

import functools
import json
import os
import shutil
import subprocess
import sys

import keras
import keras_hub
import numpy as np
import pytest
from keras_hub.src.tests.test_case import TestCase

import keras_preact as kp
from keras_preact import hub
from tests import harness
from tests.helpers import REPO, serve_hugging_face_hub, to_numpy

pytestmark = pytest.mark.multibackend
TINY = {"stage_blocks": [1, 1, 1], "stage_filters": [8, 16, 32], "stem_filters": 8}
IMAGES = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3)).astype("float32")


# --- keras-hub's own harness --------------------------------------------------------------

class PreActResNetHarnessTest(TestCase):
    """keras-hub's checks, as its model folders run them. Two checks skip themselves inside
    the harness, silently: its channels_first pass on TensorFlow without a GPU (TensorFlow's
    CPU convolution has no channels_first kernel) and its precision check on PyTorch without
    CUDA (half-precision CPU kernels are missing); both run on JAX."""

    def setUp(self):
        super().setUp()
        self.init_kwargs = {**TINY, "image_shape": (16, 16, 3)}
        self.input_data = keras.ops.ones((2, 16, 16, 3))

    def test_backbone_basics(self):
        self.run_vision_backbone_test(
            cls=hub.PreActResNetBackbone, init_kwargs=self.init_kwargs,
            input_data=self.input_data, expected_output_shape=(2, 4, 4, 32),
            expected_pyramid_output_keys=["P0", "P1", "P2"],
            expected_pyramid_image_sizes=[(16, 16), (8, 8), (4, 4)])

    def test_backbone_saving_and_preset(self):
        self.run_model_saving_test(cls=hub.PreActResNetBackbone, init_kwargs=self.init_kwargs,
                                   input_data=self.input_data)
        preset = os.path.join(self.get_temp_dir(), "backbone")
        hub.PreActResNetBackbone(**self.init_kwargs).save_to_preset(preset)
        self.run_preset_test(cls=hub.PreActResNetBackbone, preset=preset,
                             input_data=self.input_data, expected_output_shape=(2, 4, 4, 32))

    def _classifier_kwargs(self):
        converter = hub.PreActResNetImageConverter(image_size=(16, 16))
        return {"backbone": hub.PreActResNetBackbone(**self.init_kwargs), "num_classes": 2,
                "preprocessor": hub.PreActResNetImageClassifierPreprocessor(converter)}

    def test_classifier_task_and_saving(self):
        self.run_task_test(cls=hub.PreActResNetImageClassifier,
                           init_kwargs=self._classifier_kwargs(),
                           train_data=(self.input_data, np.array([0, 1])),
                           expected_output_shape=(2, 2))
        self.run_model_saving_test(cls=hub.PreActResNetImageClassifier,
                                   init_kwargs=self._classifier_kwargs(),
                                   input_data=self.input_data)

    def test_classifier_preset(self):
        model = kp.PreActResNet(**TINY, classes=2, input_shape=(16, 16, 3))
        preset = hub.save_preset(model, os.path.join(self.get_temp_dir(), "classifier"))
        self.run_preset_test(cls=keras_hub.models.ImageClassifier, preset=preset,
                             input_data=self.input_data,
                             expected_output=to_numpy(model(self.input_data)))


# --- presets keras-hub loads whole ---------------------------------------------------------
# keras-hub's `predict` runs compiled: on JAX, XLA's fusions differ from an eager call by
# about 1e-6 in a probability (TensorFlow: 0); hence the tolerance of the comparisons.

@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    # Arguments a factory does not default to, so that only the preset can restore them.
    model = kp.preact_resnet20(classes=7, first_shared_preact=False, preprocessing="cifar10")
    return model, kp.save_preset(model, tmp_path_factory.mktemp("presets") / "r20")


def test_keras_hubs_loaders_take_a_preset_whole(saved):
    model, folder = saved
    assert sorted(os.listdir(folder)) == sorted(hub.PRESET_FILES)
    expected = to_numpy(model(IMAGES))
    classifier = keras_hub.models.ImageClassifier.from_preset(folder)  # no num_classes
    assert isinstance(classifier, hub.PreActResNetImageClassifier)
    np.testing.assert_allclose(to_numpy(classifier.predict(IMAGES, verbose=0)), expected,
                               atol=1e-5)
    backbone = keras_hub.models.Backbone.from_preset(folder)
    assert isinstance(backbone, hub.PreActResNetBackbone)
    levels = keras.Model(model.input, model.pyramid_outputs)(IMAGES)
    np.testing.assert_array_equal(to_numpy(backbone(IMAGES)), to_numpy(levels["P2"]))
    # keras-preact's own loaders: the same model and weights.
    for same in (kp.from_preset(folder), kp.preact_resnet20(weights=folder)):
        assert (same.classes, same.first_shared_preact) == (7, False)
        np.testing.assert_array_equal(to_numpy(same(IMAGES)), expected)
    features = kp.from_preset(folder, features=True)(IMAGES)
    np.testing.assert_array_equal(to_numpy(features["P1"]), to_numpy(levels["P1"]))


def test_a_segmenter_trains_on_a_preset(saved):
    segmenter = keras_hub.models.DeepLabV3ImageSegmenter.from_preset(saved[1], num_classes=3)
    assert isinstance(segmenter, hub.PreActResNetDeepLabV3ImageSegmenter)
    assert isinstance(segmenter.preprocessor, hub.PreActResNetImageSegmenterPreprocessor)
    segmenter.compile(optimizer="sgd",
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    masks = np.random.default_rng(1).integers(0, 3, (2, 32, 32, 1))
    assert np.all(np.isfinite(segmenter.train_on_batch(IMAGES, masks)))
    assert segmenter.predict(IMAGES, verbose=0).shape == (2, 32, 32, 3)


def test_the_dtype_policy_reaches_the_model_object():
    # (PreActResNet's: tests/harness.py, case "precision")
    model = hub.PreActResNetBackbone(**TINY, dtype="mixed_float16")
    assert (model.dtype_policy.name, model.compute_dtype) == ("mixed_float16", "float16")


def test_registry_names_and_catalog_keys_are_presets(tmp_path, monkeypatch):
    backbone = hub.PreActResNetBackbone.from_preset("preact_resnet56")
    assert backbone.architecture["stage_blocks"] == [9, 9, 9]
    # A catalog key's weights, from a local folder through the catalog's real path.
    served = tmp_path / "served"
    model = kp.preact_resnet20(first_shared_preact=False, preprocessing="cifar10")
    kp.weights.save_weights_file(model, str(served / "preact_resnet20.cifar10.weights.h5"))
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(served))
    monkeypatch.setenv("KERAS_PREACT_OFFLINE", "1")
    classifier = hub.PreActResNetImageClassifier.from_preset("preact_resnet20.cifar10")
    np.testing.assert_allclose(to_numpy(classifier.predict(IMAGES, verbose=0)),
                               to_numpy(model(IMAGES)), atol=1e-5)
    # kp.from_preset takes what the hub classes take.
    np.testing.assert_array_equal(to_numpy(kp.from_preset("preact_resnet20.cifar10")(IMAGES)),
                                  to_numpy(model(IMAGES)))
    assert kp.from_preset("preact_resnet56").spec.stage_blocks == (9, 9, 9)
    # One command writes any catalog entry as a preset.
    from keras_preact import cli
    assert cli.main(["weights", "preset", "preact_resnet20.cifar10", str(tmp_path / "p")]) == 0
    loaded = keras_hub.models.ImageClassifier.from_preset(str(tmp_path / "p"))
    np.testing.assert_allclose(to_numpy(loaded.predict(IMAGES, verbose=0)),
                               to_numpy(model(IMAGES)), atol=1e-5)


def test_a_preset_of_keras_preact_0_1_still_loads(tmp_path):
    # The 0.1.0 layout: the PreActResNet's own config and weights file.
    model = kp.preact_resnet20(classes=7, preprocessing="cifar10")
    os.makedirs(tmp_path / "old")
    with open(tmp_path / "old" / "config.json", "w") as f:
        json.dump(keras.saving.serialize_keras_object(model), f)
    kp.weights.save_weights_file(model, str(tmp_path / "old" / "model.weights.h5"))
    for same in (kp.from_preset(tmp_path / "old"), kp.preact_resnet20(weights=tmp_path / "old")):
        np.testing.assert_array_equal(to_numpy(same(IMAGES)), to_numpy(model(IMAGES)))


def test_a_preset_is_not_overwritten_without_asking(saved, tmp_path):
    folder = shutil.copytree(saved[1], tmp_path / "copy")
    before = {n: os.path.getmtime(folder / n) for n in os.listdir(folder)}
    with pytest.raises(FileExistsError, match="pass overwrite=True"):
        kp.save_preset(kp.preact_resnet20(), folder)
    assert {n: os.path.getmtime(folder / n) for n in os.listdir(folder)} == before
    kp.save_preset(kp.preact_resnet20(include_top=False), folder, overwrite=True)
    assert "task.json" not in os.listdir(folder) and not kp.from_preset(folder).include_top


def test_a_preset_folder_has_the_permissions_of_any_new_folder(saved):
    # Written in a private temporary folder first; a server running as another user reads it.
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(saved[1]).st_mode & 0o777 == 0o777 & ~umask


def test_folders_that_are_not_presets_are_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    for target in (tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(ValueError, match="a file or a folder of other files"):
            kp.save_preset(kp.preact_resnet20(), target)
    assert os.listdir(tmp_path) == ["notes.txt"]
    with pytest.raises(ValueError, match=r"The preset file .*config.json' is missing"):
        kp.from_preset(tmp_path)


def test_a_preset_of_another_depth_is_refused(saved):
    with pytest.raises(ValueError, match="stage_blocks=.* Nothing was loaded"):
        kp.preact_resnet56(weights=saved[1])


def test_dropout_units_give_every_seed_its_own_variable_path():
    model = kp.PreActResNet(**{**TINY, "stage_blocks": [3, 1, 1]}, unit="dropout_shortcut")
    paths = [v.path for v in model.variables]
    assert len(set(paths)) == len(paths) and sum("seed" in p for p in paths) == 6
    if keras.backend.backend() == "torch":  # a torch Module tracks its variables by path
        assert len(list(model.parameters())) == len(paths)



def test_head_dropout_survives_a_preset(tmp_path):
    make = functools.partial(kp.PreActResNet, **TINY, classes=3, head_dropout=0.3)
    harness.run_model_test(make, (16, 16, 3), tmp_path, ("preset",))


def test_the_keras_hub_twin_owns_its_weights():
    # On JAX a compiled step of a model holding the original's arrays deleted them.
    model = kp.PreActResNet(**TINY, classes=3)
    twin = hub.to_keras_hub(model)
    predicted = twin.predict(IMAGES, verbose=0)
    np.testing.assert_allclose(to_numpy(model(IMAGES)), to_numpy(predicted), atol=1e-5)


def test_a_presets_metadata_names_keras_hubs_tasks(saved):
    with open(os.path.join(saved[1], "metadata.json")) as f:
        tasks = json.load(f)["tasks"]
    # As keras-hub's own presets: public task classes (ResNet's: ["ImageClassifier"]).
    assert "ImageClassifier" in tasks and all(hasattr(keras_hub.models, t) for t in tasks)


def test_a_channels_first_classifier_preset_reloads(tmp_path):
    model = kp.PreActResNet(**TINY, classes=3, input_shape=(3, 32, 32),
                            data_format="channels_first")
    classifier = keras_hub.models.ImageClassifier.from_preset(
        kp.save_preset(model, tmp_path / "first"))
    assert classifier.preprocessor.image_converter.data_format == "channels_first"
    if keras.backend.backend() == "tensorflow":
        return  # TensorFlow's CPU convolutions are NHWC only (tests/harness.py)
    images = np.transpose(IMAGES, (0, 3, 1, 2))
    np.testing.assert_allclose(to_numpy(classifier.predict(images, verbose=0)),
                               to_numpy(model(images)), atol=1e-5)


def test_a_damaged_or_incomplete_preset_names_its_file(saved, tmp_path):
    loaders = (kp.from_preset, hub.PreActResNetImageClassifier.from_preset,
               hub.PreActResNetBackbone.from_preset)
    cut = shutil.copytree(saved[1], tmp_path / "cut")
    text = (cut / "config.json").read_text()
    (cut / "config.json").write_text(text[:len(text) // 2])
    part = shutil.copytree(saved[1], tmp_path / "part")
    os.remove(part / "model.weights.h5")
    for load in loaders:
        with pytest.raises(ValueError, match=r"config.json is damaged \(cut short\?\): save"):
            load(str(cut))
        with pytest.raises(ValueError, match=r"model.weights.h5' is missing"):
            load(str(part))


def test_keras_hubs_loaders_need_keras_preact_imported_as_the_docs_say(saved):
    # The child runs on this pass's backend (KERAS_BACKEND is inherited).
    code = "import sys, keras_hub; keras_hub.models.ImageClassifier.from_preset(sys.argv[1])"
    out = subprocess.run([sys.executable, "-c", code, str(saved[1])], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert "no class registered with Keras for keras_preact>PreActResNetBackbone" in out.stderr
    with open(os.path.join(REPO, "docs", "troubleshooting.md")) as f:
        assert "no class registered with Keras for keras_preact>PreActResNetBackbone" in f.read()
    assert "import keras_preact" in kp.from_preset.__doc__

# --- uploads ------------------------------------------------------------------------------

HF_ROUND_TRIP = """
import sys, keras_hub, numpy as np, keras_preact as kp
keras_hub.upload_preset("hf://keras-preact/r20", sys.argv[1])
classifier = keras_hub.models.ImageClassifier.from_preset("hf://keras-preact/r20")
images = np.load(sys.argv[2])
np.save(sys.argv[3], classifier.predict(images, verbose=0))
np.save(sys.argv[4], kp.from_preset("hf://keras-preact/r20")(images))
"""


def test_upload_to_hugging_face_and_load_back(saved, tmp_path):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("one backend is enough for the transfer: the TensorFlow pass runs it")
    np.save(tmp_path / "images.npy", IMAGES)
    with serve_hugging_face_hub(tmp_path / "hub") as url:
        env = dict(os.environ, HF_ENDPOINT=url, HF_TOKEN="hf_test", HF_HOME=str(tmp_path / "hf"))
        out = subprocess.run([sys.executable, "-c", HF_ROUND_TRIP, str(saved[1]),
                              *(str(tmp_path / n) for n in ("images.npy", "a.npy", "b.npy"))],
                             capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # The bytes went through the server: the uploaded folder is the preset, plus its card.
    uploaded = tmp_path / "hub" / "keras-preact" / "r20"
    assert sorted(os.listdir(uploaded)) == sorted([*hub.PRESET_FILES, "README.md"])
    expected = to_numpy(saved[0](IMAGES))
    for name in ("a.npy", "b.npy"):
        np.testing.assert_allclose(np.load(tmp_path / name), expected, atol=1e-5)


def test_upload_to_kaggle_and_load_back(saved, tmp_path, monkeypatch):
    import kagglehub

    # No network: kagglehub's transfer functions are replaced by a folder.
    store = tmp_path / "kaggle"
    monkeypatch.setattr(kagglehub, "model_upload", lambda handle, folder, *a, **k: shutil.copytree(
        folder, store / handle))
    monkeypatch.setattr(kagglehub, "model_download", lambda handle, path=None, **k: str(
        store / handle / path) if path else str(store / handle))
    keras_hub.upload_preset("kaggle://org/r20/keras/v1", str(saved[1]))
    classifier = keras_hub.models.ImageClassifier.from_preset("kaggle://org/r20/keras/v1")
    np.testing.assert_allclose(to_numpy(classifier.predict(IMAGES, verbose=0)),
                               to_numpy(saved[0](IMAGES)), atol=1e-5)
    np.testing.assert_array_equal(to_numpy(kp.from_preset("kaggle://org/r20/keras/v1")(IMAGES)),
                                  to_numpy(saved[0](IMAGES)))
