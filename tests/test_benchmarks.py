"""The benchmark harness's own arithmetic and reporting (not its figures: CI does not
time anything)."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from benchmarks import launch, machine, run
from benchmarks.keras_step import summary
from tests.helpers import NO_TENSORFLOW, REPO

BENCH = os.path.join(REPO, "benchmarks")


def _script(name, *args, timeout=300):
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, os.path.join(BENCH, name), *args], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_keras_step_reports_the_steady_rate_and_the_whole_call():
    proc = _script("keras_step.py", "--model", "preact_resnet20", "--batch", "4", "--steps", "3",
                       "--warmup", "1", "--image-size", "16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    # The steady rate spans the steps only, so it cannot be below the whole call's.
    assert row["images_per_s"] >= row["call_images_per_s"] > 0
    assert row["s_per_step"] * row["steps"] <= row["call_s"]
    assert row["images_per_s"] == pytest.approx(row["batch"] / row["s_per_step"])
    assert 0 < row["median_s_per_step"] <= row["max_s_per_step"]
    assert row["steps"] == 3 and row["batch"] == 4
    import keras_preact as kp

    model = kp.get_model("preact_resnet20", input_shape=(16, 16, 3))
    assert row["macs"] == kp.count_macs(model)
    assert row["params"] == kp.count_params(model)


@pytest.mark.parametrize("script, args, message", [
    ("keras_step.py", ["--steps", "0"], "argument --steps: must be an integer >= 1. Received: 0"),
    ("keras_step.py", ["--batch", "-2"], "--batch: must be an integer >= 1. Received: -2"),
    ("keras_step.py", ["--model-kwargs", "[1]"], "--model-kwargs: invalid json_object value"),
    ("keras_step.py", ["--model-kwargs", "{bad"], "--model-kwargs: invalid json_object value"),
    ("run.py", ["--pairs", "0"], "argument --pairs: must be an integer >= 1. Received: 0"),
    ("jax_ops.py", ["--batch", "0"], "argument --batch: must be an integer >= 1. Received: 0"),
    ("step_ab.py", ["--models", "preact_resnet7"], "--models: unknown model(s) ['preact_resnet7']"),
    ("step_ab.py", ["--models", "preact_resnet20[1]"], "unknown model(s) ['preact_resnet20[1]']"),
    ("step_ab.py", ["--reps", "0"], "argument --reps: must be an integer >= 1. Received: 0"),
    ("step_ab.py", ["--variants", "NOVALUE"], "--variants: invalid variant value: 'NOVALUE'"),
    ("step_ab.py", ["--models", "preact_resnet20{bad"], "invalid model value: 'preact_resnet2"),
    ("step_ab.py", ["--model", 'preact_resnet20{"a": 1}', "x{1}"], "invalid model value: 'x{1}'"),
    ("serving_throughput.py", ["--batch-sizes", "2", "--images", "3"],
     "--images must be a multiple of every batch size. Received: 3"),
])
def test_scripts_reject_bad_arguments(script, args, message):
    proc = _script(script, *args, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_launch_runs_a_scripts_function_in_a_fresh_process():
    rows = [{"model": "a", "family": "basic", "s_per_image": 1e-3, "macs": 1e7}]
    assert launch(run.scaling_summary, rows, check=True) == run.scaling_summary(rows)
    failed = launch(run.scaling_summary, [{}])
    assert failed["error"] == ["KeyError: 'family'"], failed
    with pytest.raises(RuntimeError, match="KeyError"):
        launch(run.scaling_summary, [{}], check=True)


def test_step_summary_spans_first_start_to_last_end():
    out = summary([10.0, 11.0, 12.5], [10.5, 12.0, 13.0], 8)
    assert out["s_per_step"] == pytest.approx(1.0)
    assert out["images_per_s"] == pytest.approx(8.0)
    assert out["median_s_per_step"] == pytest.approx(0.5)
    assert out["max_s_per_step"] == pytest.approx(1.0)


def test_scaling_summary_relative_to_the_shallowest_and_across_families():
    rows = [
        {"model": "a", "family": "basic", "s_per_image": 1e-3, "macs": 1e7},    # 100 ps/MAC
        {"model": "b", "family": "basic", "s_per_image": 2.4e-3, "macs": 2e7},  # 120
        {"model": "c", "family": "bottleneck", "s_per_image": 3e-3, "macs": 2e7},  # 150
        {"model": "d", "family": "bottleneck", "s_per_image": 7.5e-3, "macs": 5e7},  # 150
    ]
    out = run.scaling_summary(rows)
    assert out["basic"] == {"a": pytest.approx(1.0), "b": pytest.approx(1.2)}
    assert out["bottleneck"] == {"c": pytest.approx(1.0), "d": pytest.approx(1.0)}
    assert out["basic_ps_per_mac"] == pytest.approx(110.0)
    assert out["bottleneck_over_basic_ps_per_mac"] == pytest.approx(150 / 110)
    # Proportional at the best constant (110 ps/MAC): 100 and 120 are both 1/11 off.
    assert out["basic_max_deviation_from_proportional"] == pytest.approx(1 / 11)
    assert out["bottleneck_max_deviation_from_proportional"] == pytest.approx(0.0)


def test_machine_names_the_cpu_and_its_vector_features():
    info = machine()["cpu"]
    assert isinstance(info["model"], str) and info["model"]
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), [])
        assert ("avx2" in info["features"]) == ("avx2" in flags)


def test_step_ab_takes_turns_over_models_and_variants(tmp_path):
    out = tmp_path / "ab.json"
    proc = _script("step_ab.py", "--models", "preact_resnet20", 'preact_resnet32{"remat": 2}',
                   "--variants", "", "KERAS_PREACT_FUSED_BN=0", "--batch", "2", "--reps", "2",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == report
    got = [(r["model"], r["variant"]) for r in report["rows"]]
    remat32 = 'preact_resnet32{"remat": 2}'
    assert got == [("preact_resnet20", ""), ("preact_resnet20", "KERAS_PREACT_FUSED_BN=0"),
                   (remat32, ""), (remat32, "KERAS_PREACT_FUSED_BN=0")]
    import keras_preact as kp

    for r in report["rows"]:
        name = r["model"].partition("{")[0]
        assert r["macs"] == kp.count_macs(kp.get_model(name, input_shape=(32, 32, 3)))
        assert r["ps_per_mac"] == pytest.approx(1e12 * r["median_s_per_step"] / 2 / r["macs"])
        assert r["min_s_per_step"] <= r["median_s_per_step"]


def test_serving_throughput_times_every_format_against_pytorch(tmp_path):
    out = tmp_path / "serving.json"
    proc = _script("serving_throughput.py", "--model", "preact_resnet20", "--batch-sizes", "2",
                   "--images", "4", "--repeats", "1", "--warmup", "1",
                   "--calibration-images", "8", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {row["format"]: row for row in report["rows"]}
    assert set(rows) == {"PyTorch eager", "Keras predict_on_batch", "SavedModel serving_default",
                         "ONNX Runtime", "ONNX Runtime int8", "LiteRT", "LiteRT float16",
                         "LiteRT dynamic range", "LiteRT int8"}
    assert rows["PyTorch eager"]["ratio_to_torch"] == 1.0
    assert all(row["images_per_s"] > 0 and row["batch"] == 2 for row in rows.values())
    # int8 weights: under half the float32 file of the same format (ONNX adds its scales).
    for fmt in ("ONNX Runtime", "LiteRT"):
        assert rows[f"{fmt} int8"]["bytes"] < rows[fmt]["bytes"] / 2, fmt


def test_gpu_suite_runs_on_jax_without_tensorflow(tmp_path):
    """What a GPU machine has is JAX: the suite runs there with TensorFlow unimportable
    (a `sitecustomize` blocks it in every process), each model in each precision."""
    (tmp_path / "sitecustomize.py").write_text(NO_TENSORFLOW)
    out = tmp_path / "gpu.json"
    env = dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=str(tmp_path), TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, os.path.join(BENCH, "run.py"), "--suite", "gpu", "--gpu-models",
         "preact_resnet20", "--batch", "2", "--steps", "2", "--precisions", "fp32",
         "mixed_bfloat16", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["case"] for r in rows] == ["preact_resnet20 b2 jax fp32",
                                         "preact_resnet20 b2 jax mixed_bfloat16"], rows
    for row in rows:
        assert row["framework"] == "keras-jax" and row["jit_compile"] and row["images_per_s"] > 0
        assert row["device"] == "cpu" and row["peak_device_mb"] is None  # a CPU reports none
    assert "resnet1001_schedule_hours" not in report


def test_gpu_suite_projects_the_papers_schedule_from_resnet1001s_rate(monkeypatch):
    # 64k iterations x 128 images at 64000 * 128 / 3600 images/s: one hour.
    calls = []

    def fake_case(model, batch, steps, **kwargs):
        calls.append((model, kwargs["precision"]))
        return {"images_per_s": 64000 * 128 / 3600 * (2 if "mixed" in kwargs["precision"] else 1)}

    monkeypatch.setattr(run, "keras_case", fake_case)
    args = argparse.Namespace(gpu_models=["preact_resnet110", "preact_resnet1001"],
                                  precisions=["fp32", "mixed_bfloat16"], batch=128, steps=3)
    report = {"rows": []}
    run.suite_gpu(args, report)
    assert calls == [(m, p) for m in args.gpu_models for p in args.precisions]
    assert report["resnet1001_schedule_hours"] == {"fp32": pytest.approx(1.0),
                                                   "mixed_bfloat16": pytest.approx(0.5)}


def test_jax_ops_times_both_frameworks_ops_and_whole_steps(tmp_path):
    out = tmp_path / "ops.json"
    proc = _script("jax_ops.py", "--rounds", "1", "--reps", "1", "--batch", "2", "--steps", "1",
                   "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rounds"]
    for side in ("jax", "torch"):
        assert row[side]["conv"] > 0 and row[side]["bn_relu"] > 0 and row[side]["step"] > 0


def test_cifar_suite_trains_both_sides_and_reads_finished_runs_again(tmp_path):
    from tests.data_fixtures import write_png_folder

    for split, n in (("train", 6), ("test", 3)):
        write_png_folder(tmp_path / "images" / split, ["cat", "dog"], n)
    runs, out = tmp_path / "runs", tmp_path / "cifar.json"
    argv = ["--suite", "cifar", "--data-path", str(tmp_path / "images"), "--runs", str(runs),
            "--seeds", "0", "--epochs", "1", "--fast-epochs", "1", "--batch", "4",
            "--out", str(out)]
    assert run.main(argv) == 0
    report = json.loads(out.read_text())
    curves = report["curves"]
    assert set(curves) == {"keras-preact paper seed 0", "PyTorch ref paper seed 0",
                           "keras-preact fast seed 0"}
    fast = json.loads((runs / "keras_fast_e1_s0" / "config.json").read_text())["train_config"]
    assert fast["schedule"] == "cosine" and fast["label_smoothing"] > 0
    for curve in curves.values():
        (epoch,) = curve
        assert epoch["epoch"] == 1 and epoch["minutes"] > 0
        # Measured on the 6 images of test/: a multiple of 1/6.
        accuracy = epoch["test_accuracy"] * 6
        assert 0 <= accuracy <= 6 and accuracy == pytest.approx(round(accuracy), abs=1e-5)
    # Finished runs are read, not trained again: the reference's log is not rewritten.
    log = runs / "torch_paper_e1_s0.jsonl"
    stamp = log.stat().st_mtime_ns
    assert run.main(argv) == 0
    assert json.loads(out.read_text())["curves"] == curves
    assert log.stat().st_mtime_ns == stamp
    # --read-only reports an unfinished run as it stands and trains nothing.
    log.write_text(log.read_text().splitlines()[0] + "\n")
    stamp = log.stat().st_mtime_ns
    assert run.main(argv + ["--read-only"]) == 0
    report = json.loads(out.read_text())
    assert report["curves"]["PyTorch ref paper seed 0"] == [] and log.stat().st_mtime_ns == stamp
    assert [r["case"] for r in report["rows"]] == ["keras-preact paper seed 0",
                                                   "keras-preact fast seed 0"]


def test_ablation_suite_reports_each_variants_raw_averaged_and_flipped_accuracy(tmp_path):
    from tests.data_fixtures import write_png_folder

    for split, n in (("train", 6), ("test", 3)):
        write_png_folder(tmp_path / "images" / split, ["cat", "dog"], n)
    runs, out = tmp_path / "runs", tmp_path / "ablation.json"
    argv = ["--suite", "ablation", "--data-path", str(tmp_path / "images"), "--runs", str(runs),
            "--seeds", "0", "--fast-epochs", "2", "--batch", "4", "--variants", "ema",
            "cutout8", "--out", str(out)]
    assert run.main(argv) == 0
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ema seed 0", "cutout8 seed 0"}
    stored = json.loads((runs / "cutout8_s0" / "config.json").read_text())["train_config"]
    assert stored["cutout"] == 8 and stored["schedule"] == "cosine"
    ema, plain = rows["ema seed 0"], rows["cutout8 seed 0"]
    assert ema["precision_auto"]["chosen"] in ("fp32", "mixed_bfloat16")
    assert ema["raw_test_accuracy"] is not None and plain["raw_test_accuracy"] is None
    assert ema["raw_flip_test_accuracy"] is not None and plain["raw_flip_test_accuracy"] is None
    for row in rows.values():  # on the 6 images of test/: multiples of 1/6
        for key in ("test_accuracy", "flip_test_accuracy", "raw_flip_test_accuracy"):
            if row[key] is None:
                continue
            assert row[key] * 6 == pytest.approx(round(row[key] * 6), abs=1e-5)
    # The final model is the averaged one: its score is the last epoch's.
    metrics = json.loads((runs / "ema_s0" / "metrics.json").read_text())
    assert ema["test_accuracy"] == pytest.approx(metrics["test_accuracy"])


def test_folder_suite_runs_the_readmes_folder_command(tmp_path):
    from tests.data_fixtures import write_png_folder

    classes = ["airplane", "automobile", "bird"]
    for split, n in (("train", 11), ("test", 3)):  # 33 images: one batch of 32 an epoch
        write_png_folder(tmp_path / "images" / split, classes, n)
    runs, out = tmp_path / "runs", tmp_path / "folder.json"
    assert run.main(["--suite", "folder", "--data-path", str(tmp_path / "images"),
                     "--runs", str(runs), "--seeds", "0", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["minutes"] > 0 and row["test_accuracy"] * 9 == pytest.approx(
        round(row["test_accuracy"] * 9), abs=1e-5)  # scored on the 9 test images
    # The run is the README's command on the subset: its flags are in the stored config.
    command = run.readme_folder_command()
    stored = json.loads((runs / "seed0" / "config.json").read_text())["train_config"]
    for flag, key in (("--model", "model"), ("--batch-size", "batch_size"), ("--epochs", "epochs")):
        assert str(stored[key]) == command[command.index(flag) + 1]
    assert stored["data_path"] == str(runs / "my_images")
    assert sorted(os.listdir(runs / "my_images" / "train")) == classes
