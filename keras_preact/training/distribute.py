"""tf.distribute strategies, precision and determinism (TensorFlow only).

Multi-worker training (``strategy="multiworker"``) runs its own loop in
`keras_preact.training.multiworker`; its cluster (``TF_CONFIG``: `parse_tf_config`)
and strategy (`make_multiworker_strategy`, with bounded waits) are defined here. Its
BatchNorm follows the rules below, with the moving statistics averaged across workers.

BatchNorm under `MirroredStrategy`: each replica normalises with the moments of *its
own share* of the global batch, as Caffe / Torch data parallelism did in the paper (a
batch of 128 "on two GPUs, 64 each"). Gradients are summed across replicas, so the
update is the global batch's, but the forward pass (and the loss) differs from a
single-device run. Keras creates the moving averages with ``aggregation="none"``, so
each replica updates its own copy; `train_and_evaluate` averages the copies at every
epoch end and before every evaluation (`average_replica_statistics`). With
``synchronized_bn=True`` every BatchNorm all-reduces its moments first, which gives the
single-device numbers up to summation order, at one all-reduce per layer per step.
"""

import dataclasses
import json
import logging
import math
import os
import socket
import time

from keras_preact import private_api

logger = logging.getLogger(__name__)

TF_CONFIG_ENV = "TF_CONFIG"
CONNECT_TIMEOUT_ENV = "KERAS_PREACT_CONNECT_TIMEOUT_S"
COLLECTIVE_TIMEOUT_ENV = "KERAS_PREACT_COLLECTIVE_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 300.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
#: How long the coordination service waits for a worker's heartbeat before it
#: declares the worker dead and aborts the collectives of the others.
HEARTBEAT_TIMEOUT_S = 15.0

_JOBS = ("chief", "worker")
_STRATEGIES = {}
_STRATEGY = {}


def configure_runtime(*, cpu_devices=None, intra_op_threads=None, inter_op_threads=None,
                      deterministic=False):
    """Settings that TensorFlow accepts only before it initialises its devices.

    `cpu_devices` splits the first CPU into that many logical devices (so
    `MirroredStrategy` gets several replicas on a CPU-only host); `deterministic`
    enables `tf.config.experimental.enable_op_determinism()`. A thread setting that
    comes too late is logged and ignored.

    Raises:
        ValueError: if `cpu_devices` differs from what TensorFlow already initialised.
    """
    import tensorflow as tf

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
    threading = tf.config.threading
    for kind, value in (("intra", intra_op_threads), ("inter", inter_op_threads)):
        getter = getattr(threading, f"get_{kind}_op_parallelism_threads")
        if value and getter() != value:
            try:
                getattr(threading, f"set_{kind}_op_parallelism_threads")(int(value))
            except RuntimeError:
                logger.warning("%s_op_threads=%s ignored: TensorFlow is already initialised with %s.",
                               kind, value, getter())
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def make_strategy(name):
    """The `tf.distribute.Strategy` for `name`.

    "default" (one device), "mirrored" (`MirroredStrategy` over every visible GPU,
    else the logical CPUs), "tpu" (`TPUStrategy` on an attached TPU) or "multiworker"
    (`MultiWorkerMirroredStrategy` over the workers of ``TF_CONFIG``; train with
    `keras_preact.training.multiworker`, since ``model.fit`` fails under it in Keras 3).

    Raises:
        ValueError: for an unknown name, or "tpu" where no TPU is found.
    """
    import tensorflow as tf

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
    """The per-replica batch; ValueError unless `batch_size` divides evenly."""
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
    """The layers of `model` that compute BatchNorm statistics, nested ones included:
    `keras.layers.BatchNormalization` and the package's units with a ``synchronized`` flag."""
    import keras

    return [
        layer
        for layer in private_api.flatten_layers(model)
        if isinstance(layer, keras.layers.BatchNormalization)
        or isinstance(getattr(layer, "synchronized", None), bool)
    ]


def set_synchronized_batch_norm(model, synchronized=True):
    """Switches every BatchNorm of a built `model` to (un)synchronized moments.

    The layers read ``self.synchronized`` when called, so setting it before the first
    training step traces has the effect of constructing them with ``synchronized=True``.

    Returns:
        int: the number of layers changed.

    Raises:
        ValueError: on a backend other than TensorFlow (Keras supports synchronized
            BatchNorm on TensorFlow only).
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

    Under `MirroredStrategy` each replica updates its own copy of BatchNorm's moving
    statistics (``aggregation="none"``), and reading, saving or checkpointing gives the
    first replica's. Averaging them makes evaluation, checkpoints and the saved model
    use one set estimated from all replicas' data, and makes a resumed run (which
    loads one copy into every replica) continue exactly like an uninterrupted one.

    Returns:
        int: the number of variables that had several differing copies.
    """
    import numpy as np

    changed = 0
    for variable in model.non_trainable_variables:
        copies = getattr(getattr(variable, "value", variable), "values", None)
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


