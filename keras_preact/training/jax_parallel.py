"""Data-parallel training on the JAX backend with `keras.distribution.DataParallel`.

The path for a machine with several accelerators and no TensorFlow: Keras shards
every global batch along its first axis over the devices, replicates the weights,
and XLA inserts the gradient all-reduce. Under JAX's SPMD compilation a model's
code sees the *global* batch, so BatchNorm's batch moments are computed over all
devices (synchronized BatchNorm, for free) and the moving statistics are one array:
the result equals a single-device run up to floating-point summation order. On
CPU, ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (set before JAX starts)
gives N host devices to try it.

Same recipe as `train_and_evaluate`: `TrainConfig`, `build_model`, the recipe's
`CoupledSGD` with its `WarmupPiecewiseConstant` schedule, and `model.fit` on NumPy
batches (`keras_preact.data.load_arrays`: no tf.data). Differences from the
TensorFlow trainer, stated: the epoch order is NumPy's permutation keyed by
``(seed, epoch)`` (not the tf.data pipeline's) and there is no augmentation, no
workdir and no resume; the model is returned (save it with ``model.save``).

Nothing here imports TensorFlow.
"""

import logging

from keras_preact.training.config import TrainConfig
from keras_preact.training.run import build_model
from keras_preact.training.run import dataset_info

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


def train_data_parallel(config, *, devices=None):
    """Trains `config`'s model with data parallelism over `devices` (JAX backend).

    Args:
        config: a `TrainConfig` (or its dict); ``strategy`` is ignored (the devices
            decide), ``augment`` is not applied and ``precision`` must be "fp32" or
            "mixed_bfloat16".
        devices: see `data_parallel`.

    Returns:
        dict: ``model`` (the trained Keras model), ``history`` (per-epoch ``loss``,
        ``accuracy``, ``step``), ``test_loss``, ``test_accuracy``, ``steps``,
        ``num_devices``, ``per_device_batch``.

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
    import keras
    import numpy as np

    from keras_preact import data
    from keras_preact.training.optimizers import make_optimizer

    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if not isinstance(config, TrainConfig):
        raise ValueError(f"`config` must be a TrainConfig or its dict. Received: {type(config).__name__}")
    config.validate()
    if config.precision == "mixed_float16":
        raise ValueError(
            "precision='mixed_float16' needs loss scaling, not set up here. Received: "
            "precision='mixed_float16'. Use 'fp32' or 'mixed_bfloat16'."
        )
    if config.synchronized_bn:
        logger.info("synchronized_bn: BatchNorm already sees the global batch under JAX's SPMD.")
    distribution = data_parallel(devices)
    num_devices = len(distribution.device_mesh.devices.reshape(-1))
    if config.batch_size % num_devices:
        raise ValueError(
            f"The global batch size must divide evenly across the {num_devices} devices. "
            f"Received: batch_size={config.batch_size}."
        )
    info = dataset_info(config.dataset, config.data_path)
    arrays = {}
    for split in ("train", "test"):
        x, y = data.load_arrays(config.dataset, split, data_dir=config.data_dir,
                                source=config.data_source, path=config.data_path,
                                download=config.download)
        x = np.asarray(x, dtype="float32")
        if not config.model_normalizes():
            mean = np.asarray(info["mean"], "float32") * 255.0
            std = np.asarray(info["std"], "float32") * 255.0
            x = (x - mean) / std
        arrays[split] = (x, np.asarray(y, dtype="int32"))
    num_train = len(arrays["train"][1])
    spe = num_train // config.batch_size
    if spe < 1:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {config.dataset!r} "
            f"training split ({num_train} images)."
        )
    sched = config.resolve_schedule(spe)

    previous = keras.distribution.distribution()
    keras.distribution.set_distribution(distribution)
    try:
        keras.utils.set_random_seed(int(config.seed))
        model = build_model(config, info)
        model.compile(
            optimizer=make_optimizer(config, spe),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        history, step = [], 0
        x_train, y_train = arrays["train"]
        for epoch in range(sched["epochs"]):
            steps_now = min(spe, sched["total_steps"] - step)
            order = np.random.default_rng([int(config.seed), epoch]).permutation(num_train)
            order = order[: steps_now * config.batch_size]
            logs = model.fit(
                x_train[order], y_train[order], batch_size=config.batch_size, epochs=epoch + 1,
                initial_epoch=epoch, shuffle=False, verbose=config.verbose,
            ).history
            step += steps_now
            history.append({"epoch": epoch + 1, "step": step,
                            "loss": float(logs["loss"][-1]),
                            "accuracy": float(logs["accuracy"][-1])})
            if step >= sched["total_steps"]:
                break
        results = _evaluate(model, *arrays["test"], batch_size=config.batch_size)
    finally:
        keras.distribution.set_distribution(previous)
    return {
        "model": model,
        "history": history,
        "test_loss": results["loss"],
        "test_accuracy": results["accuracy"],
        "steps": step,
        "num_devices": num_devices,
        "per_device_batch": config.batch_size // num_devices,
    }


def _evaluate(model, x, y, *, batch_size):
    """Loss and accuracy over every example: the split is padded to whole global
    batches (every device gets an equal shard) and the padding is left out."""
    import numpy as np

    n = len(y)
    padded = -(-n // batch_size) * batch_size
    x_in = np.concatenate([x, np.zeros((padded - n,) + x.shape[1:], x.dtype)])
    probs = np.asarray(model.predict(x_in, batch_size=batch_size, verbose=0))[:n]
    probs = probs.astype("float64")
    # Keras' sparse categorical cross-entropy on probabilities clips at its epsilon.
    eps = 1e-7
    picked = np.clip(probs[np.arange(n), y], eps, 1.0 - eps)
    return {
        "loss": float(np.mean(-np.log(picked))),
        "accuracy": float(np.mean(np.argmax(probs, axis=-1) == y)),
    }
