"""The benchmark harness: training throughput, peak memory and the PyTorch reference.

Every case runs in a fresh subprocess (`keras_step.py` or `torch_reference.py`), so
each peak resident memory figure belongs to one case. Throughput ratios compare cases
measured in the same invocation, alternating Keras and PyTorch runs so that drift of a
shared machine hits both sides. Prints a table and writes JSON. Not a test: CI does
not run it.

Suites:

* ``cpu``: ResNet-110 at batch 128 against the PyTorch reference (``--pairs``
  alternating pairs), the fraction of the fp32 matrix-multiply peak that TensorFlow
  measures on these cores, per-image time against multiply-adds for depths of both
  block families, the augmented input pipeline's images/s, and ResNet-1001's peak
  memory at a batch that fits.
* ``gpu``: the JAX backend (no TensorFlow needed) in fp32 and mixed precision with
  larger batches, and a projection of the paper's ResNet-1001 schedule
  (64k iterations x 128 images) in hours from the measured images/s.
* ``quick``: a one-minute smoke run of the machinery (small depth and batch).

    python benchmarks/run.py --suite cpu [--pairs 3] [--out benchmarks/results/cpu.json]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
#: The paper's ResNet-1001 schedule: 64k iterations of 128 images.
PAPER_1001_IMAGES = 64000 * 128


def _run(script, args, *, env=None, timeout=3600):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"], "args": list(map(str, args))}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def keras_case(model, batch, steps, *, backend="tensorflow", threads=2, precision="fp32",
               jit=False, image_size=32, model_kwargs=None):
    args = ["--model", model, "--batch", batch, "--steps", steps, "--precision", precision,
            "--image-size", image_size, "--model-kwargs", json.dumps(model_kwargs or {})]
    if threads:
        args += ["--threads", threads]
    if jit:
        args.append("--jit-compile")
    return _run("keras_step.py", args, env={"KERAS_BACKEND": backend})


def torch_case(depth, batch, steps, *, threads=2):
    return _run("torch_reference.py", ["--depth", depth, "--batch", batch, "--steps", steps,
                                       "--threads", threads])


def matmul_peak(size=2048, repeats=20):
    """fp32 GFLOP/s of a square matmul in TensorFlow on this machine."""
    code = f"""
