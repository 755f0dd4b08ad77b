"""tf.distribute strategies, precision and determinism (TensorFlow only).

Multi-worker training (``strategy="multiworker"``) lives in
`keras_preact.training.multiworker`; its BatchNorm handling follows the same rules
as below, with the moving statistics averaged across all workers.

BatchNorm under `MirroredStrategy`: each replica normalises its activations with the
mean and variance of *its own share* of the global batch (global batch / replicas),
exactly as Caffe / Torch data parallelism did in the paper (a batch of 128 "on two
GPUs, 64 each"). The gradients are summed across replicas (the loss is scaled by
1 / replicas), so the update is that of the global batch, but the forward pass --
and so the loss -- differs from a single-device run whenever the per-replica
statistics differ from the global ones. The moving averages used at inference are
kept per replica during an epoch (Keras creates them with ``aggregation="none"``, so
each replica updates its own copy from its own share); `train_and_evaluate` averages
the copies at every epoch end and before every evaluation
(`average_replica_statistics`), so evaluation, checkpoints and the saved model use
one set of statistics. With ``synchronized_bn=True``
every BatchNorm layer all-reduces its moments first
(`keras.layers.BatchNormalization(synchronized=True)`), so training computes the
single-device numbers up to floating-point summation order, at the cost of one
all-reduce per BatchNorm layer per step.
"""

import logging
import os

logger = logging.getLogger(__name__)

_STRATEGIES = {}


def _tf():
    import tensorflow as tf

    return tf


def configure_runtime(*, cpu_devices=None, intra_op_threads=None, inter_op_threads=None,
                      deterministic=False):
    """Settings that TensorFlow accepts only before it initialises its devices.

    Args:
        cpu_devices: optional int: split the first CPU into this many logical
            devices (so `MirroredStrategy` gets several replicas on a CPU-only host).
        intra_op_threads, inter_op_threads: optional thread-pool sizes.
        deterministic: bool: `tf.config.experimental.enable_op_determinism()`.

    Raises:
        ValueError: if a device or thread setting is requested after TensorFlow
            has already initialised (it cannot change then) and differs from what
            is in place.
    """
    tf = _tf()
    if cpu_devices:
        cpus = tf.config.list_physical_devices("CPU")
        wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(int(cpu_devices))]
        current = tf.config.get_logical_device_configuration(cpus[0])
        if current is None or len(current) != len(wanted):
            try:
                tf.config.set_logical_device_configuration(cpus[0], wanted)
            except RuntimeError:
                have = len(tf.config.list_logical_devices("CPU"))
                if have != int(cpu_devices):
                    raise ValueError(
                        "`cpu_devices` can only be set before TensorFlow initialises "
                        f"its devices (it has {have} logical CPU device(s) now). "
                        f"Received: cpu_devices={cpu_devices}. Run in a fresh process."
                    ) from None
    for name, value, getter, setter in (
        (
            "intra_op_threads",
            intra_op_threads,
            tf.config.threading.get_intra_op_parallelism_threads,
            tf.config.threading.set_intra_op_parallelism_threads,
        ),
        (
            "inter_op_threads",
            inter_op_threads,
            tf.config.threading.get_inter_op_parallelism_threads,
            tf.config.threading.set_inter_op_parallelism_threads,
        ),
    ):
        if value and getter() != value:
            try:
                setter(int(value))
            except RuntimeError:
                logger.warning(
                    "%s=%s ignored: TensorFlow is already initialised with %s.",
                    name, value, getter(),
                )
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def make_strategy(name):
    """The `tf.distribute.Strategy` for `name`.

    Args:
        name: "default" (TensorFlow's default strategy: one device), "mirrored"
            (`MirroredStrategy` over every visible GPU, or the logical CPUs when
            there is no GPU), "tpu" (`TPUStrategy` on an attached TPU) or
            "multiworker" (`MultiWorkerMirroredStrategy` over the workers of the
            ``TF_CONFIG`` environment variable; train with
            `keras_preact.training.multiworker`, since ``model.fit`` fails under
            it in Keras 3).

    Returns:
        A `tf.distribute.Strategy`.

    Raises:
        ValueError: for an unknown name, or "tpu" where no TPU is found.
    """
    tf = _tf()
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = None
        if not tf.config.list_logical_devices("GPU"):
            # MirroredStrategy() without GPUs takes only CPU:0; use every logical
            # CPU device so `cpu_devices` gives real replicas.
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        key = ("mirrored", tuple(devices or ()))
        if key not in _STRATEGIES:
            # One instance per device set and process: a second MirroredStrategy
            # over the same devices restarts the collective instance keys, and its
            # first all-reduce then collides with the first strategy's cached
            # collective of another shape ("Shape mismatch in the collective
            # instance 100"), e.g. two runs in one process, one with synchronized BN.
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(devices=devices)
        return _STRATEGIES[key]
    if name == "multiworker":
        # Every worker of TF_CONFIG; bounded waits (see keras_preact.training.multiworker).
        from keras_preact.training.multiworker import make_multiworker_strategy
        from keras_preact.training.multiworker import parse_tf_config

        return make_multiworker_strategy(parse_tf_config())
    if name == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as err:
            raise ValueError(
                "strategy='tpu' was requested but no TPU was found on this machine "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
                "Use strategy='default' or 'mirrored'."
            ) from None
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(
        f"Unknown strategy. Received: strategy={name!r}. "
        "Valid: ['default', 'mirrored', 'tpu', 'multiworker']"
    )


