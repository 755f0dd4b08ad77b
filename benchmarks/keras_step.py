"""One benchmark case: training images/s and peak memory of a keras-preact model, on any
backend (KERAS_BACKEND), with NumPy data. Prints one JSON line. It imports nothing else of
benchmarks/, so that `trees_ab.py` can run it over another source tree's keras_preact.

    KERAS_BACKEND=tensorflow python benchmarks/keras_step.py --model preact_resnet110 \
        --batch 128 --steps 20 [--precision mixed_bfloat16] [--jit-compile] [--threads 2]

``images_per_s`` is the steady rate of the timed `fit` call's steps (first step's start to
last step's end), what the PyTorch reference times too; ``call_images_per_s`` is the whole
call, whose set-up and tear-down (a tf.data iterator over NumPy inputs can take seconds to
be destroyed) a run of a few steps would count.
"""

import argparse
import json
import resource
import statistics
import sys
import time


def count(text):
    """An argparse type: a positive integer."""
    if not text.lstrip("-").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1. Received: {text}")
    return int(text)


def json_object(text):
    """An argparse type: a JSON object (of factory arguments)."""
    value = json.loads(text)  # argparse reports a ValueError as an invalid json_object
    if not isinstance(value, dict):
        raise ValueError(text)
    return value


def summary(starts, ends, batch):
    """Steady images/s (first start to last end), mean, median and slowest step."""
    steps = [e - s for s, e in zip(starts, ends)]
    span = ends[-1] - starts[0]
    return {"images_per_s": batch * len(steps) / span, "s_per_step": span / len(steps),
            "median_s_per_step": statistics.median(steps), "max_s_per_step": max(steps)}


def _backend_facts(backend):
    """The JAX device and its peak memory (None on a CPU), or TensorFlow's kernel switches."""
    if backend == "jax":
        import jax

        device = jax.local_devices()[0]
        stats = device.memory_stats()  # None on a CPU
        return {"device": device.device_kind,
                "peak_device_mb": stats["peak_bytes_in_use"] / 2**20 if stats else None}
    if backend == "tensorflow":
        from keras_preact.layers import tf_kernels

        return {"onednn": tf_kernels.onednn_enabled(), "fast_conv_grad": tf_kernels.enabled(),
                "fused_bn": tf_kernels.bn_enabled()}
    return {}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="preact_resnet110")
    p.add_argument("--batch", type=count, default=128)
    p.add_argument("--steps", type=count, default=20)
    p.add_argument("--warmup", type=count, default=3)
    p.add_argument("--precision", default="fp32",
                   choices=("fp32", "mixed_float16", "mixed_bfloat16"))
    p.add_argument("--jit-compile", action="store_true",
                   help="XLA on TensorFlow (JAX always compiles the step)")
    p.add_argument("--threads", type=count, help="TF intra-op threads (inter-op 1)")
    p.add_argument("--image-size", type=count, default=32)
    p.add_argument("--model-kwargs", type=json_object, default={},
                   help="JSON of extra factory arguments")
    p.add_argument("--unrolled", action="store_true", help="unroll the stages' stacked units "
                   "(PreActStage.remat_loop = False), the reference for the loop")
    args = p.parse_args(argv)
    import keras_preact as kp  # first: it turns on TensorFlow's oneDNN kernels (its docstring)
    # isort: split
    import keras
    import numpy as np

    from keras_preact.layers import PreActStage
    from keras_preact.training import CoupledSGD

    backend = keras.backend.backend()
    if backend == "tensorflow" and args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.precision != "fp32":
        keras.mixed_precision.set_global_policy(args.precision)
    if args.unrolled:
        PreActStage.remat_loop = False
    keras.utils.set_random_seed(0)
    t0 = time.perf_counter()
    model = kp.get_model(args.model, input_shape=(args.image_size, args.image_size, 3),
                         classifier_activation=None, **args.model_kwargs)
    build_s = time.perf_counter() - t0
    jit = args.jit_compile or backend == "jax"
    model.compile(optimizer=CoupledSGD(learning_rate=0.1, momentum=0.9, l2=1e-4), jit_compile=jit,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.RandomState(0)

    def fit(steps, callbacks=()):
        n, size = args.batch * steps, args.image_size
        x = rng.uniform(-1, 1, (n, size, size, 3)).astype("float32")
        y = rng.randint(0, 10, (n,)).astype("int32")
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0,
                  callbacks=list(callbacks))
        return time.perf_counter() - t0

    warmup_s = fit(args.warmup)
    starts, ends = [], []
    elapsed = fit(args.steps, [keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda *_, **__: starts.append(time.perf_counter()),
        on_train_batch_end=lambda *_, **__: ends.append(time.perf_counter()))])
    print(json.dumps({
        "framework": f"keras-{backend}", "model": args.model, "batch": args.batch,
        "precision": args.precision, "jit_compile": jit, "unrolled": args.unrolled,
        "threads": args.threads, "steps": args.steps, **summary(starts, ends, args.batch),
        "call_images_per_s": args.batch * args.steps / elapsed, "call_s": elapsed,
        "build_s": build_s, "warmup_s": warmup_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "macs": kp.count_macs(model), "params": kp.count_params(model),
        **_backend_facts(backend)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
