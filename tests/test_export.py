"""SavedModel export: serving signatures, parity with Keras, atomicity, model cards."""

import json
import math
import os
import stat

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_preact as kp
from keras_preact import export
from keras_preact.export import destination
from keras_preact.file_io import read_json
from tests import helpers
from tests.helpers import run_python


def tiny_model(**kwargs):
    return helpers.tiny_model(**{"classes": 5, "preprocessing": "cifar10", **kwargs})


def images(n, size=16, channels=3, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


def serve(folder, name="serving_default", **inputs):
    fn = tf.saved_model.load(folder).signatures[name]
    return {k: v.numpy() for k, v in fn(**{k: tf.constant(v) for k, v in inputs.items()}).items()}


# --- parity on the paper's networks --------------------------------------------------


def _tame(model):
    """Scales the conv kernels so a random-init net gives finite, unsaturated outputs.

    At initialisation BN's moving statistics are the identity, so in inference mode
    nothing normalises the residual stream and its variance grows by a factor
    (1 + c) in every unit: ResNet-1001 overflows to NaN. Scaling each kernel by
    alpha makes c about alpha ** (2 * convs per unit); we aim for 10x growth in all.
    """
    units = sum(model.stage_blocks)
    convs = 2 if model.block == "basic" else 3
    alpha = (math.log(10.0) / units) ** (1.0 / (2 * convs))
    for w in model.weights:
        if w.path.endswith("kernel") and len(w.shape) >= 4:
            w.assign(keras.ops.convert_to_numpy(w) * alpha)


@pytest.mark.parametrize("depth", [20, 110, pytest.param(1001, marks=pytest.mark.slow)])
def test_serving_default_of_a_named_network_matches_keras(depth, tmp_path):
    model = kp.preact_resnet_cifar(depth, preprocessing="cifar10")
    _tame(model)
    folder = export.export_saved_model(model, tmp_path / "export", check_parity=False)
    assert folder == str(tmp_path / "export" / "1")
    signatures = tf.saved_model.load(folder).signatures
    serving = signatures["serving_default"]
    assert serving.structured_input_signature[1]["images"].dtype == tf.uint8
    preprocess = model.get_layer("preprocessing")
    for batch in (1, 7):
        x = images(batch, size=32, seed=batch)
        served = {k: v.numpy() for k, v in serving(images=tf.constant(x)).items()}
        # The Keras model on the same images after preprocessing.
        expected = keras.ops.convert_to_numpy(model(x.astype("float32"), training=False))
        assert np.all(np.isfinite(expected)) and expected.max() < 0.99
        np.testing.assert_allclose(served["probabilities"], expected, rtol=0, atol=1e-6)
        normalised = keras.ops.convert_to_numpy(preprocess(x.astype("float32")))
        pre = signatures["serve_preprocessed"](inputs=tf.constant(normalised))
        np.testing.assert_allclose(pre["probabilities"].numpy(), expected, rtol=0, atol=1e-6)
        # Top-k: the k largest probabilities, in order, and the classes holding them
        # (compared by value, robust to near-ties).
        scores = served["top_k_scores"]
        np.testing.assert_allclose(scores, -np.sort(-expected, axis=-1)[:, :5], atol=1e-6)
        np.testing.assert_allclose(
            np.take_along_axis(expected, served["top_k_classes"], -1), scores, atol=1e-6
        )


# --- signatures ----------------------------------------------------------------------


def test_signatures_outputs_and_metadata(tmp_path):
    model = tiny_model()
    names = ["zero", "one", "two", "three", "four"]
    folder = export.export_saved_model(
        model, tmp_path / "m", top_k=3, include_features=True, accept_encoded=True,
        class_names=names, metrics={"test_accuracy": 0.5},
    )
    loaded = tf.saved_model.load(folder)
    assert set(loaded.signatures) == {"serving_default", "serve_preprocessed", "serve_encoded",
                                      "metadata"}
    x = images(7)
    out = serve(folder, images=x)
    assert set(out) == {"probabilities", "top_k_classes", "top_k_scores", "top_k_labels",
                        "features"}
    assert out["top_k_classes"].shape == (7, 3) and out["top_k_classes"].dtype == np.int32
    assert out["features"].shape == (7, 32)
    pool = keras.Model(model.inputs, model.get_layer("pool").output)
    np.testing.assert_allclose(out["features"], pool.predict(x.astype("float32"), verbose=0),
                               atol=1e-5)
    labels = [[names[c] for c in row] for row in out["top_k_classes"]]
    assert out["top_k_labels"].astype(str).tolist() == labels
    # Any batch size.
    assert serve(folder, images=images(33))["probabilities"].shape == (33, 5)
    meta = loaded.signatures["metadata"]()
    assert [n.decode() for n in meta["class_names"].numpy()] == names
    assert json.loads(meta["model_card"].numpy())["metrics"] == {"test_accuracy": 0.5}
    with open(os.path.join(folder, "assets.extra", "class_names.txt")) as f:
        assert f.read().split() == names


def test_encoded_images_give_the_same_outputs(tmp_path):
    folder = export.export_saved_model(tiny_model(), tmp_path / "m", accept_encoded=True)
    x = images(4)
    encoded = [tf.io.encode_png(x[0]).numpy(), tf.io.encode_png(x[1]).numpy(),
               tf.io.encode_png(x[2]).numpy(), tf.io.encode_png(x[3]).numpy()]
    direct = serve(folder, images=x)["probabilities"]
    decoded = serve(folder, "serve_encoded", image_bytes=np.array(encoded, dtype=object))
    np.testing.assert_array_equal(decoded["probabilities"], direct)
    # JPEG is lossy: compare with the decoded pixels, not the originals.
    jpeg = tf.io.encode_jpeg(x[0]).numpy()
    pixels = tf.io.decode_jpeg(jpeg, channels=3).numpy()[None]
    np.testing.assert_allclose(
        serve(folder, "serve_encoded", image_bytes=np.array([jpeg], dtype=object))["probabilities"],
        serve(folder, images=pixels)["probabilities"], atol=1e-6,
    )
    wrong_size = tf.io.encode_png(images(1, size=20)[0]).numpy()
    fn = tf.saved_model.load(folder).signatures["serve_encoded"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="16x16"):
        fn(image_bytes=tf.constant([wrong_size]))


def test_preprocessing_argument_for_a_model_without_the_layer(tmp_path):
    model = tiny_model(preprocessing=None)
    with pytest.raises(ValueError, match="no preprocessing layer.*preprocessing='auto'"):
        export.export_saved_model(model, tmp_path / "a")
    folder = export.export_saved_model(model, tmp_path / "m",
                                       preprocessing={"mean": 127.5, "std": 64.0, "scale": 1.0})
    x = images(3)
    expected = model.predict((x.astype("float32") - 127.5) / 64.0, verbose=0)
    np.testing.assert_allclose(serve(folder, images=x)["probabilities"], expected, atol=1e-6)
    with pytest.raises(ValueError, match="normalise twice"):
        export.export_saved_model(tiny_model(), tmp_path / "b", preprocessing="cifar10")


def test_logits_model_serves_probabilities(tmp_path):
    model = tiny_model(classifier_activation=None)
    folder = export.export_saved_model(model, tmp_path / "m")
    x = images(2)
    logits = model.predict(x.astype("float32"), verbose=0)
    expected = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    probs = serve(folder, images=x)["probabilities"]
    np.testing.assert_allclose(probs, expected, atol=1e-6)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)


