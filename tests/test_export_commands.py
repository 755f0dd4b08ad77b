"""The `keras-preact export` and `keras-preact predict` commands."""

import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

from keras_preact import cli, export, file_io
from tests import data_fixtures
from tests.helpers import TINY, run_cli, tiny_model


def write_png(path, array, mode=None):
    Image.fromarray(array, mode=mode).save(path)
    return str(path)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """preact_resnet20 exported by the command, with class names."""
    root = tmp_path_factory.mktemp("cli")
    names = root / "classes.txt"
    names.write_text("\n".join(f"class_{i}" for i in range(10)) + "\n")
    code = cli.main(["export", "preact_resnet20", "--format", "saved_model", "--out",
                     str(root / "r20"), "--class-names", str(names), "--top-k", "3"])
    assert code == 0
    return root / "r20"


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fails the test if the model is loaded: input errors must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(export, "load_export", refuse)


def test_export_then_predict(exported, tmp_path, capsys):
    card = export.read_model_card(exported)
    assert card["weights"]["initialization"].startswith("random")
    assert card["preprocessing"]["mean"] == [0.4914, 0.4822, 0.4465]
    rng = np.random.default_rng(0)
    arrays = rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
    files = [write_png(tmp_path / f"img{i}.png", a) for i, a in enumerate(arrays)]
    code, out, err = run_cli(["predict", str(exported), *files, "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    expected = export.load_export(exported).predict(arrays)
    for i, item in enumerate(result):
        assert item["image"] == files[i]
        assert [e["class"] for e in item["top_k"]] == expected["top_k_classes"][i].tolist()
        assert item["top_k"][0]["label"] == f"class_{expected['top_k_classes'][i][0]}"
        np.testing.assert_allclose([e["score"] for e in item["top_k"]],
                                   expected["top_k_scores"][i], rtol=1e-6)
    code, out, err = run_cli(["predict", str(exported), files[0], "--top-k", "2"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == files[0] and len(lines) == 3 and "class_" in lines[1]


def test_predict_with_a_keras_file_and_npy_batch(tmp_path, capsys):
    model = tiny_model(classes=4, preprocessing="unit")
    path = str(tmp_path / "m.keras")
    model.save(path)
    batch = np.random.default_rng(1).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    np.save(tmp_path / "batch.npy", batch)
    code, out, err = run_cli(["predict", path, str(tmp_path / "batch.npy"), "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    expected = np.argmax(model.predict(batch.astype("float32"), verbose=0), -1)
    assert [r["image"] for r in result] == [f"{tmp_path / 'batch.npy'}[{i}]" for i in range(3)]
    assert [r["top_k"][0]["class"] for r in result] == expected.tolist()


@pytest.mark.usefixtures("no_model_loading")
def test_predict_rejects_bad_images_before_loading(exported, tmp_path, capsys):
    rng = np.random.default_rng(2)
    cases = {
        "small.png": (write_png(tmp_path / "small.png",
                                rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)),
                      "is 28x28 (height x width); the model takes 32x32"),
        "grey.png": (write_png(tmp_path / "grey.png",
                               rng.integers(0, 256, (32, 32), dtype=np.uint8)),
                     "has 1 channel(s); the model takes 3"),
        "rgba.png": (write_png(tmp_path / "rgba.png",
                               rng.integers(0, 256, (32, 32, 4), dtype=np.uint8)),
                     "has 4 channel(s); the model takes 3"),
        "deep.png": (write_png(tmp_path / "deep.png",
                               rng.integers(0, 65535, (32, 32), dtype=np.uint16)),
                     "not 8-bit"),
        "float.npy": (None, "has dtype float32; the model takes uint8"),
        "broken.png": (None, "cannot be read as an image"),
        "missing.png": (str(tmp_path / "missing.png"), "does not exist"),
    }
    np.save(tmp_path / "float.npy", np.zeros((32, 32, 3), np.float32))
    cases["float.npy"] = (str(tmp_path / "float.npy"), cases["float.npy"][1])
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    cases["broken.png"] = (str(tmp_path / "broken.png"), cases["broken.png"][1])
    for name, (path, message) in cases.items():
        code, out, err = run_cli(["predict", str(exported), path], capsys)
        assert code == 2, name
        assert err.startswith("error: ") and message in err, (name, err)
        assert "Traceback" not in err
    # Every bad file is reported at once.
    code, _, err = run_cli(["predict", str(exported), cases["small.png"][0],
                            cases["grey.png"][0]], capsys)
    assert code == 2 and "small.png" in err and "grey.png" in err


@pytest.mark.usefixtures("no_model_loading")
def test_predict_rejects_a_bad_model_path(tmp_path, capsys):
    png = write_png(tmp_path / "a.png", np.zeros((32, 32, 3), np.uint8))
    code, _, err = run_cli(["predict", str(tmp_path / "nothing"), png], capsys)
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(["predict", str(tmp_path), png], capsys)
    assert code == 2 and "is not an export" in err


def test_export_errors(exported, tmp_path, capsys):
    code, _, err = run_cli(["export", "preact_resnet20", "--out", str(exported)], capsys)
    assert code == 2 and "already exists" in err and "--overwrite" in err
    code, _, err = run_cli(["export", "preact_resnet20", "--format", "tfjs", "--out",
                            str(tmp_path / "x")], capsys)
    assert code == 2 and "invalid choice: 'tfjs'" in err
    code, _, err = run_cli(["export", "resnet50", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "resnet50" in err and "preact_resnet20" in err
    code, _, err = run_cli(["export", "preact_resnet20", "--quantization", "float16",
                            "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "--quantize applies to --format litert or onnx only" in err
    x = str(tmp_path / "x")
    for argv, message in (
            (["--format", "onnx", "--quantize", "float16"],
             "--format onnx takes --quantize int8. Received: --quantize float16"),
            (["--format", "litert", "--quantize", "int8"],
             "--quantize int8 needs calibration images: give --calibration-data"),
            (["--format", "litert", "--calibration-data", "digits"],
             "--calibration-data is for --quantize int8 only"),
            (["--format", "litert", "--quantize", "int8", "--calibration-data", "mnist"],
             "mnist"),
            (["--held-out-images", "-1"], "--held-out-images must be >= 0. Received: -1"),
            (["--calibration-images", "0"], "--calibration-images must be >= 1. Received: 0")):
        code, _, err = run_cli(["export", "preact_resnet20", "--out", x, *argv], capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    code, _, err = run_cli(["export", "preact_resnet20", "--top-k", "11", "--out",
                            str(tmp_path / "x")], capsys)
    assert code == 2 and "top_k=11" in err
    code, _, err = run_cli(["export", "preact_resnet20", "--preprocessing", "bgr", "--out",
                            str(tmp_path / "x")], capsys)
    assert code == 2 and "preprocessing='bgr'" in err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = run_cli(["export", "preact_resnet20", "--out", str(blocker / "sub")], capsys)
    assert code == 2 and "Cannot write an export under" in err
    code, _, err = run_cli(["export", str(tmp_path / "none.keras"), "--out",
                            str(tmp_path / "x")], capsys)
    assert code == 2 and "does not exist" in err
    assert not os.path.exists(tmp_path / "x")


def test_export_overwrite_and_keras_checkpoint(tmp_path, capsys):
    model = tiny_model(classes=4, preprocessing=None)
    path = str(tmp_path / "m.keras")
    model.save(path)
    out_dir = str(tmp_path / "lite")
    code, _, err = run_cli(["export", path, "--format", "litert", "--out", out_dir], capsys)
    assert code == 2 and "no preprocessing layer" in err
    code, out, err = run_cli(["export", path, "--format", "litert", "--out", out_dir,
                              "--preprocessing", "unit", "--top-k", "2"], capsys)
    assert code == 0, err
    assert "Parity with the Keras model" in out
    card = export.read_model_card(out_dir)
    assert card["weights"]["sha256"] == file_io.file_hash(path)
    assert card["top_k"] == 2
    code, _, err = run_cli(["export", path, "--format", "litert", "--out", out_dir,
                            "--preprocessing", "unit"], capsys)
    assert code == 2 and "already exists" in err
    code, _, err = run_cli(["export", path, "--format", "litert", "--out", out_dir,
                            "--preprocessing", "unit", "--overwrite"], capsys)
    assert code == 0, err
    assert export.read_model_card(out_dir)["top_k"] == 4  # the default, capped by the classes


def test_predict_reports_a_bad_image_and_classifies_the_others(exported, tmp_path, capsys):
    good = write_png(tmp_path / "good.png", np.zeros((32, 32, 3), np.uint8))
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    broken = str(tmp_path / "broken.png")
    code, out, err = run_cli(["predict", str(exported), broken, good, "--json"], capsys)
    assert code == cli.EXIT_PARTIAL
    assert [r["image"] for r in json.loads(out)] == [good]
    assert (err.startswith(f"error: image {broken!r} cannot be read as an image")
            and err.count("\n") == 1)


def test_predict_resize_converts_grey_and_other_sizes(exported, tmp_path, capsys):
    grey = np.random.default_rng(3).integers(0, 256, (28, 20), dtype=np.uint8)
    path = write_png(tmp_path / "grey.png", grey)
    code, _, err = run_cli(["predict", str(exported), path], capsys)
    assert code == cli.EXIT_ERROR
    assert err == (f"error: image {path!r} has 1 channel(s); the model takes 3 (RGB): pass "
                   "resize=True (--resize) to convert it\n")
    code, out, err = run_cli(["predict", str(exported), path, "--resize", "--json"], capsys)
    assert code == 0, err
    rgb = np.asarray(Image.fromarray(grey).convert("RGB").resize((32, 32),
                                                                 Image.Resampling.BILINEAR))
    expected = export.load_export(exported).predict(rgb[None])
    assert ([e["class"] for e in json.loads(out)[0]["top_k"]]
            == expected["top_k_classes"][0].tolist())


def test_export_over_a_folder_that_is_not_an_export_never_suggests_overwrite(tmp_path, capsys):
    out_dir = tmp_path / "mine"
    out_dir.mkdir()
    (out_dir / "notes.txt").write_text("keep me")
    for extra in ([], ["--overwrite"]):
        code, _, err = run_cli(["export", "preact_resnet20", "--format", "litert", "--out",
                                str(out_dir), *extra], capsys)
        assert code == cli.EXIT_ERROR
        assert (f"Refusing to write over {str(out_dir)!r}: "
                "it exists and is not a keras-preact export") in err
        assert "overwrite" not in err.replace("write over", "")
    assert os.listdir(out_dir) == ["notes.txt"]


@pytest.mark.parametrize(
    "argv, blocked",
    [(["export", "preact_resnet20", "--format", "onnx", "--out", "{tmp}/x"], "tf2onnx"),
     (["predict", "{tmp}/model.onnx", "{tmp}/a.png"], "onnxruntime"),
     (["predict", "{tmp}/model.tflite", "{tmp}/a.png"], "ai_edge_litert")],
)
def test_missing_export_packages_hint_the_pinned_extra(tmp_path, capsys, monkeypatch, argv,
                                                       blocked):
    monkeypatch.setitem(sys.modules, blocked, None)  # `import` of it raises ImportError
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    for name in ("model.onnx", "model.tflite"):
        (tmp_path / name).write_bytes(b"not loaded")
    write_png(tmp_path / "a.png", np.zeros((32, 32, 3), np.uint8))
    code, _, err = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == cli.EXIT_ERROR
    assert err.splitlines()[-1].startswith("error: ") and "Traceback" not in err
    assert '(pip install "keras-preact[export]")' in err


def test_exported_run_model_card_carries_its_test_accuracy(tmp_path, capsys):
    model = tiny_model(classes=4, preprocessing="unit")
    model.save(str(tmp_path / "model.keras"))
    # What `keras-preact train` records beside its final model.
    (tmp_path / "config.json").write_text(json.dumps({"train_config": {"dataset": "digits"}}))
    (tmp_path / "metrics.json").write_text(json.dumps(
        {"model_path": "model.keras", "dataset": "digits", "test_accuracy": 0.9875,
         "test_loss": 0.05}))
    code, _, err = run_cli(["export", str(tmp_path / "model.keras"), "--out", str(tmp_path / "x"),
                            "--no-parity-check"], capsys)
    assert code == 0, err
    card = export.read_model_card(tmp_path / "x" / "1")
    assert card["metrics"] == {"dataset": "digits", "test_accuracy": 0.9875, "test_loss": 0.05}
    assert "- test_accuracy: 0.9875" in (tmp_path / "x" / "1" / "model_card.md").read_text()


def test_a_run_model_is_checked_on_its_held_out_images(tmp_path, capsys):
    model = tiny_model(input_shape=(32, 32, 3), classes=10, preprocessing="unit")
    model.save(str(tmp_path / "model.keras"))
    # What `keras-preact train` writes beside its model: the run's dataset.
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"train_config": {"dataset": "digits"}}))
    argv = ["export", str(tmp_path / "model.keras"), "--format", "onnx", "--held-out-images", "50"]
    code, out, err = run_cli(argv + ["--out", str(tmp_path / "a")], capsys)
    assert code == 0, err
    parity = export.read_model_card(tmp_path / "a")["parity"]
    assert parity["images"] == 50 and set(parity["accuracy"]) == {"keras", "export"}
    assert f"Held-out accuracy: export {parity['accuracy']['export']:.2%}" in out
    # The run's data missing here: a warning, and the export checked on random images.
    config.write_text(json.dumps({"train_config": {
        "dataset": "cifar10", "data_source": "archive", "data_path": str(tmp_path / "gone")}}))
    code, out, err = run_cli(argv + ["--out", str(tmp_path / "b")], capsys)
    assert code == 0 and err.startswith("warning: no held-out check (") and "gone" in err, err
    assert export.read_model_card(tmp_path / "b")["parity"]["images"] == 8


def test_a_folder_run_carries_its_class_names_into_the_export_and_predict(tmp_path, capsys):
    images, workdir, out = tmp_path / "imgs", tmp_path / "run", tmp_path / "export"
    for split, per_class in (("train", 4), ("val", 1)):
        data_fixtures.write_png_folder(str(images / split), ["cat", "dog"], per_class)
    code, _, err = run_cli(["train", "--model", "tiny", "--model-kwargs", json.dumps(TINY),
                            "--dataset", "folder", "--data-path", str(images), "--batch-size", "4",
                            "--epochs", "1", "--eval-every", "0", "--workdir", str(workdir),
                            "--verbose", "0"], capsys)
    assert code == 0, err
    code, _, err = run_cli(["export", str(workdir), "--out", str(out)], capsys)
    assert code == 0, err
    assert export.read_model_card(out)["class_names"] == ["cat", "dog"]
    import tensorflow as tf
    signature = tf.saved_model.load(str(out / "1")).signatures[export.SIGNATURE_METADATA]
    assert signature()["class_names"].numpy().tolist() == [b"cat", b"dog"]
    png = write_png(tmp_path / "x.png", np.zeros((32, 32, 3), np.uint8))
    for model in (out, workdir / "model.keras"):
        code, text, err = run_cli(["predict", str(model), png], capsys)
        assert code == 0, err
        assert sorted(line.split()[1] for line in text.splitlines()[1:]) == ["cat", "dog"], text
    # --class-names still overrides the run's names.
    (tmp_path / "names.txt").write_text("tabby\nbeagle\n")
    code, text, err = run_cli(["predict", str(out), png, "--class-names",
                               str(tmp_path / "names.txt")], capsys)
    assert code == 0 and "tabby" in text and "cat" not in text, (text, err)


@pytest.mark.parametrize("content, says", [
    (b"\xff\xfe\x00c\x00a\x00t", "must be UTF-8 text, one class name a line"),
    (b"\n  \n", "The class names file holds no class name.")])
@pytest.mark.parametrize("command", ["export", "predict"])
def test_a_class_names_file_that_is_not_utf8_or_empty_is_one_clear_line(tmp_path, capsys,
                                                                        command, content, says):
    names = tmp_path / "names.txt"
    names.write_bytes(content)
    argv = {"export": ["export", "preact_resnet20", "--out", str(tmp_path / "x")],
            "predict": ["predict", str(tmp_path / "m.keras"), str(tmp_path / "a.png")]}[command]
    code, _, err = run_cli([*argv, "--class-names", str(names)], capsys)
    assert code == cli.EXIT_ERROR and len(err.strip().splitlines()) == 1, err
    assert says in err
    assert err.strip().endswith(f"Received: --class-names={str(names)!r}")
    assert not os.path.exists(tmp_path / "x")