# -- multi-worker: the cluster of TF_CONFIG and its strategy -------------------------

@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated ``TF_CONFIG``: `tasks` are ``(job, index, "host:port")`` in rank
    order (the chief job first); `rank` is this process's position in them (0: the
    chief); `raw` is the parsed dict."""

    tasks: tuple
    task_type: str
    task_index: int
    rank: int
    raw: dict

    @property
    def num_workers(self):
        return len(self.tasks)

    @property
    def is_chief(self):
        return self.rank == 0

    @property
    def address(self):
        return self.tasks[self.rank][2]

    @property
    def leader(self):
        """The coordination service leader: TensorFlow's rule, the chief job if any."""
        job, index, _ = self.tasks[0]
        return f"/job:{job}/replica:0/task:{index}"

    def job_counts(self):
        counts = {}
        for job, _, _ in self.tasks:
            counts[job] = counts.get(job, 0) + 1
        return counts


def parse_tf_config(text=None):
    """Parses and validates a ``TF_CONFIG`` (default: the environment variable) into
    a `ClusterInfo`.

    Raises:
        ValueError: naming what is wrong, with the value received.

    Example:
        >>> info = parse_tf_config('{"cluster": {"worker": ["10.0.0.1:2222", '
        ...                        '"10.0.0.2:2222"]}, "task": {"type": "worker", "index": 1}}')
        >>> info.rank, info.num_workers, info.is_chief
        (1, 2, False)
    """
    if text is None:
        text = os.environ.get(TF_CONFIG_ENV)
    if text is None or not str(text).strip():
        raise ValueError(
            f"strategy='multiworker' needs the {TF_CONFIG_ENV} environment variable, e.g. "
            '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
            '"task": {"type": "worker", "index": 0}} on the first host. '
            f"Received: {TF_CONFIG_ENV}={text!r}"
        )
    shown = shorten(str(text))
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{TF_CONFIG_ENV} is not valid JSON ({err}). Received: {TF_CONFIG_ENV}={shown}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("cluster"), dict) or not isinstance(raw.get("task"), dict):
        raise ValueError(
            f'{TF_CONFIG_ENV} must be a JSON object with a "cluster" object and a "task" '
            f"object. Received: {TF_CONFIG_ENV}={shown}"
        )
    cluster, task = raw["cluster"], raw["task"]
    unknown = sorted(set(cluster) - set(_JOBS))
    if unknown:
        raise ValueError(
            f"{TF_CONFIG_ENV}: jobs {unknown} are not supported by "
            f"MultiWorkerMirroredStrategy (no parameter servers or evaluators). Valid jobs: "
            f"{list(_JOBS)}. Received: {TF_CONFIG_ENV}={shown}"
        )
    tasks, seen = [], {}
    for job in _JOBS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not addresses and job in cluster:
            raise ValueError(
                f'{TF_CONFIG_ENV}: cluster["{job}"] must be a non-empty list of "host:port" '
                f"strings. Received: {TF_CONFIG_ENV}={shown}"
            )
        if job == "chief" and len(addresses) > 1:
            raise ValueError(
                f'{TF_CONFIG_ENV}: cluster["chief"] holds at most one address. Received: '
                f"{len(addresses)} ({addresses})"
            )
        for index, address in enumerate(addresses):
            _check_address(job, index, address, shown)
            if address in seen:
                raise ValueError(
                    f"{TF_CONFIG_ENV}: the address {address!r} is listed twice ({seen[address]} "
                    f"and {job} {index}); every task needs its own port. Received: "
                    f"{TF_CONFIG_ENV}={shown}"
                )
            seen[address] = f"{job} {index}"
            tasks.append((job, index, address))
    if not tasks:
        raise ValueError(f'{TF_CONFIG_ENV}: the cluster lists no "worker" (or "chief"). Received: {TF_CONFIG_ENV}={shown}')
    task_type, task_index = task.get("type"), task.get("index")
    if task_type not in _JOBS or task_type not in cluster:
        raise ValueError(
            f'{TF_CONFIG_ENV}: task["type"] must be one of the cluster\'s jobs '
            f"{[j for j in _JOBS if j in cluster]}. Received: type={task_type!r}"
        )
    count = len(cluster[task_type])
    if isinstance(task_index, bool) or not isinstance(task_index, int) or not 0 <= task_index < count:
        raise ValueError(
            f'{TF_CONFIG_ENV}: task["index"] must be an int in [0, {count - 1}] for job '
            f"{task_type!r}. Received: index={task_index!r}"
        )
    rank = next(i for i, (job, index, _) in enumerate(tasks) if (job, index) == (task_type, task_index))
    return ClusterInfo(tuple(tasks), task_type, task_index, rank, raw)


