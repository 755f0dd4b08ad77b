"""One benchmark case: training throughput and peak memory of a keras-preact model.

Runs in its own process (the harness starts one per case, so peak resident memory is
this case's alone). Works on the TensorFlow, JAX and PyTorch backends (set
KERAS_BACKEND); uses only NumPy data, so a machine without TensorFlow can run it.

    KERAS_BACKEND=tensorflow python benchmarks/keras_step.py --model preact_resnet110 \
        --batch 128 --steps 20 [--precision mixed_bfloat16] [--jit-compile] [--threads 2]

prints one JSON line: images/s, seconds per step, peak resident memory (and on JAX the
device's peak memory where it reports one, as GPUs do), MACs.

``images_per_s`` is the steady rate of the timed `fit` call's training steps: from the
first step's start to the last step's end, as a callback sees them (data fetch from the
iterator included; it runs inside Keras' train function). That is what the PyTorch
reference times too (its loop of steps). ``call_images_per_s`` is the whole call, which
adds `fit`'s fixed setup and teardown: with NumPy inputs, Keras' array adapter builds a
tf.data pipeline whose iterator can take seconds to be destroyed after the last step
(seen here: 0 s in some runs, up to ~7 s in others, whatever the step time), which a run of
a few steps would otherwise count as training time.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def json_object(text, what):
    """Parses `text` as a JSON object of factory arguments; ValueError naming `what`."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} must be a JSON object. Received: {text!r} ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object. Received: {text!r}")
    return value


def step_timer(keras):
    """A callback that records each training step's start and end (perf_counter)."""

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.starts, self.ends = [], []

        def on_train_batch_begin(self, batch, logs=None):
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, batch, logs=None):
            self.ends.append(time.perf_counter())

        def summary(self, batch):
            """Steady images/s (first start to last end), median and slowest step."""
            if not self.ends:
                raise RuntimeError("fit ran no training step")
            steps = [e - s for s, e in zip(self.starts, self.ends)]
            span = self.ends[-1] - self.starts[0]
            return {"images_per_s": batch * len(steps) / span, "s_per_step": span / len(steps),
                    "median_s_per_step": statistics.median(steps), "max_s_per_step": max(steps)}

    return StepTimer()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="preact_resnet110")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--precision", default="fp32", choices=("fp32", "mixed_float16", "mixed_bfloat16"))
    p.add_argument("--jit-compile", action="store_true",
                   help="XLA on TensorFlow (JAX always compiles the step)")
    p.add_argument("--threads", type=int, default=None, help="TF intra-op threads (inter-op 1)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--model-kwargs", default="{}", help="JSON of extra factory arguments")
    p.add_argument("--unrolled", action="store_true",
                   help="unroll the stacked units of every stage in training (no backend "
                        "loop: PreActStage.remat_loop = False), the reference for the loop")
    args = p.parse_args(argv)
    for name in ("batch", "steps", "warmup", "image_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1. Received: {getattr(args, name)}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1. Received: {args.threads}")
    try:
        model_kwargs = json_object(args.model_kwargs, "--model-kwargs")
    except ValueError as e:
        p.error(str(e))

    import keras_preact as kp  # first: it turns on TensorFlow's oneDNN kernels (its docstring)
    import keras

    backend = keras.backend.backend()
    if backend == "tensorflow" and args.threads:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if args.precision != "fp32":
        keras.mixed_precision.set_global_policy(args.precision)
    import numpy as np

    from keras_preact.training import CoupledSGD

    if args.unrolled:
        from keras_preact.layers import PreActStage

        PreActStage.remat_loop = False
    keras.utils.set_random_seed(0)
    t0 = time.perf_counter()
    model = kp.get_model(args.model, input_shape=(args.image_size, args.image_size, 3),
                         classifier_activation=None, **model_kwargs)
    build_s = time.perf_counter() - t0
    model.compile(
        optimizer=CoupledSGD(learning_rate=0.1, momentum=0.9, l2=1e-4),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=bool(args.jit_compile) or backend == "jax",
    )
    rng = np.random.RandomState(0)

    def data(steps):
        n = args.batch * steps
        x = rng.uniform(-1, 1, (n, args.image_size, args.image_size, 3)).astype("float32")
        y = rng.randint(0, 10, (n,)).astype("int32")
        return x, y

    x, y = data(args.warmup)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
    warmup_s = time.perf_counter() - t0
    x, y = data(args.steps)
    timer = step_timer(keras)
    t0 = time.perf_counter()
    model.fit(x, y, batch_size=args.batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    elapsed = time.perf_counter() - t0
    steady = timer.summary(args.batch)
    kernels = {}
    if backend == "jax":
        import jax

        device = jax.local_devices()[0]
        stats = device.memory_stats() or {}  # None on a CPU
        kernels = {"device": device.device_kind,
                   "peak_device_mb": stats["peak_bytes_in_use"] / 2**20 if stats else None}
    if backend == "tensorflow":
        from keras_preact.layers import tf_kernels

        kernels = {"onednn": tf_kernels.onednn_enabled(),
                   "fast_conv_grad": tf_kernels.enabled(), "fused_bn": tf_kernels.bn_enabled()}
    print(json.dumps({
        "framework": f"keras-{backend}",
        "model": args.model,
        "batch": args.batch,
        "precision": args.precision,
        "jit_compile": bool(args.jit_compile) or backend == "jax",
        "unrolled": bool(args.unrolled),
        "threads": args.threads,
        "steps": args.steps,
        **steady,
        "call_images_per_s": args.batch * args.steps / elapsed,
        "call_s": elapsed,
        "build_s": build_s,
        "warmup_s": warmup_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "macs": kp.count_macs(model),
        "params": kp.count_params(model),
        "pid": os.getpid(),
        **kernels,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
