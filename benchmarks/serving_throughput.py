"""Served images/s of every export format against the PyTorch eager reference.

A CIFAR zoo model with its preprocessing layer (random weights) is exported in every format
of `EXPORTS` (int8 calibrated on seeded random images) and served through
``keras_preact.export.load_export(folder).predict`` on uint8 images, beside Keras'
``predict_on_batch`` and `torch_reference.PreActResNet` in PyTorch eager. At each batch
size the runners are warmed up, then take turns for ``--repeats`` rounds (`measure`).

    python benchmarks/serving_throughput.py [--model preact_resnet110] [--batch-sizes 1 128]
        [--repeats 5] [--out benchmarks/results/serving_throughput.json]
"""

import os
import shlex
import sys
import tempfile
import time
from importlib import metadata

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import (  # noqa: E402
    count,
    machine,
    median,
    now,
    parser,
    print_table,
    take_turns,
    write_report,
)

REFERENCE = "PyTorch eager"
#: The exports: {label: (format, quantization)}.
EXPORTS = {"SavedModel serving_default": ("saved_model", None), "ONNX Runtime": ("onnx", None),
           "ONNX Runtime int8": ("onnx", "int8"), "LiteRT": ("litert", None),
           "LiteRT float16": ("litert", "float16"),
           "LiteRT dynamic range": ("litert", "dynamic_range"), "LiteRT int8": ("litert", "int8")}
#: Packages whose versions go into the report (by their distribution names).
PACKAGES = ("keras-preact", "tensorflow", "keras", "torch", "onnxruntime", "onnx", "tf2onnx",
            "ai-edge-litert", "numpy")


def export_all(model, folder, calibration):
    """Each of `EXPORTS`, made in `folder`: {label: record}."""
    from keras_preact import export

    skip = {export.MODEL_CARD_JSON, export.MODEL_CARD_MD, export.CLASS_NAMES_FILE}
    made = {}
    for label, (kind, quantization) in EXPORTS.items():
        # A quantised export's parity is recorded in its card, not enforced.
        kwargs = {} if quantization is None else {"quantization": quantization,
                                                  "parity_tolerance": 1.0}
        if quantization == "int8":
            kwargs["calibration_images"] = calibration
        t0 = time.perf_counter()
        exporter = getattr(export, "export_" + kind)
        path = exporter(model, os.path.join(folder, label.replace(" ", "_")), **kwargs)
        made[label] = record = {
            "format": kind, "quantization": quantization, "path": path,
            "export_s": time.perf_counter() - t0,
            "parity": export.read_model_card(path).get("parity"),
            # what a runtime loads: all but the card and the labels
            "bytes": sum(os.path.getsize(os.path.join(root, name))
                         for root, _, names in os.walk(path) for name in names if name not in skip)}
        print(f"exported {label}: {record['bytes']:,} bytes in {record['export_s']:.0f} s",
              flush=True)
    return made


def make_runners(model, exports, depth, classes):
    """{label: (prepare, run)}: ``prepare(uint8 batch)`` makes the input untimed, ``run``
    serves it and returns numpy arrays. The reference comes first."""
    import numpy as np
    import torch

    from benchmarks.torch_reference import PreActResNet
    from keras_preact import export

    torch.manual_seed(0)
    reference = PreActResNet(depth, classes).eval()
    torch_run = torch.inference_mode()(lambda x: reference(x).numpy())
    runners = {REFERENCE: (lambda images: torch.from_numpy(np.ascontiguousarray(
                               images.transpose(0, 3, 1, 2), "float32")), torch_run),
               "Keras predict_on_batch": (lambda images: images.astype("float32"),
                                          model.predict_on_batch)}
    for label, record in exports.items():
        runners[label] = (lambda images: images, export.load_export(record["path"]).predict)
    return runners


