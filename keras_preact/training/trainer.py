"""`train_and_evaluate`: one crash-safe training run with `model.fit` (TensorFlow).

Resume. After every epoch the model and optimizer variables (momentum slots and the
iteration counter, which drives the learning-rate schedule) are written to a
checkpoint, then `checkpoints/state.json` is replaced to point at it (see
`keras_preact.training.workdir`). Restarting the same run loads that checkpoint and
calls `fit(initial_epoch=e)` on a dataset built with ``epoch=e``: the data pipeline's
order and augmentation of epoch ``e`` depend only on ``(seed, e)``, and the schedule
only on the restored iteration count, so the resumed run continues exactly where an
uninterrupted one would be. Work done in an interrupted epoch is lost, no completed
epoch is. With ``deterministic=True`` (TensorFlow op determinism, fixed seeds) the
resumed run's final weights equal the uninterrupted run's.

A workdir belongs to one config: a restart with any other model, data or recipe
setting is refused before anything is written (`RUNTIME_FIELDS` -- paths, thread
counts, verbosity -- may change).
"""

import logging
import os
import time

from keras_preact import private_api
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import average_replica_statistics
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
from keras_preact.training.workdir import TENSORBOARD_DIR
from keras_preact.training.workdir import Workdir
from keras_preact.files import atomic_save
from keras_preact.training.workdir import read_json

logger = logging.getLogger("keras_preact.training")

#: Fewer steps than this in an epoch get a warning: every epoch ends with a checkpoint,
#: the reports and (with eval_every) a test evaluation, which then outweigh training.
FEW_STEPS_PER_EPOCH = 10


def _make_callbacks(keras, *, config, workdir, schedule, spe, history, total_steps,
                    fingerprint):
    recorder = EpochRecorder(config=config, workdir=workdir, schedule=schedule,
                             history=history, fingerprint=fingerprint)

    class EpochCheckpoint(keras.callbacks.Callback):
        """`EpochRecorder` after every completed epoch."""

        def on_epoch_begin(self, epoch, logs=None):
            recorder.epoch_begin()

        def on_epoch_end(self, epoch, logs=None):
            recorder.epoch_end(self.model, epoch, logs)

    class StopAtStep(keras.callbacks.Callback):
        """Ends training at the schedule's last step, even inside an epoch."""

        def on_train_batch_end(self, batch, logs=None):
            if optimizer_step(self.model.optimizer) >= total_steps:
                self.model.stop_training = True

    class AverageReplicaStatistics(keras.callbacks.Callback):
        """One set of BatchNorm moving statistics across replicas (see
        `distribute.average_replica_statistics`); a no-op on one device."""

        def on_test_begin(self, logs=None):
            average_replica_statistics(self.model)

        def on_epoch_end(self, epoch, logs=None):
            average_replica_statistics(self.model)

    # Averaging runs before the checkpoint is written (callbacks run in order).
    callbacks = [AverageReplicaStatistics(), EpochCheckpoint(), StopAtStep()]
    import importlib.util

    if importlib.util.find_spec("tensorboard") is not None:
        callbacks.append(
            keras.callbacks.TensorBoard(
                log_dir=workdir.file(TENSORBOARD_DIR), write_graph=False, profile_batch=0
            )
        )
    else:
        # tf.summary needs the tensorboard package; everything else works without.
        logger.warning(
            "The tensorboard package is not installed: no TensorBoard logs in %s "
            "(pip install tensorboard).", workdir.file(TENSORBOARD_DIR),
        )
    return callbacks


