"""The benchmark harness: training throughput, peak memory and the PyTorch reference.

Training rates are steady rates of the timed steps on both sides (`keras_step.py`'s
docstring says why the whole `fit` call is reported beside them, not instead).
The report names the CPU and its vector features: they decide which kernels run.
Every case runs in a fresh subprocess (`keras_step.py` or `torch_reference.py`), so
each peak resident memory figure belongs to one case. Throughput ratios compare cases
measured in the same invocation, alternating Keras and PyTorch runs so that drift of a
shared machine hits both sides. Prints a table and writes JSON. Not a test: CI does
not run it.

Suites:

* ``cpu``: ResNet-110 at batch 128 against the PyTorch reference (``--pairs``
  alternating rounds of keras-preact; the same model on the unoptimised path, i.e.
  TensorFlow's Eigen kernels (its default on an AVX2-only CPU) and none of ours,
  ``TF_ENABLE_ONEDNN_OPTS=0 KERAS_PREACT_FAST_CONV_GRAD=0 KERAS_PREACT_FUSED_BN=0``;
  PyTorch; with ``--bf16`` also keras-preact in mixed bfloat16), the fraction of the
  fp32 matrix-multiply peak that TensorFlow measures on these cores, per-image time
  against multiply-adds for depths of both block families (basic 20 -> 1202,
  bottleneck 164 -> 1001; a family's models take turns step by step in one process), the
  augmented input pipeline's images/s against the training rate, and ResNet-1001 with
  rematerialisation: peak memory at batch 128, and per-image time with and without it
  at a batch that fits (both in one process, taking turns). ``--parts`` picks a
  subset; ``--max-isa avx2`` caps both sides' kernels at AVX2.
* ``gpu``: the JAX backend, which is all a GPU machine needs (``pip install keras
  keras-preact`` beside its JAX; nothing is installed at run time): ResNet-110, 164 and
  1001 training images/s in fp32, mixed bfloat16 and mixed float16 at ``--batch``
  (the paper's 128), the peak device memory of each, and the paper's ResNet-1001
  schedule (64k iterations x 128 images) in hours from the measured images/s.
* ``jax``: the JAX backend on the CPU: ResNet-56 and 110 at ``--batch`` against the
  PyTorch reference in ``--pairs`` alternating rounds (first step and steady rate), and
  ResNet-1001 at batch 128 with remat on JAX and TensorFlow (peak memory).
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
#: The unoptimised path: TensorFlow's default kernels on an AVX2 CPU, none of ours.
UNOPTIMISED_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "KERAS_PREACT_FAST_CONV_GRAD": "0",
                   "KERAS_PREACT_FUSED_BN": "0"}
#: The paper's ResNet-1001 schedule: 64k iterations of 128 images.
PAPER_1001_IMAGES = 64000 * 128


#: --max-isa: caps on the vector instructions of both sides' kernels (oneDNN in
#: TensorFlow and PyTorch, and PyTorch's own ATen kernels), to measure on an AVX-512 CPU
#: what an AVX2-only CPU would run. TensorFlow's Eigen kernels are compiled for a fixed
#: instruction set and are not affected.
ISA_ENVS = {
    "native": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
}
_CASE_ENV = {}


def _run(script, args, *, env=None, timeout=3600):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                    PYTHONPATH=os.pathsep.join(filter(None, (REPO, os.environ.get("PYTHONPATH")))))
    full_env.update(_CASE_ENV)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *map(str, args)],
        env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"], "args": list(map(str, args))}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def keras_case(model, batch, steps, *, backend="tensorflow", threads=2, precision="fp32",
               jit=False, image_size=32, model_kwargs=None, warmup=3, extra_env=None,
               unrolled=False):
    args = ["--model", model, "--batch", batch, "--steps", steps, "--precision", precision,
            "--image-size", image_size, "--model-kwargs", json.dumps(model_kwargs or {}),
            "--warmup", warmup]
    if threads:
        args += ["--threads", threads]
    if jit:
        args.append("--jit-compile")
    if unrolled:
        args.append("--unrolled")
    return _run("keras_step.py", args, env={"KERAS_BACKEND": backend, **(extra_env or {})})


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


def cpu_info():
    """The CPU's model name and the vector features that decide which kernels run
    (TensorFlow turns oneDNN on by itself only with recent AVX-512 extensions or AMX;
    AVX512_BF16 or AMX give bfloat16 its speed), from /proc/cpuinfo where there is one."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())  # the first CPU's
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "features": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                                     "amx_bf16", "amx_tile") if f in flags]}


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _rate(row):
    return row.get("images_per_s") if isinstance(row, dict) else None


