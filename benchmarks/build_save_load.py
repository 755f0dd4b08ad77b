"""Build, save and load times of the deep models (and the naive reference).

Each measurement runs in a fresh process at Python's default recursion limit, so
nothing is cached (JAX's persistent compilation cache is off) and no limit is raised.
With several backends each model is measured on each in turn, so that a shared
machine's drift hits them alike. Prints a table and writes JSON.

Usage:
    python benchmarks/build_save_load.py [--models preact_resnet1001 ... | all] [--naive]
        [--backends tensorflow jax torch] [--out benchmarks/results/build_save_load.json]

`--naive` also times a one-Keras-layer-per-op functional ResNet-1001 (the reference
the targets are stated against), first at the default recursion limit, then with the
limit raised.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

CHILD = r"""
import json, os, sys, tempfile, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import keras
import keras_preact as kp
name = sys.argv[1]
assert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()
t0 = time.perf_counter()
model = kp.get_model(name)
t_build = time.perf_counter() - t0
x = np.random.RandomState(0).rand(2, *model.input_shape[1:]).astype("float32") * 255
# Batch statistics: inference mode at initialisation (moving variance 1) overflows
# through hundreds of units in any framework, so compare training-mode outputs.
y = keras.ops.convert_to_numpy(model(x, training=True))
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, name + ".keras")
    t0 = time.perf_counter()
    model.save(path)
    t_save = time.perf_counter() - t0
    size = os.path.getsize(path)
    t0 = time.perf_counter()
    loaded = keras.saving.load_model(path)
    t_load = time.perf_counter() - t0
    diff = float(np.abs(keras.ops.convert_to_numpy(loaded(x, training=True)) - y).max())
print(json.dumps({"model": name, "backend": keras.backend.backend(), "build_s": t_build, "save_s": t_save, "load_s": t_load,
                  "save_load_s": t_save + t_load, "file_mb": size / 1e6,
                  "max_abs_diff": diff, "keras_layers": len(model.layers),
                  "parameters": kp.count_params(model)}))
"""

NAIVE = r"""
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras
from keras import layers
limit = int(sys.argv[1])
if limit:
    sys.setrecursionlimit(limit)

def bn_relu(x):
    return layers.Activation("relu")(layers.BatchNormalization()(x))

def unit(x, filters, stride, project):
    a = bn_relu(x)
    shortcut = layers.Conv2D(filters, 1, strides=stride, use_bias=False)(a) if project else x
    r = layers.Conv2D(filters // 4, 1, use_bias=False)(a)
    r = layers.Conv2D(filters // 4, 3, strides=stride, padding="same", use_bias=False)(bn_relu(r))
    r = layers.Conv2D(filters, 1, use_bias=False)(bn_relu(r))
    return layers.Add()([shortcut, r])

t0 = time.perf_counter()
try:
    inputs = keras.Input((32, 32, 3))
    x = layers.Conv2D(16, 3, padding="same", use_bias=False)(inputs)
    for stage, filters in enumerate((64, 128, 256)):
        for i in range(111):
            x = unit(x, filters, 2 if (i == 0 and stage > 0) else 1, i == 0)
    x = layers.GlobalAveragePooling2D()(bn_relu(x))
    model = keras.Model(inputs, layers.Dense(10)(x))
    result = {"build_s": time.perf_counter() - t0, "keras_layers": len(model.layers), "error": None}
except RecursionError as err:
    result = {"build_s": time.perf_counter() - t0, "error": "RecursionError in build"}
if result["error"] is None:
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "naive.keras")
        t0 = time.perf_counter()
        try:
            model.save(path)
            t_save = time.perf_counter() - t0
            t0 = time.perf_counter()
            keras.saving.load_model(path)
            result["save_load_s"] = t_save + time.perf_counter() - t0
        except RecursionError:
            result["error"] = "RecursionError in save/load"
print(json.dumps(result))
"""


def _run(code, *args, backend="tensorflow"):
    env = dict(os.environ, KERAS_BACKEND=backend, JAX_ENABLE_COMPILATION_CACHE="false")
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False, env=env
    )
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["preact_resnet164", "preact_resnet1001"])
    parser.add_argument("--backends", nargs="+", default=["tensorflow"],
                        choices=("tensorflow", "jax", "torch"))
    parser.add_argument("--naive", action="store_true")
    parser.add_argument("--out", default=os.path.join("benchmarks", "results", "build_save_load.json"))
    args = parser.parse_args(argv)

    if args.models == ["all"]:
        import keras_preact as kp
        args.models = kp.list_models()
    rows = [_run(CHILD, name, backend=b) for name in args.models for b in args.backends]
    naive = []
    if args.naive:
        for limit in (0, 20000):
            r = _run(NAIVE, str(limit))
            r["recursion_limit"] = limit or sys.getrecursionlimit()
            naive.append(r)

    print(f"{'model':<20} {'backend':<10} {'build s':>8} {'save s':>7} {'load s':>7} {'save+load':>9} {'layers':>7} {'max |diff|':>10}")
    for r in rows:
        print(f"{r['model']:<20} {r['backend']:<10} {r['build_s']:8.2f} {r['save_s']:7.2f} {r['load_s']:7.2f} "
              f"{r['save_load_s']:9.2f} {r['keras_layers']:7d} {r['max_abs_diff']:10.2e}")
    for r in naive:
        status = r["error"] or f"{r['keras_layers']} layers"
        save_load = f", save+load {r['save_load_s']:.2f} s" if "save_load_s" in r else ""
        print(f"naive ResNet-1001, recursion limit {r['recursion_limit']}: "
              f"build {r['build_s']:.2f} s{save_load} ({status})")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    report = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "python": platform.python_version()},
              "models": rows, "naive_reference": naive,
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