def train_and_evaluate(config, workdir):
    """Trains `config`'s model on its dataset, resuming what `workdir` holds.

    Writes into `workdir`: ``config.json``; ``checkpoints/`` (a checkpoint per
    completed epoch, the newest `keep_checkpoints` kept, and ``state.json``);
    ``metrics.json`` (per-epoch entries, then the final ``test_accuracy`` and
    ``test_loss``); ``metrics.csv``; ``tensorboard/``; ``training_curve.png``; and the
    final model ``model.keras``. Progress bars come from `fit` (``verbose``).

    Args:
        config: a `TrainConfig` (or its dict).
        workdir: a folder: new or empty, or one holding this same run (it is then
            resumed from its last completed epoch, or its stored results returned if
            it is complete).

    Returns:
        dict: ``test_accuracy``, ``test_loss``, ``history`` (per-epoch dicts),
        ``epochs``, ``steps``, ``resumed_from_epoch`` (0 for a fresh start, None
        when the run was already complete), ``train_time_s``, ``num_replicas``,
        ``model_path`` and ``workdir``.

    Raises:
        ValueError: for an invalid config (unknown model or dataset, ...), missing
            or corrupt data, a workdir holding a different run or another model's
            checkpoint, a batch size that does not divide across the replicas, or
            strategy "tpu" without a TPU. Raised before anything in `workdir` is
            written or overwritten.
        WorkdirInUseError: if another process is training in `workdir` (each run
            holds its lock); nothing was changed.

    Example:
        >>> from keras_preact.training import TrainConfig, train_and_evaluate
        >>> result = train_and_evaluate(
        ...     TrainConfig(model="preact_resnet20", dataset="digits", epochs=8,
        ...                 batch_size=32, lr_scaling="sqrt", seed=0), "runs/digits")
        >>> result["test_accuracy"] > 0.97
        True
    """
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if not isinstance(config, TrainConfig):
        raise ValueError(
            f"`config` must be a TrainConfig or its dict. Received: {type(config).__name__}"
        )
    config.validate()
    if config.strategy == "multiworker":
        # model.fit fails under MultiWorkerMirroredStrategy in Keras 3: own loop.
        from keras_preact.training.multiworker import train_multiworker

        return train_multiworker(config, workdir)
    workdir = Workdir(workdir)
    with workdir.lock():
        return _train_locked(config, workdir)


