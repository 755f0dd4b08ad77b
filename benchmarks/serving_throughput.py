"""Served images/s of every export format against the PyTorch eager reference.

Builds a zoo model with its preprocessing layer (``kp.get_model(name,
preprocessing="cifar10")``, random weights, CIFAR input 32x32x3), exports it with the
library's own exporters into a temporary folder and runs each export through the library's
loader (``keras_preact.export.load_export(folder).predict``: uint8 images in, preprocessing
inside, numpy arrays out, each runtime on its default threads):

* Keras ``model.predict_on_batch`` on float32 pixels (the Keras model itself);
* the SavedModel's ``serving_default`` signature (reloaded with ``tf.saved_model.load``);
* ONNX Runtime (``CPUExecutionProvider``) and LiteRT (the ``ai-edge-litert`` interpreter):
  float32, LiteRT float16 and dynamic range, and static int8 for both, calibrated on
  ``--calibration-images`` seeded random images. A quantisation the exporters do not offer
  (``keras_preact.export.QUANTIZATIONS``, ``ONNX_QUANTIZATIONS``) is skipped with a note. A
  quantised export's parity against the Keras model is recorded, not enforced;
* the reference: `torch_reference.PreActResNet` of the same depth, PyTorch eager in fp32,
  ``model.eval()`` under ``torch.inference_mode()``, on float32 NCHW tensors made beforehand.

At each batch size every runner is warmed up on ``--warmup`` batches, then each of
``--repeats`` rounds times every format once over the same images (``--images`` per
measurement: one figure for every batch size or one per batch size; default two batches, at
least 64 images), the formats in turn and in reverse order every other round, so that a
shared machine's drift hits all of them alike. The report gives each format's median
images/s, the median of its ratios to PyTorch eager in the same round, the cores it kept
busy (process CPU time over wall time) and the cores other processes kept busy meanwhile
(from ``/proc/stat``: PyTorch's OpenMP threads slow down most while another process holds a
core), the exports' sizes in bytes and their parity from their model cards. Prints a table
and writes JSON. Not a test: CI does not run it.

Usage:
    python benchmarks/serving_throughput.py [--model preact_resnet110] [--batch-sizes 1 128]
        [--images 64 256] [--repeats 5] [--warmup 2] [--calibration-images 64]
        [--out benchmarks/results/serving_throughput.json]
"""

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # torch_reference's model, run's cpu_info

REFERENCE = "PyTorch eager"
KERAS = "Keras predict_on_batch"
#: The exports: (label, format, quantization).
EXPORTS = (("SavedModel serving_default", "saved_model", None),
           ("ONNX Runtime", "onnx", None),
           ("ONNX Runtime int8", "onnx", "int8"),
           ("LiteRT", "litert", None),
           ("LiteRT float16", "litert", "float16"),
           ("LiteRT dynamic range", "litert", "dynamic_range"),
           ("LiteRT int8", "litert", "int8"))
#: Packages whose versions go into the report (by their distribution names).
PACKAGES = ("keras-preact", "tensorflow", "keras", "torch", "onnxruntime", "onnx", "tf2onnx",
            "ai-edge-litert", "numpy")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="preact_resnet110", help="a CIFAR model of the zoo")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 128])
    p.add_argument("--images", type=int, nargs="+", default=None,
                   help="images per measurement: one figure, or one per batch size, each a "
                        "multiple of its batch size (default: two batches, at least 64 images)")
    p.add_argument("--repeats", type=int, default=5, help="rounds over all formats")
    p.add_argument("--warmup", type=int, default=2, help="batches each runner runs untimed")
    p.add_argument("--calibration-images", type=int, default=64,
                   help="seeded random uint8 images calibrating the int8 exports")
    p.add_argument("--out", default=os.path.join(HERE, "results", "serving_throughput.json"))
    args = p.parse_args(argv)
    for name in ("repeats", "calibration_images"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0. Received: {args.warmup}")
    if min(args.batch_sizes) < 1:
        p.error(f"--batch-sizes must be >= 1. Received: {args.batch_sizes}")
    images = args.images or [max(64, 2 * b) for b in args.batch_sizes]
    if len(images) == 1:
        images = images * len(args.batch_sizes)
    if len(images) != len(args.batch_sizes):
        p.error(f"--images takes one figure or one per batch size ({len(args.batch_sizes)}). "
                f"Received: {args.images}")
    for batch, count in zip(args.batch_sizes, images):
        if count < 1 or count % batch:
            p.error(f"--images must be a positive multiple of the batch size. "
                    f"Received: {count} images at batch {batch}")
    args.images = dict(zip(args.batch_sizes, images))
    return args


def _versions():
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _export_bytes(folder):
    """Bytes of what a runtime loads from an export folder (all but the card and labels)."""
    from keras_preact import export

    skip = {export.MODEL_CARD_JSON, export.MODEL_CARD_MD, export.CLASS_NAMES_FILE}
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(folder)
               for name in names if name not in skip)


