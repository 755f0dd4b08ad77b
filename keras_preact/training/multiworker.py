"""Multi-worker training on `MultiWorkerMirroredStrategy` with a custom loop (``model.fit``
fails under it in Keras 3): ``TF_CONFIG``'s cluster, its strategy and the loop. Rank 0 alone
reads and writes the workdir and broadcasts its state; each worker keeps its slice of every
global batch (step ``s`` sees the single-process batch)."""

import collections
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import socket
import time
import zlib

import keras
import numpy as np
import tensorflow as tf

from keras_preact import private_api
from keras_preact.checks import shorten
from keras_preact.layers.remat import model_pruning_off
from keras_preact.training.config import RUNTIME_FIELDS, training_path
from keras_preact.training.distribute import (average_replica_statistics, on_every_replica,
                                              reduce_variables)
from keras_preact.training.run import Run, Stepper, as_config, optimizer_step

logger = logging.getLogger("keras_preact.training")

TF_CONFIG_ENV = "TF_CONFIG"
CONNECT_TIMEOUT_ENV = "KERAS_PREACT_CONNECT_TIMEOUT_S"
COLLECTIVE_TIMEOUT_ENV = "KERAS_PREACT_COLLECTIVE_TIMEOUT_S"
#: Seconds without a worker's heartbeat before it is declared dead (the others abort).
HEARTBEAT_TIMEOUT_S = 15.0

_JOBS = ("chief", "worker")
_STATUS_OK, _STATUS_WORKDIR_REFUSED, _STATUS_COMPLETE = 0, 1, 2
_STRATEGY = {}


class ClusterError(RuntimeError):
    """A worker of the cluster failed or stopped responding during training."""


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """A validated ``TF_CONFIG``: `tasks` are ``(job, index, "host:port")`` in rank order
    (the chief job first), `rank` is this process's (0: the chief), `raw` the dict."""

    tasks: tuple
    rank: int
    raw: dict

    num_workers = property(lambda self: len(self.tasks))
    is_chief = property(lambda self: self.rank == 0)
    task = property(lambda self: "{} {}".format(*self.tasks[self.rank][:2]))  # "worker 1"

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
    return ClusterInfo(tuple(tasks), rank, raw)


def resolve_timeouts(connect_timeout=None, collective_timeout=None):
    """``(connect_timeout, collective_timeout)`` in seconds: each argument, else its variable
    (`CONNECT_TIMEOUT_ENV`, `COLLECTIVE_TIMEOUT_ENV`), else 300 and 600; ValueError if bad."""
    out = []
    for value, name, default in ((connect_timeout, CONNECT_TIMEOUT_ENV, 300.0),
                                 (collective_timeout, COLLECTIVE_TIMEOUT_ENV, 600.0)):
        if value is None and (text := os.environ.get(name)):
            with contextlib.suppress(ValueError):
                value = float(text)
            if not isinstance(value, float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a number of seconds > 0. "
                                 f"Received: {name}={text!r}")
        out.append(default if value is None else value)
    return tuple(out)


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


def make_multiworker_strategy(cluster, connect_timeout, collective_timeout):
    """The process's `MultiWorkerMirroredStrategy` for `cluster` (one per process:
    TensorFlow's rule). The chief waits at most `connect_timeout` s for the others to listen;
    they register within 2 * `connect_timeout` + 10 s; collectives time out after
    `collective_timeout` s. ValueError if a worker cannot be reached in time, or this process
    already joined another cluster."""
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
        raise ValueError(
            f"Worker {cluster.task} ({cluster.tasks[cluster.rank][2]}) could not join the cluster: "
            f"the chief at {cluster.tasks[0][2]} did not accept it in time ({type(err).__name__}: "
            f"{shorten(err, 200)}). Is the chief running with the same {TF_CONFIG_ENV}['cluster']?"
        ) from None
    _STRATEGY[key] = strategy
    return strategy


def all_gather_rows(strategy, row):
    """Gathers one int32 row from every replica: an array (replicas, len(row))."""
    row = tf.constant(np.asarray(row, dtype=np.int32)[None, :])
    gather = on_every_replica(
        strategy, lambda: tf.distribute.get_replica_context().all_gather(row, axis=0))
    return np.asarray(gather())


def weights_digest(model):
    """SHA-256 (hex) of every weight of `model` (values, shapes, dtypes, in order)."""
    digest = hashlib.sha256()
    for variable in model.weights:
        array = np.ascontiguousarray(np.asarray(variable.numpy()))
        digest.update(f"{array.dtype}{array.shape}".encode() + array.tobytes())
    return digest.hexdigest()