def suite_cpu(args, report):
    rows = report["rows"]
    parts = set(args.parts)
    if "speed" in parts:
        # keras-preact as shipped, the same model on the unoptimised path (no oneDNN, no
        # kernels of ours: what TensorFlow runs by default on an AVX2 CPU), and the
        # PyTorch reference, alternating.
        sides = {
            "keras": lambda: keras_case("preact_resnet110", args.batch, args.steps),
            "keras_unoptimised": lambda: keras_case(
                "preact_resnet110", args.batch, args.steps, extra_env=UNOPTIMISED_ENV),
            "torch": lambda: torch_case(110, args.batch, args.steps),
        }
        if args.bf16:
            # The same model in mixed bfloat16 (not a target: a CPU with AVX512_BF16 or
            # AMX runs bfloat16 convolutions natively; others emulate them).
            sides["keras_bf16"] = lambda: keras_case("preact_resnet110", args.batch, args.steps,
                                                     precision="mixed_bfloat16")
        ratios, plain_ratios, bf16_ratios = [], [], []
        for i in range(args.pairs):
            order = list(sides) if i % 2 == 0 else list(reversed(list(sides)))
            got = {side: sides[side]() for side in order}
            torch_rate = _rate(got["torch"])
            ratio = _rate(got["keras"]) / torch_rate if _rate(got["keras"]) and torch_rate else None
            plain = (_rate(got["keras_unoptimised"]) / torch_rate
                     if _rate(got["keras_unoptimised"]) and torch_rate else None)
            ratios.append(ratio)
            plain_ratios.append(plain)
            rows.append({"case": f"ResNet-110 b{args.batch} keras-preact (round {i + 1})", **got["keras"],
                         "ratio_over_torch": ratio})
            rows.append({"case": f"ResNet-110 b{args.batch} unoptimised (round {i + 1})",
                         **got["keras_unoptimised"], "ratio_over_torch": plain})
            rows.append({"case": f"ResNet-110 b{args.batch} PyTorch ref (round {i + 1})", **got["torch"]})
            if "keras_bf16" in got:
                bf16 = (_rate(got["keras_bf16"]) / torch_rate
                        if _rate(got["keras_bf16"]) and torch_rate else None)
                bf16_ratios.append(bf16)
                rows.append({"case": f"ResNet-110 b{args.batch} keras-preact bf16 (round {i + 1})",
                             **got["keras_bf16"], "ratio_over_torch": bf16})
        report["ratio_keras_over_torch"] = {"rounds": ratios, "median": _median(ratios)}
        report["ratio_unoptimised_over_torch"] = {"rounds": plain_ratios, "median": _median(plain_ratios)}
        if bf16_ratios:
            report["ratio_bf16_over_torch_fp32"] = {"rounds": bf16_ratios, "median": _median(bf16_ratios)}
        peak = matmul_peak()
        report["matmul_gflops"] = peak
        if peak:
            # ResNet-110 forward multiply-adds x 2 FLOP x 3 (forward + backward).
            flop_per_image = 2 * 3 * 253.1e6
            report["train_gflop_per_image"] = flop_per_image / 1e9

            def fraction(prefix):
                rates = [r["images_per_s"] for r in rows
                         if r["case"].startswith(prefix) and "images_per_s" in r]
                return _median(rates) * flop_per_image / (peak * 1e9) if rates else None

            report["fraction_of_matmul_peak"] = {
                "keras-preact": fraction(f"ResNet-110 b{args.batch} keras-preact (round"),
                "torch": fraction(f"ResNet-110 b{args.batch} PyTorch ref (round"),
            }
    if "pipeline" in parts:
        rate = pipeline_rate()
        report["pipeline_images_per_s"] = rate
        train = _median([r["images_per_s"] for r in rows
                         if "keras-preact (round" in r["case"] and "images_per_s" in r])
        if rate and train:
            report["pipeline_over_training"] = rate / train
    if "scaling" in parts:
        # One process per block family: every model of the family is traced there and
        # the models take turns step by step (`step_ab.py`), so a slow spell of a shared
        # machine hits every model alike rather than whichever ran during it.
        scaling = []
        for family in ("basic", "bottleneck"):
            models = [m for m in args.scaling_models
                      if (m in BOTTLENECK_MODELS) == (family == "bottleneck")]
            if not models:
                continue
            r = _run("step_ab.py", ["--models", *models, "--batch", args.scaling_batch,
                                    "--reps", args.scaling_steps])
            if "error" in r:
                rows.append({"case": f"{family} family b{args.scaling_batch} (cost scaling)", **r})
                continue
            for row in r["rows"]:
                rows.append({"case": f"{row['model']} b{args.scaling_batch} (scaling)", "images_per_s": row["images_per_s"],
                             "s_per_step": row["median_s_per_step"], "peak_rss_mb": None,
                             "macs": row["macs"]})
                scaling.append({"model": row["model"], "family": family,
                                "s_per_image": row["ms_per_image"] / 1e3, "macs": row["macs"]})
        report["cost_scaling"] = scaling
        report["cost_scaling_summary"] = scaling_summary(scaling)
    if "memory" in parts:
        # ResNet-1001: at batch 128 with remat (the <= 4 GB target), and per-image time
        # with and without remat at a batch that fits without it.
        mem = {}
        # Peak memory: a process per case, so that each peak is that case's alone.
        for label, batch, remat in (("remat b128", 128, "segment"),
                                    (f"plain b{args.batch_1001}", args.batch_1001, None),
                                    (f"remat b{args.batch_1001}", args.batch_1001, "segment")):
            r = keras_case("preact_resnet1001", batch, args.steps_1001, warmup=1,
                           model_kwargs={"remat": remat} if remat else None)
            rows.append({"case": f"ResNet-1001 {label}", **r})
            mem[label] = r
        # Time with remat against without: both traced in one process, steps taking
        # turns (`step_ab.py`), so that the machine's drift hits both alike. The plain
        # model comes first: the first rematerialised stage turns Grappler's model
        # pruning off for the process, after the plain step was optimised with it on.
        ab = _run("step_ab.py", ["--models", "preact_resnet1001",
                                 'preact_resnet1001{"remat": "segment"}',
                                 "--batch", args.batch_1001, "--reps", args.memory_reps])
        ratio = None
        if "error" in ab:
            rows.append({"case": "ResNet-1001 remat time A/B", **ab})
        else:
            plain_row, remat_row = ab["rows"]
            ratio = remat_row["median_s_per_step"] / plain_row["median_s_per_step"]
            for label, row in (("plain", plain_row), ("remat", remat_row)):
                rows.append({"case": f"ResNet-1001 {label} b{args.batch_1001} (in-process turns)",
                             "images_per_s": row["images_per_s"],
                             "s_per_step": row["median_s_per_step"], "peak_rss_mb": None})
        report["resnet1001"] = {
            "peak_rss_mb_b128_remat": mem["remat b128"].get("peak_rss_mb"),
            "remat_time_ratio": ratio,
            f"peak_rss_mb_b{args.batch_1001}_plain": mem[f"plain b{args.batch_1001}"].get("peak_rss_mb"),
            f"peak_rss_mb_b{args.batch_1001}_remat": mem[f"remat b{args.batch_1001}"].get("peak_rss_mb"),
        }
        if _rate(mem["remat b128"]):
            report["resnet1001_schedule_hours"] = {
                "cpu fp32 remat b128": PAPER_1001_IMAGES / _rate(mem["remat b128"]) / 3600
            }


