"""Kill `keras-preact train` with SIGKILL mid-epoch, restart it, compare (e2e), on the
TensorFlow, JAX and PyTorch backends.

Determinism: the same seed (`keras.utils.set_random_seed` inside the command),
TensorFlow op determinism (``--deterministic``), fixed thread pools (2 intra-op, 1
inter-op), and a data pipeline whose epoch ``e`` depends only on ``(seed, e)``. The
resumed run reloads the last completed epoch's weights and optimizer state (momentum
and iteration count, hence the learning rate) bit for bit from the checkpoint, so
the remaining epochs compute exactly what the uninterrupted run computes: the final
weights must be *equal* (tolerance 0; measured: identical on each backend on this CPU,
where JAX's XLA kernels and PyTorch with `use_deterministic_algorithms` are deterministic).
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, TINY

EPOCHS = 3


def train_command(workdir, backend):
    # XLA sizes its thread pool at start: JAX takes no thread counts.
    threads = [] if backend == "jax" else ["--intra-op-threads", "2", "--inter-op-threads", "1"]
    return [
        sys.executable, "-m", "keras_preact", "train", "--model", "tiny",
        "--model-kwargs", json.dumps(TINY), "--dataset", "digits", "--batch-size", "64",
        "--epochs", str(EPOCHS), "--seed", "0", "--deterministic", "--eval-every", "0",
        *threads, "--verbose", "2", "--workdir", workdir,
    ]


def start(workdir, log, backend):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               KERAS_BACKEND=backend)
    return subprocess.Popen(train_command(workdir, backend), cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT, text=True)


def read_state(workdir):
    path = os.path.join(workdir, "checkpoints", "state.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


@pytest.mark.e2e
@pytest.mark.parametrize("backend", ["tensorflow", "jax", "torch"])
def test_sigkill_mid_epoch_then_restart_equals_uninterrupted_run(tmp_path, backend):
    import keras
    import numpy as np

    import keras_preact  # noqa: F401  (registers the layers for loading)

    killed_dir, reference_dir = str(tmp_path / "killed"), str(tmp_path / "reference")
    logs = {name: open(tmp_path / f"{name}.log", "w+")
            for name in ("reference", "killed", "resumed")}
    # The reference run goes alongside (2 cores): determinism does not depend on load.
    reference = start(reference_dir, logs["reference"], backend)
    victim = start(killed_dir, logs["killed"], backend)
    try:
        # Wait for epoch 1's checkpoint, and for Keras to announce epoch 2 (printed
        # when it begins, after epoch 1's files are all written).
        deadline = time.time() + 300
        state = None
        while time.time() < deadline and victim.poll() is None:
            state = read_state(killed_dir)
            logs["killed"].flush()
            started = "Epoch 2/3" in open(logs["killed"].name).read()
            if state and state["epoch"] >= 1 and started:
                break
            time.sleep(0.02)
        assert state and state["epoch"] == 1, "the first epoch never completed"
        # A few of epoch 2's 22 steps (about 0.1 s each here) run, then the kill.
        time.sleep(0.6)
        assert read_state(killed_dir)["epoch"] == 1, "epoch 2 finished before the kill"
        victim.send_signal(signal.SIGKILL)
        victim.wait(60)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert victim.returncode == -signal.SIGKILL
    state = read_state(killed_dir)
    assert state["epoch"] == 1 and not state["complete"]
    assert not os.path.exists(os.path.join(killed_dir, "model.keras"))
    ckpts = sorted(os.listdir(os.path.join(killed_dir, "checkpoints")))
    assert "ckpt-00001.weights.h5" in ckpts

    # The same command again.
    resumed = start(killed_dir, logs["resumed"], backend)
    assert resumed.wait(300) == 0
    assert reference.wait(300) == 0
    for log in logs.values():
        log.seek(0)
    out = {name: log.read() for name, log in logs.items()}
    assert "Resuming tiny from epoch 1 (step 22)" in out["resumed"], out["resumed"][-2000:]
    assert "Resumed from epoch 1." in out["resumed"]
    assert "Epoch 2/3" in out["resumed"] and "Epoch 1/3" not in out["resumed"]

    final = {}
    for name, folder in (("reference", reference_dir), ("resumed", killed_dir)):
        model = keras.saving.load_model(os.path.join(folder, "model.keras"), compile=False)
        final[name] = model.get_weights()
        final[name + "_metrics"] = json.load(open(os.path.join(folder, "metrics.json")))
    assert len(final["reference"]) == len(final["resumed"])
    for a, b in zip(final["reference"], final["resumed"]):
        np.testing.assert_array_equal(a, b)  # tolerance 0: bit-identical
    ref_m, res_m = final["reference_metrics"], final["resumed_metrics"]
    assert [e["step"] for e in res_m["epochs"]] == [22, 44, 66]
    assert [e["loss"] for e in res_m["epochs"]] == [e["loss"] for e in ref_m["epochs"]]
    assert ([e["learning_rate"] for e in res_m["epochs"]]
            == [e["learning_rate"] for e in ref_m["epochs"]])
    assert res_m["test_accuracy"] == ref_m["test_accuracy"]
    assert res_m["test_loss"] == ref_m["test_loss"]