def test_versions_side_by_side_and_load_export_picks_the_latest(tmp_path):
    model = tiny_model()
    export.export_saved_model(model, tmp_path / "m", version=1, class_names=list("abcde"))
    export.export_saved_model(model, tmp_path / "m", version=2, top_k=2)
    assert sorted(p for p in os.listdir(tmp_path / "m") if not p.startswith(".")) == ["1", "2"]
    served = export.load_export(tmp_path / "m")
    assert served.path.endswith(os.path.join("m", "2"))
    out = served.predict(images(3))
    assert out["top_k_classes"].shape == (3, 2)
    assert export.load_export(tmp_path / "m" / "1").class_names == list("abcde")


# --- model card ----------------------------------------------------------------------


def test_model_card_contents(tmp_path):
    model = kp.preact_resnet20(preprocessing="cifar10")
    weights = {"tag": "preact_resnet20.cifar10", "sha256": "ab" * 32}
    folder = export.export_saved_model(
        model, tmp_path / "m", class_names=[str(i) for i in range(10)],
        weights_info=weights, metrics={"test_error": 0.08},
    )
    with open(os.path.join(folder, "model_card.json")) as f:
        card = json.load(f)
    assert card["format"] == "saved_model"
    assert card["architecture"]["parameters"] == kp.count_params(model)
    assert card["architecture"]["multiply_adds"] == kp.count_macs(model)
    assert card["architecture"]["depth"] == 20
    assert card["weights"] == weights
    assert card["metrics"] == {"test_error": 0.08}
    assert card["preprocessing"]["mean"] == [0.4914, 0.4822, 0.4465]
    assert card["versions"]["keras"] == keras.__version__
    assert card["versions"]["keras_preact"] == kp.__version__
    assert card["parity"]["max_abs_diff"] <= card["parity"]["tolerance"] == 1e-5
    with open(os.path.join(folder, "model_card.md")) as f:
        text = f.read()
    for needle in ("preact_resnet20", f"{kp.count_params(model):,}", "preact_resnet20.cifar10",
                   "test_error", keras.__version__, "0.4914"):
        assert needle in text


