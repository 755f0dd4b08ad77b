"""One training contract: `keras_preact.training.LIMITS` declares what a path cannot honour,
each such setting is refused before anything is written, and the same `TrainConfig` trains
the same on the TensorFlow, JAX and PyTorch backends (e2e, in fresh interpreters).

Backend parity. Each backend trains the tiny network on digits for 3 steps (batch 64,
augmentation and cutout on, label smoothing 0.1) from one initial weights file, with the
same batches (the tf.data pipeline, keyed by seed and epoch). Only the backends' kernels
differ (convolution algorithms, summation order). Measured on an Intel Xeon (AVX-512), 2
cores, against TensorFlow, on JAX and on PyTorch alike: the 3 steps' mean loss within
2.2e-6 relative, the test loss within 5.6e-5 relative, the final weights within 1.8e-4
absolute (two float32 orderings of 3 SGD steps at lr 0.1). Asserted: 1e-4 relative on the
loss, 1e-3 on the test loss, 1e-3 absolute on the weights.
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_preact.training import LIMITS, PATHS, TrainConfig, training_path
from tests.helpers import REPO, TINY

#: A value of each field that `LIMITS` names, other than its default.
_SET = {"jit_compile": True, "cpu_devices": 2, "intra_op_threads": 1, "inter_op_threads": 1}


@pytest.mark.parametrize("path,field", [(p, f) for p, limits in LIMITS.items() for f in limits])
def test_every_declared_limit_is_refused_in_one_line(path, field):
    backend, strategies = PATHS[path]
    config = TrainConfig(strategy=strategies[0], **{field: _SET[field]})
    with pytest.raises(ValueError) as err:
        training_path(config, backend)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"The {path} cannot honour {field}={_SET[field]!r}: ")
    assert LIMITS[path][field] in message


def test_each_backend_takes_its_strategies_and_refuses_the_others():
    for path, (backend, strategies) in PATHS.items():
        for strategy in strategies:
            assert training_path(TrainConfig(strategy=strategy), backend) == path
    with pytest.raises(ValueError, match=r"^strategy='mirrored' does not run on the jax "
                       r"backend. Valid there: \['default', 'data_parallel'\] \(or set "
                       r"KERAS_BACKEND=tensorflow\)$"):
        training_path(TrainConfig(strategy="mirrored"), "jax")
    with pytest.raises(ValueError, match="^strategy='data_parallel' does not run on the "
                       "tensorflow backend"):
        training_path(TrainConfig(strategy="data_parallel"), "tensorflow")


def test_a_refused_setting_writes_nothing(tmp_path):
    from keras_preact.training import train_and_evaluate

    config = TrainConfig(model="tiny", model_kwargs=TINY, dataset="digits", steps=1,
                         strategy="multiworker", jit_compile=False, cpu_devices=2)
    with pytest.raises(ValueError, match="multi-worker loop cannot honour cpu_devices=2"):
        train_and_evaluate(config, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_the_docs_table_is_made_from_the_declaration():
    sys.path.insert(0, os.path.join(REPO, "docs"))
    import generate

    generated = generate.training_paths_table()
    for path, limits in LIMITS.items():
        assert path in generated
        for why in limits.values():
            assert f"✗ {why}" in generated
    every_field = {f.name for f in dataclasses.fields(TrainConfig)}
    assert all(f"`{name}`" in generated for name in every_field - {"strategy"})
    with open(os.path.join(REPO, "docs", "training.md"), encoding="utf-8") as f:
        assert "<!-- generated: training-paths -->" in f.read()


PARITY = r"""
import json, sys
import numpy as np
import keras
from keras_preact.training import TrainConfig, train_and_evaluate
config = TrainConfig.from_dict(json.loads(sys.argv[1]))
result = train_and_evaluate(config, sys.argv[2])
model = keras.saving.load_model(result["model_path"], compile=False)
np.savez(sys.argv[2] + ".npz", *model.get_weights())
print("RESULT" + json.dumps({"loss": result["history"][0]["loss"],
                             "test_loss": result["test_loss"]}))
"""


@pytest.mark.e2e
def test_tensorflow_jax_and_pytorch_train_the_same_steps(tmp_path):
    import keras

    import keras_preact

    start = str(tmp_path / "start.weights.h5")
    keras_preact.PreActResNet(**TINY["architecture"], classes=10, input_shape=(32, 32, 3),
                              name="tiny").save_weights(start)
    config = TrainConfig(model="tiny", model_kwargs=TINY, dataset="digits", batch_size=64,
                         steps=3, seed=0, weights=start, cutout=4, label_smoothing=0.1,
                         eval_every=0, verbose=0)
    procs = {}
    for backend in ("tensorflow", "jax", "torch"):
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        procs[backend] = subprocess.Popen(
            [sys.executable, "-c", PARITY, config.to_json(), str(tmp_path / backend)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = {}
    for backend, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        line = next(ln for ln in stdout.splitlines() if ln.startswith("RESULT"))
        out[backend] = json.loads(line[len("RESULT"):])
        out[backend]["weights"] = list(np.load(str(tmp_path / backend) + ".npz").values())
    del keras
    reference = out.pop("tensorflow")
    for backend, got in out.items():
        assert got["loss"] == pytest.approx(reference["loss"], rel=1e-4), backend
        assert got["test_loss"] == pytest.approx(reference["test_loss"], rel=1e-3), backend
        assert len(got["weights"]) == len(reference["weights"])
        gap = max(float(np.max(np.abs(a - b))) for a, b in zip(got["weights"],
                                                                reference["weights"]) if a.size)
        print(f"{backend}: loss {got['loss'] / reference['loss'] - 1:.1e} relative, "
              f"test loss {got['test_loss'] / reference['test_loss'] - 1:.1e}, weights {gap:.1e}")
        assert gap < 1e-3, (backend, gap)