BOTTLENECK_MODELS = {"preact_resnet164", "preact_resnet272", "preact_resnet542", "preact_resnet1001"}


def scaling_summary(scaling):
    """Per family: time per MAC of each depth relative to the family's shallowest, the
    family's median picoseconds per MAC, and how far the family is from proportional
    to its MACs at the best constant (the midpoint of its fastest and slowest time per
    MAC: the largest relative deviation is then (max - min) / (max + min)); and the
    cross-family ratio of the medians."""
    out = {}
    for family in ("basic", "bottleneck"):
        rows = [r for r in scaling if r["family"] == family]
        if not rows:
            continue
        per_mac = [r["s_per_image"] / r["macs"] for r in rows]
        out[family] = {r["model"]: v / per_mac[0] for r, v in zip(rows, per_mac)}
        out[family + "_ps_per_mac"] = _median([v * 1e12 for v in per_mac])
        out[family + "_max_deviation_from_proportional"] = (
            (max(per_mac) - min(per_mac)) / (max(per_mac) + min(per_mac)))
    if "basic_ps_per_mac" in out and "bottleneck_ps_per_mac" in out:
        out["bottleneck_over_basic_ps_per_mac"] = out["bottleneck_ps_per_mac"] / out["basic_ps_per_mac"]
    return out