def _check_address(job, index, address, shown):
    host, sep, port = str(address).rpartition(":") if isinstance(address, str) else ("", "", "")
    ok = bool(sep and host) and port.isdigit() and 0 < int(port) < 65536
    if not ok:
        raise ValueError(
            f'{TF_CONFIG_ENV}: cluster["{job}"][{index}] must be "host:port" with a port in '
            f"1..65535. Received: {address!r} in {TF_CONFIG_ENV}={shown}"
        )


def shorten(text, limit=300):
    """`text` on one line, cut to `limit` characters (for error messages)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def resolve_timeouts(connect_timeout=None, collective_timeout=None):
    """``(connect_timeout, collective_timeout)`` in seconds: each argument, else its
    environment variable, else its default. ValueError for an environment value that
    is not a number of seconds > 0."""
    if connect_timeout is None:
        connect_timeout = _timeout_from_env(CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S)
    if collective_timeout is None:
        collective_timeout = _timeout_from_env(COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S)
    return connect_timeout, collective_timeout


def _timeout_from_env(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return float(default)
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"{name} must be a number of seconds > 0. Received: {name}={value!r}")
    return seconds


def wait_for_peers(addresses, timeout):
    """Waits until every ``host:port`` accepts a TCP connection, at most `timeout` s;
    returns the addresses that never did."""
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while pending:
        still = []
        for address in pending:
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=2.0):
                    pass
            except OSError:
                still.append(address)
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return pending


def make_multiworker_strategy(cluster, *, connect_timeout=None, collective_timeout=None):
    """The process's `MultiWorkerMirroredStrategy` for `cluster`, with bounded waits.

    The chief first waits (at most `connect_timeout` s) until every other worker
    listens; the others register with the chief within 2 * `connect_timeout` + 10 s.
    Collectives time out after `collective_timeout` s (defaults: `resolve_timeouts`).
    One strategy per process (TensorFlow's collective runtime can be set up only once).

    Raises:
        ValueError: if a worker cannot be reached in time, or this process already
            joined another cluster.
    """
    import tensorflow as tf

    connect_timeout, collective_timeout = resolve_timeouts(connect_timeout, collective_timeout)
    key = json.dumps(cluster.raw, sort_keys=True)
    if _STRATEGY:
        if key in _STRATEGY:
            return _STRATEGY[key]
        raise ValueError(
            "This process already joined another multi-worker cluster; TensorFlow sets "
            "up its collective runtime once per process. Run each training in a fresh "
            f"process. Received: {TF_CONFIG_ENV}={shorten(key)}"
        )
    peers = [address for i, (_, _, address) in enumerate(cluster.tasks) if i != cluster.rank]
    if cluster.is_chief and peers:
        logger.info("Chief %s: waiting up to %.0f s for %d worker(s) to start.",
                    cluster.address, connect_timeout, len(peers))
        missing = wait_for_peers(peers, connect_timeout)
        if missing:
            raise ValueError(
                f"Cannot reach worker(s) {missing} within {connect_timeout:.0f} s: nothing "
                "accepts connections there. Start every worker listed in "
                f"{TF_CONFIG_ENV}['cluster'] with the same command and its own task, or fix "
                f"the address(es). Received: {TF_CONFIG_ENV}={shorten(key)}"
            )
    # The chief may spend `connect_timeout` waiting for the slowest worker before it
    # starts its own server, so the others wait for it somewhat longer.
    _configure_coordination(cluster, register_timeout=2 * connect_timeout + 10.0)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )
    except tf.errors.OpError as err:
        raise ValueError(
            f"Worker {cluster.task_type} {cluster.task_index} ({cluster.address}) could not "
            f"join the cluster: the chief at {cluster.tasks[0][2]} did not accept it in "
            f"time ({type(err).__name__}: {shorten(str(err), 200)}). Is the chief running "
            f"with the same {TF_CONFIG_ENV}['cluster']?"
        ) from None
    _STRATEGY[key] = strategy
    return strategy


def _configure_coordination(cluster, *, register_timeout):
    """Sets up TensorFlow's coordination service as the strategy would, plus timeouts.

    The strategy configures the service itself only when nobody did; doing it first
    adds the registration and heartbeat timeouts (TensorFlow's defaults let a chief
    wait for a missing worker without end). The job list is the strategy's own.
    """
    configured = private_api.configure_coordination_service(
        leader=cluster.leader,
        job_counts=cluster.job_counts(),
        register_timeout_ms=int(register_timeout * 1000),
        heartbeat_timeout_ms=int(HEARTBEAT_TIMEOUT_S * 1000),
    )
    if configured is None:
        logger.warning("TensorFlow's coordination config is not importable: "
                       "registration and heartbeat use TensorFlow's defaults.")
