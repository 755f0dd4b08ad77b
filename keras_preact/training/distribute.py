"""Strategies (tf.distribute on TensorFlow, DataParallel on JAX) and runtime settings, and
the collectives that keep replicas' variables one. Under a mirrored strategy each replica's
BatchNorm normalises its share of the batch (as the paper's two GPUs did) unless
``synchronized_bn=True`` all-reduces the moments."""

import contextlib
import logging

import keras

from keras_preact import private_api
from keras_preact.checks import check_choice, shorten
from keras_preact.training.config import STRATEGIES

logger = logging.getLogger(__name__)

_STRATEGIES = {}
_REDUCE_FNS = {}


def configure_runtime(*, cpu_devices=None, intra_op_threads=None, inter_op_threads=None,
                      deterministic=False):
    """Applies settings that TensorFlow accepts only before it initialises its devices.

    Args:
        cpu_devices: split the first CPU into that many logical devices (replicas); ValueError
            if TensorFlow already initialised another number.
        intra_op_threads, inter_op_threads: thread pool sizes (too late: a warning).
        deterministic: enable TensorFlow's op determinism (the input pipeline's, on every
            backend; PyTorch's too on its backend)."""
    import tensorflow as tf
    if keras.backend.backend() == "torch":
        import torch
        torch.use_deterministic_algorithms(bool(deterministic))
        for kind, value in (("", intra_op_threads), ("interop_", inter_op_threads)):
            try:
                if value:
                    getattr(torch, f"set_num_{kind}threads")(int(value))
            except RuntimeError:  # inter-op: only before PyTorch's first parallel work
                logger.warning("PyTorch's %sthreads=%s ignored: set too late.", kind, value)
    if cpu_devices:
        try:
            tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0], [
                tf.config.LogicalDeviceConfiguration() for _ in range(int(cpu_devices))])
        except RuntimeError:  # TensorFlow is initialised: fine if it has those devices
            if (have := len(tf.config.list_logical_devices("CPU"))) != int(cpu_devices):
                raise ValueError("`cpu_devices` can only be set before TensorFlow initialises its "
                                 f"devices (it has {have} logical CPU device(s) now). Received: "
                                 f"cpu_devices={cpu_devices}. Run in a fresh process.") from None
    for kind, value in (("intra", intra_op_threads), ("inter", inter_op_threads)):
        getter = getattr(tf.config.threading, f"get_{kind}_op_parallelism_threads")
        if value and getter() != value:
            try:
                getattr(tf.config.threading, f"set_{kind}_op_parallelism_threads")(int(value))
            except RuntimeError:
                logger.warning("%s_op_threads=%s ignored: TensorFlow is already initialised "
                               "with %s.", kind, value, getter())
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def accelerated():
    """Whether the backend computes on a GPU or TPU (else on the CPU)."""
    if keras.backend.backend() == "torch":  # Keras lists no PyTorch devices
        import torch
        return torch.cuda.is_available()
    return any(not d.lower().startswith("cpu") for d in keras.distribution.list_devices())


class OneDevice:
    """The strategy of a run on one device of the JAX or PyTorch backend."""

    num_replicas_in_sync = 1
    scope = staticmethod(contextlib.nullcontext)


