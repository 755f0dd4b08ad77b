"""Multi-worker training on `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow).

Why a custom loop: in Keras 3.15.1 ``model.fit`` under `MultiWorkerMirroredStrategy`
fails before the first step (``_maybe_symbolic_build`` reduces the first batch
eagerly; keras issue 20585 is the same family). `MultiWorkerStepper` trains the same
`Run` with ``strategy.run`` inside a `tf.function`, a `tf.GradientTape`, the loss
averaged over the *global* batch and the Keras optimizer's ``apply_gradients`` (which
all-reduces the gradients), so a workdir looks exactly like a single-host one.

The cluster: every worker runs the same command with its own ``TF_CONFIG``
(`parse_tf_config`). Rank 0 (the chief job if listed, else worker 0) leads
TensorFlow's coordination service, alone reads and writes the workdir, and broadcasts
its state (resume epoch, every model and optimizer variable) to the others, which need
no shared filesystem.

Data: every worker builds the same pipeline (keyed by ``(seed, epoch)``) at the global
batch and keeps its slice of each batch (worker ``k`` of ``n``: rows ``k*B/n`` to
``(k+1)*B/n - 1``), so step ``s`` sees exactly the single-process batch ``s``.

BatchNorm: each replica normalises with its share of the batch unless
``synchronized_bn=True``; the moving statistics (aggregation "none") are averaged
across all workers at every epoch end and before every evaluation
(`sync_non_trainable`), and at the end the workers compare a digest of their weights.

Failures stop in bounded time: a malformed ``TF_CONFIG`` raises before TensorFlow
starts; the chief waits at most ``connect_timeout`` for the others' ports and the
others 2 * ``connect_timeout`` + 10 s to register; workers with different configs are
refused by a per-field fingerprint exchange (as is a chief's refused workdir); a dead
worker is found by heartbeats (`HEARTBEAT_TIMEOUT_S`) and every collective is bounded
by ``collective_timeout``, and the survivors exit with `ClusterError`. Restart every
worker with the same command to resume. The timeouts default to
`DEFAULT_CONNECT_TIMEOUT_S` and `DEFAULT_COLLECTIVE_TIMEOUT_S`; the environment
variables ``KERAS_PREACT_CONNECT_TIMEOUT_S`` and ``KERAS_PREACT_COLLECTIVE_TIMEOUT_S``
override them.
"""

import contextlib
import hashlib
import json
import logging
import zlib

from keras_preact.training.config import RUNTIME_FIELDS
from keras_preact.training.distribute import make_multiworker_strategy
from keras_preact.training.distribute import parse_tf_config
from keras_preact.training.distribute import resolve_timeouts
from keras_preact.training.distribute import shorten
from keras_preact.training.run import Run
from keras_preact.training.run import Stepper
from keras_preact.training.run import as_config
from keras_preact.training.run import build_model
from keras_preact.training.run import load_weights_file
from keras_preact.training.run import optimizer_step
from keras_preact.training.run import weights_fingerprint

logger = logging.getLogger("keras_preact.training")

#: Config fields that may differ between workers: the runtime fields (paths, thread
#: counts, verbosity) and where each host keeps its copy of the data.
WORKER_LOCAL_FIELDS = tuple(RUNTIME_FIELDS) + ("data_path",)

_STATUS_OK, _STATUS_WORKDIR_REFUSED, _STATUS_COMPLETE = 0, 1, 2
_SYNC_FNS = {}


class ClusterError(RuntimeError):
    """A worker of the cluster failed or stopped responding during training."""


# -- collectives used outside the training step --------------------------------------

def _replica_fn_results(strategy, fn):
    """Runs `fn` on every replica (inside a tf.function) and returns the first local
    replica's results (every replica gets the same all-reduced values)."""
    import tensorflow as tf

    @tf.function(autograph=False)
    def run():
        return strategy.run(fn)

    results = run()
    return tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], results)


def all_gather_rows(strategy, row):
    """Gathers one int32 row from every replica: an array (replicas, len(row))."""
    import numpy as np
    import tensorflow as tf

    row = tf.constant(np.asarray(row, dtype=np.int32)[None, :])

    def fn():
        return tf.distribute.get_replica_context().all_gather(row, axis=0)

    return np.asarray(_replica_fn_results(strategy, fn))