def _offered(kind, quantization):
    """Why the exporters cannot make this quantisation yet, or None if they can."""
    from keras_preact import export

    # ONNX_QUANTIZATIONS came with ONNX's int8; before it, ONNX was float32 only.
    offered = {"saved_model": (None,), "litert": export.QUANTIZATIONS,
               "onnx": getattr(export, "ONNX_QUANTIZATIONS", (None,))}[kind]
    if quantization in offered:
        return None
    return f"the {kind} exporter has no quantization={quantization!r} yet"


def export_all(model, folder, calibration):
    """Each of `EXPORTS` the exporters offer, made in `folder`: ({label: record}, [notes])."""
    from keras_preact import export

    exporters = {"saved_model": export.export_saved_model, "onnx": export.export_onnx,
                 "litert": export.export_litert}
    made, skipped = {}, []
    for label, kind, quantization in EXPORTS:
        why = _offered(kind, quantization)
        if why:
            skipped.append(f"{label}: {why}")
            print(f"skipping {label}: {why}", flush=True)
            continue
        # A quantised export's parity is recorded in its card, not enforced.
        kwargs = {} if quantization is None else {"quantization": quantization,
                                                  "parity_tolerance": 1.0}
        if quantization == "int8":
            kwargs["calibration_images"] = calibration
        t0 = time.perf_counter()
        try:
            path = exporters[kind](model, os.path.join(folder, label.replace(" ", "_")), **kwargs)
        except Exception as err:  # noqa: BLE001 - the int8 exporters are new: note, go on
            if quantization != "int8":
                raise
            skipped.append(f"{label}: export failed: {type(err).__name__}: {err}")
            print(f"skipping {label}: export failed: {err}", flush=True)
            continue
        card = export.read_model_card(path)
        made[label] = {"format": kind, "quantization": quantization, "path": path,
                       "export_s": time.perf_counter() - t0, "bytes": _export_bytes(path),
                       "parity": card.get("parity")}
        print(f"exported {label}: {made[label]['bytes']:,} bytes in "
              f"{made[label]['export_s']:.0f} s", flush=True)
    return made, skipped


def make_runners(model, exports, depth, classes):
    """{label: (prepare, run)}: ``prepare(uint8 batch)`` makes the input untimed, ``run``
    serves it and returns numpy arrays. The reference comes first."""
    import numpy as np
    import torch

    from keras_preact import export
    from torch_reference import PreActResNet

    torch.manual_seed(0)
    reference = PreActResNet(depth, classes).eval()

    def torch_input(images):
        return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2), "float32"))

    def torch_run(x):
        with torch.inference_mode():
            return reference(x).numpy()

    def as_is(images):
        return images

    runners = {REFERENCE: (torch_input, torch_run),
               KERAS: (lambda images: images.astype("float32"), model.predict_on_batch)}
    for label, record in exports.items():
        runners[label] = (as_is, export.load_export(record["path"]).predict)
    return runners