def test_model_card_of_a_model_without_a_config(tmp_path):
    class NoConfig(keras.Model):
        def get_config(self):
            raise NotImplementedError

    inputs = keras.Input((16, 16, 3))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(keras.layers.Conv2D(4, 3)(inputs))
    model = NoConfig(inputs, keras.layers.Dense(5, activation="softmax")(x))
    folder = export.export_saved_model(model, tmp_path / "m", preprocessing="unit")
    architecture = read_json(os.path.join(folder, "model_card.json"))["architecture"]
    assert "config" not in architecture
    assert architecture["class"] == "NoConfig" and architecture["classes"] == 5
    other = export.export_saved_model(tiny_model(), tmp_path / "t")
    assert "config" in read_json(os.path.join(other, "model_card.json"))["architecture"]


def test_import_keras_preact_does_not_import_export():
    result = run_python(
        "import sys, keras_preact\n"
        "from keras_preact import cli\n"
        "cli.build_parser()\n"
        "assert 'keras_preact.export' not in sys.modules, 'export imported eagerly'\n"
        "print('ok')\n"
    )
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


def test_export_demo_writes_a_serving_export_with_metrics(tmp_path):
    """The demo's export step: a trained `.keras` model in a run folder becomes a
    SavedModel whose serving signature reproduces it."""
    from keras_preact.training.demo import export_demo

    model = tiny_model(input_shape=(32, 32, 3), classes=10, preprocessing="unit")
    model_path = str(tmp_path / "model.keras")
    model.save(model_path)
    # What a training run writes beside its model.
    (tmp_path / "config.json").write_text(json.dumps({"train_config": {"dataset": "digits"}}))
    (tmp_path / "metrics.json").write_text(json.dumps({"test_accuracy": 0.975, "test_loss": 0.1}))
    folder = export_demo(workdir=str(tmp_path), model_path=model_path)["saved_model"]
    assert folder == str(tmp_path / "export" / "saved_model" / "1")
    assert "0.975" in open(os.path.join(folder, "model_card.json")).read()
    x = images(3, size=32)
    np.testing.assert_allclose(serve(folder, images=x)["probabilities"],
                               model.predict(x.astype("float32"), verbose=0), atol=1e-5)
    # A rerun of the demo replaces its own export.
    export_demo(workdir=str(tmp_path), model_path=model_path)


# --- atomicity -----------------------------------------------------------------------


def _listing(folder):
    return sorted(os.listdir(folder))


