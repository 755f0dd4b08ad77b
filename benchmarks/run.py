"""The benchmark harness: training throughput, peak memory and the PyTorch reference.

Every case runs in a fresh process (`keras_step.py`, `torch_reference.py`); rates are the
steady rates of the timed steps, Keras and PyTorch alternating round by round. Suites
(docs/performance.md describes every figure): ``cpu`` (``--parts``; ``--bf16``; ``--max-isa
avx2`` caps both sides' kernels at AVX2), ``jax`` (the JAX backend on the CPU), ``gpu`` (the
JAX backend in each of ``--precisions``, and the paper's ResNet-1001 schedule in hours;
installs nothing), ``cifar`` (test accuracy against training minutes on a real image folder,
keras-preact and the PyTorch reference, each of ``--seeds``), ``ablation`` (the fast recipe's
variants on such a folder) and ``quick`` (a smoke run).

    python benchmarks/run.py --suite cpu [--pairs 3] [--out benchmarks/results/cpu.json]
    python benchmarks/run.py --suite cifar --data-path CIFAR-10-images --runs runs/cifar
    python benchmarks/run.py --suite folder --data-path CIFAR-10-images --runs runs/folder
"""

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import (  # noqa: E402
    REPO,
    count,
    launch,
    machine,
    median,
    now,
    parser,
    print_table,
    take_turns,
    write_report,
)

#: The unoptimised path: TensorFlow's default kernels on an AVX2 CPU, none of ours.
UNOPTIMISED_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "KERAS_PREACT_FAST_CONV_GRAD": "0",
                   "KERAS_PREACT_FUSED_BN": "0"}
#: --max-isa: caps on the vector instructions of oneDNN (TensorFlow, PyTorch) and ATen, to
#: measure on an AVX-512 CPU what an AVX2-only CPU runs (TensorFlow's Eigen is unaffected).
ISA_ENVS = {"native": {}, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "DNNL_MAX_CPU_ISA": "AVX2",
                                   "ATEN_CPU_CAPABILITY": "avx2"}}
BOTTLENECK_MODELS = {"preact_resnet164", "preact_resnet272", "preact_resnet542",
                     "preact_resnet1001"}
TORCH = "PyTorch ref"
#: Environment settings of every training case (--max-isa).
CASE_ENV = {}


def keras_case(model, batch, steps, *, backend="tensorflow", threads=2, precision="fp32",
               model_kwargs=None, warmup=3, env=None, unrolled=False):
    """One `keras_step.py` case in a fresh process: its JSON row."""
    flags = ["--threads", threads] if threads else []
    return launch("keras_step", "--model", model, "--batch", batch, "--steps", steps,
                  "--precision", precision, "--model-kwargs", json.dumps(model_kwargs or {}),
                  "--warmup", warmup, *flags, *(["--unrolled"] if unrolled else []),
                  env={**CASE_ENV, "KERAS_BACKEND": backend, **(env or {})})


def torch_case(depth, batch, steps):
    return launch("torch_reference", "--depth", depth, "--batch", batch, "--steps", steps,
                  "--threads", 2, env=CASE_ENV)


def _rate(row):
    return row.get("images_per_s")


def _hours(row):  # the paper's ResNet-1001 schedule (64k iterations of 128 images)
    return 64000 * 128 / _rate(row) / 3600


def rounds(args, rows, model, prefix, cases):
    """`model` in `keras_case` with each of `cases` ({side: its keyword arguments}) and the
    PyTorch reference taking turns for --pairs rounds, appending rows '<prefix> <side> (round
    i)'; each side's ratios over the reference's rate: {side: {"rounds": [...], "median": m}}."""
    sides = {side: lambda kw=kw: keras_case(model, args.batch, args.steps, **kw)
             for side, kw in cases.items()}
    sides[TORCH] = lambda: torch_case(int(model.rsplit("resnet", 1)[1]), args.batch, args.steps)
    ratios = {side: [] for side in cases}
    for i, got in enumerate(take_turns(sides, args.pairs)):
        for side in sides:
            row = {"case": f"{prefix} {side} (round {i + 1})", **got[side]}
            if side in ratios:
                ok = _rate(got[side]) and _rate(got[TORCH])
                row["ratio_over_torch"] = _rate(got[side]) / _rate(got[TORCH]) if ok else None
                ratios[side].append(row["ratio_over_torch"])
            rows.append(row)
    return {side: {"rounds": r, "median": median(r)} for side, r in ratios.items()}


