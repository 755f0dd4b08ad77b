"""In-process A/B of keras-preact's TensorFlow kernels: one model, one traced training
step per variant, steps alternating, medians compared.

A shared machine drifts by tens of percent within minutes, which buries a 10% effect
between two separate processes. Here every variant is traced in the same process (the
kernel switches are read at trace time) and the variants take turns, step by step.

    python benchmarks/step_ab.py --variants "KERAS_PREACT_FUSED_BN=1" "KERAS_PREACT_FUSED_BN=0" \
        [--model preact_resnet110] [--batch 128] [--reps 10] [--out result.json]

A variant is a comma-separated list of NAME=VALUE environment settings (the first
variant is the reference; an empty string is the default). TF_ENABLE_ONEDNN_OPTS cannot
vary within a process: set it for the whole run. Prints a table and one JSON line.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def parse_variant(text):
    """'A=1,B=0' -> {'A': '1', 'B': '0'}; a clear error for anything else."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--variants: expected NAME=VALUE items separated by commas. "
                             f"Received: {text!r}")
        out[name] = value
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", required=True)
    p.add_argument("--model", default="preact_resnet110")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="TF intra-op threads (inter-op 1)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.reps < 1 or args.batch < 1:
        raise SystemExit(f"--reps and --batch must be >= 1. Received: {args.reps}, {args.batch}")
    variants = [parse_variant(v) for v in args.variants]

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras_preact as kp  # first: it turns on TensorFlow's oneDNN kernels

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_preact.layers import tf_kernels

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model = kp.get_model(args.model, input_shape=(32, 32, 3), classifier_activation=None)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.uniform(-1, 1, (args.batch, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.randint(0, 10, (args.batch,)))

    steps = []
    for variant in variants:
        saved = {k: os.environ.get(k) for k in variant}
        os.environ.update(variant)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        step(x, y).numpy()  # traced (and optimised) under this variant's switches
        steps.append(step)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    for step in steps:
        step(x, y).numpy()
    times = [[] for _ in steps]
    for _ in range(args.reps):
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            step(x, y).numpy()
            times[i].append(time.perf_counter() - t0)
    medians = [float(np.median(t)) for t in times]
    rows = [{"variant": v, "median_s_per_step": m, "images_per_s": args.batch / m,
             "min_s_per_step": float(min(t)), "speed_over_first": medians[0] / m}
            for v, m, t in zip(args.variants, medians, times)]
    print(f"{'variant':64s} {'s/step':>8s} {'img/s':>8s} {'x first':>8s}")
    for r in rows:
        print(f"{r['variant'] or '(default)':64s} {r['median_s_per_step']:8.3f} "
              f"{r['images_per_s']:8.1f} {r['speed_over_first']:8.3f}")
    report = {"model": args.model, "batch": args.batch, "reps": args.reps,
              "onednn": tf_kernels.onednn_enabled(), "rows": rows}
    print(json.dumps(report))
    if args.out:
        tmp = args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