def test_failure_half_way_leaves_no_partial_export(tmp_path, monkeypatch):
    model = tiny_model()
    calls = []

    def broken(folder, card):
        # The SavedModel is fully written by now: fail on the last step.
        calls.append(sorted(os.listdir(folder)))
        raise OSError("disk full (injected)")

    monkeypatch.setattr(destination, "write_model_card", broken)
    with pytest.raises(OSError, match="injected"):
        export.export_saved_model(model, tmp_path / "m")
    assert "saved_model.pb" in calls[0]
    assert not os.path.exists(tmp_path / "m" / "1")
    assert _listing(tmp_path / "m") == []  # no temporary folder left either


def test_failed_overwrite_keeps_the_old_export(tmp_path, monkeypatch):
    model = tiny_model()
    folder = export.export_saved_model(model, tmp_path / "m", top_k=2)
    before = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
              if os.path.isfile(os.path.join(folder, name))}
    x = images(3)
    expected = serve(folder, images=x)["probabilities"]

    real_save = tf.saved_model.save

    def broken(obj, export_dir, *args, **kwargs):
        # Write a real SavedModel, then fail as if the process died half-way.
        real_save(obj, export_dir, *args, **kwargs)
        raise RuntimeError("crash while writing (injected)")

    monkeypatch.setattr(tf.saved_model, "save", broken)
    with pytest.raises(RuntimeError, match="injected"):
        export.export_saved_model(model, tmp_path / "m", top_k=4, overwrite=True)
    after = {name: os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
             if os.path.isfile(os.path.join(folder, name))}
    assert after == before
    out = serve(folder, images=x)
    np.testing.assert_array_equal(out["probabilities"], expected)
    assert out["top_k_classes"].shape == (3, 2)
    assert _listing(tmp_path / "m") == ["1"]


def test_failed_final_rename_restores_the_old_export(tmp_path, monkeypatch):
    model = tiny_model()
    folder = export.export_saved_model(model, tmp_path / "m", top_k=2)
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(src).startswith(".1.partial-"):
            raise OSError("rename failed (injected)")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(OSError, match="injected"):
        export.export_saved_model(model, tmp_path / "m", top_k=3, overwrite=True)
    assert _listing(tmp_path / "m") == ["1"]
    assert serve(folder, images=images(1))["top_k_classes"].shape == (1, 2)


def test_existing_export_needs_overwrite(tmp_path):
    model = tiny_model()
    folder = export.export_saved_model(model, tmp_path / "m", top_k=2)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export.export_saved_model(model, tmp_path / "m", top_k=3)
    assert serve(folder, images=images(1))["top_k_classes"].shape == (1, 2)
    export.export_saved_model(model, tmp_path / "m", top_k=3, overwrite=True)
    assert serve(folder, images=images(1))["top_k_classes"].shape == (1, 3)
    assert _listing(tmp_path / "m") == ["1"]
    # Renamed from a private temporary folder, the export still gets the usual
    # permissions, so a server running as another user can read it.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o777 & ~umask


def test_overwrite_refuses_a_folder_that_is_not_an_export(tmp_path):
    target = tmp_path / "m" / "1"
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("precious")
    with pytest.raises(ValueError, match="not a keras-preact export"):
        export.export_saved_model(tiny_model(), tmp_path / "m", overwrite=True)
    assert (target / "notes.txt").read_text() == "precious"


def test_overwrite_refuses_an_export_holding_the_users_files(tmp_path):
    # Before: overwrite=True replaced the whole folder, MY_NOTES.txt with it.
    folder = export.export_saved_model(tiny_model(), tmp_path / "m", top_k=2)
    with open(os.path.join(folder, "MY_NOTES.txt"), "w") as f:
        f.write("precious")
    before = {name: os.path.getmtime(os.path.join(folder, name)) for name in os.listdir(folder)}
    with pytest.raises(ValueError) as raised:
        export.export_saved_model(tiny_model(), tmp_path / "m", top_k=3, overwrite=True)
    assert str(raised.value) == (
        f"Refusing to write over {folder!r}: it holds files an export does not write "
        f"(MY_NOTES.txt). Nothing was changed; move them out or choose another path. "
        f"Received: path={folder!r}")
    assert {name: os.path.getmtime(os.path.join(folder, name))
            for name in os.listdir(folder)} == before
    assert _listing(tmp_path / "m") == ["1"]  # no temporary folder left
    assert serve(folder, images=images(1))["top_k_classes"].shape == (1, 2)
    os.remove(os.path.join(folder, "MY_NOTES.txt"))  # with only its own files, it is replaced
    export.export_saved_model(tiny_model(), tmp_path / "m", top_k=3, overwrite=True)
    assert serve(folder, images=images(1))["top_k_classes"].shape == (1, 3)