def check_global_batch(batch_size, num_replicas):
    """The per-replica batch; the global batch must divide evenly.

    Raises:
        ValueError: if `batch_size` is not a multiple of `num_replicas`.
    """
    if batch_size % num_replicas:
        lower = batch_size - batch_size % num_replicas
        raise ValueError(
            f"The global batch size must divide evenly across the {num_replicas} "
            f"replicas. Received: batch_size={batch_size}. Use a multiple of "
            f"{num_replicas}, e.g. {max(lower, num_replicas)} or {lower + num_replicas}."
        )
    return batch_size // num_replicas


def precision_dtype(precision):
    """The model `dtype` policy name for a ``--precision`` value (None for fp32)."""
    mapping = {"fp32": None, "mixed_float16": "mixed_float16", "mixed_bfloat16": "mixed_bfloat16"}
    if precision not in mapping:
        raise ValueError(
            f"Unknown precision. Received: precision={precision!r}. Valid: {list(mapping)}"
        )
    return mapping[precision]


def batch_norm_layers(model):
    """The layers of `model` that compute BatchNorm statistics, nested ones included.

    `keras.layers.BatchNormalization` layers, and layers of this package that carry
    their BatchNorm arithmetic themselves and expose a ``synchronized`` flag.
    """
    import keras

    return [
        layer
        for layer in model._flatten_layers(include_self=False, recursive=True)
        if isinstance(layer, keras.layers.BatchNormalization)
        or isinstance(getattr(layer, "synchronized", None), bool)
    ]


def set_synchronized_batch_norm(model, synchronized=True):
    """Switches every BatchNorm of a built `model` to (un)synchronized moments.

    `keras.layers.BatchNormalization` (and the package's units) read
    ``self.synchronized`` when called, so setting it on the built layers before the
    first training step (before `fit` traces the step function) has the same effect
    as constructing them with ``synchronized=True``. It is a training-time setting:
    inference never uses batch statistics.

    Args:
        model: a built Keras model.
        synchronized: bool, default True.

    Returns:
        int: the number of layers changed.

    Raises:
        ValueError: on a backend other than TensorFlow (Keras supports
            synchronized BatchNorm on TensorFlow only).
    """
    import keras

    if synchronized and keras.backend.backend() != "tensorflow":
        raise ValueError(
            "synchronized_bn=True needs the TensorFlow backend. Received backend: "
            f"{keras.backend.backend()!r}"
        )
    layers = batch_norm_layers(model)
    for layer in layers:
        layer.synchronized = bool(synchronized)
    return len(layers)


def average_replica_statistics(model):
    """Sets every replica's copy of each non-trainable variable to their mean.

    Keras creates BatchNorm's moving mean and variance with ``aggregation="none"``:
    under `MirroredStrategy` each replica updates its own copy from its own share of
    the batch, and the copies drift apart (reading the variable, saving a checkpoint
    or the model gives the first replica's). Averaging them at the end of every
    epoch and before every evaluation makes evaluation, checkpoints and the saved
    model use one set of statistics, estimated from all replicas' data -- and makes
    a resumed run, which loads one copy into every replica, continue exactly like
    an uninterrupted one. Trainable weights are untouched (they are mirrored).

    Args:
        model: a Keras model built under a strategy.

    Returns:
        int: the number of variables that had several differing copies.
    """
    import numpy as np

    changed = 0
    for variable in model.non_trainable_variables:
        value = getattr(variable, "value", variable)
        copies = getattr(value, "values", None)
        if not copies or len(copies) < 2:
            continue
        arrays = [np.asarray(c.numpy()) for c in copies]
        if all(np.array_equal(arrays[0], a) for a in arrays[1:]):
            continue
        mean = np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)
        for copy in copies:
            copy.assign(mean)
        changed += 1
    return changed


def seed_everything(seed):
    """`keras.utils.set_random_seed` (Python, NumPy, TensorFlow and Keras' seeds)."""
    import keras

    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    keras.utils.set_random_seed(int(seed))
