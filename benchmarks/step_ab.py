r"""In-process A/B of training steps: kernel switches of one model, or several models.

A shared machine drifts by tens of percent within minutes, which buries a small effect
between two processes. Here every (model, variant) pair gets its own training step traced
in one process (the kernel switches are read at trace time), and the steps take turns. A
variant is comma-separated NAME=VALUE environment settings (the first is the reference;
"" is no change; TF_ENABLE_ONEDNN_OPTS cannot vary within a process); a model may carry
factory arguments as a JSON object after its name. Prints its report as one JSON line.

    python benchmarks/step_ab.py --variants "" "KERAS_PREACT_FUSED_BN=0" [--batch 128] [--reps 10]
    python benchmarks/step_ab.py --models preact_resnet1001 \
        'preact_resnet1001{"remat": true}' --batch 32
"""

import functools
import json
import os
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import count, json_object, machine, parser, print_table, write_report  # noqa: E402


def variant(text):
    """An argparse type: 'A=1,B=0' -> ('A=1,B=0', {'A': '1', 'B': '0'}); an item without
    '=' is a ValueError, which argparse reports as an invalid variant."""
    return text, dict(item.strip().split("=", 1) for item in text.split(",") if item.strip())


def model(spec):
    """An argparse type: 'preact_resnet1001{"remat": "segment"}' -> (spec, name, kwargs)."""
    name, brace, rest = spec.partition("{")
    return spec, name.strip(), json_object(brace + rest) if brace else {}


def time_steps(args):
    """Every (model, variant) step traced in this process, then timed in turns: a row each."""
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_preact as kp

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    rng = np.random.RandomState(0)
    x = tf.constant(rng.uniform(-1, 1, (args.batch, 32, 32, 3)).astype("float32"))
    y = tf.constant(rng.randint(0, 10, (args.batch,)))

    def train_step(model, optimizer, x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    cases = []  # (model spec, variant text, step, MACs)
    for spec, name, kwargs in args.models:
        net = kp.get_model(name, input_shape=(32, 32, 3), classifier_activation=None, **kwargs)
        for text, env in args.variants:
            optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
            optimizer.build(net.trainable_variables)
            with mock.patch.dict(os.environ, env):
                step = tf.function(functools.partial(train_step, net, optimizer))
                step(x, y).numpy()  # traced (and optimised) under this variant's switches
            cases.append((spec, text, step, kp.count_macs(net)))
    times = [[] for _ in cases]
    for rep in range(args.reps + 1):  # the first round untimed
        for i, (_, _, step, _) in enumerate(cases):
            t0 = time.perf_counter()
            step(x, y).numpy()
            if rep:
                times[i].append(time.perf_counter() - t0)
    medians = [float(np.median(t)) for t in times]
    return [{"model": spec, "variant": text, "median_s_per_step": m,
             "images_per_s": args.batch / m, "min_s_per_step": float(min(t)),
             "speed_over_first": medians[0] / m, "macs": macs,
             "ms_per_image": 1e3 * m / args.batch, "ps_per_mac": 1e12 * m / args.batch / macs}
            for (spec, text, _, macs), m, t in zip(cases, medians, times)]


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--variants", type=variant, nargs="+", default=[("", {})])
    p.add_argument("--models", "--model", type=model, nargs="+",
                   default=[model("preact_resnet110")])
    p.add_argument("--batch", type=count, default=128)
    p.add_argument("--reps", type=count, default=10)
    p.add_argument("--threads", type=count, default=2, help="TF intra-op threads (inter-op 1)")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ["KERAS_BACKEND"] = "tensorflow"
    import keras_preact as kp  # first: it turns on TensorFlow's oneDNN kernels
    from keras_preact.layers import tf_kernels

    unknown = [name for _, name, _ in args.models if name not in kp.list_models()]
    if unknown:
        p.error(f"--models: unknown model(s) {unknown}. Valid: {kp.list_models()}")
    rows = time_steps(args)
    print_table(rows, [("model", "model", "s"), ("variant", "variant", "s"),
                       ("s/step", "median_s_per_step", ".3f"), ("img/s", "images_per_s", ".1f"),
                       ("ps/MAC", "ps_per_mac", ".1f"), ("x first", "speed_over_first", ".3f")])
    report = {"machine": machine(), "models": [spec for spec, _, _ in args.models],
              "batch": args.batch,
              "reps": args.reps, "onednn": tf_kernels.onednn_enabled(), "rows": rows}
    if args.out:
        write_report(report, args.out)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
