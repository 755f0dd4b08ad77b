"""Build, save and load times of the zoo's models, and of a naive reference.

Each measurement runs in a fresh process at Python's default recursion limit, with JAX's
persistent compilation cache off, on each of ``--backends`` in turn. ``--naive`` also times
a functional ResNet-1001 of one Keras layer per op, at the default recursion limit, then
with it raised.

    python benchmarks/build_save_load.py [--models preact_resnet1001 ... | all] [--naive]
        [--backends tensorflow jax torch] [--out benchmarks/results/build_save_load.json]
"""

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import launch, machine, now, parser, print_table, write_report  # noqa: E402


def _timed(fn, *args):
    t0 = time.perf_counter()
    return fn(*args), time.perf_counter() - t0


def case(name):
    """Builds, saves and loads the zoo model `name` on this process's backend."""
    import keras
    import numpy as np

    import keras_preact as kp

    assert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()
    model, build_s = _timed(kp.get_model, name)
    x = np.random.RandomState(0).rand(2, *model.input_shape[1:]).astype("float32") * 255
    # Batch statistics: inference mode at initialisation (moving variance 1) overflows
    # through hundreds of units in any framework, so compare training-mode outputs.
    y = keras.ops.convert_to_numpy(model(x, training=True))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, name + ".keras")
        _, save_s = _timed(model.save, path)
        loaded, load_s = _timed(keras.saving.load_model, path)
        diff = float(np.abs(keras.ops.convert_to_numpy(loaded(x, training=True)) - y).max())
        size = os.path.getsize(path)
    return {"model": name, "backend": keras.backend.backend(), "build_s": build_s,
            "save_s": save_s, "load_s": load_s, "save_load_s": save_s + load_s,
            "file_mb": size / 1e6, "max_abs_diff": diff, "keras_layers": len(model.layers),
            "parameters": kp.count_params(model)}


def naive_resnet1001():
    """ResNet-1001 written as one Keras layer per op, functionally."""
    import keras
    from keras import layers

    def bn_relu(x):
        return layers.Activation("relu")(layers.BatchNormalization()(x))

    def conv(x, filters, kernel, stride=1):
        return layers.Conv2D(filters, kernel, strides=stride, padding="same", use_bias=False)(x)

    inputs = keras.Input((32, 32, 3))
    x = conv(inputs, 16, 3)
    for stage, filters in enumerate((64, 128, 256)):
        for i in range(111):
            stride = 2 if i == 0 and stage > 0 else 1
            a = bn_relu(x)
            shortcut = conv(a, filters, 1, stride) if i == 0 else x
            r = bn_relu(conv(a, filters // 4, 1))
            r = bn_relu(conv(r, filters // 4, 3, stride))
            x = layers.Add()([shortcut, conv(r, filters, 1)])
    x = layers.GlobalAveragePooling2D()(bn_relu(x))
    return keras.Model(inputs, layers.Dense(10)(x))


def naive_case(limit):
    """The naive ResNet-1001's build and save + load at recursion limit `limit` (0: Python's
    default); a RecursionError is the result, not a failure."""
    import keras

    sys.setrecursionlimit(limit or sys.getrecursionlimit())
    result = {"recursion_limit": sys.getrecursionlimit(), "error": "RecursionError in build"}
    try:
        model, result["build_s"] = _timed(naive_resnet1001)
        result.update(keras_layers=len(model.layers), error="RecursionError in save/load")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "naive.keras")
            _, save_s = _timed(model.save, path)
            _, load_s = _timed(keras.saving.load_model, path)
        result.update(save_load_s=save_s + load_s, error=None)
    except RecursionError:
        pass  # "error" says where
    return result


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--models", nargs="+", default=["preact_resnet164", "preact_resnet1001"])
    p.add_argument("--backends", nargs="+", default=["tensorflow"],
                   choices=("tensorflow", "jax", "torch"))
    p.add_argument("--naive", action="store_true")
    args = p.parse_args(argv)
    if args.models == ["all"]:
        import keras_preact as kp

        args.models = kp.list_models()

    env = {"KERAS_BACKEND": "tensorflow", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    rows = [launch(case, name, check=True, env={**env, "KERAS_BACKEND": backend})
            for name in args.models for backend in args.backends]
    naive = [launch(naive_case, limit, check=True, env=env)
             for limit in ((0, 20000) if args.naive else ())]
    print_table(rows, [("model", "model", "s"), ("backend", "backend", "s"),
                       ("build s", "build_s", ".2f"), ("save s", "save_s", ".2f"),
                       ("load s", "load_s", ".2f"), ("save+load", "save_load_s", ".2f"),
                       ("layers", "keras_layers", "d"), ("max |diff|", "max_abs_diff", ".2e")])
    if naive:
        print_table(naive, [("naive ResNet-1001, recursion limit", "recursion_limit", "d"),
                            ("build s", "build_s", ".2f"), ("save+load s", "save_load_s", ".2f"),
                            ("layers", "keras_layers", "d")])
    write_report({"machine": machine(), "started": now(), "models": rows,
                  "naive_reference": naive}, args.out, "build_save_load")
    return 0


if __name__ == "__main__":
    sys.exit(main())
