"""The offline demo learns for real, and the CIFAR example runs under mirrored (e2e)."""

import json
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO


def run(argv, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo's workdir and its output, trained once for this file."""
    workdir = str(tmp_path_factory.mktemp("runs") / "demo")
    proc = run([sys.executable, "-m", "keras_preact", "demo", "--workdir", workdir,
                "--verbose", "2", "--no-export"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return workdir, proc


@pytest.mark.e2e
def test_demo_reaches_97_percent_on_held_out_digits(demo_run):
    from keras_preact.training.demo import DEMO_EPOCHS

    workdir, proc = demo_run
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert len(metrics["epochs"]) == DEMO_EPOCHS
    assert metrics["num_test_examples"] == 359  # the held-out digits, never trained on
    assert metrics["test_accuracy"] >= 0.97, metrics["test_accuracy"]
    match = re.search(r"Held-out accuracy on digits: ([\d.]+)%", proc.stdout)
    assert match and float(match.group(1)) == pytest.approx(100 * metrics["test_accuracy"],
                                                            abs=0.01)
    # One name for that accuracy, and the output ends on where the files are.
    assert "test accuracy" not in proc.stdout
    assert proc.stdout.splitlines()[-1] == f"curve:   {os.path.join(workdir, 'training_curve.png')}"
    with open(os.path.join(workdir, "training_curve.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.exists(os.path.join(workdir, "model.keras"))
    # Learning, not luck: the first epoch is far from the final accuracy.
    assert metrics["epochs"][0]["val_accuracy"] < 0.9
    # The last checkpoint alone rebuilds the model that reached that accuracy: its
    # file records the architecture and the digits' normalisation, which the factory
    # applies (a checkpoint used to load without it: 0 of 8 digits right).
    import numpy as np

    import keras_preact as kp
    from keras_preact.data.digits import read_digits

    state = json.load(open(os.path.join(workdir, "checkpoints", "state.json")))
    model = kp.preact_resnet20(weights=os.path.join(workdir, "checkpoints", state["checkpoint"]))
    images, labels, _ = read_digits("test")
    predicted = np.argmax(model.predict(images, verbose=0), axis=-1)
    assert np.mean(predicted == labels) == pytest.approx(metrics["test_accuracy"], abs=1e-6)


@pytest.mark.e2e
def test_int8_exports_of_the_demo_model_keep_its_accuracy(demo_run, tmp_path):
    # Calibrated on 256 of the run's training images, checked on its 359 held-out ones.
    workdir, _ = demo_run
    cards = {}
    for fmt, quantize in (("litert", None), ("litert", "int8"), ("onnx", None), ("onnx", "int8")):
        out = str(tmp_path / f"{fmt}-{quantize}")
        proc = run([sys.executable, "-m", "keras_preact", "export",
                    os.path.join(workdir, "model.keras"), "--format", fmt, "--out", out]
                   + (["--quantize", quantize] if quantize else []))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert re.search(r"Held-out accuracy: export [\d.]+%, Keras [\d.]+%", proc.stdout)
        cards[fmt, quantize] = json.load(open(os.path.join(out, "model_card.json")))
    for key in (("litert", "int8"), ("onnx", "int8")):
        parity, serving = cards[key]["parity"], cards[key]["serving"]
        assert parity["images"] == 359 and serving["calibration_images"] == 256, key
        accuracy = parity["accuracy"]
        assert accuracy["export"] >= accuracy["keras"] - 0.01, (key, accuracy)
        assert parity["top1_agreement"] >= 0.98, (key, parity)
    # int8 weights: about a quarter of the float32 file (ONNX's QDQ graph adds its scales).
    for fmt, ratio in (("litert", 0.35), ("onnx", 0.5)):
        int8, float32 = (cards[fmt, q]["serving"]["bytes"] for q in ("int8", None))
        assert int8 < ratio * float32, (fmt, int8, float32)


@pytest.mark.e2e
def test_cifar_example_runs_a_few_steps_under_mirrored(tmp_path):
    workdir = str(tmp_path / "run")
    proc = run([sys.executable, os.path.join("examples", "train_cifar.py"), "--model",
                "preact_resnet20", "--dataset", "digits", "--steps", "4", "--batch-size", "16",
                "--cpu-devices", "2", "--eval-every", "0", "--verbose", "2",
                "--workdir", workdir])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "replicas: 2" in proc.stdout
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert metrics["num_replicas"] == 2
    assert metrics["schedule"]["per_replica_batch"] == 8
    assert metrics["epochs"][-1]["step"] == 4
    config = json.load(open(os.path.join(workdir, "config.json")))["train_config"]
    assert config["strategy"] == "mirrored"  # the example's default
    # The paper's recipe, stretched to 4 steps at batch 16 (linear scaling).
    assert metrics["schedule"]["values"][0] == pytest.approx(0.1 * 16 / 128)
