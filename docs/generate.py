"""The documentation's generated parts: the model table, the command-line reference, the
performance tables and the figures, made from the code, the catalog and committed data.

The site's build runs this file as a MkDocs hook (``mkdocs.yml``): a page's
``<!-- generated: NAME -->`` line becomes the part NAME, and the figures are added as
files of the site. From the command line::

    python docs/generate.py models --write   # zoo/models.json's costs, README.md's model table
    python docs/generate.py performance      # the performance tables, as Markdown
    python docs/generate.py figures OUT_DIR  # the figures, as PNG files
"""

import argparse
import ast
import csv
import io
import json
import math
import os
import re
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the figures import Keras
if REPO not in sys.path:  # run as a hook or a script from anywhere
    sys.path.insert(0, REPO)
DATA = os.path.join(REPO, "docs", "data")
MEASURED = os.path.join(REPO, "benchmarks", "measured", "2026-12-04-epyc-avx512")
#: `benchmarks/serving_throughput.py`'s report.
SERVING = os.path.join(REPO, "benchmarks", "measured", "2026-12-05-serving",
                       "serving_throughput.json")
#: The JAX backend's reports (build times on every backend, `run.py --suite jax`, `jax_ops.py`).
JAX_MEASURED = os.path.join(REPO, "benchmarks", "measured", "2026-12-05-jax")
#: `benchmarks/run.py --suite cifar`'s report: training on real CIFAR-10 images.
CIFAR = os.path.join(REPO, "benchmarks", "measured", "2026-12-06-cifar", "cifar.json")
#: fp32 against mixed bfloat16 training steps, taking turns, one report a CPU: `step_ab.py`'s
#: (a report without its machine: the one of the cifar report beside it) and the cpu suite's
#: ``--bf16`` rounds.
BF16 = [os.path.join(REPO, "benchmarks", "measured", *p) for p in (
    ("2026-12-04-epyc-avx512", "cpu.json"), ("2026-12-06-cifar", "bf16_ab.json"),
    ("2026-12-07-bf16", "bf16_ab.json"))]
#: `benchmarks/run.py --suite ablation`'s report: the fast recipe's variants on real CIFAR-10.
FAST_ABLATION = os.path.join(REPO, "benchmarks", "measured", "2026-12-07-ablation", "ablation.json")
#: `benchmarks/run.py --suite folder`'s report: the README's image-folder example.
FOLDER = os.path.join(REPO, "benchmarks", "measured", "2026-12-07-folder", "folder.json")
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)
#: README.md's model table lies between these two lines (the site includes it from there).
TABLE_START, TABLE_END = "<!-- --8<-- [start:models] -->", "<!-- --8<-- [end:models] -->"


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


# --- the model table --------------------------------------------------------------------

def models_table():
    """The models of `zoo/models.json` with their parameters and multiply-adds and the paper's
    figures (`measure_models` records the costs; a test checks them against built models)."""
    import keras_preact as kp
    from keras_preact.zoo_catalog import load_json

    tags = {}
    for entry in kp.weights.list_entries():
        tags.setdefault(entry.model, []).append(entry.tag)
    rows = []
    for name, info in load_json("models.json")["models"].items():
        errors = ", ".join(f"{label} {info[key]}%" for key, label in (
            ("paper_error_cifar10", "CIFAR-10"), ("paper_error_cifar100", "CIFAR-100"),
            ("paper_error_imagenet2012", "ImageNet top-1")) if key in info)
        rows.append((f"`{name}`", info["depth"], info["block"], f"{info['params']:,}",
                     f"{info['macs'] / 1e6:,.1f}M", errors, ", ".join(tags.get(name, []))))
    return table(("model", "depth", "block", "parameters", "multiply-adds", "paper's error",
                  "pretrained `weights=`"), rows)


def measure_models():
    """`zoo/models.json` with every registered model's parameters and multiply-adds, as
    built with its defaults (one model a line)."""
    import keras_preact as kp
    from keras_preact.zoo_catalog import load_json

    doc = load_json("models.json")
    for name, row in doc["models"].items():
        model = kp.get_model(name)
        row.update(params=kp.count_params(model), macs=kp.count_macs(model))
    lines = [f"    {json.dumps(name)}: {json.dumps(row)}" for name, row in doc["models"].items()]
    return (f'{{\n  "_source": {json.dumps(doc["_source"])},\n  "models": {{\n'
            + ",\n".join(lines) + "\n  }\n}\n")


