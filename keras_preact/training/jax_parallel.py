"""Data-parallel training on the JAX backend with `keras.distribution.DataParallel`.

The path for a machine with several accelerators and no TensorFlow: Keras shards
every global batch along its first axis over the devices, replicates the weights,
and XLA inserts the gradient all-reduce. Under JAX's SPMD compilation a model's
code sees the *global* batch, so BatchNorm's batch moments are computed over all
devices (synchronized BatchNorm, for free) and the moving statistics are one array:
the result equals a single-device run up to floating-point summation order. On
CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX starts)
gives N host devices to try it.

The same `Run` as `train_and_evaluate` (config, schedule, model, optimizer, reports),
with `model.fit` on NumPy batches (`keras_preact.data.load_arrays`: no tf.data).
Differences from the TensorFlow trainer, stated: the epoch order is NumPy's
permutation keyed by ``(seed, epoch)`` (not the tf.data pipeline's), there is no
augmentation, and nothing is written (no workdir, so no resume); the model is returned
(save it with ``model.save``).

Nothing here imports TensorFlow.
"""

import logging

import contextlib

from keras_preact.training.run import Run
from keras_preact.training.run import Stepper

logger = logging.getLogger("keras_preact.training")


def data_parallel(devices=None):
    """A `keras.distribution.DataParallel` over `devices`.

    Args:
        devices: None (every device of the default platform:
            ``keras.distribution.list_devices()``), an int n (the first n), or a list
            of device names such as ``["cpu:0", "cpu:1"]``.

    Returns:
        `keras.distribution.DataParallel`.

    Raises:
        ValueError: on a backend other than JAX, or for devices that do not exist.
    """
    import keras

    if keras.backend.backend() != "jax":
        raise ValueError(
            "keras.distribution.DataParallel is used here on the JAX backend. Received "
            f"backend: {keras.backend.backend()!r}. Set KERAS_BACKEND=jax (on TensorFlow "
            "use strategy='mirrored' or 'multiworker')."
        )
    available = keras.distribution.list_devices()
    if devices is None:
        chosen = available
    elif isinstance(devices, int) and not isinstance(devices, bool):
        if not 1 <= devices <= len(available):
            raise ValueError(
                f"`devices` must be in [1, {len(available)}] (the devices JAX sees: "
                f"{available}). Received: devices={devices}"
            )
        chosen = available[:devices]
    else:
        chosen = [str(d) for d in devices]
        wanted = {d.lower() for d in chosen}
        known = {d.lower() for d in available}
        if not chosen or not wanted <= known:
            raise ValueError(
                f"Unknown device(s) {sorted(wanted - known) or chosen}. Received: "
                f"devices={devices!r}. Valid: {available}"
            )
    return keras.distribution.DataParallel(devices=chosen)


class DataParallelStepper(Stepper):
    """Epochs by ``model.fit`` on NumPy arrays under `keras.distribution.DataParallel`."""

    switch_synchronized_bn = False  # JAX's SPMD step already sees the global batch

    def __init__(self, devices=None):
        self.distribution = data_parallel(devices)
        self.replicas = len(self.distribution.device_mesh.devices.reshape(-1))
        self.labels = {"num_devices": self.replicas}

    def start(self, run):
        c = run.config
        if c.precision == "mixed_float16":
            raise ValueError("precision='mixed_float16' needs loss scaling, not set up here. "
                             "Received: precision='mixed_float16'. Use 'fp32' or 'mixed_bfloat16'.")
        if c.synchronized_bn:
            logger.info("synchronized_bn: BatchNorm already sees the global batch under JAX's SPMD.")
        if c.batch_size % self.replicas:
            raise ValueError(
                f"The global batch size must divide evenly across the {self.replicas} devices. "
                f"Received: batch_size={c.batch_size}.")

    @contextlib.contextmanager
    def scope(self):
        import keras

        previous = keras.distribution.distribution()
        keras.distribution.set_distribution(self.distribution)
        try:
            yield
        finally:
            keras.distribution.set_distribution(previous)

    def load_data(self, run):
        import numpy as np

        from keras_preact import data

        c, self.arrays = run.config, {}
        for split in ("train", "test"):
            x, y = data.load_arrays(c.dataset, split, data_dir=c.data_dir, source=c.data_source,
                                    path=c.data_path, download=c.download)
            x = np.asarray(x, dtype="float32")
            if not c.model_normalizes():
                mean = np.asarray(run.info["mean"], "float32") * 255.0
                x = (x - mean) / (np.asarray(run.info["std"], "float32") * 255.0)
            self.arrays[split] = (x, np.asarray(y, dtype="int32"))
        return len(self.arrays["train"][1]), len(self.arrays["test"][1])

    def train_epochs(self, run, model, start_epoch, recorder):
        import keras
        import numpy as np

        c, (x, y) = run.config, self.arrays["train"]

        class Record(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                recorder.epoch_begin()

            def on_epoch_end(self, epoch, logs=None):
                recorder.epoch_end(self.model, epoch, logs)

        step = start_epoch * run.spe
        with self.scope():
            for epoch in range(start_epoch, run.epochs):
                steps_now = min(run.spe, run.total_steps - step)
                order = np.random.default_rng([int(c.seed), epoch]).permutation(len(y))
                order = order[: steps_now * c.batch_size]
                model.fit(x[order], y[order], batch_size=c.batch_size, epochs=epoch + 1,
                          initial_epoch=epoch, shuffle=False, verbose=c.verbose,
                          callbacks=[Record()])
                step += steps_now

    def evaluate(self, run, model):
        """Loss and accuracy over every example: the split is padded to whole global
        batches (every device gets an equal shard) and the padding is left out."""
        import numpy as np

        (x, y), batch = self.arrays["test"], run.config.batch_size
        n = len(y)
        padded = np.concatenate([x, np.zeros((-n % batch,) + x.shape[1:], x.dtype)])
        with self.scope():
            probs = np.asarray(model.predict(padded, batch_size=batch, verbose=0))[:n]
        # Keras' sparse categorical cross-entropy on probabilities clips at its epsilon.
        picked = np.clip(probs.astype("float64")[np.arange(n), y], 1e-7, 1.0 - 1e-7)
        return {"loss": float(np.mean(-np.log(picked))),
                "accuracy": float(np.mean(np.argmax(probs, axis=-1) == y))}

    def finish(self, run, model):
        return {"per_device_batch": run.config.batch_size // self.replicas}


def train_data_parallel(config, *, devices=None):
    """Trains `config`'s model with data parallelism over `devices` (JAX backend).

    Args:
        config: a `TrainConfig` (or its dict); ``strategy`` is ignored (the devices
            decide), ``augment`` is not applied and ``precision`` must be "fp32" or
            "mixed_bfloat16".
        devices: see `data_parallel`.

    Returns:
        dict: `Run.train`'s, plus ``model`` (the trained Keras model),
        ``num_devices`` and ``per_device_batch``.

    Raises:
        ValueError: for an invalid config, a backend other than JAX, unknown devices,
            or a global batch that does not divide across the devices.

    Example:
        >>> # XLA_FLAGS=--xla_force_host_platform_device_count=2 KERAS_BACKEND=jax
        >>> from keras_preact.training import TrainConfig
        >>> from keras_preact.training.jax_parallel import train_data_parallel
        >>> r = train_data_parallel(TrainConfig(model="preact_resnet20", dataset="digits",
        ...                                     batch_size=64, epochs=2), devices=2)
    """
    run = Run(config, None, DataParallelStepper(devices))
    return {**run.train(), "model": getattr(run, "model", None)}