def test_parity_failure_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(export.PARITY_TOLERANCES, "saved_model", -1.0)
    with pytest.raises(export.ExportParityError, match="Nothing was written"):
        export.export_saved_model(tiny_model(), tmp_path / "m")
    assert _listing(tmp_path / "m") == []


# --- bad input -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(top_k=0), r"top_k=0"),
        (dict(top_k=6), r"at most the number of classes \(5\).*top_k=6"),
        (dict(version=0), r"version=0"),
        (dict(version="1"), r"version='1'"),
        (dict(class_names=["a", "b"]), r"one name per class \(5\)"),
        (dict(class_names="abcde"), r"list of strings"),
        (dict(preprocessing="bgr"), r"normalise twice"),
        (dict(metrics={"x": object()}), r"metrics.*JSON"),
        (dict(overwrite="yes"), r"overwrite='yes'"),
    ],
)
def test_bad_arguments_raise_clear_errors(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        export.export_saved_model(tiny_model(), tmp_path / "m", **kwargs)
    assert not os.path.exists(tmp_path / "m")


def test_bad_models_raise_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="classifier"):
        export.export_saved_model(tiny_model(include_top=False, pooling=None), tmp_path / "a")
    with pytest.raises(ValueError, match="keras.Model"):
        export.export_saved_model("preact_resnet20", tmp_path / "b")
    inputs = keras.Input((4,))
    with pytest.raises(ValueError, match="4D image input"):
        export.export_saved_model(keras.Model(inputs, keras.layers.Dense(3)(inputs)),
                                  tmp_path / "c")
    flat = keras.Input((16, 16, 3))
    plain = keras.Model(flat, keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(flat)))
    with pytest.raises(ValueError, match="include_features=True.*'pool'"):
        export.export_saved_model(plain, tmp_path / "d", preprocessing="unit",
                                  include_features=True)


def test_unknown_format_and_unwritable_path(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"format='tfjs'.*saved_model"):
        export.export_model(model, tmp_path / "m", format="tfjs")
    with pytest.raises(ValueError,
                       match=r"Unknown argument `quantization` for the 'saved_model' exporter"):
        export.export_model(model, tmp_path / "m", format="saved_model", quantization="float16")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="Cannot write an export under"):
        export.export_saved_model(model, a_file / "sub")
    with pytest.raises(ValueError, match="must be a folder.*a file"):
        export.export_saved_model(model, a_file)
    with pytest.raises(ValueError, match="Cannot write an export under"):
        export.export_litert(model, "/proc/keras_preact_export")


def test_python_wrapper_validates_images(tmp_path):
    folder = export.export_saved_model(tiny_model(), tmp_path / "m")
    served = export.load_export(folder)
    assert served.predict(images(2))["probabilities"].shape == (2, 5)
    assert served.predict(images(1)[0])["probabilities"].shape == (1, 5)
    bad = [
        (images(2).astype("float32"), r"uint8.*dtype=float32"),
        (images(2, size=20), r"16x16.*\(2, 20, 20, 3\)"),
        (images(2, channels=1), r"3 channels.*1 channels"),
        (images(2, channels=4), r"3 channels.*4 channels"),
        (np.zeros((16, 16), np.uint8), r"\[batch, height, width, channels\]"),
        (np.zeros((0, 16, 16, 3), np.uint8), r"empty batch"),
    ]
    for value, match in bad:
        with pytest.raises(ValueError, match=match):
            served.predict(value)
    with pytest.raises(ValueError, match="does not exist"):
        export.load_export(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="is not an export"):
        export.load_export(tmp_path)