def broadcast_from_chief(strategy, variables):
    """Sets every worker's `variables` to the chief's (replica 0's) values.

    A sum all-reduce in which every other replica contributes zeros, so the chief's
    values arrive bit for bit (x + 0 == x).
    """
    import tensorflow as tf

    variables = list(variables)
    if not variables:
        return

    groups = {}
    for variable in variables:  # one all-reduce per dtype (they pack their inputs)
        groups.setdefault(str(variable.dtype), []).append(variable)

    for group in groups.values():
        def fn(group=group):
            ctx = tf.distribute.get_replica_context()
            source = tf.equal(ctx.replica_id_in_sync_group, 0)
            values = [tf.convert_to_tensor(v) for v in group]
            values = [tf.where(source, v, tf.zeros_like(v)) for v in values]
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)

        for variable, value in zip(group, _replica_fn_results(strategy, fn)):
            variable.assign(value)


def sync_non_trainable(strategy, model):
    """Sets every replica's BatchNorm moving statistics (every float non-trainable
    variable) to their mean over all replicas of all workers.

    Returns:
        int: the number of variables averaged.
    """
    import tensorflow as tf

    variables = [v for v in model.non_trainable_variables if "float" in str(v.dtype)]
    if not variables:
        return 0
    key = (id(strategy), id(model))
    if key in _SYNC_FNS:
        run = _SYNC_FNS[key]
        for variable, value in zip(variables, run()):
            variable.assign(value)
        return len(variables)

    def fn():
        ctx = tf.distribute.get_replica_context()
        # tf.identity: an all-reduce of a variable's own read finds no destination.
        values = [tf.identity(tf.convert_to_tensor(v)) for v in variables]
        total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, values)
        return [t / ctx.num_replicas_in_sync for t in total]

    @tf.function(autograph=False)
    def run():
        results = strategy.run(fn)
        return [strategy.experimental_local_results(v)[0] for v in results]

    # Kept per (strategy, model): a new tf.function per epoch would retrace.
    _SYNC_FNS[key] = run
    for variable, value in zip(variables, run()):
        variable.assign(value)
    return len(variables)


def weights_digest(model):
    """SHA-256 (hex) of every weight of `model` (values, shapes, dtypes, in order)."""
    import numpy as np

    digest = hashlib.sha256()
    for variable in model.weights:
        array = np.ascontiguousarray(np.asarray(variable.numpy()))
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def config_fields_fingerprint(config):
    """``(field names, CRC-32 per field)`` of the fields all workers must share."""
    values = config.to_dict()
    names = sorted(k for k in values if k not in WORKER_LOCAL_FIELDS)
    crcs = [
        zlib.crc32(json.dumps(values[k], sort_keys=True).encode()) & 0x7FFFFFFF for k in names
    ]
    return names, crcs


# -- the training run -----------------------------------------------------------------

