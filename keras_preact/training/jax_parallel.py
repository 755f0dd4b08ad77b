"""Data-parallel training on the JAX backend with `keras.distribution.DataParallel`: the
model sees the global batch, so a run equals a single-device one up to summation order."""

import logging

import keras
import numpy as np

from keras_preact import data
from keras_preact.training.distribute import check_global_batch
from keras_preact.training.run import Run, Stepper

logger = logging.getLogger("keras_preact.training")


class DataParallelStepper(Stepper):
    """Epochs by ``model.fit`` on NumPy arrays under `keras.distribution.DataParallel`."""

    def __init__(self, devices=None):
        if keras.backend.backend() != "jax":
            raise ValueError("keras.distribution.DataParallel is used here on the JAX backend. "
                             f"Received backend: {keras.backend.backend()!r}. Set KERAS_BACKEND="
                             "jax (on TensorFlow use strategy='mirrored' or 'multiworker').")
        available = keras.distribution.list_devices()
        devices = available if devices is None else devices
        if isinstance(devices, int) and not isinstance(devices, bool):
            if not 1 <= devices <= len(available):
                raise ValueError(f"`devices` must be in [1, {len(available)}] (the devices JAX "
                                 f"sees: {available}). Received: devices={devices}")
            devices = available[:devices]
        else:
            chosen = [str(d) for d in devices]
            wanted, known = {d.lower() for d in chosen}, {d.lower() for d in available}
            if not chosen or not wanted <= known:
                raise ValueError(f"Unknown device(s) {sorted(wanted - known) or chosen}. "
                                 f"Received: devices={devices!r}. Valid: {available}")
            devices = chosen
        self.strategy = keras.distribution.DataParallel(devices=devices)  # scope(): variables
        self.replicas = len(devices)
        self.labels = {"num_devices": self.replicas}

    def start(self, run):
        c = run.config
        if c.precision == "mixed_float16":
            raise ValueError("precision='mixed_float16' needs loss scaling, not set up here. "
                             "Received: precision='mixed_float16'. Use 'fp32' or 'mixed_bfloat16'.")
        if c.ema_momentum is not None:  # `fit` would put the average in the model every epoch
            raise ValueError("The moving average of the weights is not kept here. Received: "
                             f"ema_momentum={c.ema_momentum!r}. Leave it None.")
        if c.synchronized_bn:
            logger.info("synchronized_bn: JAX's SPMD BatchNorm already sees the global batch.")
        check_global_batch(c.batch_size, self.replicas, "devices")

    def load_data(self, run):
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

    def train_epochs(self, run, model, start_epoch):
        c, (x, y) = run.config, self.arrays["train"]
        step = start_epoch * run.spe
        with self.strategy.scope():
            for epoch in range(start_epoch, run.epochs):
                steps_now = min(run.spe, run.total_steps - step)
                order = np.random.default_rng([int(c.seed), epoch]).permutation(len(y))
                order = order[: steps_now * c.batch_size]
                run.epoch_begin()
                history = model.fit(x[order], y[order], batch_size=c.batch_size, epochs=epoch + 1,
                                    initial_epoch=epoch, shuffle=False, verbose=c.verbose)
                run.epoch_end(model, epoch, {k: v[-1] for k, v in history.history.items()})
                step += steps_now

    def evaluate(self, run, model):
        """Over every example: padded to whole global batches (equal shards), padding left out."""
        (x, y), batch = self.arrays["test"], run.config.batch_size
        n = len(y)
        padded = np.concatenate([x, np.zeros((-n % batch,) + x.shape[1:], x.dtype)])
        with self.strategy.scope():
            probs = np.asarray(model.predict(padded, batch_size=batch, verbose=0))[:n]
        # Keras' sparse categorical cross-entropy on probabilities clips at its epsilon.
        picked = np.clip(probs.astype("float64")[np.arange(n), y], 1e-7, 1.0 - 1e-7)
        return {"loss": float(np.mean(-np.log(picked))),
                "accuracy": float(np.mean(np.argmax(probs, axis=-1) == y))}

    def finish(self, run, model):
        return {"per_device_batch": run.config.batch_size // self.replicas}


def train_data_parallel(config, *, devices=None):
    """Trains `config`'s model with data parallelism over `devices` (JAX backend); returns
    `Run.train`'s dict plus ``model`` (the trained Keras model, to save yourself),
    ``num_devices`` and ``per_device_batch``.

    Args:
        config: a `TrainConfig` (or its dict); ``strategy`` is ignored, ``augment`` and
            ``cutout`` are not applied, ``ema_momentum`` must be None and ``precision``
            "fp32" or "mixed_bfloat16".
        devices: None (every device of ``keras.distribution.list_devices()``; on CPU,
            ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` makes N), an int n
            (the first n), or a list of device names such as ``["cpu:0", "cpu:1"]``.

    Raises ValueError for an invalid config, a backend other than JAX, unknown devices or a
    global batch the devices cannot split."""
    run = Run(config, None, DataParallelStepper(devices))
    return {**run.train(), "model": getattr(run, "model", None)}