def suite_gpu(args, report):
    """Training img/s and peak device memory on the JAX backend, each model in each
    precision, and the paper's ResNet-1001 schedule in hours at the measured rate."""
    rows = report["rows"]
    for model in args.gpu_models:
        for precision in args.precisions:
            r = keras_case(model, args.batch, args.steps, backend="jax", threads=None,
                           precision=precision, warmup=2)
            rows.append({"case": f"{model} b{args.batch} jax {precision}", **r})
            if model == "preact_resnet1001" and _rate(r):
                report.setdefault("resnet1001_schedule_hours", {})[precision] = (
                    PAPER_1001_IMAGES / _rate(r) / 3600)


def suite_jax(args, report):
    """The JAX backend on this machine's CPU: ResNet-56 and 110 against the PyTorch
    reference in alternating rounds (the first step, compilation included, and the steady
    rate), with the stages looped (the default) and unrolled, and ResNet-1001 at batch 128 with remat on JAX and TensorFlow (first step and
    peak resident memory)."""
    rows = report["rows"]
    for model in args.jax_models:
        depth = int(model.rsplit("resnet", 1)[1])
        sides = {"jax": lambda: keras_case(model, args.batch, args.steps, backend="jax",
                                           threads=None, warmup=1),
                 "jax unrolled": lambda: keras_case(model, args.batch, args.steps, backend="jax",
                                                    threads=None, warmup=1, unrolled=True),
                 "torch": lambda: torch_case(depth, args.batch, args.steps)}
        ratios = []
        for i in range(args.pairs):
            got = {side: sides[side]() for side in (sides if i % 2 == 0 else reversed(sides))}
            ratio = (_rate(got["jax"]) / _rate(got["torch"])
                     if _rate(got["jax"]) and _rate(got["torch"]) else None)
            ratios.append(ratio)
            rows.append({"case": f"{model} b{args.batch} jax (round {i + 1})", **got["jax"],
                         "ratio_over_torch": ratio})
            rows.append({"case": f"{model} b{args.batch} jax unrolled (round {i + 1})",
                         **got["jax unrolled"]})
            rows.append({"case": f"{model} b{args.batch} PyTorch ref (round {i + 1})", **got["torch"]})
        report.setdefault("ratio_jax_over_torch", {})[model] = {"rounds": ratios,
                                                                "median": _median(ratios)}
    for backend in ("jax", "tensorflow"):
        r = keras_case("preact_resnet1001", 128, args.steps_1001, backend=backend,
                       threads=None if backend == "jax" else 2, warmup=1,
                       model_kwargs={"remat": "segment"})
        rows.append({"case": f"preact_resnet1001 b128 remat {backend}", **r})


def suite_quick(args, report):
    rows = report["rows"]
    rows.append({"case": "ResNet-20 b16 keras/tf", **keras_case("preact_resnet20", 16, 3)})
    rows.append({"case": "ResNet-20 b16 torch", **torch_case(20, 16, 3)})