def _machine_busy_s():
    """CPU seconds the whole machine has been busy (stolen ones included), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle, iowait


def measure(runners, images, batch, repeats, warmup, exports):
    """The runners over `images` in batches of `batch` after `warmup` untimed batches, taking
    turns for `repeats` rounds: a row each with the median images/s and ratio to the same
    round's reference, the cores busy in it and in other processes, the export's size."""
    batches = [images[i:i + batch] for i in range(0, len(images), batch)]
    inputs = {label: [prepare(b) for b in batches] for label, (prepare, _) in runners.items()}
    for label, (_, run) in runners.items():
        for i in range(warmup):
            run(inputs[label][i % len(batches)])

    def timed(label):
        busy, cpu, wall = _machine_busy_s(), time.process_time(), time.perf_counter()
        for x in inputs[label]:
            runners[label][1](x)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        others = None if busy is None else max(0.0, (_machine_busy_s() - busy - cpu) / wall)
        return {"s": wall, "cpu_s": cpu, "others_cores": others}

    rounds = take_turns({label: lambda label=label: timed(label) for label in runners}, repeats)
    rows = []
    for label in runners:
        t = {key: [r[label][key] for r in rounds] for key in ("s", "cpu_s", "others_cores")}
        record = exports.get(label, {})
        rows.append({
            "format": label, "batch": batch, "images": len(images),
            "quantization": record.get("quantization"),
            "images_per_s": median(len(images) / s for s in t["s"]),
            "ratio_to_torch": median(r[REFERENCE]["s"] / r[label]["s"] for r in rounds),
            "cores_busy": sum(t["cpu_s"]) / sum(t["s"]), "others_cores": median(t["others_cores"]),
            "bytes": record.get("bytes"), "rounds": t})
    return rows


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--model", default="preact_resnet110", help="a CIFAR model of the zoo")
    p.add_argument("--batch-sizes", type=count, nargs="+", default=[1, 128])
    p.add_argument("--images", type=count, help="images per measurement, a multiple of every "
                   "batch size (default: two batches, at least 64 images)")
    p.add_argument("--repeats", type=count, default=5, help="rounds over all formats")
    p.add_argument("--warmup", type=count, default=2, help="batches each runner runs untimed")
    p.add_argument("--calibration-images", type=count, default=64,
                   help="seeded random uint8 images calibrating the int8 exports")
    args = p.parse_args(argv)
    if args.images and any(args.images % b for b in args.batch_sizes):
        p.error(f"--images must be a multiple of every batch size. Received: {args.images}")
    args.images = {b: args.images or max(64, 2 * b) for b in args.batch_sizes}
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np

    import keras_preact as kp

    info = kp.model_info(args.model)
    if info["family"] != "cifar":
        raise SystemExit(f"--model must be a CIFAR model (the PyTorch reference has the CIFAR "
                         f"layout). Received: {args.model!r} ({info['family']})")
    model = kp.get_model(args.model, preprocessing="cifar10")
    rng = np.random.default_rng(0)
    shape = tuple(model.inputs[0].shape[1:])
    calibration = rng.integers(0, 256, (args.calibration_images, *shape), dtype=np.uint8)
    installed = {d.metadata["Name"] for d in metadata.distributions()}
    report = {
        "command": shlex.join(["python", "benchmarks/serving_throughput.py",
                               *(sys.argv[1:] if argv is None else argv)]),
        "machine": machine(), "started": now(),
        "versions": {name: metadata.version(name) for name in PACKAGES if name in installed},
        "model": args.model, "input_shape": list(shape), "params": kp.count_params(model),
        "macs": kp.count_macs(model), "images": args.images, "repeats": args.repeats,
        "warmup_batches": args.warmup, "calibration_images": args.calibration_images,
        "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        exports = export_all(model, tmp, calibration)
        runners = make_runners(model, exports, info["depth"], int(model.outputs[0].shape[-1]))
        for batch, n in args.images.items():
            images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
            report["rows"] += measure(runners, images, batch, args.repeats, args.warmup, exports)
    report["exports"] = {label: {k: v for k, v in record.items() if k != "path"}
                         for label, record in exports.items()}
    print(f"{report['model']}: medians of {report['repeats']} rounds")
    print_table(report["rows"], [
        ("format", "format", "s"), ("batch", "batch", "d"), ("img/s", "images_per_s", ".1f"),
        ("x PyTorch", "ratio_to_torch", ".2f"), ("cores", "cores_busy", ".2f"),
        ("others", "others_cores", ".2f"), ("bytes", "bytes", ",")])
    write_report(report, args.out, "serving_throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