class MultiWorkerStepper(Stepper):
    """Epochs by the custom loop on `MultiWorkerMirroredStrategy` (see the module doc)."""

    collective = True

    def __init__(self, cluster, *, connect_timeout, collective_timeout):
        self.cluster, self.is_chief = cluster, cluster.is_chief
        self.timeouts = resolve_timeouts(connect_timeout, collective_timeout)
        self.task = cluster.task  # "worker 1"
        self.labels = {"task": self.task, "is_chief": cluster.is_chief,
                       "num_workers": cluster.num_workers, "weights_digest": None}
        self.schedule_labels = {"num_workers": cluster.num_workers}

    def start(self, run):
        super().start(run, lambda: make_multiworker_strategy(self.cluster, *self.timeouts))

    def agree(self, run, state, refused):
        """The start-of-run exchange: status, resume epoch, rank and a CRC per config field."""
        values = run.config.to_dict()
        names = sorted(k for k in values if k not in RUNTIME_FIELDS)
        crcs = [zlib.crc32(json.dumps(values[k], sort_keys=True).encode()) & 0x7FFFFFFF
                for k in names]
        status = (_STATUS_WORKDIR_REFUSED if refused is not None
                  else _STATUS_COMPLETE if run.complete(state) else _STATUS_OK)
        start_epoch = state["epoch"] if state else 0
        rows = all_gather_rows(self.strategy, [status, start_epoch, self.cluster.rank] + crcs)
        if differ := sorted({names[i] for r in rows for i, c in enumerate(r[3:]) if c != crcs[i]}):
            raise ValueError(
                f"The workers were started with different training configs (fields {differ} "
                f"differ; this is {self.task}). Every worker must run the same command; only "
                f"{list(RUNTIME_FIELDS)} may differ between hosts. Nothing was written.")
        if refused is not None:
            raise refused
        chief_status, chief_epoch = (int(v) for v in {int(r[2]): r for r in rows}[0][:2])
        if chief_status == _STATUS_WORKDIR_REFUSED:
            raise ValueError(f"The chief refused its workdir (see the chief's error); {self.task} "
                             "stops too. Nothing was written.")
        if self.is_chief:
            return state
        if chief_status == _STATUS_COMPLETE:
            return {"complete": True}
        return {"epoch": chief_epoch} if chief_epoch else None

    def restore(self, run, model, optimizer, state):
        """The chief loads; then every worker takes the chief's variables."""
        variables = list(model.weights) + list(optimizer.variables)
        if self.is_chief and state is not None:
            # `load_weights` in the scope would create variables (collectives) on the chief
            # alone: load a copy built outside it and assign its values (no collective).
            shadow, shadow_optimizer = run.build(contextlib.nullcontext())
            run.load_checkpoint(shadow, shadow_optimizer, state)
            sources = list(shadow.weights) + list(shadow_optimizer.variables)
            for target, source in zip(variables, sources):
                target.assign(source.numpy())
        elif self.is_chief and run.config.weights is not None:
            run.load_pretrained(model)
        reduce_variables(self.strategy, variables, mean=False)
        self.forward = tf.function(lambda x: model(x, training=False))

    def train_epochs(self, run, model, start_epoch):
        # Grappler's model pruning would undo rematerialisation in the custom step.
        pruning = model_pruning_off() if getattr(model, "remat", None) else contextlib.nullcontext()
        try:
            with pruning:
                self._epochs(run, model, start_epoch)
        except tf.errors.OpError as err:
            last = run.workdir.read_state() if run.owns_files else None
            raise ClusterError(
                f"{self.task}: training stopped because another worker failed or stopped "
                f"responding ({type(err).__name__}: {shorten(err, 300)}). Restart every "
                "worker with the same command to resume from the last completed epoch"
                + (f" ({last['epoch']})." if last else ".")) from None

    def _epochs(self, run, model, start_epoch):
        """`fit`'s work with `Stepper.callbacks`, by a step of `_make_train_step`."""
        c, spe = run.config, run.spe
        train_step = _make_train_step(self.strategy, model)
        train = run.train_data(epoch=start_epoch, repeat_epochs=run.epochs - start_epoch)
        iterator = iter(self.strategy.distribute_datasets_from_function(
            _shard_fn(train, c.batch_size)))
        callbacks = keras.callbacks.CallbackList(  # a progress bar on the chief, as `fit` has
            self.callbacks(run), model=model, add_progbar=self.is_chief and c.verbose != 0,
            verbose=c.verbose, epochs=run.epochs, steps=spe)
        callbacks.on_train_begin()
        step = optimizer_step(model.optimizer)
        for epoch in range(start_epoch, run.epochs):
            callbacks.on_epoch_begin(epoch)
            steps_now, loss_sum, correct_sum = min(spe, run.total_steps - step), 0.0, 0.0
            for i in range(steps_now):
                loss, correct = train_step(iterator)
                loss_sum, correct_sum = loss_sum + float(loss), correct_sum + float(correct)
                logs = {"loss": loss_sum / (i + 1),
                        "accuracy": correct_sum / ((i + 1) * c.batch_size)}
                callbacks.on_train_batch_end(i, logs)
            step += steps_now
            for _ in range(spe - steps_now):  # one iterator for all epochs: skip the cut rest
                next(iterator)
            callbacks.on_epoch_end(epoch, dict(logs))
            logger.info("%s: epoch %d/%d done, step %d, loss %.4f", self.task, epoch + 1,
                        run.epochs, step, logs["loss"])
            if step >= run.total_steps:
                break
        callbacks.on_train_end()

    def predict(self, model, dataset):
        """On this worker alone: every worker holds the same weights, so gets the same."""
        return np.concatenate([self.forward(x) for x, _ in dataset])

    def finish(self, run, model):
        """The moving average into the model (as `fit` ends), one set of statistics everywhere,
        then a check that all weights are equal."""
        model.optimizer.finalize_variable_values(model.trainable_variables)
        average_replica_statistics(self.strategy, model)
        digest = weights_digest(model)
        digests = all_gather_rows(self.strategy, np.frombuffer(bytes.fromhex(digest[:32]), ">i4"))
        if (digests != digests[0]).any():
            raise RuntimeError(f"The workers' final weights differ ({self.task}: "
                               f"{digest[:16]}...). This is a bug; the checkpoints of the chief "
                               "are intact.")
        return {"num_workers": self.cluster.num_workers, "weights_digest": digest}


