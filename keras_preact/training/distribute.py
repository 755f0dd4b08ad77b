"""tf.distribute strategies, runtime settings and the multi-worker cluster (TensorFlow).
Under a mirrored strategy each replica's BatchNorm normalises its share of the batch (as the
paper's two GPUs did) unless ``synchronized_bn=True`` all-reduces the moments."""

import collections
import contextlib
import dataclasses
import json
import logging
import math
import os
import socket
import time

import keras
import numpy as np

from keras_preact import private_api
from keras_preact.checks import check_choice, shorten
from keras_preact.training.config import STRATEGIES

logger = logging.getLogger(__name__)

TF_CONFIG_ENV = "TF_CONFIG"
CONNECT_TIMEOUT_ENV = "KERAS_PREACT_CONNECT_TIMEOUT_S"
COLLECTIVE_TIMEOUT_ENV = "KERAS_PREACT_COLLECTIVE_TIMEOUT_S"
DEFAULT_CONNECT_TIMEOUT_S = 300.0
DEFAULT_COLLECTIVE_TIMEOUT_S = 600.0
#: Seconds without a worker's heartbeat before it is declared dead (the others abort).
HEARTBEAT_TIMEOUT_S = 15.0

_JOBS = ("chief", "worker")
_STRATEGIES = {}
_STRATEGY = {}


def configure_runtime(*, cpu_devices=None, intra_op_threads=None, inter_op_threads=None,
                      deterministic=False):
    """Applies settings that TensorFlow accepts only before it initialises its devices.

    Args:
        cpu_devices: split the first CPU into that many logical devices (replicas); ValueError
            if TensorFlow already initialised another number.
        intra_op_threads, inter_op_threads: thread pool sizes (too late: a warning).
        deterministic: enable TensorFlow's op determinism."""
    import tensorflow as tf
    if cpu_devices:
        wanted = [tf.config.LogicalDeviceConfiguration() for _ in range(int(cpu_devices))]
        try:
            tf.config.set_logical_device_configuration(
                tf.config.list_physical_devices("CPU")[0], wanted)
        except RuntimeError:  # TensorFlow is initialised: fine if it has those devices
            have = len(tf.config.list_logical_devices("CPU"))
            if have != int(cpu_devices):
                raise ValueError("`cpu_devices` can only be set before TensorFlow initialises its "
                                 f"devices (it has {have} logical CPU device(s) now). Received: "
                                 f"cpu_devices={cpu_devices}. Run in a fresh process.") from None
    threading = tf.config.threading
    for kind, value in (("intra", intra_op_threads), ("inter", inter_op_threads)):
        getter = getattr(threading, f"get_{kind}_op_parallelism_threads")
        if value and getter() != value:
            try:
                getattr(threading, f"set_{kind}_op_parallelism_threads")(int(value))
            except RuntimeError:
                logger.warning("%s_op_threads=%s ignored: TensorFlow is already initialised "
                               "with %s.", kind, value, getter())
    if deterministic:
        tf.config.experimental.enable_op_determinism()


def make_strategy(name):
    """The `tf.distribute.Strategy` for `name`: "default" (one device), "mirrored" (every visible
    GPU, else every logical CPU), "tpu" or "multiworker" (``TF_CONFIG``'s workers: train with
    `train_multiworker`). ValueError for an unknown name or "tpu" without a TPU."""
    import tensorflow as tf
    check_choice("strategy", name, STRATEGIES)
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        devices = None
        if not tf.config.list_logical_devices("GPU"):  # else MirroredStrategy() takes CPU:0 only
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
        key = tuple(devices or ())
        if key not in _STRATEGIES:
            # One per device set: a second MirroredStrategy restarts the collective keys and
            # collides with the first's cached ones ("Shape mismatch in the collective ...").
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(devices=devices)
        return _STRATEGIES[key]
    if name == "multiworker":
        return make_multiworker_strategy(parse_tf_config())
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise ValueError(
            "strategy='tpu' was requested but no TPU was found on this machine "
            f"({type(err).__name__}: {shorten(err, 200)}). Use strategy='default' or 'mirrored'."
        ) from None
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