def _median_rate(rows, name):
    return median([_rate(r) for r in rows if f" {name} (round" in r["case"]])


def part_speed(args, report):
    """ResNet-110: keras-preact as shipped, on the unoptimised path and (--bf16) in mixed
    bfloat16, against the PyTorch reference; and the fraction of the matmul peak."""
    cases = {"keras-preact": {}, "unoptimised": {"env": UNOPTIMISED_ENV}}
    if args.bf16:
        cases["keras-preact bf16"] = {"precision": "mixed_bfloat16"}
    ratios = rounds(args, report["rows"], "preact_resnet110", f"ResNet-110 b{args.batch}", cases)
    keys = {"keras-preact": "ratio_keras_over_torch", "unoptimised": "ratio_unoptimised_over_torch",
            "keras-preact bf16": "ratio_bf16_over_torch_fp32"}
    report.update({keys[side]: r for side, r in ratios.items()})
    peak = report["matmul_gflops"] = launch(probe_matmul).get("gflops")
    if peak:
        flop_per_image = 2 * 3 * 253.1e6  # ResNet-110's multiply-adds x 2 FLOP x 3 (fwd + bwd)
        report["train_gflop_per_image"] = flop_per_image / 1e9
        report["fraction_of_matmul_peak"] = {
            label: (rate := _median_rate(report["rows"], side))
            and rate * flop_per_image / peak / 1e9
            for label, side in (("keras-preact", "keras-preact"), ("torch", TORCH))}


def part_pipeline(args, report):
    rate = report["pipeline_images_per_s"] = launch(probe_pipeline).get("images_per_s")
    train = _median_rate(report["rows"], "keras-preact")
    if rate and train:
        report["pipeline_over_training"] = rate / train


def turns(rows, models, batch, reps, label):
    """`models` traced in one process by `step_ab.py`, their steps taking turns: a row each
    (or the error's), named '<model> b<batch> (<label>)'; step_ab's rows, or [] on error."""
    r = launch("step_ab", "--models", *models, "--batch", batch, "--reps", reps, env=CASE_ENV)
    if "error" in r:
        rows.append({"case": f"{' '.join(models)} b{batch} ({label})", **r})
    rows += [{"case": f"{row['model']} b{batch} ({label})", "images_per_s": row["images_per_s"],
              "s_per_step": row["median_s_per_step"], "peak_rss_mb": None, "macs": row["macs"]}
             for row in r.get("rows", [])]
    return r.get("rows", [])


def part_scaling(args, report):
    """Per-image time against MACs. One process per block family: its models take turns
    step by step, so a slow spell of a shared machine hits every model alike."""
    scaling = report["cost_scaling"] = []
    for family in ("basic", "bottleneck"):
        models = [m for m in args.scaling_models
                  if (m in BOTTLENECK_MODELS) == (family == "bottleneck")]
        rows = models and turns(report["rows"], models, args.scaling_batch,
                                args.scaling_steps, "scaling")
        scaling += [{"model": r["model"], "family": family, "s_per_image": r["ms_per_image"] / 1e3,
                     "macs": r["macs"]} for r in rows]
    report["cost_scaling_summary"] = scaling_summary(scaling)


def part_memory(args, report):
    """ResNet-1001's peak memory at batch 128 with remat and at --batch-1001 with and without
    it, a process per case; and its per-image time with remat against without."""
    b, mem = args.batch_1001, {}
    for label, batch, remat in (("remat b128", 128, "segment"), (f"plain b{b}", b, None),
                                (f"remat b{b}", b, "segment")):
        mem[label] = keras_case("preact_resnet1001", batch, args.steps_1001, warmup=1,
                                model_kwargs={"remat": remat} if remat else None)
        report["rows"].append({"case": f"ResNet-1001 {label}", **mem[label]})
    # The plain model first: the first rematerialised stage turns Grappler's model pruning
    # off for the process, after the plain step was optimised with it on.
    ab = turns(report["rows"], ["preact_resnet1001", 'preact_resnet1001{"remat": "segment"}'],
               b, args.memory_reps, "in-process turns")
    report["resnet1001"] = {
        "peak_rss_mb_b128_remat": mem["remat b128"].get("peak_rss_mb"),
        "remat_time_ratio": ab[1]["median_s_per_step"] / ab[0]["median_s_per_step"] if ab else None,
        f"peak_rss_mb_b{b}_plain": mem[f"plain b{b}"].get("peak_rss_mb"),
        f"peak_rss_mb_b{b}_remat": mem[f"remat b{b}"].get("peak_rss_mb")}
    if _rate(mem["remat b128"]):
        report["resnet1001_schedule_hours"] = {"cpu fp32 remat b128": _hours(mem["remat b128"])}