class MultiWorkerStepper(Stepper):
    """Epochs by the custom loop on `MultiWorkerMirroredStrategy` (see the module doc)."""

    collective = True

    def __init__(self, cluster, *, connect_timeout, collective_timeout):
        self.cluster, self.is_chief = cluster, cluster.is_chief
        self.timeouts = resolve_timeouts(connect_timeout, collective_timeout)
        self.task = f"{cluster.task_type} {cluster.task_index}"
        self.labels = {"task": self.task, "is_chief": cluster.is_chief,
                       "num_workers": cluster.num_workers, "weights_digest": None}
        self.schedule_labels = {"num_workers": cluster.num_workers}

    def start(self, run):
        from keras_preact.training import distribute

        c = run.config
        distribute.configure_runtime(intra_op_threads=c.intra_op_threads,
                                     inter_op_threads=c.inter_op_threads,
                                     deterministic=c.deterministic)
        connect, collective = self.timeouts
        self.strategy = make_multiworker_strategy(self.cluster, connect_timeout=connect,
                                                  collective_timeout=collective)
        self.replicas = self.strategy.num_replicas_in_sync
        distribute.check_global_batch(c.batch_size, self.replicas)

    def scope(self):
        return self.strategy.scope()

    def agree(self, run, state, refused):
        """The start-of-run exchange: status, resume epoch, rank and the config fields."""
        names, crcs = config_fields_fingerprint(run.config)
        status = (_STATUS_WORKDIR_REFUSED if refused is not None
                  else _STATUS_COMPLETE if run.complete(state) else _STATUS_OK)
        start_epoch = state["epoch"] if state else 0
        rows = all_gather_rows(self.strategy, [status, start_epoch, self.cluster.rank] + crcs)
        differ = sorted({names[i] for r in rows for i, c in enumerate(r[3:]) if c != crcs[i]})
        if differ:
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
        if chief_status == _STATUS_COMPLETE:
            return state if self.is_chief else {"complete": True}
        return state if self.is_chief else ({"epoch": chief_epoch} if chief_epoch else None)

    def restore(self, run, model, optimizer, state):
        """The chief loads outside the strategy's scope (see `load_outside_strategy`),
        then every worker starts from the chief's variables."""
        if self.is_chief and state is not None:
            path = run.checkpoint_path(state, weights_fingerprint(model))
            load_outside_strategy(run, path, model, optimizer)
            logger.info("Resuming %s from epoch %d (step %d) in %s.", run.config.model,
                        state["epoch"], state["step"], run.workdir.path)
        elif self.is_chief and run.config.weights is not None:
            run.load_pretrained(model)
        broadcast_from_chief(self.strategy, list(model.weights) + list(optimizer.variables))
        self.evaluator = _make_evaluator(model)

    def train_epochs(self, run, model, start_epoch, recorder):
        import tensorflow as tf

        from keras_preact.layers.remat import model_pruning_off

        # Grappler's model pruning would undo rematerialisation in the custom step.
        pruning = model_pruning_off() if getattr(model, "remat", None) else contextlib.nullcontext()
        try:
            with pruning:
                self._epochs(run, model, start_epoch, recorder)
        except tf.errors.OpError as err:
            last = run.workdir.read_state() if run.owns_files else None
            raise ClusterError(
                f"{self.task}: training stopped because another worker failed or stopped "
                f"responding ({type(err).__name__}: {shorten(err, 300)}). Restart every "
                "worker with the same command to resume from the last completed epoch"
                + (f" ({last['epoch']})." if last else ".")) from None

    def _epochs(self, run, model, start_epoch, recorder):
        import keras

        c, spe = run.config, run.spe
        train_step = _make_train_step(self.strategy, model, model.optimizer, c.batch_size)
        train = run.train_data(epoch=start_epoch, repeat_epochs=run.epochs - start_epoch)
        iterator = iter(self.strategy.distribute_datasets_from_function(
            _shard_fn(train, c.batch_size)))
        step = optimizer_step(model.optimizer)
        for epoch in range(start_epoch, run.epochs):
            recorder.epoch_begin()
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
            for _ in range(spe - steps_now):  # one iterator for all epochs: skip a cut epoch's rest
                next(iterator)
            sync_non_trainable(self.strategy, model)
            logs = {"loss": loss_sum / max(steps_now, 1),
                    "accuracy": correct_sum / max(steps_now * c.batch_size, 1)}
            if c.eval_every and (epoch + 1) % c.eval_every == 0:
                val = self.evaluate(run, model)
                logs.update(val_loss=val["loss"], val_accuracy=val["accuracy"])
            recorder.epoch_end(model, epoch, logs)
            logger.info("%s: epoch %d/%d done, step %d, loss %.4f", self.task, epoch + 1,
                        run.epochs, step, logs["loss"])
            if step >= run.total_steps:
                break

    def evaluate(self, run, model):
        """On this worker alone: every worker holds the same weights, so gets the same."""
        return self.evaluator(run.test_data)

    def finish(self, run, model):
        """One set of statistics everywhere, then a check that all weights are equal."""
        import numpy as np

        sync_non_trainable(self.strategy, model)
        digest = weights_digest(model)
        digests = all_gather_rows(self.strategy,
                                  np.frombuffer(bytes.fromhex(digest[:32]), ">i4").astype(np.int32))
        if any((row != digests[0]).any() for row in digests):
            raise RuntimeError(f"The workers' final weights differ ({self.task}: {digest[:16]}...). "
                               "This is a bug; the checkpoints of the chief are intact.")
        return {"num_workers": self.cluster.num_workers, "weights_digest": digest}