def train_multiworker(config, workdir, *, connect_timeout=None, collective_timeout=None):
    """`train_and_evaluate` across the workers of ``TF_CONFIG``; every worker calls it with the
    same config. Returns `Run.train`'s dict plus ``task`` ("worker 1"), ``is_chief``,
    ``num_workers`` and ``weights_digest`` (SHA-256 of the final weights).

    Args:
        config: a `TrainConfig` (or its dict) with ``strategy="multiworker"``.
        workdir: the run's folder (used by the chief only).
        connect_timeout, collective_timeout: seconds (see `make_multiworker_strategy`).

    Raises:
        ValueError: before anything is written, for a malformed ``TF_CONFIG``, an invalid or
            unsupported config, an unreachable worker, workers with different configs or a
            foreign workdir.
        ClusterError: if another worker fails or stops responding during training.
        RuntimeError: if the workers' final weights differ (a bug)."""
    config = as_config(config)
    if config.strategy != "multiworker":
        raise ValueError("train_multiworker needs strategy='multiworker'. "
                         f"Received: strategy={config.strategy!r}")
    training_path(config, "tensorflow")
    stepper = MultiWorkerStepper(parse_tf_config(), connect_timeout=connect_timeout,
                                 collective_timeout=collective_timeout)
    return Run(config, workdir, stepper).train()


def _shard_fn(global_ds, global_batch):
    """The `distribute_datasets_from_function` input: each pipeline's slice of every batch."""
    def dataset_fn(ctx):
        pipelines, k = ctx.num_input_pipelines, ctx.input_pipeline_id
        local_replicas = ctx.num_replicas_in_sync // pipelines
        per_replica = global_batch // ctx.num_replicas_in_sync
        width = per_replica * local_replicas

        def take_slice(x, y):
            x, y = x[k * width:(k + 1) * width], y[k * width:(k + 1) * width]
            x = tf.reshape(x, [local_replicas, per_replica] + x.shape.as_list()[1:])
            y = tf.reshape(y, [local_replicas, per_replica])
            return tf.data.Dataset.from_tensor_slices((x, y))

        return global_ds.flat_map(take_slice)

    return dataset_fn


def _make_train_step(strategy, model):
    """A `tf.function` of one global step: each replica computes `fit`'s train step (the
    compiled loss, scaled for the replicas, by `compute_loss`; the optimizer's loss scaling
    and `apply`, which all-reduces the gradients and keeps the moving average); returns the
    summed losses (the global batch's mean) and the number right."""
    optimizer = model.optimizer

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            loss = model.compute_loss(x, y, probs, training=True)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss, tf.reduce_sum(keras.metrics.sparse_categorical_accuracy(y, probs))

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        loss, correct = strategy.run(step_fn, args=(x, y))
        total = tf.distribute.ReduceOp.SUM
        return strategy.reduce(total, loss, axis=None), strategy.reduce(total, correct, axis=None)

    return train_step