def average_replica_statistics(model):
    """Sets every replica's copy of each non-trainable variable (BatchNorm's moving
    statistics) to their mean; returns how many variables had differing copies."""
    changed = 0
    for variable in model.non_trainable_variables:
        copies = getattr(getattr(variable, "value", variable), "values", None) or ()
        arrays = [np.asarray(c.numpy()) for c in copies]
        if all(np.array_equal(arrays[0], a) for a in arrays[1:]):  # also: fewer than 2 copies
            continue
        mean = np.mean(np.stack(arrays).astype(np.float64), axis=0).astype(arrays[0].dtype)
        for copy in copies:
            copy.assign(mean)
        changed += 1
    return changed


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated ``TF_CONFIG``: `tasks` are ``(job, index, "host:port")`` in rank order
    (the chief job first), `rank` is this process's (0: the chief), `raw` the dict."""

    tasks: tuple
    task_type: str
    task_index: int
    rank: int
    raw: dict

    num_workers = property(lambda self: len(self.tasks))
    is_chief = property(lambda self: self.rank == 0)

    @property
    def leader(self):
        """The coordination service leader (TensorFlow's rule: the chief job if any)."""
        job, index, _ = self.tasks[0]
        return f"/job:{job}/replica:0/task:{index}"


def parse_tf_config(text=None):
    """Parses and validates a ``TF_CONFIG`` (default: the environment variable) into a
    `ClusterInfo`; ValueError naming what is wrong, with the value received."""
    text = os.environ.get(TF_CONFIG_ENV) if text is None else text
    if text is None or not str(text).strip():
        raise ValueError(
            f"strategy='multiworker' needs the {TF_CONFIG_ENV} environment variable, e.g. "
            '{"cluster": {"worker": ["host0:12345", "host1:12345"]}, '
            '"task": {"type": "worker", "index": 0}} on the first host. '
            f"Received: {TF_CONFIG_ENV}={text!r}")
    shown = f"{TF_CONFIG_ENV}={shorten(text)}"

    def invalid(problem, received=shown):
        return ValueError(f"{TF_CONFIG_ENV}{problem}. Received: {received}")

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise invalid(f" is not valid JSON ({err})") from None
    if not (isinstance(raw, dict) and isinstance(raw.get("cluster"), dict)
            and isinstance(raw.get("task"), dict)):
        raise invalid(' must be a JSON object with a "cluster" object and a "task" object')
    cluster, task = raw["cluster"], raw["task"]
    if unknown := sorted(set(cluster) - set(_JOBS)):
        raise invalid(f": jobs {unknown} are not supported by MultiWorkerMirroredStrategy (no "
                      f"parameter servers or evaluators). Valid jobs: {list(_JOBS)}")
    tasks, seen = [], {}
    for job in _JOBS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not addresses and job in cluster:
            raise invalid(f': cluster["{job}"] must be a non-empty list of "host:port" strings')
        if job == "chief" and len(addresses) > 1:
            raise invalid(': cluster["chief"] holds at most one address',
                          f"{len(addresses)} ({addresses})")
        for index, address in enumerate(addresses):
            host, _, port = address.rpartition(":") if isinstance(address, str) else ("", "", "")
            if not (host and port.isdigit() and 0 < int(port) < 65536):
                raise invalid(f': cluster["{job}"][{index}] must be "host:port" with a port in '
                              "1..65535", f"{address!r} in {shown}")
            if address in seen:
                raise invalid(f": the address {address!r} is listed twice ({seen[address]} and "
                              f"{job} {index}); every task needs its own port")
            seen[address] = f"{job} {index}"
            tasks.append((job, index, address))
    task_type, task_index = task.get("type"), task.get("index")
    if task_type not in _JOBS or task_type not in cluster:
        raise invalid(f': task["type"] must be one of the cluster\'s jobs '
                      f"{[j for j in _JOBS if j in cluster]}", f"type={task_type!r}")
    count = len(cluster[task_type])
    if type(task_index) is not int or not 0 <= task_index < count:
        raise invalid(f': task["index"] must be an int in [0, {count - 1}] for job {task_type!r}',
                      f"index={task_index!r}")
    rank = [t[:2] for t in tasks].index((task_type, task_index))
    return ClusterInfo(tuple(tasks), task_type, task_index, rank, raw)