def readme_with_models_table(text, generated):
    """`text` (README.md) with the part between the table markers replaced by `generated`."""
    start, end = text.index(TABLE_START) + len(TABLE_START), text.index(TABLE_END)
    return text[:start] + "\n" + generated + "\n" + text[end:]


# --- the command-line reference ---------------------------------------------------------

def _subcommands(parser):
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def cli_reference():
    """Every command's ``--help``, from the parser that `keras-preact` runs."""
    from keras_preact.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the same width everywhere
    parser = build_parser()
    parts = ["## keras-preact", "", "```text", parser.format_help().rstrip(), "```"]
    for name, sub in _subcommands(parser):
        parts += ["", f"## keras-preact {name}", "", "```text", sub.format_help().rstrip(), "```"]
        for child, subsub in _subcommands(sub):
            parts += ["", f"### keras-preact {name} {child}", "", "```text",
                      subsub.format_help().rstrip(), "```"]
    return "\n".join(parts)


# --- the performance tables -------------------------------------------------------------

def _measured(name):
    with open(os.path.join(MEASURED, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def speed_table(name="cpu"):
    """ResNet-110 training rounds: keras-preact against the PyTorch reference (cpu.json; the
    run with every kernel capped at AVX2: cpu_avx2.json)."""
    report = _measured(name)
    rounds = {}
    for row in report["rows"]:
        match = re.match(r"ResNet-110 b128 (.*) \(round (\d+)\)", row["case"])
        if match and "images_per_s" in row:
            rounds.setdefault(int(match[2]), {})[match[1]] = row
    rows = []
    for n, cases in sorted(rounds.items()):
        ours, torch = cases["keras-preact"], cases["PyTorch ref"]

        def rate(case, cases=cases):
            return f"{cases[case]['images_per_s']:.1f}" if case in cases else "-"

        rows.append((n, rate("keras-preact"), rate("unoptimised"), rate("PyTorch ref"),
                     f"{ours['images_per_s'] / torch['images_per_s']:.2f}x",
                     rate("keras-preact bf16"), f"{ours['call_images_per_s']:.1f}"))
    ratio = report["ratio_keras_over_torch"]["median"]
    peak = report["fraction_of_matmul_peak"]
    return table(("round", "keras-preact img/s", "unoptimised img/s", "PyTorch img/s",
                  "keras-preact / PyTorch", "mixed bfloat16 img/s", "whole `fit` call img/s"),
                 rows) + (f"\n\nMedian keras-preact / PyTorch: **{ratio:.2f}x**. Fraction of the "
                          f"fp32 matmul peak measured in the same run "
                          f"({report['matmul_gflops']:.1f} GFLOP/s): keras-preact "
                          f"{peak['keras-preact']:.2f}, PyTorch {peak['torch']:.2f}.")


def scaling_table():
    """Per-image training time against multiply-adds (cpu_scaling.json)."""
    report = _measured("cpu_scaling")
    first = {}
    rows = []
    for r in report["cost_scaling"]:
        ps = r["s_per_image"] / r["macs"] * 1e12
        base = first.setdefault(r["family"], ps)
        rows.append((r["model"], r["family"], f"{r['macs'] / 1e6:.1f}M",
                     f"{r['s_per_image'] * 1e3:.2f}", f"{ps:.1f}", f"{ps / base:.2f}"))
    summary = report["cost_scaling_summary"]
    note = ", ".join(f"{family} {100 * summary[family + '_max_deviation_from_proportional']:.1f}%"
                     for family in ("basic", "bottleneck"))
    return table(("model", "block", "MACs", "ms / image", "ps / MAC", "against its shallowest"),
                 rows) + f"\n\nLargest deviation from proportional to multiply-adds: {note}."


def memory_table():
    """ResNet-1001's peak memory with and without remat (cpu_memory.json)."""
    report = _measured("cpu_memory")
    rows = [(r["case"].replace("ResNet-1001 ", ""), f"{r['peak_rss_mb'] / 1e3:.2f} GB",
             f"{r['s_per_step']:.2f}") for r in report["rows"] if r.get("peak_rss_mb")]
    hours = report["resnet1001_schedule_hours"]["cpu fp32 remat b128"]
    return table(("ResNet-1001", "peak resident memory", "s / step"), rows) + (
        f"\n\nPer-image time with remat against without at batch 32, steps taking turns in one "
        f"process: **{report['resnet1001']['remat_time_ratio']:.2f}x**. The paper's schedule "
        f"(64k iterations of 128 images) would take {hours:.0f} hours on these cores.")


def feature_levels_table():
    """Each level of `features=True` models of both families and blocks, read from the built
    models: height x width x channels for the input size given."""
    import keras_preact as kp

    rows, levels = [], [f"P{n}" for n in range(6)]
    for name, size in (("preact_resnet110", 32), ("preact_resnet164", 32),
                       ("preact_resnet18", 224), ("preact_resnet50", 224)):
        maps = kp.get_model(name, features=True, input_shape=(size, size, 3)).output
        shapes = {k: "x".join(str(d) for d in v.shape[1:]) for k, v in maps.items()}
        rows.append((f"`{name}`", f"{size}x{size}", *(shapes.get(k, "") for k in levels)))
    return table(("model", "input", *(f"{k} (stride {2 ** n})" for n, k in enumerate(levels))),
                 rows)


def training_paths_table():
    """What each training path honours, from `keras_preact.training.LIMITS` (the code's one
    declaration): a ✗ cell is refused before a run starts, with the reason shown."""
    import dataclasses

    from keras_preact.training import LIMITS, PATHS, TrainConfig

    limited = sorted({name for limits in LIMITS.values() for name in limits})
    rows = [("strategies", *(", ".join(f"`{s}`" for s in ss) for _, ss in PATHS.values()))]
    rows += [(f"`{name}`", *("✗ " + LIMITS[p][name] if name in LIMITS.get(p, {}) else "✓"
                             for p in PATHS)) for name in limited]
    others = [f.name for f in dataclasses.fields(TrainConfig)
              if f.name not in limited and f.name != "strategy"]
    rows.append(("every other field: " + ", ".join(f"`{n}`" for n in others),
                 *("✓" for _ in PATHS)))
    return table(("setting", *(f"{p} (`KERAS_BACKEND={b}`)" for p, (b, _) in PATHS.items())),
                 rows)


def build_table():
    """Build, save and load times (build_save_load.json)."""
    report = _measured("build_save_load")
    rows = [(r["model"], f"{r['build_s']:.2f} s", f"{r['save_s']:.2f} s", f"{r['load_s']:.2f} s",
             r["keras_layers"], r["max_abs_diff"]) for r in report["models"]]
    return table(("model", "build", "save `.keras`", "load `.keras`", "Keras layers",
                  "reloaded output difference"), rows)


def _jax_measured(name):
    with open(os.path.join(JAX_MEASURED, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def build_backends_table():
    """Every registered model's build time on each backend, a fresh process each
    (2026-12-05-jax/build_save_load.json)."""
    builds = {}
    for r in _jax_measured("build_save_load")["models"]:
        builds.setdefault(r["model"], {})[r["backend"]] = r["build_s"]
    rows = [(f"`{m}`", *(f"{b[k]:.2f} s" for k in ("tensorflow", "jax", "torch")),
             f"{b['jax'] / b['tensorflow']:.2f}") for m, b in builds.items()]
    return table(("model", "TensorFlow", "JAX", "PyTorch", "JAX / TensorFlow"), rows)


def jax_training_table():
    """ResNet-56 and 110 on JAX against the PyTorch reference, rounds alternating, and
    ResNet-1001 with remat on JAX and TensorFlow (2026-12-05-jax/jax.json)."""
    report = _jax_measured("jax")
    rows = []
    for model, ratio in report["ratio_jax_over_torch"].items():
        def side(name, model=model):
            return [r for r in report["rows"] if r["case"].startswith(f"{model} b")
                    and f" {name} (round" in r["case"]]

        looped, unrolled, torch = side("jax"), side("jax unrolled"), side("PyTorch ref")
        rows.append((f"`{model}`", f"{_median_of(looped, 'warmup_s'):.1f} s",
                     f"{_median_of(unrolled, 'warmup_s'):.1f} s",
                     f"{_median_of(looped, 'images_per_s'):.1f}",
                     f"{_median_of(unrolled, 'images_per_s'):.1f}",
                     f"{_median_of(torch, 'images_per_s'):.1f}", f"{ratio['median']:.2f}x"))
    memory = {r["case"].rsplit(" ", 1)[1]: r for r in report["rows"]
              if r["case"].startswith("preact_resnet1001")}
    batch = report["rows"][0]["batch"]
    return table((f"batch {batch}", "first step, looped", "first step, unrolled",
                  "JAX img/s, looped", "JAX img/s, unrolled", "PyTorch img/s",
                  "JAX (looped) / PyTorch"), rows) + "\n\n" + table(
        ("ResNet-1001, batch 128, remat", "first step", "s / step", "peak resident memory"),
        [(backend, f"{r['warmup_s']:.0f} s", f"{r['s_per_step']:.1f} ({r['steps']} timed)",
          f"{r['peak_rss_mb'] / 1e3:.2f} GB") for backend, r in memory.items()])


def _median_of(rows, key):
    return statistics.median(r[key] for r in rows)


def jax_ops_table():
    """ResNet-56's convolutions and BN-ReLUs, forward and backward, each framework's ops
    timed alone and summed, beside its whole step (2026-12-05-jax/jax_ops.json)."""
    rounds = _jax_measured("jax_ops")["rounds"]
    rows = []
    for side, name in (("jax", "JAX (XLA:CPU)"), ("torch", "PyTorch")):
        med = {k: _median_of([r[side] for r in rounds], k) for k in ("conv", "bn_relu", "step")}
        rows.append((name, f"{med['conv']:.2f} s", f"{med['bn_relu']:.2f} s",
                     f"{med['step']:.2f} s", f"{med['conv'] / med['step']:.0%}"))
    return table(("ResNet-56 step, batch 128", "convolutions", "BN-ReLUs", "whole step",
                  "convolutions / step"), rows)


def fused_bn_table():
    """The fused BatchNorm + ReLU kernel on and off, steps alternating (fused_bn_ab.json)."""
    report = _measured("fused_bn_ab")
    rows = [(r["variant"] or "default (fused)", f"{r['images_per_s']:.1f}",
             f"{r['median_s_per_step']:.2f}") for r in report["rows"]]
    return table((f"ResNet-110, batch {report['batch']}", "img/s", "s / step (median)"), rows)


def serving_table():
    """Served images/s of each export format against PyTorch eager, rounds taking turns in one
    process (serving_throughput.json)."""
    with open(SERVING, encoding="utf-8") as f:
        report = json.load(f)

    def cores(value):
        return "-" if value is None else f"{value:.1f}"

    rows = [(r["format"], r["batch"], f"{r['images_per_s']:.1f}", f"{r['ratio_to_torch']:.2f}x",
             cores(r["cores_busy"]), cores(r["others_cores"]),
             "-" if r["bytes"] is None else f"{r['bytes'] / 1e6:.2f} MB") for r in report["rows"]]
    machine = report["machine"]
    images = ", ".join(f"{n} at batch {b}" for b, n in report["images"].items())
    versions = ", ".join(f"{name} {v}" for name, v in report["versions"].items() if v)
    return table(("format", "batch", "img/s", "x PyTorch eager", "cores busy",
                  "other processes' cores", "file size"), rows) + (
        f"\n\n`{report['model']}`, images per measurement: {images}; medians of "
        f"{report['repeats']} rounds. Measured on {report['started'][:10]} on "
        f"{machine['cpus']} cores of an {machine['cpu']['model']} by `{report['command']}` "
        f"({versions}).")


def machine_line():
    machine = _measured("cpu")["machine"]
    cpu = machine["cpu"]
    return (f"Measured on {machine['cpus']} cores of an {cpu['model']} "
            f"({', '.join(cpu['features'])}), Python {machine['python']}; "
            f"the JSON files are in `benchmarks/measured/{os.path.basename(MEASURED)}/`.")


def _gradient_flow_rows(name):
    from keras_preact import diagnostics

    return diagnostics.read_csv(os.path.join(DATA, name))


def gradient_flow_table():
    """First-to-last gradient ratios of `keras-preact diagnose`'s committed CSV."""
    reports = {r.label: r for r in _gradient_flow_rows("preact_resnet164_gradient_flow.csv")}
    rows = [(f"`{label}`", f"{r.first_to_last:.3g}") for label, r in reports.items()]
    ratio = reports["original"].first_to_last / reports["full_preact"].first_to_last
    return table(("ResNet-164 unit", "first-to-last gradient ratio at initialisation"), rows) + (
        f"\n\nThe original unit's gradient grows {ratio:.1f}x more from the last unit to the "
        "first.")


def gradient_flow_1001_table():
    """`examples/gradient_flow.py`'s committed CSV: ratios at initialisation and after training."""
    rows = [(r.label, f"{r.first_to_last:.3g}", f"{r.stage_ratios()[max(r.stage_ratios())]:.3g}")
            for r in _gradient_flow_rows("resnet1001_gradient_flow.csv")]
    return table(("ResNet-1001", "first-to-last gradient ratio", "within the last stage"), rows)


def ablation_table():
    """The local ablation's runs (`docs/data/ablation_local/<run>/`): test error on the
    digits beside the paper's CIFAR-10 ResNet-110 error."""
    from keras_preact.layers.variants import PAPER_RESULTS, UNIT_TYPES

    root = os.path.join(DATA, "ablation_local")
    rows = []
    for run in sorted(os.listdir(root)):
        with open(os.path.join(root, run, "config.json"), encoding="utf-8") as f:
            config = json.load(f)["train_config"]
        with open(os.path.join(root, run, "metrics.json"), encoding="utf-8") as f:
            accuracy = json.load(f)["test_accuracy"]
        kwargs = config["model_kwargs"]
        unit = kwargs.pop("unit")
        options = ", ".join(f"{k}={v:g}" for k, v in kwargs.items())
        rows.append((f"`{unit}`", options, f"{100 * (1 - accuracy):.2f}",
                     PAPER_RESULTS[unit]["resnet110"]))
    rows.sort(key=lambda row: UNIT_TYPES.index(row[0].strip("`")))
    return table(("unit", "parameters", "digits test error %", "paper: CIFAR-10 ResNet-110 %"),
                 rows)


def _cifar_curves():
    with open(CIFAR, encoding="utf-8") as f:
        report = json.load(f)
    return report, {name: curve for name, curve in sorted(report["curves"].items()) if curve}


def cifar_table():
    """Each run of the cifar suite (cifar.json): its test accuracy at its end and at the
    last epoch finished within 30 minutes of training; then each side's mean over seeds."""
    report, curves = _cifar_curves()
    rows, finals = [], {}  # finals: side -> final test accuracies (%) over its seeds
    for name, curve in curves.items():
        early = [e for e in curve if e["minutes"] <= 30]
        final = 100 * curve[-1]["test_accuracy"]
        rows.append((name, len(curve), f"{curve[-1]['minutes']:.0f}", f"{final:.2f}%",
                     f"{100 * early[-1]['test_accuracy']:.2f}%" if early else "-"))
        finals.setdefault(name.rsplit(" seed ", 1)[0], []).append(final)
    spread = "".join(f"\n- {side}: mean {statistics.mean(acc):.2f}% over {len(acc)} seeds, "
                     f"spread between seeds {max(acc) - min(acc):.2f} points"
                     for side, acc in finals.items() if len(acc) > 1)
    recipe = report["recipe"]
    return (table(("run", "epochs", "training minutes", "test accuracy", "at 30 minutes"), rows)
            + (f"\n\nAt the end of each run:{spread}" if spread else "")
            + f"\n\n`{recipe['model']}` on the `{recipe['data_path']}` folder, written on "
            f"{report['started'][:10]} by `benchmarks/run.py --suite cifar --read-only` (the "
            f"JSON is in `{os.path.relpath(CIFAR, REPO)}`).")


def folder_table():
    """The README's image-folder example on a 3-class subset of real CIFAR-10 (folder.json)."""
    with open(FOLDER, encoding="utf-8") as f:
        report = json.load(f)
    recipe = report["recipe"]
    rows = [(r["case"], f"{r['minutes']:.1f}", f"{100 * r['test_accuracy']:.2f}%")
            for r in report["rows"]]
    return (table(("run", "minutes, command start to end", "test accuracy"), rows)
            + f"\n\n`{recipe['command']}` on the classes {', '.join(recipe['classes'])}, "
            f"{recipe['per_class']['train']} training and {recipe['per_class']['test']} test "
            f"images a class (chance: {100 / len(recipe['classes']):.1f}%), on "
            f"{report['machine']['cpu']['model']} ({report['machine']['cpus']} cores), "
            f"written on {report['started'][:10]} (the JSON is in "
            f"`{os.path.relpath(FOLDER, REPO)}`).")


def _bf16_rates(report):
    """{model: {precision: img/s}} of a step_ab.py report, or of the cpu suite's rounds
    (medians over the rounds)."""
    rates = {}
    for r in report["rows"]:
        if "case" in r:  # "ResNet-110 b128 keras-preact bf16 (round 2)"
            if not r["case"].split(" (")[0].endswith(("keras-preact", "keras-preact bf16")):
                continue
            name, precision = "preact_resnet110", r["precision"]
        else:
            name, brace, kwargs = r["model"].partition("{")
            precision = json.loads(brace + kwargs)["dtype"] if brace else "fp32"
        rates.setdefault(name, {}).setdefault(precision, []).append(r["images_per_s"])
    return {m: {p: statistics.median(v) for p, v in ps.items()} for m, ps in rates.items()}


def bf16_table():
    """fp32 against mixed bfloat16 training steps (batch 128) on each measured CPU (`BF16`)."""
    rows = []
    for path in BF16:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)
        if "machine" not in report:
            with open(os.path.join(os.path.dirname(path), "cifar.json"), encoding="utf-8") as f:
                report["machine"] = json.load(f)["machine"]
        cpu = report["machine"]["cpu"]
        flags = [f for f in cpu["features"] if "bf16" in f or "amx" in f] or ["no bf16 feature"]
        for name, rate in _bf16_rates(report).items():
            rows.append((f"{cpu['model']} ({', '.join(flags)})", f"`{name}`",
                         f"{rate['fp32']:.1f}", f"{rate['mixed_bfloat16']:.1f}",
                         f"**{rate['mixed_bfloat16'] / rate['fp32']:.2f}x**",
                         f"`{os.path.relpath(path, REPO)}`"))
    return table(("CPU (its bfloat16 features)", "model", "fp32 img/s", "mixed_bfloat16 img/s",
                  "bf16 / fp32", "report"), rows)


PARTS = {"speed": speed_table, "speed-avx2": lambda: speed_table("cpu_avx2"),
         "fused-bn": fused_bn_table, "scaling": scaling_table, "memory": memory_table,
         "build": build_table, "build-backends": build_backends_table,
         "jax": jax_training_table, "jax-ops": jax_ops_table, "serving": serving_table,
         "machine": machine_line,
         "cli": cli_reference, "training-paths": training_paths_table,
         "feature-levels": feature_levels_table,
         "gradient-flow": gradient_flow_table, "gradient-flow-1001": gradient_flow_1001_table,
         "ablation": ablation_table, "cifar": cifar_table, "bf16": bf16_table,
         "fast-ablation": lambda: fast_ablation_table(),  # defined with its figure, below
         "folder": folder_table}


# --- the figures ------------------------------------------------------------------------

def _read_csv(name):
    with open(os.path.join(DATA, name), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def training_curve():
    from keras_preact.training.workdir import plot_training_curve

    history = [{**row, "epoch": int(row["epoch"])} for row in _read_csv("demo_metrics.csv")]
    return plot_training_curve(history, title="keras-preact demo: ResNet-20 on digits")


def gradient_flow():
    from keras_preact import diagnostics

    reports = diagnostics.read_csv(os.path.join(DATA, "preact_resnet164_gradient_flow.csv"))
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"gradient_flow_{os.getpid()}.png")
    try:
        diagnostics.plot_gradient_flow(reports, out, title="ResNet-164 at initialisation")
        with open(out, "rb") as f:
            return f.read()
    finally:
        os.remove(out)


def depth_sweep():
    from keras_preact.tuning.study import plot_results

    def typed(row):
        done = row["val_accuracy"] not in ("", None)
        return {**row, "depth": int(row["depth"]), "macs": float(row["macs"]),
                "within_budget": int(row["within_budget"]),
                "val_accuracy": float(row["val_accuracy"]) if done else None}

    rows = [typed(row) for row in _read_csv("depth_sweep_results.csv")]
    return plot_results(rows, title="digits, --max-params 300000")


def _fast_ablation():
    with open(FAST_ABLATION, encoding="utf-8") as f:
        return json.load(f)


def fast_ablation_table():
    """Each run of the fast recipe's ablation (ablation.json): the final test accuracy of its
    weights (a moving-average run's raw ones: its last checkpoint), of its moving average
    where it has one, each also with test-time flips; first the cifar report's fast recipe
    runs, which have none of the variants."""
    report, (_, curves) = _fast_ablation(), _cifar_curves()
    pct = lambda v: "-" if v is None else f"{100 * v:.2f}%"  # noqa: E731
    rows = [("none (the fast recipe)", name.rsplit(" ", 1)[1], len(c), f"{c[-1]['minutes']:.0f}",
             pct(c[-1]["test_accuracy"]), "-", "-", "-")
            for name, c in curves.items() if name.startswith("keras-preact fast")]
    for r in report["rows"]:
        ema = r["raw_test_accuracy"] is not None
        rows.append((f"`{r['flags']}`", r["seed"], r["epochs"], f"{r['minutes']:.0f}",
                     pct(r["raw_test_accuracy"] if ema else r["test_accuracy"]),
                     pct(r["raw_flip_test_accuracy"] if ema else r["flip_test_accuracy"]),
                     pct(r["test_accuracy"]) if ema else "-",
                     pct(r["flip_test_accuracy"]) if ema else "-"))
    auto = [r["precision_auto"] for r in report["rows"] if "precision_auto" in r]
    machine = report["machine"]
    return (table(("flags over `--recipe fast`", "seed", "epochs", "training minutes",
                   "test accuracy", "with flips", "moving average", "with flips"), rows)
            + f"\n\n`{report['recipe']['model']}`, batch {report['recipe']['batch']}, on "
            f"{machine['cpu']['model']} ({machine['cpus']} cores; features: "
            f"{', '.join(machine['cpu']['features'])}), written on {report['started'][:10]} by "
            f"`benchmarks/run.py --suite ablation --read-only` (the JSON is in "
            f"`{os.path.relpath(FAST_ABLATION, REPO)}`)."
            + "".join(f" `--precision auto` chose {a['chosen']} there: fp32 "
                      f"{a['images_per_s']['fp32']:.0f} images/s, mixed_bfloat16 "
                      f"{a['images_per_s']['mixed_bfloat16']:.0f}, timed in "
                      f"{a['timing_s']:.0f} s." for a in auto))


def fast_ablation_curves():
    """Test accuracy per epoch of each run of ablation.json: the moving average's (solid) and
    the raw weights' (dashed) where a run has both."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from keras_preact.file_io import figure_png

    report = _fast_ablation()
    fig = Figure(figsize=(9, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (name, curve) in enumerate(report["curves"].items()):
        color = f"C{i % 10}"
        epochs = [e["epoch"] for e in curve]
        if "raw_test_accuracy" in curve[-1]:
            ax.plot(epochs, [100 * e["raw_test_accuracy"] for e in curve], "--", color=color,
                    label=f"{name}, raw weights")
        ax.plot(epochs, [100 * e["test_accuracy"] for e in curve], "-", color=color, marker=".",
                label=name + (", moving average" if "raw_test_accuracy" in curve[-1] else ""))
    ax.set(xlabel="epoch", ylabel="test accuracy (%)", ylim=(60, 90))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return figure_png(fig, f"The fast recipe's variants, {report['recipe']['model']} on real "
                      "CIFAR-10")


def cifar_time_to_accuracy():
    """Test accuracy against minutes of training and against epochs, a line per run of
    cifar.json."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from keras_preact.file_io import figure_png

    report, curves = _cifar_curves()
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    by_time, by_epoch = fig.subplots(1, 2)
    for name, curve in curves.items():
        accuracy = [100 * e["test_accuracy"] for e in curve]
        by_time.plot([e["minutes"] for e in curve], accuracy, marker="o", markersize=3,
                     label=name)
        by_epoch.plot([e["epoch"] for e in curve], accuracy, marker="o", markersize=3)
    by_time.axvline(30, color="#999", linewidth=0.8, linestyle="--")
    by_time.set(xlabel="minutes of training (the first hour)", ylabel="test accuracy (%)",
                xlim=(0, 60))
    by_epoch.set(xlabel="epoch", ylabel="test accuracy (%)")
    by_epoch.xaxis.get_major_locator().set_params(integer=True)
    for ax in (by_time, by_epoch):
        ax.axhline(90, color="#999", linewidth=0.8, linestyle="--")
        ax.grid(alpha=0.3)
    by_time.legend(fontsize=8)
    return figure_png(fig, f"{report['recipe']['model']} on real CIFAR-10 (JPEG), 2 CPU "
                      "cores")


def _import_graph():
    """{part: parts it imports}, a part being a subpackage or a top-level module."""
    root = os.path.join(REPO, "keras_preact")
    edges = {}
    for folder, _, files in os.walk(root):
        for name in (n for n in files if n.endswith(".py")):
            rel = os.path.relpath(os.path.join(folder, name), root).split(os.sep)
            part = rel[0].removesuffix(".py")
            if part in ("__init__", "__main__"):
                continue
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [f"{node.module}.{a.name}" for a in node.names]
                         if isinstance(node, ast.ImportFrom) and node.module else [])
                for target in (n.split(".") for n in names):
                    if target[0] == "keras_preact" and len(target) > 1 and target[1] != part:
                        edges.setdefault(part, set()).add(target[1])
            edges.setdefault(part, set())
    return edges


def house_of_modules():
    """The package's parts in their three floors (command line, application, core) with
    the imports between them, read from the source."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    edges = _import_graph()
    floors = {"command line": ["cli"],
              "application": ["data", "training", "tuning", "export", "diagnostics", "finetune",
                              "hub"],
              "core": ["layers", "models", "weights", "zoo_catalog", "file_io", "checks",
                       "architecture", "private_api"]}
    assert set(edges) == {p for parts in floors.values() for p in parts}, sorted(edges)
    fig = Figure(figsize=(10, 5.6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, 10), ylim=(0, 5.6))
    ax.axis("off")
    where = {}
    for level, (floor, parts) in enumerate(floors.items()):
        y = 4.5 - 1.85 * level
        ax.add_patch(_box(0.1, y - 0.6, 9.8, 1.2, "#eef1fb"))
        ax.text(0.2, y + 0.45, floor, fontsize=9, color="#555")
        for i, part in enumerate(parts):
            x = 0.1 + 9.8 * (i + 0.5) / len(parts)
            where[part] = (x, y)
            ax.add_patch(_box(x - 0.7, y - 0.22, 1.4, 0.44, "white"))
            ax.text(x, y, part, ha="center", va="center", fontsize=9, family="monospace")
    for source, targets in edges.items():
        for target in targets:
            (x0, y0), (x1, y1) = where[source], where[target]
            same = y0 == y1  # within a floor: an arc below the boxes
            ax.annotate("", xy=(x1, y1 - 0.24 if same else y1 + 0.24),
                        xytext=(x0, y0 - 0.24), arrowprops=dict(
                            arrowstyle="->", color="#3f51b5", lw=0.7, alpha=0.6,
                            connectionstyle=f"arc3,rad={_bend(x0, x1) if same else 0}"))
    ax.text(9.9, 0.05, "an arrow: the module imports the other", ha="right", fontsize=8,
            color="#555")
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _bend(x0, x1):
    """An arc of about the same small height below the boxes, whichever the direction."""
    return math.copysign(min(0.4, 0.7 / abs(x1 - x0)), x1 - x0)


def _box(x, y, w, h, color):
    from matplotlib.patches import FancyBboxPatch
    return FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02", fc=color, ec="#9fa8da")


FIGURES = {"training_curve.png": training_curve, "gradient_flow.png": gradient_flow,
           "depth_sweep.png": depth_sweep, "house_of_modules.png": house_of_modules,
           "cifar_time_to_accuracy.png": cifar_time_to_accuracy,
           "fast_ablation.png": fast_ablation_curves}


# --- the MkDocs hooks -------------------------------------------------------------------

def on_files(files, config):
    """Adds the figures to the site as figures/NAME.png."""
    from mkdocs.structure.files import File

    for name, make in FIGURES.items():
        files.append(File.generated(config, f"figures/{name}", content=make()))
    return files


def on_page_markdown(markdown, page, config, files):
    """Replaces each ``<!-- generated: NAME -->`` line with the part NAME."""
    return MARKER.sub(lambda m: PARTS[m[1]](), markdown)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("models", "performance", "figures"))
    parser.add_argument("out", nargs="?", help="figures: the folder to write them to")
    parser.add_argument("--write", action="store_true", help="models: measure the costs into "
                        "zoo/models.json and rewrite README.md's table")
    args = parser.parse_args(argv)
    if args.what == "models":
        if args.write:
            with open(os.path.join(REPO, "zoo", "models.json"), "w", encoding="utf-8") as f:
                f.write(measure_models())
        generated = models_table()
        if not args.write:
            print(generated)
            return 0
        path = os.path.join(REPO, "README.md")
        with open(path, encoding="utf-8") as f:
            text = readme_with_models_table(f.read(), generated)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    elif args.what == "performance":
        for name in ("machine", "speed", "speed-avx2", "fused-bn", "scaling", "memory", "build",
                     "serving", "build-backends", "jax", "jax-ops", "cifar", "bf16",
                     "fast-ablation"):
            print(PARTS[name](), end="\n\n")
    else:
        if not args.out:
            parser.error("figures needs OUT_DIR")
        os.makedirs(args.out, exist_ok=True)
        for name, make in FIGURES.items():
            with open(os.path.join(args.out, name), "wb") as f:
                f.write(make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