def make_strategy(name):
    """The strategy for `name`: on TensorFlow the `tf.distribute.Strategy` "default" (one
    device), "mirrored" (every visible GPU, else every logical CPU) or "tpu"; on JAX
    "data_parallel", a `keras.distribution.DataParallel` over every device JAX sees (with
    ``num_replicas_in_sync``); else `OneDevice`. ValueError for "multiworker" (it trains with
    its own loop: `train_multiworker`) or "tpu" without a TPU."""
    check_choice("strategy", name, STRATEGIES)
    if name == "data_parallel":
        strategy = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
        strategy.num_replicas_in_sync = int(strategy.device_mesh.devices.size)
        return strategy
    if keras.backend.backend() != "tensorflow":
        return OneDevice()
    import tensorflow as tf
    if name == "multiworker":
        raise ValueError("strategy='multiworker' trains with its own loop (`model.fit` fails "
                         "under MultiWorkerMirroredStrategy): use `train_and_evaluate`. "
                         "Received: strategy='multiworker'")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        # Without a GPU, every logical CPU (MirroredStrategy() would take CPU:0 only).
        devices = None if tf.config.list_logical_devices("GPU") else [
            d.name for d in tf.config.list_logical_devices("CPU")]
        if (key := tuple(devices or ())) not in _STRATEGIES:
            # One per device set: a second MirroredStrategy restarts the collective keys and
            # collides with the first's cached ones ("Shape mismatch in the collective ...").
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(devices=devices)
        return _STRATEGIES[key]
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise ValueError("strategy='tpu' was requested but no TPU was found on this machine "
                         f"({type(err).__name__}: {shorten(err, 200)}). Use strategy='default' "
                         "or 'mirrored'.") from None
    return tf.distribute.TPUStrategy(resolver)


def check_global_batch(batch_size, num_replicas, unit="replicas"):
    """The per-replica batch; ValueError unless `batch_size` divides evenly."""
    if batch_size % num_replicas:
        lower = batch_size - batch_size % num_replicas
        raise ValueError(
            f"The global batch size must divide evenly across the {num_replicas} {unit}. "
            f"Received: batch_size={batch_size}. Use a multiple of {num_replicas}, "
            f"e.g. {max(lower, num_replicas)} or {lower + num_replicas}.")
    return batch_size // num_replicas


def batch_norm_layers(model):
    """The layers of `model`, nested ones included, that compute BatchNorm statistics."""
    return [layer for layer in private_api.flatten_layers(model)
            if isinstance(layer, keras.layers.BatchNormalization)
            or isinstance(getattr(layer, "synchronized", None), bool)]


def set_synchronized_batch_norm(model, synchronized=True):
    """Switches every BatchNorm of a built `model`, before its first training step, to
    (un)synchronized moments; returns how many. ValueError on another backend than TensorFlow."""
    if synchronized and keras.backend.backend() != "tensorflow":
        raise ValueError("synchronized_bn=True needs the TensorFlow backend. Received backend: "
                         f"{keras.backend.backend()!r}")
    layers = batch_norm_layers(model)
    for layer in layers:
        layer.synchronized = bool(synchronized)
    return len(layers)


def on_every_replica(strategy, fn):
    """A `tf.function` running `fn` on every replica; it returns the first local result."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def run():
        results = strategy.run(fn)
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)

    return run


def reduce_variables(strategy, variables, *, mean):
    """Sets `variables` on every replica of every worker to their mean over all replicas
    (`mean=True`) or to replica 0's values (bit for bit: the others add zeros)."""
    import tensorflow as tf

    groups = {}
    for variable in variables:  # one all-reduce per dtype (they pack their inputs)
        groups.setdefault(str(variable.dtype), []).append(variable)
    for group in groups.values():
        key = (id(strategy), mean, tuple(map(id, group)))
        if key not in _REDUCE_FNS:  # kept: a new tf.function per epoch would retrace

            def fn(group=group):
                ctx = tf.distribute.get_replica_context()
                # tf.identity: an all-reduce of a variable's own read finds no destination.
                values = [tf.identity(tf.convert_to_tensor(v)) for v in group]
                if not mean:
                    source = tf.equal(ctx.replica_id_in_sync_group, 0)
                    values = [tf.where(source, v, tf.zeros_like(v)) for v in values]
                total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)
                return [t / ctx.num_replicas_in_sync for t in total] if mean else total

            _REDUCE_FNS[key] = on_every_replica(strategy, fn)
        for variable, value in zip(group, _REDUCE_FNS[key]()):
            variable.assign(value)


def average_replica_statistics(strategy, model):
    """Sets every replica's copy (on every worker) of each float non-trainable variable,
    BatchNorm's moving statistics, to their mean; returns how many variables there are."""
    if keras.backend.backend() != "tensorflow" or strategy.num_replicas_in_sync < 2:
        return 0
    floats = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    reduce_variables(strategy, floats, mean=True)
    return len(floats)