def _machine_busy_s():
    """CPU seconds the whole machine has spent busy (stolen by the hypervisor included), or
    None where ``/proc/stat`` cannot tell."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def _timed(run, inputs):
    """(wall seconds, this process's CPU seconds, cores other processes kept busy) of
    running `inputs` one after the other."""
    machine, cpu, wall = _machine_busy_s(), time.process_time(), time.perf_counter()
    for x in inputs:
        run(x)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    others = None if machine is None else max(0.0, (_machine_busy_s() - machine - cpu) / wall)
    return wall, cpu, others


def measure(runners, images, batch, repeats, warmup):
    """Each runner timed over `images` in batches of `batch`, once a round, in turn (reversed
    every other round) after `warmup` untimed batches: {label: {"s", "cpu_s", "others_cores"}},
    a list each, one figure a round."""
    batches = [images[i:i + batch] for i in range(0, len(images), batch)]
    inputs = {label: [prepare(b) for b in batches] for label, (prepare, _) in runners.items()}
    for label, (_, run) in runners.items():
        for i in range(warmup):
            run(inputs[label][i % len(batches)])
    times = {label: {"s": [], "cpu_s": [], "others_cores": []} for label in runners}
    order = list(runners)
    for r in range(repeats):
        for label in order if r % 2 == 0 else order[::-1]:
            wall, cpu, others = _timed(runners[label][1], inputs[label])
            times[label]["s"].append(wall)
            times[label]["cpu_s"].append(cpu)
            times[label]["others_cores"].append(others)
    return times


def _median_or_none(values):
    return None if None in values else statistics.median(values)


def summarise(times, images, batch, exports):
    """One row a format: median images/s, median ratio to the reference's rate of the same
    round, cores kept busy by it and by other processes, and the export's size."""
    reference = [images / s for s in times[REFERENCE]["s"]]
    rows = []
    for label, t in times.items():
        rates = [images / s for s in t["s"]]
        record = exports.get(label, {})
        rows.append({
            "format": label, "batch": batch, "images": images,
            "quantization": record.get("quantization"),
            "images_per_s": statistics.median(rates),
            "ratio_to_torch": statistics.median(a / b for a, b in zip(rates, reference)),
            "cores_busy": sum(t["cpu_s"]) / sum(t["s"]),
            "others_cores": _median_or_none(t["others_cores"]),
            "bytes": record.get("bytes"), "rounds": t})
    return rows


def print_table(report):
    header = (f"{'format':<28} {'batch':>5} {'img/s':>8} {'x PyTorch':>9} {'cores':>5} "
              f"{'others':>6} {'bytes':>11}")
    images = ", ".join(f"{n} at batch {b}" for b, n in report["images"].items())
    print(f"{report['model']}: medians of {report['repeats']} rounds, images per measurement: "
          f"{images}")
    print(header)
    print("-" * len(header))
    for r in report["rows"]:
        size = f"{r['bytes']:,}" if r["bytes"] is not None else "-"
        others = f"{r['others_cores']:.2f}" if r["others_cores"] is not None else "-"
        print(f"{r['format']:<28} {r['batch']:>5} {r['images_per_s']:>8.1f} "
              f"{r['ratio_to_torch']:>8.2f}x {r['cores_busy']:>5.2f} {others:>6} {size:>11}")
    for note in report["skipped"]:
        print(f"skipped: {note}")


def main(argv=None):
    args = _parse(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    import keras_preact as kp
    from run import cpu_info

    info = kp.model_info(args.model)
    if info["family"] != "cifar":
        raise SystemExit(f"--model must be a CIFAR model (the PyTorch reference has the CIFAR "
                         f"layout). Received: {args.model!r} ({info['family']})")
    model = kp.get_model(args.model, preprocessing="cifar10")
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    calibration = rng.integers(0, 256, (args.calibration_images, *shape), dtype=np.uint8)
    report = {
        "benchmark": "serving_throughput",
        "command": shlex.join(["python", "benchmarks/serving_throughput.py",
                               *(sys.argv[1:] if argv is None else argv)]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "cpu": cpu_info()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "versions": _versions(),
        "model": args.model, "input_shape": list(shape), "params": kp.count_params(model),
        "macs": kp.count_macs(model), "images": args.images, "repeats": args.repeats,
        "warmup_batches": args.warmup, "calibration_images": args.calibration_images,
        "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        exports, report["skipped"] = export_all(model, tmp, calibration)
        runners = make_runners(model, exports, info["depth"], int(model.outputs[0].shape[-1]))
        for batch, count in args.images.items():
            images = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
            times = measure(runners, images, batch, args.repeats, args.warmup)
            report["rows"] += summarise(times, count, batch, exports)
    report["exports"] = {label: {k: v for k, v in record.items() if k != "path"}
                         for label, record in exports.items()}
    print_table(report)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