def print_table(report):
    machine = report.get("machine", {})
    cpu = machine.get("cpu", {})
    print(f"machine: {cpu.get('model', '?')}, {machine.get('cpus', '?')} CPUs, "
          f"features {' '.join(cpu.get('features', [])) or '?'}, "
          f"kernels capped at: {machine.get('max_isa', 'native')}")
    # img/s: the steady rate of the training steps; call img/s: the whole fit call,
    # setup and teardown included (keras_step.py's docstring).
    print(f"{'case':46s} {'img/s':>9s} {'s/step':>8s} {'call img/s':>10s} {'peak MB':>9s} "
          f"{'device MB':>9s}")
    for r in report["rows"]:
        if "error" in r:
            print(f"{r['case']:46s} error: {r['error']}")
            continue
        call = r.get("call_images_per_s")
        call = f"{call:10.1f}" if call else f"{'-':>10s}"
        peak = f"{r['peak_rss_mb']:9.0f}" if r.get("peak_rss_mb") else f"{'-':>9s}"
        device = f"{r['peak_device_mb']:9.0f}" if r.get("peak_device_mb") else f"{'-':>9s}"
        print(f"{r['case']:46s} {r['images_per_s']:9.1f} {r['s_per_step']:8.3f} {call} {peak} "
              f"{device}")
    for key in ("ratio_keras_over_torch", "ratio_jax_over_torch", "ratio_unoptimised_over_torch",
                "ratio_bf16_over_torch_fp32", "matmul_gflops",
                "fraction_of_matmul_peak", "pipeline_images_per_s", "pipeline_over_training",
                "cost_scaling_summary", "resnet1001", "resnet1001_schedule_hours"):
        if key in report:
            print(f"{key}: {report[key]}")
    for row in report.get("cost_scaling", []):
        print(f"cost scaling {row['model']}: {row['s_per_image'] * 1e3:.2f} ms/image, "
              f"{row['macs'] / 1e6:.1f}M MACs, {row['s_per_image'] / row['macs'] * 1e12:.2f} ps/MAC")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", choices=("cpu", "jax", "gpu", "quick"), default="cpu")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bf16", action="store_true",
                   help="cpu speed rounds: also keras-preact in mixed_bfloat16")
    p.add_argument("--parts", nargs="*", default=["speed", "pipeline", "scaling", "memory"],
                   help="cpu suite parts to run")
    p.add_argument("--scaling-models", nargs="*",
                   default=["preact_resnet20", "preact_resnet56", "preact_resnet110",
                            "preact_resnet1202", "preact_resnet164", "preact_resnet1001"])
    p.add_argument("--scaling-batch", type=int, default=32)
    p.add_argument("--scaling-steps", type=int, default=8,
                   help="timed steps of each scaling model (they take turns; medians)")
    p.add_argument("--batch-1001", type=int, default=32)
    p.add_argument("--steps-1001", type=int, default=4)
    p.add_argument("--memory-reps", type=int, default=6,
                   help="timed steps each of ResNet-1001 plain and remat at --batch-1001, "
                        "taking turns in one process")
    p.add_argument("--max-isa", choices=tuple(ISA_ENVS), default="native",
                   help="cap the kernels' vector instructions on both sides (avx2: what an "
                        "AVX2-only CPU runs, measured on a newer one)")
    p.add_argument("--jax-models", nargs="+", default=["preact_resnet56", "preact_resnet110"],
                   help="jax suite: CIFAR models timed against the PyTorch reference")
    p.add_argument("--gpu-models", nargs="+",
                   default=["preact_resnet110", "preact_resnet164", "preact_resnet1001"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "mixed_bfloat16", "mixed_float16"],
                   choices=("fp32", "mixed_bfloat16", "mixed_float16"), help="gpu suite")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    _CASE_ENV.clear()
    _CASE_ENV.update(ISA_ENVS[args.max_isa])
    for name in ("pairs", "batch", "steps", "scaling_batch", "scaling_steps",
                 "batch_1001", "steps_1001", "memory_reps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}")
    report = {
        "suite": args.suite,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "cpu": cpu_info(),
                    "max_isa": args.max_isa},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "rows": [],
    }
    {"cpu": suite_cpu, "jax": suite_jax, "gpu": suite_gpu,
     "quick": suite_quick}[args.suite](args, report)
    print_table(report)
    out = args.out or os.path.join(HERE, "results", f"{args.suite}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, out)
    print(f"wrote {out}")
    failed = [r["case"] for r in report["rows"] if "error" in r]
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
