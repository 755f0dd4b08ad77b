"""Public API behaviour: errors on bad input, backends, the CLI."""

import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_preact as kp
from tests.helpers import NO_TENSORFLOW, REPO, run_cli, run_python


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: kp.preact_resnet_cifar(21, block="basic"), r"6n\+2.*Received: depth=21"),
        (lambda: kp.preact_resnet_cifar(165, block="bottleneck"), r"9n\+2.*Received: depth=165"),
        (lambda: kp.preact_resnet_cifar(20, block="wide"), r"block='wide'.*Valid"),
        (lambda: kp.preact_resnet_cifar("20"), r"depth='20'"),
        (lambda: kp.get_model("resnet50"), r"name='resnet50'.*preact_resnet20"),
        (lambda: kp.preact_resnet20(classes=0), r"classes=0"),
        (lambda: kp.preact_resnet20(input_shape=(7, 32, 3)), r"at least 8.*\(7, 32, 3\)"),
        (lambda: kp.preact_resnet20(input_shape=(32, 32)), r"3 dimensions"),
        (lambda: kp.preact_resnet20(pooling="sum"), r"pooling='sum'"),
        (lambda: kp.preact_resnet20(classifier_activation="nope"), r"classifier_activation='nope'"),
        (lambda: kp.preact_resnet20(preprocessing="bgr"), r"preprocessing='bgr'.*cifar10"),
        (lambda: kp.preact_resnet20(data_format="NCHW"), r"data_format='NCHW'"),
        (lambda: kp.preact_resnet20(bottleneck_stride="last"), r"bottleneck_stride='last'"),
        (lambda: kp.preact_resnet20(weights="imagenet"), r"weights='imagenet'"),
        (lambda: kp.preact_resnet20(weights="/no/such/file.weights.h5"), r"does not exist"),
        (lambda: kp.preact_resnet20(stage_blocks=(1, 1)),
         r"stage_blocks.*fixed by the registered model"),
        (lambda: kp.PreActResNet(stage_blocks=(1, 1), stage_filters=(8, 16, 32)),
         r"one entry per stage"),
        (lambda: kp.PreActResNet(block="bottleneck", stage_filters=(10, 32, 64)), r"divisible"),
    ],
)
def test_bad_input_raises_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_errors_come_before_any_layer_is_built(built_convs):
    for bad in (dict(classes=0), dict(input_shape=(4, 4, 3)), dict(weights="/nope.weights.h5")):
        with pytest.raises(ValueError):
            kp.preact_resnet20(**bad)
    assert built_convs == []


def test_import_and_build_without_tensorflow():
    """keras_preact works on the JAX backend with TensorFlow made unimportable."""
    code = NO_TENSORFLOW + """
import numpy as np
import keras
import keras_preact as kp
m = kp.preact_resnet20()
tiny = kp.PreActResNet(stage_blocks=(1, 2, 1), stage_filters=(8, 16, 32), stem_filters=8,
                       input_shape=(16, 16, 3))
out = keras.ops.convert_to_numpy(tiny(np.zeros((2, 16, 16, 3), "float32")))
assert out.shape == (2, 10)
assert "tensorflow" not in sys.modules
print("OK", kp.count_params(m))
"""
    proc = run_python(code, env={"KERAS_BACKEND": "jax"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OK 272282" in proc.stdout


CROSS_BACKEND = """
import sys, json, numpy as np, keras, keras_preact as kp
for job in json.load(open(sys.argv[1])):
    model = kp.PreActResNet.from_config(job["config"])
    model.load_weights(job["weights"])
    x = np.load(job["x"])
    np.save(job["out"] + "_" + keras.backend.backend() + ".npy",
            keras.ops.convert_to_numpy(model(x, training=False)))
print(keras.backend.backend())
"""


def test_same_weights_same_outputs_on_three_backends(tmp_path):
    """Two representative models (basic ResNet-20 with preprocessing, a tiny
    bottleneck net) give equal outputs for the same weights on TF, JAX and torch."""
    import json

    models = {
        "preact_resnet20": kp.preact_resnet20(preprocessing="cifar10"),
        "tiny_bottleneck": kp.PreActResNet(
            block="bottleneck", stage_blocks=(2, 1, 1), stage_filters=(16, 32, 64),
            stem_filters=8, input_shape=(16, 16, 3), classes=5,
        ),
    }
    rng = np.random.RandomState(0)
    jobs, reference = [], {}
    for name, model in models.items():
        # Non-trivial BN statistics so inference mode is really compared.
        for w in model.non_trainable_weights:
            lo, hi = (-0.2, 0.2) if w.name.endswith("moving_mean") else (0.5, 1.5)
            w.assign(rng.uniform(lo, hi, tuple(w.shape)).astype("float32"))
        size = model.input_shape[1]
        x = rng.uniform(0, 255, (3, size, size, 3)).astype("float32")
        np.save(tmp_path / f"{name}_x.npy", x)
        model.save_weights(str(tmp_path / f"{name}.weights.h5"))
        reference[name] = keras.ops.convert_to_numpy(model(x, training=False))
        jobs.append({"config": model.get_config(), "weights": str(tmp_path / f"{name}.weights.h5"),
                     "x": str(tmp_path / f"{name}_x.npy"), "out": str(tmp_path / name)})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    script = tmp_path / "run.py"
    script.write_text(CROSS_BACKEND)
    for backend in ("jax", "torch"):
        proc = subprocess.run(
            [sys.executable, str(script), str(tmp_path / "jobs.json")],
            env={**os.environ, "KERAS_BACKEND": backend}, cwd=REPO,
            capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip().endswith(backend)
        for name in models:
            got = np.load(tmp_path / f"{name}_{backend}.npy")
            np.testing.assert_allclose(got, reference[name], atol=1e-5, rtol=1e-4)


def test_cli_list_and_summary(capsys):
    code, out, _ = run_cli(["list", "preact_resnet[2-5][0-9]"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["model", "depth", "block", "parameters", "multiply-adds"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"preact_resnet20", "preact_resnet32", "preact_resnet44", "preact_resnet56",
                         "preact_resnet34", "preact_resnet50"}  # ImageNet family too
    assert rows["preact_resnet50"][1:4] == ["50", "bottleneck", "25,549,480"]
    assert rows["preact_resnet20"][1:4] == ["20", "basic", "272,282"]
    assert rows["preact_resnet20"][4] == f"{kp.count_macs(kp.preact_resnet20()) / 1e6:,.1f}M"
    code, out, _ = run_cli(["summary", "preact_resnet20"], capsys)
    assert code == 0 and "Trainable parameters: 272,282" in out
    code, _, err = run_cli(["summary", "resnet50"], capsys)
    assert code == 2 and "error: Unknown model name" in err and "Traceback" not in err