def train_multiworker(config, workdir, *, connect_timeout=None, collective_timeout=None):
    """`train_and_evaluate` across the workers of ``TF_CONFIG``.

    Every worker calls this with the same config. Outputs, resume and the returned
    dict are those of `keras_preact.training.train_and_evaluate`, written by the
    chief only (see the module doc), plus ``task`` ("worker 1"), ``is_chief``,
    ``num_workers`` and ``weights_digest`` (SHA-256 of the final weights; equal on
    every worker, which is checked).

    Args:
        config: a `TrainConfig` (or its dict) with ``strategy="multiworker"``.
        workdir: the run's folder (used by the chief; other workers do not touch it).
        connect_timeout, collective_timeout: seconds (see
            `make_multiworker_strategy`).

    Raises:
        ValueError: for a malformed ``TF_CONFIG``, an invalid config or options this
            loop does not support (``precision="mixed_float16"``, ``jit_compile``),
            a worker that cannot be reached in time, workers with different configs,
            a workdir of another run, or any error `train_and_evaluate` raises for
            bad input. Raised before anything is written.
        RuntimeError: if the workers' final weights differ (a bug, not bad input).
    """
    import keras

    config = as_config(config)
    unsupported = {
        "strategy": (config.strategy != "multiworker", "train_multiworker needs strategy='multiworker'"),
        "precision": (config.precision == "mixed_float16", "'mixed_float16' needs loss scaling, "
                      "which the multi-worker loop does not implement; use 'fp32' or 'mixed_bfloat16'"),
        "jit_compile": (config.jit_compile, "XLA is off under tf.distribute in Keras"),
        "cpu_devices": (config.cpu_devices, "it is for strategy='mirrored' on one host; each "
                        "worker uses its own devices"),
    }
    for name, (bad, why) in unsupported.items():
        if bad:
            raise ValueError(f"Unsupported {name} with the multi-worker loop: {why}. "
                             f"Received: {name}={getattr(config, name)!r}")
    cluster = parse_tf_config()
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "strategy='multiworker' runs on the TensorFlow backend (tf.distribute). "
            f"Received backend: {keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow, "
            "or use keras_preact.training.jax_parallel on JAX.")
    stepper = MultiWorkerStepper(cluster, connect_timeout=connect_timeout,
                                 collective_timeout=collective_timeout)
    return Run(config, workdir, stepper).train()


def load_outside_strategy(run, path, model, optimizer):
    """Loads a checkpoint into the strategy's `model` and `optimizer`, on the chief.

    ``load_weights`` inside the strategy's scope creates variables (each one a
    broadcast collective) on the chief only, which puts the chief's collectives out
    of step with the other workers' ("Collective instance ... expected type 0"). So
    a shadow copy is built and loaded outside the scope, and its values are assigned
    (no collective) to the strategy's variables, created in the same order.
    """
    from keras_preact.training.optimizers import make_optimizer

    config = run.config
    shadow = build_model(config, run.info)
    if config.freeze:
        from keras_preact import finetune

        finetune.freeze(shadow, list(config.freeze))
    shadow_optimizer = make_optimizer(config, run.spe)
    shadow.compile(optimizer=shadow_optimizer, loss="sparse_categorical_crossentropy")
    shadow_optimizer.build(shadow.trainable_variables)
    load_weights_file(shadow, path, config.model)
    targets = list(model.weights) + list(optimizer.variables)
    sources = list(shadow.weights) + list(shadow_optimizer.variables)
    if [tuple(v.shape) for v in targets] != [tuple(v.shape) for v in sources]:
        raise ValueError(f"The checkpoint {path} does not fit the model {config.model!r}.")
    for target, source in zip(targets, sources):
        target.assign(source.numpy())


def _shard_fn(global_ds, global_batch):
    """`distribute_datasets_from_function`'s input function: DATA sharding by batch
    slice (see the module doc)."""
    import tensorflow as tf

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
    import keras
    import tensorflow as tf

    def step_fn(x, y):
        with tf.GradientTape() as tape:
            probs = model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, probs)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hits = tf.equal(tf.cast(tf.argmax(probs, axis=-1), y.dtype), y)
        return loss, tf.reduce_sum(tf.cast(hits, tf.float32))

    @tf.function
    def train_step(iterator):
        x, y = next(iterator)
        loss, correct = strategy.run(step_fn, args=(x, y))
        total = tf.distribute.ReduceOp.SUM
        return strategy.reduce(total, loss, axis=None), strategy.reduce(total, correct, axis=None)

    return train_step


def _make_evaluator(model):
    """Loss and accuracy over a dataset on this worker alone (no collectives: every
    worker holds the same weights, so every worker gets the same numbers)."""
    import keras
    import tensorflow as tf

    @tf.function
    def batch(x, y):
        probs = model(x, training=False)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, probs))
        hits = tf.equal(tf.cast(tf.argmax(probs, axis=-1), y.dtype), y)
        return loss, tf.reduce_sum(tf.cast(hits, tf.float32)), tf.shape(y)[0]

    def evaluate(dataset):
        loss, correct, count = 0.0, 0.0, 0
        for x, y in dataset:
            a, b, n = batch(x, y)
            loss, correct, count = loss + float(a), correct + float(b), count + int(n)
        return {"loss": loss / max(count, 1), "accuracy": correct / max(count, 1)}

    return evaluate