def scaling_summary(scaling):
    """Per family: each depth's time per MAC relative to the shallowest's, the median ps per
    MAC, and the largest deviation from proportional to MACs at the best constant ((max -
    min) / (max + min) of the time per MAC); and the ratio of the families' medians."""
    out = {}
    for family in ("basic", "bottleneck"):
        rows = [r for r in scaling if r["family"] == family]
        if not rows:
            continue
        per_mac = [r["s_per_image"] / r["macs"] for r in rows]
        out[family] = {r["model"]: v / per_mac[0] for r, v in zip(rows, per_mac)}
        out[family + "_ps_per_mac"] = median([v * 1e12 for v in per_mac])
        out[family + "_max_deviation_from_proportional"] = (
            (max(per_mac) - min(per_mac)) / (max(per_mac) + min(per_mac)))
    if "basic" in out and "bottleneck" in out:
        out["bottleneck_over_basic_ps_per_mac"] = (out["bottleneck_ps_per_mac"]
                                                   / out["basic_ps_per_mac"])
    return out


PARTS = {"speed": part_speed, "pipeline": part_pipeline, "scaling": part_scaling,
         "memory": part_memory}


def suite_cpu(args, report):
    for name, part in PARTS.items():
        if name in args.parts:
            part(args, report)


def suite_gpu(args, report):
    """Each model in each precision on the JAX backend, and ResNet-1001's schedule."""
    for model in args.gpu_models:
        for precision in args.precisions:
            r = keras_case(model, args.batch, args.steps, backend="jax", threads=None,
                           precision=precision, warmup=2)
            report["rows"].append({"case": f"{model} b{args.batch} jax {precision}", **r})
            if model == "preact_resnet1001" and _rate(r):
                report.setdefault("resnet1001_schedule_hours", {})[precision] = _hours(r)


def suite_jax(args, report):
    """The JAX backend on this CPU against the PyTorch reference in alternating rounds, the
    stages looped and unrolled; ResNet-1001 at batch 128 with remat on JAX and TensorFlow."""
    jax = {"backend": "jax", "threads": None, "warmup": 1}
    for model in args.jax_models:
        ratios = rounds(args, report["rows"], model, f"{model} b{args.batch}",
                        {"jax": jax, "jax unrolled": {**jax, "unrolled": True}})
        report.setdefault("ratio_jax_over_torch", {})[model] = ratios["jax"]
    for backend in ("jax", "tensorflow"):
        r = keras_case("preact_resnet1001", 128, args.steps_1001, backend=backend,
                       threads=None if backend == "jax" else 2, warmup=1,
                       model_kwargs={"remat": "segment"})
        report["rows"].append({"case": f"preact_resnet1001 b128 remat {backend}", **r})