import time, json, tensorflow as tf
a = tf.random.normal(({size}, {size})); b = tf.random.normal(({size}, {size}))
f = tf.function(lambda a, b: tf.matmul(a, b))
f(a, b).numpy()
t = time.perf_counter()
for _ in range({repeats}): c = f(a, b)
c.numpy()
dt = (time.perf_counter() - t) / {repeats}
print(json.dumps({{"gflops": 2 * {size}**3 / dt / 1e9}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["gflops"]


def pipeline_rate(batch=128, batches=200):
    code = f"""
import time, json, numpy as np
from keras_preact.data import dataset_from_arrays
x = np.random.RandomState(0).randint(0, 256, (50000, 32, 32, 3)).astype(np.uint8)
y = np.zeros(50000, np.int64)
ds = dataset_from_arrays(x, y, batch_size={batch}, shuffle=True, augment="pad_crop_flip",
                         mean=(0.5,) * 3, std=(0.25,) * 3, drop_remainder=True, repeat_epochs=-1)
it = iter(ds)
for _ in range(10): next(it)
t = time.perf_counter()
for _ in range({batches}): next(it)
print(json.dumps({{"images_per_s": {batch} * {batches} / (time.perf_counter() - t)}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO))
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["images_per_s"]


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def suite_cpu(args, report):
    rows = report["rows"]
    pairs = []
    for i in range(args.pairs):
        # Alternate which side goes first, so slow drift does not favour one.
        order = ("keras", "torch") if i % 2 == 0 else ("torch", "keras")
        pair = {}
        for side in order:
            if side == "keras":
                pair[side] = keras_case("preact_resnet110", args.batch, args.steps)
            else:
                pair[side] = torch_case(110, args.batch, args.steps)
        ratio = None
        if "images_per_s" in pair["keras"] and "images_per_s" in pair["torch"]:
            ratio = pair["keras"]["images_per_s"] / pair["torch"]["images_per_s"]
        pairs.append(ratio)
        rows.append({"case": f"ResNet-110 b{args.batch} keras/tf (pair {i + 1})", **pair["keras"]})
        rows.append({"case": f"ResNet-110 b{args.batch} torch reference (pair {i + 1})", **pair["torch"],
                     "ratio_keras_over_torch": ratio})
    report["ratio_keras_over_torch"] = {"pairs": pairs, "median": _median(pairs)}
    peak = matmul_peak()
    report["matmul_gflops"] = peak
    if peak:
        flop_per_image = 2 * 3 * 253.1e6  # forward MACs x 2 FLOP x ~3 (forward + backward)
        keras_rates = [r["images_per_s"] for r in rows if r["case"].startswith("ResNet-110") and
                       r.get("framework", "").startswith("keras") and "images_per_s" in r]
        torch_rates = [r["images_per_s"] for r in rows if "torch reference" in r["case"] and "images_per_s" in r]
        report["fraction_of_matmul_peak"] = {
            "keras": _median(keras_rates) * flop_per_image / (peak * 1e9) if keras_rates else None,
            "torch": _median(torch_rates) * flop_per_image / (peak * 1e9) if torch_rates else None,
        }
    scaling = []
    for model in args.scaling_models:
        r = keras_case(model, args.scaling_batch, max(3, args.steps // 2))
        rows.append({"case": f"{model} b{args.scaling_batch} (cost scaling)", **r})
        if "images_per_s" in r:
            scaling.append({"model": model, "s_per_image": 1 / r["images_per_s"], "macs": r["macs"]})
    report["cost_scaling"] = scaling
    report["pipeline_images_per_s"] = pipeline_rate()
    r = keras_case("preact_resnet1001", args.batch_1001, 2)
    rows.append({"case": f"ResNet-1001 b{args.batch_1001} (memory)", **r})


def suite_gpu(args, report):
    rows = report["rows"]
    for precision in ("fp32", "mixed_bfloat16", "mixed_float16"):
        for batch in (128, 512):
            r = keras_case("preact_resnet110", batch, args.steps, backend="jax", threads=None,
                           precision=precision, jit=True)
            rows.append({"case": f"ResNet-110 b{batch} jax {precision}", **r})
    for precision in ("fp32", "mixed_bfloat16"):
        r = keras_case("preact_resnet1001", 128, args.steps, backend="jax", threads=None,
                       precision=precision, jit=True)
        rows.append({"case": f"ResNet-1001 b128 jax {precision}", **r})
        if "images_per_s" in r:
            report.setdefault("resnet1001_schedule_hours", {})[precision] = (
                PAPER_1001_IMAGES / r["images_per_s"] / 3600
            )


def suite_quick(args, report):
    rows = report["rows"]
    rows.append({"case": "ResNet-20 b16 keras/tf", **keras_case("preact_resnet20", 16, 3)})
    rows.append({"case": "ResNet-20 b16 torch", **torch_case(20, 16, 3)})


def print_table(report):
    print(f"{'case':46s} {'img/s':>9s} {'s/step':>8s} {'peak MB':>9s}")
    for r in report["rows"]:
        if "error" in r:
            print(f"{r['case']:46s} error: {r['error']}")
            continue
        print(f"{r['case']:46s} {r['images_per_s']:9.1f} {r['s_per_step']:8.3f} {r['peak_rss_mb']:9.0f}")
    for key in ("ratio_keras_over_torch", "matmul_gflops", "fraction_of_matmul_peak",
                "pipeline_images_per_s", "resnet1001_schedule_hours"):
        if key in report:
            print(f"{key}: {report[key]}")
    for row in report.get("cost_scaling", []):
        print(f"cost scaling {row['model']}: {row['s_per_image'] * 1e3:.2f} ms/image, "
              f"{row['macs'] / 1e6:.1f}M MACs, {row['s_per_image'] / row['macs'] * 1e12:.2f} ps/MAC")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("cpu", "gpu", "quick"), default="cpu")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--scaling-models", nargs="*",
                   default=["preact_resnet20", "preact_resnet56", "preact_resnet110",
                            "preact_resnet164", "preact_resnet272"])
    p.add_argument("--scaling-batch", type=int, default=64)
    p.add_argument("--batch-1001", type=int, default=16)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    report = {
        "suite": args.suite,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [],
    }
    {"cpu": suite_cpu, "gpu": suite_gpu, "quick": suite_quick}[args.suite](args, report)
    print_table(report)
    out = args.out or os.path.join(HERE, "results", f"{args.suite}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
