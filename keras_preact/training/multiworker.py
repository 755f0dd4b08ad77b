"""Multi-worker training on `tf.distribute.MultiWorkerMirroredStrategy` (TensorFlow).

Why a custom loop. In Keras 3.15.1 ``model.fit`` under `MultiWorkerMirroredStrategy`
fails before the first step: ``_maybe_symbolic_build`` reduces the first batch eagerly
and TensorFlow refuses to convert the ``PerReplica`` value to a tensor (keras issue
20585 is the same family). This module trains the same recipe with its own loop:
``strategy.run`` inside a `tf.function`, a `tf.GradientTape`, the per-example loss
averaged over the *global* batch (`tf.nn.compute_average_loss`), and the Keras
optimizer's ``apply_gradients``, which all-reduces (sums) the gradients across every
replica of every worker. The optimizer is the recipe's `CoupledSGD` with its
`WarmupPiecewiseConstant` schedule, the model is `build_model`'s, and the epoch
bookkeeping, checkpoints, metrics, curve and final model are those of
`keras_preact.training.run`, as for `model.fit`, so a workdir looks exactly like a
single-host one.

The cluster. Every worker runs the same command with its own ``TF_CONFIG``
(`keras_preact.training.distribute.parse_tf_config`): ``{"cluster": {"worker":
["host0:port", "host1:port"]}, "task": {"type": "worker", "index": i}}`` (a
``"chief"`` job of one task may be listed as well). Rank 0 -- the chief if there is
one, else worker 0 -- is the chief: it leads TensorFlow's coordination service, it
alone reads and writes the workdir, and it broadcasts its state (the resume epoch and
every model and optimizer variable) to the others, so the other workers need no shared
filesystem and write nothing (their ``workdir`` argument is not touched).

Data sharding: DATA, at the batch level. Every worker builds the same deterministic
pipeline (`keras_preact.data.make_dataset`, keyed by ``(seed, epoch)``) at the global
batch size and keeps only its slice of each global batch: worker ``k`` of ``n`` takes
rows ``k * B/n .. (k+1) * B/n - 1``. The union of the slices of step ``s`` is
exactly the single-process run's batch ``s``, so the run computes the single-process
update up to the order of the gradient summation (and BatchNorm, below). FILE
sharding does not apply: the pipeline reads in-memory arrays, not files, and
TensorFlow's auto-sharding is not used (`distribute_datasets_from_function`).

BatchNorm. As under `MirroredStrategy` (see `keras_preact.training.distribute`), each
replica normalises with its own share of the batch unless ``synchronized_bn=True``
(moments all-reduced across all workers every step: the single-process computation).
The moving statistics are updated by ``assign`` inside ``call`` on variables with
aggregation "none": each worker keeps its own copy, which drifts from the others'.
At every epoch end and before every evaluation the copies are all-reduced to their
mean across *all* workers (`sync_non_trainable`), so checkpoints, evaluation and the
saved model use one set of statistics and every worker holds identical weights; at
the end the workers compare a digest of all their weights and fail loudly if any
differs.

Failures stop within bounded time instead of hanging:

- a malformed ``TF_CONFIG`` raises ValueError before TensorFlow starts;
- the chief waits at most ``connect_timeout`` seconds for every other worker's port
  to accept a TCP connection (a worker's gRPC server listens while it waits to
  register), and the others wait at most 2 * ``connect_timeout`` + 10 s to register with
  the chief (TensorFlow's coordination service ``cluster_register_timeout``);
- workers exchange a per-field fingerprint of their training configs before the
  model is built: any difference is refused on every worker, naming the fields;
- a chief that refuses its workdir (another run's) tells the others in the same
  exchange, and they stop too;
- a worker that dies mid-run is detected by the coordination service's heartbeats
  (`HEARTBEAT_TIMEOUT_S`), and every collective is bounded by ``collective_timeout``
  seconds (`tf.distribute.experimental.CommunicationOptions`): the survivors raise
  and exit. Restart every worker with the same command to resume from the last
  completed epoch.

The timeouts default to `DEFAULT_CONNECT_TIMEOUT_S` and `DEFAULT_COLLECTIVE_TIMEOUT_S`
(`keras_preact.training.distribute.resolve_timeouts`); the environment variables
``KERAS_PREACT_CONNECT_TIMEOUT_S`` and ``KERAS_PREACT_COLLECTIVE_TIMEOUT_S`` override
them (runtime settings: they are not part of the config).
"""