def keras_curve(args, seed, recipe="paper", name=None, flags=()):
    """Trains (or, finished, reads) `recipe` (with more `train` `flags`) with ``keras-preact
    train`` in a workdir of --runs (``{name}_s{seed}`` where a `name` is given): [{epoch,
    minutes, test_accuracy, maybe raw_test_accuracy}], minutes of training summed over
    epochs; ``raw_test_accuracy``: a moving-average run's raw weights."""
    epochs = args.epochs if recipe == "paper" else args.fast_epochs
    workdir = os.path.join(args.runs, f"{name}_s{seed}" if name else
                           f"keras_{recipe}_e{epochs}_s{seed}")
    command = ["-m", "keras_preact", "train", "--recipe", recipe,
               "--model", f"preact_resnet{args.depth}", "--dataset", "folder",
               "--data-path", args.data_path, "--epochs", epochs, "--batch-size", args.batch,
               "--seed", seed, "--workdir", workdir, "--verbose", 2, *flags]
    if not args.read_only:
        subprocess.run([sys.executable, *map(str, command)], check=True, cwd=REPO,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    if not os.path.exists(os.path.join(workdir, "metrics.csv")):
        return []  # --read-only: not started
    with open(os.path.join(workdir, "metrics.csv"), newline="", encoding="utf-8") as f:
        rows, minutes = [], 0.0
        for row in csv.DictReader(f):
            minutes += float(row["time_s"]) / 60
            rows.append({"epoch": int(row["epoch"]), "minutes": minutes,
                         "test_accuracy": float(row["val_accuracy"]),
                         **({"raw_test_accuracy": float(row["raw_val_accuracy"])}
                            if row.get("raw_val_accuracy") else {})})
    return rows


def torch_curve(args, seed, log):
    """The PyTorch reference's paper recipe on the folder, its JSON lines kept in `log`
    (read, not rerun, once it holds the last epoch): [{epoch, minutes, test_accuracy}]."""
    def epochs():
        if not os.path.exists(log):
            return []
        with open(log, encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.startswith("{")]
        return [r for r in lines if "epoch" in r]

    if len(epochs()) < args.epochs and not args.read_only:
        with open(log, "w", encoding="utf-8") as f:
            subprocess.run([sys.executable, os.path.join(REPO, "benchmarks",
                                                         "torch_reference.py"),
                            *map(str, ["--data-path", args.data_path, "--depth", args.depth,
                                       "--epochs", args.epochs, "--batch", args.batch,
                                       "--seed", seed])],
                           stdout=f, check=True)
    return [{"epoch": r["epoch"], "minutes": r["train_s"] / 60,
             "test_accuracy": r["test_accuracy"]} for r in epochs()]


def suite_cifar(args, report):
    """For each of --seeds, keras-preact and the PyTorch reference train the paper's recipe
    on --data-path (train/ and test/ class folders), in turns, then keras-preact the fast
    recipe for --fast-epochs (0: not); runs kept under --runs."""
    if not args.data_path:
        raise SystemExit("--suite cifar needs --data-path, a folder with train/ and test/")
    os.makedirs(args.runs, exist_ok=True)
    paper = {"keras-preact paper": lambda s: keras_curve(args, s),
             f"{TORCH} paper": lambda s: torch_curve(
                 args, s, os.path.join(args.runs, f"torch_paper_e{args.epochs}_s{s}.jsonl"))}
    fast = {"keras-preact fast": lambda s: keras_curve(args, s, "fast")} if args.fast_epochs else {}
    curves = report.setdefault("curves", {})
    for i, seed in enumerate(args.seeds):
        for side in (list(paper) if i % 2 == 0 else list(paper)[::-1]) + list(fast):
            curve = curves[f"{side} seed {seed}"] = {**paper, **fast}[side](seed)
            if curve:  # (a --read-only report of a run not started yet has none)
                report["rows"].append({"case": f"{side} seed {seed}", "epochs": len(curve),
                                       "minutes": curve[-1]["minutes"],
                                       "test_accuracy": curve[-1]["test_accuracy"]})
    report["recipe"] = {"model": f"preact_resnet{args.depth}", "epochs": args.epochs,
                        "fast_epochs": args.fast_epochs,
                        "data_path": os.path.basename(os.path.normpath(args.data_path))}


#: The fast recipe's ablation: each variant's `train` flags over the recipe's. Every variant
#: with the moving average also scores its raw weights every epoch, which is the variant
#: without it (the average only follows the weights).
ABLATION = {"ema": ("--ema-momentum", "0.999", "--precision", "auto"),
            "cutout8": ("--cutout", "8"), "cutout16": ("--cutout", "16"),
            "sd01": ("--stochastic-depth", "0.1"), "sd005": ("--stochastic-depth", "0.05"),
            "batch64": ("--batch-size", "64"), "epochs20": ("--epochs", "20")}


def suite_ablation(args, report):
    """The fast recipe for --fast-epochs with each of --variants (`ABLATION`) and --seeds on
    --data-path, one run at a time, kept under --runs (finished runs are read again): each
    run's curve, its final model's test accuracy, and with test-time flips."""
    from keras_preact.training import evaluate

    if not args.data_path:
        raise SystemExit("--suite ablation needs --data-path, a folder with train/ and test/")
    curves = report.setdefault("curves", {})
    for seed in args.seeds:
        for name in args.variants:
            curve = keras_curve(args, seed, "fast", name=name, flags=ABLATION[name])
            if len(curve) < args.fast_epochs:
                continue  # --read-only: not finished
            workdir = os.path.join(args.runs, f"{name}_s{seed}")
            with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
                precision = json.load(f).get("precision")
            curves[f"{name} seed {seed}"] = curve
            # A moving-average run's raw weights: its last checkpoint's.
            raw = curve[-1].get("raw_test_accuracy") and evaluate(
                model=f"preact_resnet{args.depth}", dataset="folder", data_path=args.data_path,
                weights=os.path.join(workdir, "checkpoints", f"ckpt-{len(curve):05d}.weights.h5"),
                flip=True, verbose=0)["accuracy"]
            report["rows"].append({
                "case": f"{name} seed {seed}", "variant": name, "seed": seed,
                "flags": " ".join(ABLATION[name]), "epochs": len(curve),
                "minutes": curve[-1]["minutes"], "test_accuracy": curve[-1]["test_accuracy"],
                "raw_test_accuracy": curve[-1].get("raw_test_accuracy"),
                "flip_test_accuracy": evaluate(workdir, flip=True, verbose=0)["accuracy"],
                "raw_flip_test_accuracy": raw or None,
                **({"precision_auto": precision} if precision else {})})
    report["recipe"] = {"model": f"preact_resnet{args.depth}", "fast_epochs": args.fast_epochs,
                        "batch": args.batch,
                        "data_path": os.path.basename(os.path.normpath(args.data_path))}


def readme_folder_command():
    """The README's image-folder example: its one ```bash block that trains ``my_images``."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```bash\n(.*?)```", f.read(), re.S)
    (command,) = [b for b in blocks if "--data-path my_images" in b]
    return command.replace("\\\n", " ").split()


def suite_folder(args, report):
    """The README's image-folder example, as a new user runs it first: on --folder-classes of
    --data-path (train/ and test/ class folders), 300 training and 100 test images a class,
    for each of --seeds; its test accuracy and wall-clock minutes, command start to end."""
    if not args.data_path:
        raise SystemExit("--suite folder needs --data-path, a folder with train/ and test/")
    subset = os.path.join(args.runs, "my_images")
    for split, count_ in (("train", 300), ("test", 100)):
        for name in args.folder_classes:
            os.makedirs(out := os.path.join(subset, split, name), exist_ok=True)
            for file in sorted(os.listdir(os.path.join(args.data_path, split, name)))[:count_]:
                shutil.copy(os.path.join(args.data_path, split, name, file), out)
    command = readme_folder_command()
    for seed in args.seeds:
        workdir = os.path.join(args.runs, f"seed{seed}")
        shutil.rmtree(workdir, ignore_errors=True)
        argv = [subset if a == "my_images" else a for a in command[1:]]
        argv[argv.index("--workdir") + 1] = workdir
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "keras_preact", *argv, "--seed", str(seed),
                        "--verbose", "2"], check=True, cwd=REPO,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        with open(os.path.join(workdir, "metrics.json"), encoding="utf-8") as f:
            accuracy = json.load(f)["test_accuracy"]
        report["rows"].append({"case": f"README folder example seed {seed}",
                               "minutes": (time.perf_counter() - start) / 60,
                               "test_accuracy": accuracy})
    report["recipe"] = {"command": " ".join(command), "classes": args.folder_classes,
                        "per_class": {"train": 300, "test": 100}}


def suite_quick(args, report):
    report["rows"] += [{"case": "ResNet-20 b16 keras/tf", **keras_case("preact_resnet20", 16, 3)},
                       {"case": "ResNet-20 b16 torch", **torch_case(20, 16, 3)}]


def probe_matmul(size=2048, repeats=20):
    """GFLOP/s of a square fp32 matmul in TensorFlow (a child of `part_speed`)."""
    import tensorflow as tf

    a, b = tf.random.normal((size, size)), tf.random.normal((size, size))
    f = tf.function(tf.matmul)
    f(a, b).numpy()
    t = time.perf_counter()
    for _ in range(repeats):
        c = f(a, b)
    c.numpy()
    return {"gflops": 2 * size ** 3 / ((time.perf_counter() - t) / repeats) / 1e9}


def probe_pipeline(batch=128, batches=200):
    """Images/s of the CIFAR training pipeline: pad, crop, flip, normalise, shuffle."""
    import numpy as np

    from keras_preact.data import dataset_from_arrays

    x = np.random.RandomState(0).randint(0, 256, (50000, 32, 32, 3)).astype(np.uint8)
    ds = dataset_from_arrays(x, np.zeros(50000, np.int64), batch_size=batch, shuffle=True,
                             augment="pad_crop_flip", mean=(0.5,) * 3, std=(0.25,) * 3,
                             drop_remainder=True, repeat_epochs=-1)
    it = iter(ds)
    for _ in range(10):
        next(it)
    t = time.perf_counter()
    for _ in range(batches):
        next(it)
    return {"images_per_s": batch * batches / (time.perf_counter() - t)}


#: The counts of the command line: (flag, default, help).
COUNTS = (("--pairs", 3, "alternating rounds against the PyTorch reference"),
          ("--batch", 128, None), ("--steps", 10, "timed steps a case"),
          ("--scaling-batch", 32, None), ("--batch-1001", 32, None), ("--steps-1001", 4, None),
          ("--scaling-steps", 8, "timed steps of each scaling model (they take turns; medians)"),
          ("--memory-reps", 6, "timed steps of ResNet-1001 plain and remat, in turns in a process"))


SUITES = {"cpu": suite_cpu, "jax": suite_jax, "gpu": suite_gpu, "cifar": suite_cifar,
          "folder": suite_folder, "quick": suite_quick, "ablation": suite_ablation}


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--suite", choices=tuple(SUITES), default="cpu")
    for flag, default, help in COUNTS:
        p.add_argument(flag, type=count, default=default, help=help)
    p.add_argument("--bf16", action="store_true",
                   help="cpu speed rounds: also keras-preact in mixed_bfloat16")
    p.add_argument("--parts", nargs="*", default=list(PARTS), choices=tuple(PARTS),
                   help="cpu suite parts to run")
    p.add_argument("--scaling-models", nargs="*",
                   default=["preact_resnet20", "preact_resnet56", "preact_resnet110",
                            "preact_resnet1202", "preact_resnet164", "preact_resnet1001"])
    p.add_argument("--max-isa", choices=tuple(ISA_ENVS), default="native",
                   help="cap the kernels' vector instructions on both sides (avx2: what an "
                        "AVX2-only CPU runs, measured on a newer one)")
    p.add_argument("--jax-models", nargs="+", default=["preact_resnet56", "preact_resnet110"],
                   help="jax suite: CIFAR models timed against the PyTorch reference")
    p.add_argument("--gpu-models", nargs="+",
                   default=["preact_resnet110", "preact_resnet164", "preact_resnet1001"])
    p.add_argument("--precisions", nargs="+", default=["fp32", "mixed_bfloat16", "mixed_float16"],
                   choices=("fp32", "mixed_bfloat16", "mixed_float16"), help="gpu suite")
    p.add_argument("--data-path", help="cifar, folder suites: an image folder with train/ and "
                                       "test/")
    p.add_argument("--runs", default=os.path.join("runs", "cifar"),
                   help="cifar suite: where the runs are kept (finished runs are read again)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="cifar, folder suites")
    p.add_argument("--folder-classes", nargs="+", default=["airplane", "automobile", "bird"],
                   help="folder suite: the classes of --data-path to take")
    p.add_argument("--epochs", type=count, default=20, help="cifar suite: the paper's recipe")
    p.add_argument("--fast-epochs", type=int, default=16,
                   help="cifar and ablation suites: the fast recipe's epochs (0: not)")
    p.add_argument("--variants", nargs="+", choices=tuple(ABLATION), default=list(ABLATION),
                   help="ablation suite: the fast recipe's variants (see ABLATION)")
    p.add_argument("--read-only", action="store_true",
                   help="cifar suite: report the runs as they stand (unfinished too); train none")
    p.add_argument("--depth", type=count, default=20, help="cifar suite: ResNet depth (6n+2)")
    args = p.parse_args(argv)
    CASE_ENV.clear()
    CASE_ENV.update(ISA_ENVS[args.max_isa])
    report = {"suite": args.suite, "machine": machine(max_isa=args.max_isa), "started": now(),
              "rows": []}
    SUITES[args.suite](args, report)
    print(f"machine: {report['machine']}")
    # img/s: the steady rate of the steps; call img/s: the whole fit call (keras_step.py)
    print_table(report["rows"], [
        ("case", "case", "s"), ("img/s", "images_per_s", ".1f"), ("s/step", "s_per_step", ".3f"),
        ("call img/s", "call_images_per_s", ".1f"), ("peak MB", "peak_rss_mb", ".0f"),
        ("device MB", "peak_device_mb", ".0f"), ("minutes", "minutes", ".1f"),
        ("test acc", "test_accuracy", ".4f")])
    for key, value in report.items():
        if key not in ("suite", "machine", "started", "rows"):
            print(f"{key}: {value}")
    write_report(report, args.out, args.suite)
    failed = [r["case"] for r in report["rows"] if "error" in r]
    if failed:
        print(f"{len(failed)} case(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
