"""In-process A/B of training steps: kernel switches of one model, or several models.
Every (model, variant) pair gets its own traced training step in one process, and the
steps take turns; medians are compared.

A shared machine drifts by tens of percent within minutes, which buries a 10% effect
between two separate processes. Here every variant is traced in the same process (the
kernel switches are read at trace time) and the variants take turns, step by step.

    python benchmarks/step_ab.py --variants "KERAS_PREACT_FUSED_BN=1" "KERAS_PREACT_FUSED_BN=0" \
        [--models preact_resnet110] [--batch 128] [--reps 10] [--out result.json]
    python benchmarks/step_ab.py --models preact_resnet164 preact_resnet1001 --batch 32
    python benchmarks/step_ab.py --models preact_resnet1001 'preact_resnet1001{"remat": true}' --batch 32

A model may carry factory arguments as a JSON object after its name. A variant is a
comma-separated list of NAME=VALUE environment settings (the first
variant is the reference; an empty string, the default, is no change). With several
models the rows also give each model's milliseconds per image and picoseconds per
forward multiply-add, the harness's cost-scaling figures (`run.py --parts scaling`).
TF_ENABLE_ONEDNN_OPTS cannot vary within a process: set it for the whole run. Prints a
table and one JSON line.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)  # keras_step's helpers


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


def parse_model(spec):
    """'preact_resnet1001' or 'preact_resnet1001{"remat": "segment"}' -> (name, kwargs)."""
    from keras_step import json_object

    name, brace, rest = spec.partition("{")
    if not brace:
        return name.strip(), {}
    try:
        return name.strip(), json_object(brace + rest, "--models: the factory arguments after the name")
    except ValueError as e:
        raise SystemExit(str(e)) from None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="+", default=[""])
    p.add_argument("--models", "--model", nargs="+", default=["preact_resnet110"])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--threads", type=int, default=2, help="TF intra-op threads (inter-op 1)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.reps < 1 or args.batch < 1 or args.threads < 1:
        p.error(f"--reps, --batch and --threads must be >= 1. Received: {args.reps}, "
                f"{args.batch}, {args.threads}")
    models = args.models
    specs = [parse_model(m) for m in models]
    variants = [parse_variant(v) for v in args.variants]

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras_preact as kp  # first: it turns on TensorFlow's oneDNN kernels

    unknown = [name for name, _ in specs if name not in kp.list_models()]
    if unknown:
        p.error(f"--models: unknown model(s) {unknown}. Valid: {kp.list_models()}")

    import keras
    import numpy as np
    import tensorflow as tf

    from keras_preact.layers import tf_kernels

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.uniform(-1, 1, (args.batch, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.randint(0, 10, (args.batch,)))

    def make_step(model, optimizer):
        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return step

    cases = []  # (model name, variant text, step, MACs)
    for spec, (name, kwargs) in zip(models, specs):
        model = kp.get_model(name, input_shape=(32, 32, 3), classifier_activation=None, **kwargs)
        macs = kp.count_macs(model)
        for text, variant in zip(args.variants, variants):
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
            optimizer.build(model.trainable_variables)
            saved = {k: os.environ.get(k) for k in variant}
            os.environ.update(variant)
            step = make_step(model, optimizer)
            step(x, y).numpy()  # traced (and optimised) under this variant's switches
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            cases.append((spec, text, step, macs))
    for case in cases:
        case[2](x, y).numpy()
    times = [[] for _ in cases]
    for _ in range(args.reps):
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            case[2](x, y).numpy()
            times[i].append(time.perf_counter() - t0)
    medians = [float(np.median(t)) for t in times]
    rows = []
    for (name, text, _, macs), m, t in zip(cases, medians, times):
        rows.append({"model": name, "variant": text, "median_s_per_step": m,
                     "images_per_s": args.batch / m, "min_s_per_step": float(min(t)),
                     "speed_over_first": medians[0] / m, "macs": macs,
                     "ms_per_image": 1e3 * m / args.batch,
                     "ps_per_mac": 1e12 * m / args.batch / macs})
    print(f"{'model':20s} {'variant':40s} {'s/step':>8s} {'img/s':>8s} {'ps/MAC':>7s} {'x first':>8s}")
    for r in rows:
        print(f"{r['model']:20s} {r['variant'] or '(default)':40s} {r['median_s_per_step']:8.3f} "
              f"{r['images_per_s']:8.1f} {r['ps_per_mac']:7.1f} {r['speed_over_first']:8.3f}")
    report = {"models": models, "batch": args.batch, "reps": args.reps,
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
