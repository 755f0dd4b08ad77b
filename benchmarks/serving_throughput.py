"""Served images/s of a SavedModel export against `model.predict`.

Exports a zoo model with `keras_preact.export.export_saved_model`, reloads it with
`tf.saved_model.load` and times its ``serving_default`` signature (uint8 images in,
preprocessing inside, as TF Serving runs it) against `model.predict` on the same
images as float32, over the same number of images in the same batch size. The target
is served/predict >= 0.95 at every batch size. Repeats are interleaved and the median
is reported (the machines are shared and noisy). Prints a table and writes JSON.

Usage:
    python benchmarks/serving_throughput.py [--model preact_resnet20] [--batch-sizes 1 32 128]
        [--images 512] [--repeats 5] [--threads 0]
        [--out benchmarks/results/serving_throughput.json]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

TARGET = 0.95


def _parse():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="preact_resnet20")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument("--images", type=int, default=512, help="images per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0,
                        help="TF intra-op threads (0: TensorFlow's default); inter-op is 1 when set")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "serving_throughput.json"))
    return parser.parse_args()


def main():
    args = _parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    import keras_preact as kp
    from keras_preact import export

    model = kp.get_model(args.model, preprocessing="cifar10")
    height, width, channels = model.inputs[0].shape[1:]
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (args.images, height, width, channels), dtype=np.uint8)
    floats = images.astype("float32")

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        folder = export.export_saved_model(model, os.path.join(tmp, "export"), check_parity=False)
        export_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        serve = tf.saved_model.load(folder).signatures["serving_default"]
        load_s = time.perf_counter() - t0

        def served(batch):
            for start in range(0, len(images), batch):
                serve(images=tf.constant(images[start:start + batch]))["probabilities"].numpy()

        def predicted(batch):
            model.predict(floats, batch_size=batch, verbose=0)

        for batch in args.batch_sizes:
            # Warm-up: traces predict's function and the loaded graph for this shape.
            served(batch)
            predicted(batch)
            times = {"served": [], "predict": []}
            for _ in range(args.repeats):
                for name, fn in (("served", served), ("predict", predicted)):
                    t0 = time.perf_counter()
                    fn(batch)
                    times[name].append(time.perf_counter() - t0)
            served_ips = len(images) / statistics.median(times["served"])
            predict_ips = len(images) / statistics.median(times["predict"])
            rows.append({
                "batch_size": batch,
                "served_images_per_s": served_ips,
                "predict_images_per_s": predict_ips,
                "ratio": served_ips / predict_ips,
                "meets_target": served_ips / predict_ips >= TARGET,
                "served_s": times["served"],
                "predict_s": times["predict"],
            })
        check = np.asarray(serve(images=tf.constant(images[:8]))["probabilities"])
        diff = float(np.abs(check - model.predict(floats[:8], verbose=0)).max())

    header = f"{'batch':>5}  {'served img/s':>12}  {'predict img/s':>13}  {'ratio':>6}  target >= {TARGET}"
    print(f"{args.model}: SavedModel serving_default vs model.predict, {args.images} images "
          f"a measurement, median of {args.repeats}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['batch_size']:>5}  {r['served_images_per_s']:>12.1f}  "
              f"{r['predict_images_per_s']:>13.1f}  {r['ratio']:>6.2f}  "
              f"{'yes' if r['meets_target'] else 'NO'}")
    print(f"export {export_s:.1f} s, load {load_s:.1f} s, max |served - predict| {diff:.2g}")

    result = {
        "benchmark": "serving_throughput",
        "model": args.model,
        "images": args.images,
        "repeats": args.repeats,
        "threads": args.threads or "default",
        "target_ratio": TARGET,
        "export_s": export_s,
        "load_s": load_s,
        "max_abs_diff": diff,
        "rows": rows,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
        "versions": {"keras_preact": kp.__version__, "keras": keras.__version__,
                     "tensorflow": tf.__version__},
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