def resolve_timeouts(connect_timeout=None, collective_timeout=None):
    """``(connect_timeout, collective_timeout)`` in seconds: each argument, else its variable
    (`CONNECT_TIMEOUT_ENV`, `COLLECTIVE_TIMEOUT_ENV`), else its default; ValueError if bad."""
    return (_timeout(connect_timeout, CONNECT_TIMEOUT_ENV, DEFAULT_CONNECT_TIMEOUT_S),
            _timeout(collective_timeout, COLLECTIVE_TIMEOUT_ENV, DEFAULT_COLLECTIVE_TIMEOUT_S))


def _timeout(value, name, default):
    text = os.environ.get(name)
    if value is None and text:
        with contextlib.suppress(ValueError):
            value = float(text)
        if not isinstance(value, float) or not 0 < value < math.inf:
            raise ValueError(f"{name} must be a number of seconds > 0. Received: {name}={text!r}")
    return default if value is None else value


def wait_for_peers(addresses, timeout):
    """Waits up to `timeout` s for every ``host:port`` to accept; returns those that never did."""
    deadline = time.monotonic() + timeout
    pending = list(addresses)
    while True:
        for address in list(pending):
            host, _, port = address.rpartition(":")
            with contextlib.suppress(OSError):
                socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
                pending.remove(address)
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.5)


def make_multiworker_strategy(cluster, *, connect_timeout=None, collective_timeout=None):
    """The process's `MultiWorkerMirroredStrategy` for `cluster` (one per process:
    TensorFlow's rule). The chief waits at most `connect_timeout` s for the others to listen;
    they register within 2 * `connect_timeout` + 10 s; collectives time out after
    `collective_timeout` s (defaults: `resolve_timeouts`). ValueError if a worker cannot be
    reached in time, or this process already joined another cluster."""
    import tensorflow as tf
    connect_timeout, collective_timeout = resolve_timeouts(connect_timeout, collective_timeout)
    key = json.dumps(cluster.raw, sort_keys=True)
    if _STRATEGY:
        if key in _STRATEGY:
            return _STRATEGY[key]
        raise ValueError(
            "This process already joined another multi-worker cluster; TensorFlow sets up its "
            "collective runtime once per process. Run each training in a fresh process. "
            f"Received: {TF_CONFIG_ENV}={shorten(key)}")
    peers = [address for i, (_, _, address) in enumerate(cluster.tasks) if i != cluster.rank]
    if cluster.is_chief and peers:
        logger.info("Chief %s: waiting up to %.0f s for %d worker(s) to start.",
                    cluster.tasks[0][2], connect_timeout, len(peers))
        if missing := wait_for_peers(peers, connect_timeout):
            raise ValueError(
                f"Cannot reach worker(s) {missing} within {connect_timeout:.0f} s: nothing accepts "
                f"connections there. Start every worker listed in {TF_CONFIG_ENV}['cluster'] with "
                "the same command and its own task, or fix the address(es). Received: "
                f"{TF_CONFIG_ENV}={shorten(key)}")
    # Before the strategy configures it without timeouts (a chief would wait for a missing
    # worker forever); the chief may first spend `connect_timeout`, so the others wait longer.
    configured = private_api.configure_coordination_service(
        leader=cluster.leader,
        job_counts=dict(collections.Counter(job for job, _, _ in cluster.tasks)),
        register_timeout_ms=int((2 * connect_timeout + 10.0) * 1000),
        heartbeat_timeout_ms=int(HEARTBEAT_TIMEOUT_S * 1000))
    if configured is None:
        logger.warning("TensorFlow's coordination config is not importable: registration and "
                       "heartbeat use TensorFlow's defaults.")
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver,
                                                             communication_options=options)
    except tf.errors.OpError as err:
        job, index, address = cluster.tasks[cluster.rank]
        raise ValueError(
            f"Worker {job} {index} ({address}) could not join the cluster: the chief at "
            f"{cluster.tasks[0][2]} did not accept it in time ({type(err).__name__}: "
            f"{shorten(err, 200)}). Is the chief running with the same {TF_CONFIG_ENV}['cluster']?"
        ) from None
    _STRATEGY[key] = strategy
    return strategy
