"""Multi-worker training on `MultiWorkerMirroredStrategy` with a custom loop (``model.fit``
fails under it in Keras 3). Rank 0 alone reads and writes the workdir and broadcasts its state;
each worker keeps its slice of every global batch (step ``s`` sees the single-process batch)."""

import contextlib
import hashlib
import json
import logging
import zlib

import keras
import numpy as np
import tensorflow as tf

from keras_preact.checks import shorten
from keras_preact.layers.remat import model_pruning_off
from keras_preact.training.config import RUNTIME_FIELDS
from keras_preact.training.distribute import (make_multiworker_strategy, parse_tf_config,
                                              resolve_timeouts)
from keras_preact.training.run import Run, Stepper, as_config, optimizer_step

logger = logging.getLogger("keras_preact.training")

#: Config fields that may differ between workers.
WORKER_LOCAL_FIELDS = tuple(RUNTIME_FIELDS) + ("data_path",)

_STATUS_OK, _STATUS_WORKDIR_REFUSED, _STATUS_COMPLETE = 0, 1, 2
_REDUCE_FNS = {}


class ClusterError(RuntimeError):
    """A worker of the cluster failed or stopped responding during training."""


def _on_every_replica(strategy, fn):
    """A `tf.function` running `fn` on every replica; it returns the first local result."""
    @tf.function(autograph=False)
    def run():
        results = strategy.run(fn)
        return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)

    return run


def all_gather_rows(strategy, row):
    """Gathers one int32 row from every replica: an array (replicas, len(row))."""
    row = tf.constant(np.asarray(row, dtype=np.int32)[None, :])
    gather = _on_every_replica(
        strategy, lambda: tf.distribute.get_replica_context().all_gather(row, axis=0))
    return np.asarray(gather())


def reduce_variables(strategy, variables, *, mean):
    """Sets `variables` on every replica of every worker to their mean over all replicas
    (`mean=True`) or to replica 0's values (bit for bit: the others add zeros)."""
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

            _REDUCE_FNS[key] = _on_every_replica(strategy, fn)
        for variable, value in zip(group, _REDUCE_FNS[key]()):
            variable.assign(value)


def sync_non_trainable(strategy, model):
    """Averages BatchNorm's moving statistics over all replicas of all workers."""
    floats = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    reduce_variables(strategy, floats, mean=True)


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
        self.timeouts = dict(zip(("connect_timeout", "collective_timeout"),
                                 resolve_timeouts(connect_timeout, collective_timeout)))
        self.task = f"{cluster.task_type} {cluster.task_index}"
        self.labels = {"task": self.task, "is_chief": cluster.is_chief,
                       "num_workers": cluster.num_workers, "weights_digest": None}
        self.schedule_labels = {"num_workers": cluster.num_workers}

    def start(self, run):
        super().start(run, lambda: make_multiworker_strategy(self.cluster, **self.timeouts))

    def agree(self, run, state, refused):
        """The start-of-run exchange: status, resume epoch, rank and a CRC per config field."""
        values = run.config.to_dict()
        names = sorted(k for k in values if k not in WORKER_LOCAL_FIELDS)
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
                f"{list(WORKER_LOCAL_FIELDS)} may differ between hosts. Nothing was written.")
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
        self.eval_batch = _make_eval_batch(model)

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
        c, spe = run.config, run.spe
        train_step = _make_train_step(self.strategy, model, model.optimizer, c.batch_size)
        train = run.train_data(epoch=start_epoch, repeat_epochs=run.epochs - start_epoch)
        iterator = iter(self.strategy.distribute_datasets_from_function(
            _shard_fn(train, c.batch_size)))
        step = optimizer_step(model.optimizer)
        for epoch in range(start_epoch, run.epochs):
            run.epoch_begin()
            steps_now = min(spe, run.total_steps - step)
            bar = None
            if self.is_chief and c.verbose != 0:
                bar = keras.utils.Progbar(steps_now, verbose=1 if c.verbose in ("auto", 1) else 2)
                logger.info("Epoch %d/%d", epoch + 1, run.epochs)
            loss_sum = correct_sum = 0.0
            for i in range(steps_now):
                loss, correct = train_step(iterator)
                loss_sum, correct_sum = loss_sum + float(loss), correct_sum + float(correct)
                if bar is not None:
                    bar.update(i + 1, [("loss", loss_sum / (i + 1)),
                                       ("accuracy", correct_sum / ((i + 1) * c.batch_size))])
            step += steps_now
            for _ in range(spe - steps_now):  # one iterator for all epochs: skip the cut rest
                next(iterator)
            sync_non_trainable(self.strategy, model)
            logs = {"loss": loss_sum / max(steps_now, 1),
                    "accuracy": correct_sum / max(steps_now * c.batch_size, 1)}
            if c.eval_every and (epoch + 1) % c.eval_every == 0:
                val = self.evaluate(run, model)
                logs.update(val_loss=val["loss"], val_accuracy=val["accuracy"])
            run.epoch_end(model, epoch, logs)
            logger.info("%s: epoch %d/%d done, step %d, loss %.4f", self.task, epoch + 1,
                        run.epochs, step, logs["loss"])
            if step >= run.total_steps:
                break

    def evaluate(self, run, model):
        """On this worker alone: every worker holds the same weights, so gets the same."""
        loss, correct, count = 0.0, 0.0, 0
        for x, y in run.test_data:
            a, b, n = self.eval_batch(x, y)
            loss, correct, count = loss + float(a), correct + float(b), count + int(n)
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1)}

    def finish(self, run, model):
        """One set of statistics everywhere, then a check that all weights are equal."""
        sync_non_trainable(self.strategy, model)
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
    for name, bad, why in (
        ("strategy", config.strategy != "multiworker", "it needs strategy='multiworker'"),
        ("precision", config.precision == "mixed_float16", "'mixed_float16' needs loss scaling, "
         "which the multi-worker loop does not implement; use 'fp32' or 'mixed_bfloat16'"),
        ("jit_compile", config.jit_compile, "XLA is off under tf.distribute in Keras"),
        ("cpu_devices", config.cpu_devices, "it is for strategy='mirrored' on one host; "
         "each worker uses its own devices")):
        if bad:
            raise ValueError(f"Unsupported {name} with the multi-worker loop: {why}. "
                             f"Received: {name}={getattr(config, name)!r}")
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


def _make_train_step(strategy, model, optimizer, global_batch):
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, probs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.reduce_sum(keras.metrics.sparse_categorical_accuracy(y, probs))

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        loss, correct = strategy.run(step_fn, args=(x, y))
        total = tf.distribute.ReduceOp.SUM
        return strategy.reduce(total, loss, axis=None), strategy.reduce(total, correct, axis=None)

    return train_step


def _make_eval_batch(model):
    """A batch's summed loss, number right and size, on this worker alone (no collectives)."""
    @tf.function
    def batch(x, y):
        probs = model(x, training=False)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, probs))
        hits = tf.reduce_sum(keras.metrics.sparse_categorical_accuracy(y, probs))
        return loss, hits, tf.shape(y)[0]

    return batch