import hashlib
import json
import logging
import os
import time
import zlib

from keras_preact.training.config import RUNTIME_FIELDS
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import make_multiworker_strategy
from keras_preact.training.distribute import parse_tf_config
from keras_preact.training.distribute import resolve_timeouts
from keras_preact.training.distribute import shorten
from keras_preact.training.run import EpochRecorder
from keras_preact.training.run import build_model
from keras_preact.training.run import check_workdir
from keras_preact.training.run import config_document
from keras_preact.training.run import dataset_info
from keras_preact.training.run import dataset_preprocessing
from keras_preact.training.run import optimizer_step
from keras_preact.training.run import weights_fingerprint
from keras_preact.training.run import write_reports
from keras_preact.training.workdir import CHECKPOINT_DIR
from keras_preact.training.workdir import CURVE_PNG
from keras_preact.training.workdir import METRICS_JSON
from keras_preact.training.workdir import Workdir
from keras_preact.files import atomic_save
from keras_preact.training.workdir import read_json

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
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if not isinstance(config, TrainConfig):
        raise ValueError(f"`config` must be a TrainConfig or its dict. Received: {type(config).__name__}")
    config.validate()
    if config.strategy != "multiworker":
        raise ValueError(f"train_multiworker needs strategy='multiworker'. Received: strategy={config.strategy!r}")
    if config.precision == "mixed_float16":
        raise ValueError(
            "precision='mixed_float16' needs loss scaling, which the multi-worker loop does "
            "not implement. Received: precision='mixed_float16'. Use 'fp32' or 'mixed_bfloat16'."
        )
    if config.jit_compile:
        raise ValueError(
            "jit_compile=True is not supported with strategy='multiworker' (Keras turns "
            "XLA off under tf.distribute). Received: jit_compile=True"
        )
    if config.cpu_devices:
        raise ValueError(
            "cpu_devices is for strategy='mirrored' on one host; each multi-worker worker "
            f"uses its own devices. Received: cpu_devices={config.cpu_devices}"
        )
    cluster = parse_tf_config()
    connect_timeout, collective_timeout = resolve_timeouts(connect_timeout, collective_timeout)
    task = f"{cluster.task_type} {cluster.task_index}"

    import keras

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "strategy='multiworker' runs on the TensorFlow backend (tf.distribute). "
            f"Received backend: {keras.backend.backend()!r}. Set KERAS_BACKEND=tensorflow, "
            "or use keras_preact.training.jax_parallel on JAX."
        )
    import numpy as np
    import tensorflow as tf

    from keras_preact import data
    from keras_preact.training import distribute
    from keras_preact.training.optimizers import make_optimizer

    # What can fail on this worker's input without TensorFlow runs before it joins
    # (a worker that fails here never registers; the others stop at their connect
    # timeout). TensorFlow's collective runtime must be set up before the first
    # TensorFlow op, so the strategy comes next and the data after it: a worker
    # that fails later exits, and the others see it through the heartbeats.
    workdir = Workdir(workdir)
    state, refused = None, None
    if cluster.is_chief:
        try:
            state = check_workdir(config, workdir)
        except ValueError as err:
            refused = err  # told to the other workers below, then raised
    info = dataset_info(config.dataset, config.data_path)
    distribute.configure_runtime(
        intra_op_threads=config.intra_op_threads,
        inter_op_threads=config.inter_op_threads,
        deterministic=config.deterministic,
    )
    strategy = make_multiworker_strategy(
        cluster, connect_timeout=connect_timeout, collective_timeout=collective_timeout
    )
    replicas = strategy.num_replicas_in_sync
    distribute.check_global_batch(config.batch_size, replicas)

    def data_kwargs(**changes):
        return {**dict(
            batch_size=config.batch_size, data_dir=config.data_dir, source=config.data_source,
            path=config.data_path, download=config.download, seed=config.seed,
            normalize=not config.model_normalizes(),
        ), **changes}

    test_ds = data.make_dataset(config.dataset, "test", shuffle=False, augment=False,
                                drop_remainder=False, **data_kwargs())
    num_train = int(data.make_dataset(config.dataset, "train", augment=config.augment,
                                      drop_remainder=True, **data_kwargs(batch_size=1)).cardinality())
    num_test = int(data.make_dataset(config.dataset, "test", shuffle=False, augment=False,
                                     drop_remainder=False, **data_kwargs(batch_size=1)).cardinality())
    spe = num_train // config.batch_size
    if spe < 1:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {config.dataset!r} "
            f"training split ({num_train} images)."
        )
    sched = config.resolve_schedule(spe)
    epochs, total_steps = sched["epochs"], sched["total_steps"]
    complete = bool(
        state is not None and state.get("complete") and os.path.exists(workdir.final_model_path)
    )
    start_epoch = state["epoch"] if state else 0
    if start_epoch > epochs and refused is None:
        refused = ValueError(
            f"The workdir's checkpoint is at epoch {start_epoch}, past this run's "
            f"{epochs} epochs; the workdir does not belong to this run."
        )

    # The start-of-run exchange: status, resume epoch, rank and the config fields.
    names, crcs = config_fields_fingerprint(config)
    status = _STATUS_OK
    if refused is not None:
        status = _STATUS_WORKDIR_REFUSED
    elif complete:
        status = _STATUS_COMPLETE
    rows = all_gather_rows(strategy, [status, start_epoch, cluster.rank] + crcs)
    rows_by_rank = {int(r[2]): r for r in rows}
    differ = sorted({names[i] for r in rows for i, c in enumerate(r[3:]) if c != crcs[i]})
    if differ:
        raise ValueError(
            f"The workers were started with different training configs (fields {differ} "
            f"differ; this is {task}). Every worker must run the same command; only "
            f"{list(WORKER_LOCAL_FIELDS)} may differ between hosts. Nothing was written."
        )
    chief_row = rows_by_rank[0]
    if refused is not None:
        raise refused
    if int(chief_row[0]) == _STATUS_WORKDIR_REFUSED:
        raise ValueError(
            f"The chief refused its workdir (see the chief's error); {task} stops too. "
            "Nothing was written."
        )
    if int(chief_row[0]) == _STATUS_COMPLETE:
        if cluster.is_chief:
            metrics = read_json(workdir.file(METRICS_JSON))
            logger.info("The run in %s is complete; returning its results.", workdir.path)
            return {
                "test_accuracy": metrics.get("test_accuracy"), "test_loss": metrics.get("test_loss"),
                "history": metrics["epochs"], "epochs": state["epoch"], "steps": state["step"],
                "resumed_from_epoch": None, "train_time_s": 0.0,
                "num_replicas": metrics.get("num_replicas"), "model_path": workdir.final_model_path,
                "workdir": workdir.path, "task": task, "is_chief": True,
                "num_workers": cluster.num_workers, "weights_digest": None,
            }
        return {
            "test_accuracy": float("nan"), "test_loss": float("nan"), "history": [],
            "epochs": None, "steps": None, "resumed_from_epoch": None, "train_time_s": 0.0,
            "num_replicas": replicas, "model_path": None, "workdir": None, "task": task,
            "is_chief": False, "num_workers": cluster.num_workers, "weights_digest": None,
        }
    start_epoch = int(chief_row[1])
    history = list(state["history"]) if (cluster.is_chief and state) else []

    distribute.seed_everything(config.seed)
    with strategy.scope():
        model = build_model(config, info)
        if config.synchronized_bn:
            distribute.set_synchronized_batch_norm(model, True)
        if getattr(config, "freeze", ()):
            from keras_preact import finetune

            finetune.freeze(model, list(config.freeze))
        optimizer = make_optimizer(config, spe)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        )
        optimizer.build(model.trainable_variables)
        fingerprint = weights_fingerprint(model)
    if cluster.is_chief and state is not None:
        ckpt = workdir.file(CHECKPOINT_DIR, state["checkpoint"])
        stored_print = state.get("fingerprint")
        if stored_print is not None and stored_print != fingerprint:
            # Cannot happen for an accepted config (the config fixes the model);
            # stop every worker rather than train from the wrong weights.
            raise ValueError(
                f"The checkpoint {ckpt} does not fit the model {config.model!r}. "
                "Nothing was changed. Use a new --workdir."
            )
        _load_checkpoint_outside_strategy(config, info, spe, ckpt, model, optimizer)
        logger.info("Resuming %s from epoch %d (step %d) in %s.",
                    config.model, start_epoch, state["step"], workdir.path)
    if cluster.is_chief and state is None and getattr(config, "weights", None) is not None:
        from keras_preact import finetune

        # Outside the scope (see _load_checkpoint_outside_strategy); the chief's
        # copy reaches the other workers with the broadcast below.
        finetune.load_pretrained(model, config.weights, model_name=config.model)
    # One starting point everywhere: the chief's (fresh or resumed) variables.
    broadcast_from_chief(strategy, list(model.weights) + list(optimizer.variables))

    schedule_info = {**sched, "num_replicas": replicas,
                     "per_replica_batch": config.batch_size // replicas,
                     "num_workers": cluster.num_workers}
    if cluster.is_chief:
        for path in workdir.remove_stale_temporaries():
            logger.info("Removed %s (a write interrupted by a crash).", path)
        if state is None:
            os.makedirs(workdir.path, exist_ok=True)
            workdir.write_config(config_document(config))
            write_reports(workdir, config, history, schedule_info=schedule_info)
        recorder = EpochRecorder(config=config, workdir=workdir, schedule=config.make_schedule(spe),
                                 history=history, fingerprint=fingerprint)

    train_step = _make_train_step(strategy, model, optimizer, config.batch_size)
    evaluate = _make_evaluator(model)
    t0 = time.time()
    step = optimizer_step(optimizer)

    def train_epochs(step):
        """The remaining epochs; returns the optimizer step reached."""
        if start_epoch < epochs:
            train_ds = data.make_dataset(
                config.dataset, "train", augment=config.augment, epoch=start_epoch,
                drop_remainder=True, repeat_epochs=epochs - start_epoch, **data_kwargs(),
            )
            dist_ds = strategy.distribute_datasets_from_function(
                _shard_fn(train_ds, config.batch_size)
            )
            iterator = iter(dist_ds)
            for epoch in range(start_epoch, epochs):
                if cluster.is_chief:
                    recorder.epoch_begin()
                steps_now = min(spe, total_steps - step)
                bar = None
                if cluster.is_chief and config.verbose not in (0,):
                    bar = keras.utils.Progbar(steps_now, verbose=1 if config.verbose in ("auto", 1) else 2)
                    logger.info("Epoch %d/%d", epoch + 1, epochs)
                loss_sum, correct_sum = 0.0, 0.0
                for i in range(steps_now):
                    loss, correct = train_step(iterator)
                    loss_sum += float(loss)
                    correct_sum += float(correct)
                    if bar is not None:
                        bar.update(i + 1, [("loss", loss_sum / (i + 1)),
                                           ("accuracy", correct_sum / ((i + 1) * config.batch_size))])
                step += steps_now
                # The iterator is shared by all epochs: skip the batches of a cut epoch.
                for _ in range(spe - steps_now):
                    next(iterator)
                sync_non_trainable(strategy, model)
                logs = {"loss": loss_sum / max(steps_now, 1),
                        "accuracy": correct_sum / max(steps_now * config.batch_size, 1)}
                if config.eval_every and (epoch + 1) % config.eval_every == 0:
                    val = evaluate(test_ds)
                    logs.update(val_loss=val["loss"], val_accuracy=val["accuracy"])
                if cluster.is_chief:
                    recorder.epoch_end(model, epoch, logs)
                logger.info("%s: epoch %d/%d done, step %d, loss %.4f", task, epoch + 1, epochs,
                            step, logs["loss"])
                if step >= total_steps:
                    break
        return step

    try:
        step = train_epochs(step)
    except tf.errors.OpError as err:
        last = workdir.read_state() if cluster.is_chief else None
        raise ClusterError(
            f"{task}: training stopped because another worker failed or stopped "
            f"responding ({type(err).__name__}: {shorten(err, 300)}). Restart every "
            "worker with the same command to resume from the last completed epoch"
            + (f" ({last['epoch']})." if last else ".")
        ) from None
    train_time = time.time() - t0

    sync_non_trainable(strategy, model)
    digest = weights_digest(model)
    digests = all_gather_rows(strategy, np.frombuffer(bytes.fromhex(digest[:32]), ">i4").astype(np.int32))
    if any((row != digests[0]).any() for row in digests):
        raise RuntimeError(
            f"The workers' final weights differ ({task}: {digest[:16]}...). This is a bug; "
            "the checkpoints of the chief are intact."
        )
    results = evaluate(test_ds)
    final = {
        "test_accuracy": results["accuracy"], "test_loss": results["loss"],
        "num_train_examples": num_train, "num_test_examples": num_test,
        "num_params": int(model.count_params()), "num_replicas": replicas,
        "num_workers": cluster.num_workers,
        "input_normalization": {"in_model": config.model_normalizes(),
                                **dataset_preprocessing(info)},
        "schedule": schedule_info,
        "model_path": os.path.basename(workdir.final_model_path), "curve_path": CURVE_PNG,
        "weights_digest": digest,
    }
    epochs_done, steps_done = None, optimizer_step(optimizer)
    if cluster.is_chief:
        atomic_save(workdir.final_model_path, model.save)
        state = workdir.read_state()
        write_reports(workdir, config, history, schedule_info=schedule_info, final=final)
        workdir.write_state({**{k: v for k, v in state.items() if k != "format"}, "complete": True})
        epochs_done, steps_done = state["epoch"], state["step"]
    return {
        "test_accuracy": final["test_accuracy"], "test_loss": final["test_loss"],
        "history": history, "epochs": epochs_done, "steps": steps_done,
        "resumed_from_epoch": start_epoch, "train_time_s": train_time, "num_replicas": replicas,
        "model_path": workdir.final_model_path if cluster.is_chief else None,
        "workdir": workdir.path if cluster.is_chief else None, "task": task,
        "is_chief": cluster.is_chief, "num_workers": cluster.num_workers,
        "weights_digest": digest,
    }


def _load_checkpoint_outside_strategy(config, info, spe, path, model, optimizer):
    """Loads a checkpoint into the strategy's `model` and `optimizer`, on the chief.

    ``load_weights`` inside the strategy's scope creates variables (each one a
    broadcast collective) on the chief only, which puts the chief's collectives out
    of step with the other workers' ("Collective instance ... expected type 0"). So
    a shadow copy is built and loaded outside the scope, and its values are assigned
    (no collective) to the strategy's variables, created in the same order.
    """
    from keras_preact.training.optimizers import make_optimizer

    shadow = build_model(config, info)
    if getattr(config, "freeze", ()):
        from keras_preact import finetune

        finetune.freeze(shadow, list(config.freeze))
    shadow_optimizer = make_optimizer(config, spe)
    shadow.compile(optimizer=shadow_optimizer, loss="sparse_categorical_crossentropy")
    shadow_optimizer.build(shadow.trainable_variables)
    try:
        shadow.load_weights(path)
    except Exception as err:  # Keras raises several types for a mismatch.
        raise ValueError(
            f"The checkpoint {path} does not fit the model {config.model!r} "
            f"({type(err).__name__}: {shorten(err, 300)}). Nothing was changed. "
            "Use a new --workdir."
        ) from None
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