def _train_locked(config, workdir):
    """`train_and_evaluate` of a validated config while this process holds `workdir`."""
    state = check_workdir(config, workdir)
    if state is not None and state.get("complete") and os.path.exists(workdir.final_model_path):
        metrics = read_json(workdir.file(METRICS_JSON))
        if "test_accuracy" in metrics:
            logger.info("The run in %s is complete; returning its results.", workdir.path)
            return {
                "test_accuracy": metrics["test_accuracy"],
                "test_loss": metrics["test_loss"],
                "history": metrics["epochs"],
                "epochs": state["epoch"],
                "steps": state["step"],
                "resumed_from_epoch": None,
                "train_time_s": 0.0,
                "num_replicas": metrics.get("num_replicas"),
                "model_path": workdir.final_model_path,
                "workdir": workdir.path,
            }

    import keras

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "train_and_evaluate runs on the TensorFlow backend (tf.data and "
            f"tf.distribute). Received backend: {keras.backend.backend()!r}. "
            "Set KERAS_BACKEND=tensorflow."
        )
    from keras_preact.training import distribute
    from keras_preact.training.optimizers import make_optimizer
    from keras_preact.weights.local import first_difference

    distribute.configure_runtime(
        cpu_devices=config.cpu_devices,
        intra_op_threads=config.intra_op_threads,
        inter_op_threads=config.inter_op_threads,
        deterministic=config.deterministic,
    )
    strategy = distribute.make_strategy(config.strategy)
    replicas = strategy.num_replicas_in_sync
    distribute.check_global_batch(config.batch_size, replicas)

    from keras_preact import data

    info = dataset_info(config.dataset, config.data_path)

    def data_kwargs():
        return dict(
            batch_size=config.batch_size,
            data_dir=config.data_dir,
            source=config.data_source,
            path=config.data_path,
            download=config.download,
            seed=config.seed,
            normalize=not config.model_normalizes(),
        )

    # Data first: missing or corrupt files fail here, before the workdir is touched.
    test_ds = data.make_dataset(
        config.dataset, "test", shuffle=False, augment=False, drop_remainder=False,
        **data_kwargs(),
    )
    # Steps per epoch from the files actually read (not the published split size).
    one_epoch = data.make_dataset(
        config.dataset, "train", augment=config.augment, drop_remainder=True,
        **{**data_kwargs(), "batch_size": 1},
    )
    num_train = int(one_epoch.cardinality())
    num_test = int(
        data.make_dataset(
            config.dataset, "test", shuffle=False, augment=False, drop_remainder=False,
            **{**data_kwargs(), "batch_size": 1},
        ).cardinality()
    )
    spe, dropped = divmod(num_train, config.batch_size)
    if spe < 1:
        raise ValueError(
            f"batch_size={config.batch_size} is larger than the {config.dataset!r} "
            f"training split ({num_train} images)."
        )
    # Batches are whole (drop_remainder=True): say so rather than lose images silently.
    if dropped:
        logger.warning("Training drops the last %d of %d training images each epoch (batch %d).",
                       dropped, num_train, config.batch_size)
    if spe < FEW_STEPS_PER_EPOCH:
        logger.warning(
            "An epoch is only %d step(s) (%d training images at batch %d): its checkpoint "
            "and evaluation cost more than its training; a smaller batch size gives more steps.",
            spe, num_train, config.batch_size,
        )
    sched = config.resolve_schedule(spe)
    epochs, total_steps = sched["epochs"], sched["total_steps"]
    start_epoch = state["epoch"] if state else 0
    history = list(state["history"]) if state else []
    if start_epoch > epochs:
        raise ValueError(
            f"The workdir's checkpoint is at epoch {start_epoch}, past this run's "
            f"{epochs} epochs; the workdir does not belong to this run."
        )
    train_ds = None
    if start_epoch < epochs:
        train_ds = data.make_dataset(
            config.dataset, "train", augment=config.augment, epoch=start_epoch,
            drop_remainder=True, repeat_epochs=epochs - start_epoch, **data_kwargs(),
        )
        expected = (epochs - start_epoch) * spe
        if int(train_ds.cardinality()) != expected:
            raise ValueError(
                f"The training data yields {int(train_ds.cardinality())} batches for "
                f"{epochs - start_epoch} epochs, expected {expected}."
            )

    distribute.seed_everything(config.seed)

    with strategy.scope():
        model = build_model(config, info)
        if config.synchronized_bn:
            # Switched on the built layers rather than through the constructor, so
            # the saved model's config stays free of a TensorFlow-only training
            # setting (it loads on every backend).
            distribute.set_synchronized_batch_norm(model, True)
        if getattr(config, "freeze", ()):
            from keras_preact import finetune

            # Before compiling, so the optimizer holds only the trainable part.
            finetune.freeze(model, list(config.freeze))
        if state is None and getattr(config, "weights", None) is not None:
            from keras_preact import finetune

            loaded = finetune.load_pretrained(model, config.weights, model_name=config.model)
            logger.info(
                "Fine-tuning from %s (%s).", loaded["source"],
                "classifier loaded too" if loaded["copied_head"] else "new classifier",
            )
        optimizer = make_optimizer(config, spe)
        if config.precision == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            jit_compile=bool(config.jit_compile),
        )
        optimizer.build(model.trainable_variables)
        fingerprint = weights_fingerprint(model)
        if state is not None:
            ckpt = workdir.file(CHECKPOINT_DIR, state["checkpoint"])
            stored_print = state.get("fingerprint")
            if stored_print is not None and stored_print != fingerprint:
                first, stored, built = first_difference(stored_print, fingerprint)
                raise ValueError(
                    f"The checkpoint {ckpt} does not fit the model {config.model!r}: it "
                    f"holds {len(stored_print)} variables, the model {len(fingerprint)}; "
                    f"the first difference is variable {first} (checkpoint: {stored}, "
                    f"model: {built}). Nothing was changed. Use a new --workdir."
                )
            try:
                model.load_weights(ckpt)
            except Exception as err:  # Keras raises several types for a mismatch.
                raise ValueError(
                    f"The checkpoint {ckpt} does not fit the model {config.model!r} "
                    f"({type(err).__name__}: {shorten(err, 400)}). "
                    "Nothing was changed. Use a new --workdir."
                ) from None
            if optimizer_step(optimizer) != int(state["step"]):
                raise ValueError(
                    f"The checkpoint {ckpt} holds {optimizer_step(optimizer)} optimizer "
                    f"steps but its state says {state['step']}; refusing to resume."
                )
            logger.info(
                "Resuming %s from epoch %d (step %d) in %s.",
                config.model, start_epoch, state["step"], workdir.path,
            )

    schedule_info = {**sched, "num_replicas": replicas,
                     "per_replica_batch": config.batch_size // replicas}
    for path in workdir.remove_stale_temporaries():
        logger.info("Removed %s (a write interrupted by a crash).", path)
    if state is None:
        # The first write: everything that can fail on bad input has run by now.
        os.makedirs(workdir.path, exist_ok=True)
        workdir.write_config(config_document(config))
        write_reports(workdir, config, history, schedule_info=schedule_info)

    t0 = time.time()
    if start_epoch < epochs:
        callbacks = _make_callbacks(
            keras, config=config, workdir=workdir, schedule=config.make_schedule(spe),
            spe=spe, history=history, total_steps=total_steps, fingerprint=fingerprint,
        )
        model.fit(
            train_ds,
            epochs=epochs,
            initial_epoch=start_epoch,
            steps_per_epoch=spe,
            shuffle=False,  # the pipeline shuffles, keyed by (seed, epoch)
            validation_data=test_ds if config.eval_every else None,
            validation_freq=max(1, config.eval_every),
            callbacks=callbacks,
            verbose=config.verbose,
        )
    train_time = time.time() - t0

    average_replica_statistics(model)
    results = model.evaluate(test_ds, return_dict=True, verbose=config.verbose)
    atomic_save(workdir.final_model_path, model.save)
    state = workdir.read_state()
    final = {
        "test_accuracy": float(results["accuracy"]),
        "test_loss": float(results["loss"]),
        "num_train_examples": num_train,
        "num_test_examples": num_test,
        "num_params": int(model.count_params()),
        "num_replicas": replicas,
        "input_normalization": {
            "in_model": config.model_normalizes(),
            **dataset_preprocessing(info),
        },
        "schedule": schedule_info,
        "model_path": os.path.basename(workdir.final_model_path),
        "curve_path": CURVE_PNG,
    }
    write_reports(workdir, config, history, schedule_info=schedule_info, final=final)
    workdir.write_state({**{k: v for k, v in state.items() if k != "format"}, "complete": True})
    return {
        "test_accuracy": final["test_accuracy"],
        "test_loss": final["test_loss"],
        "history": history,
        "epochs": state["epoch"],
        "steps": state["step"],
        "resumed_from_epoch": start_epoch,
        "train_time_s": train_time,
        "num_replicas": replicas,
        "model_path": workdir.final_model_path,
        "workdir": workdir.path,
    }


def has_preprocessing_layer(model):
    """Whether `model` normalises raw pixels itself (an `ImageNormalization` layer)."""
    from keras_preact.layers.preprocessing import ImageNormalization

    return any(
        isinstance(layer, ImageNormalization)
        for layer in private_api.flatten_layers(model)
    )


def _load_weights(model, path, label):
    try:
        model.load_weights(path)
    except OSError as err:  # h5py's error for a truncated or damaged file names no file
        raise ValueError(
            f"The weights file {path} cannot be read ({shorten(err, 400)}): it is damaged or "
            "incomplete (an interrupted copy?); copy it again."
        ) from None
    except Exception as err:  # Keras raises several types for a mismatch.
        raise ValueError(
            f"The weights {path} do not fit {label!r} ({type(err).__name__}: "
            f"{shorten(err, 400)})."
        ) from None


def load_workdir_model(workdir):
    """The trained model of a workdir: ``model.keras``, else its newest checkpoint.

    Returns:
        ``(model, config, source_path)``.

    Raises:
        ValueError: if the workdir holds no run or no weights.
    """
    import keras

    wd = Workdir(workdir)
    stored = wd.read_config()
    if stored is None or "train_config" not in stored:
        raise ValueError(
            f"No training run in {wd.path} (config.json missing). Received: workdir={workdir!r}"
        )
    config = TrainConfig.from_dict(stored["train_config"])
    if os.path.exists(wd.final_model_path):
        return keras.saving.load_model(wd.final_model_path, compile=False), config, wd.final_model_path
    state = wd.read_state()
    if state is None:
        raise ValueError(f"The run in {wd.path} has no completed epoch to evaluate yet.")
    model = build_model(config, dataset_info(config.dataset, config.data_path))
    ckpt = wd.file(CHECKPOINT_DIR, state["checkpoint"])
    _load_weights(model, ckpt, config.model)
    return model, config, ckpt


def evaluate(workdir=None, *, model=None, weights=None, dataset=None, data_dir=None,
             data_source="auto", data_path=None, batch_size=256, split="test",
             model_kwargs=None, verbose="auto"):
    """Loss and accuracy of a trained model on a dataset split.

    Either `workdir` (its final model, or newest checkpoint, and its dataset) or
    `model` + `weights` + `dataset`.

    Args:
        workdir: a training workdir.
        model: a model name (with `weights`) or a built Keras model.
        weights: path to ``.keras`` or ``.weights.h5`` (for a model name).
        dataset: dataset name (default: the workdir's).
        data_dir, data_source, data_path: see `keras_preact.data.make_dataset`
            (default: the workdir's).
        batch_size: int, default 256.
        split: default "test".
        model_kwargs: extra `get_model` arguments for a model name.
        verbose: Keras verbosity, default "auto".

    Returns:
        dict: ``loss``, ``accuracy``, ``num_examples``, ``dataset``, ``split``,
        ``source`` (what was loaded).

    Raises:
        ValueError: for a missing workdir / weights file, an unknown model or
            dataset, or weights that do not fit the model.
    """
    import keras

    import keras_preact
    from keras_preact import data

    if workdir is not None:
        net, config, source = load_workdir_model(workdir)
        dataset = dataset or config.dataset
        data_dir = data_dir if data_dir is not None else config.data_dir
        data_path = data_path if data_path is not None else config.data_path
        if data_source == "auto":
            data_source = config.data_source
    else:
        if dataset is None or (model is None and weights is None):
            raise ValueError(
                "Give `workdir`, or `dataset` with `weights` (a .keras file, or a "
                "model name and its .weights.h5). Received: workdir=None, "
                f"model={model!r}, weights={weights!r}, dataset={dataset!r}"
            )
        if dataset not in data.list_datasets():
            raise ValueError(
                f"Unknown dataset. Received: dataset={dataset!r}. Valid: {data.list_datasets()}"
            )
        if weights is not None and not os.path.isfile(weights):
            raise ValueError(f"Weights file not found. Received: weights={weights!r}")
        source = weights
        if model is not None and not isinstance(model, str):
            net = model
            if weights is not None:
                _load_weights(net, weights, getattr(net, "name", "the model"))
        elif weights is not None and str(weights).endswith(".keras"):
            from keras_preact.weights.local import load_keras_file

            net = load_keras_file(weights)
        else:
            if model not in keras_preact.list_models():
                raise ValueError(
                    f"Unknown model. Received: model={model!r}. Valid: {keras_preact.list_models()}"
                )
            info = dataset_info(dataset, data_path)
            kwargs = dict(model_kwargs or {})
            kwargs.setdefault("classes", info["num_classes"])
            kwargs.setdefault("input_shape", tuple(info["image_shape"]))
            # As `train` builds it (the layer has no weights, so weights trained
            # either way load).
            kwargs.setdefault("preprocessing", dataset_preprocessing(info))
            net = keras_preact.get_model(model, **kwargs)
            if weights is not None:
                _load_weights(net, weights, model)
    ds = data.make_dataset(
        dataset, split, batch_size=batch_size, data_dir=data_dir, source=data_source,
        path=data_path, shuffle=False, augment=False, drop_remainder=False,
        normalize=not has_preprocessing_layer(net),
    )
    net.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
    )
    results = net.evaluate(ds, return_dict=True, verbose=verbose)
    n = int(
        data.make_dataset(
            dataset, split, batch_size=1, data_dir=data_dir, source=data_source,
            path=data_path, shuffle=False, augment=False, drop_remainder=False,
        ).cardinality()
    )
    return {
        "loss": float(results["loss"]),
        "accuracy": float(results["accuracy"]),
        "num_examples": n,
        "dataset": dataset,
        "split": split,
        "source": source,
    }
