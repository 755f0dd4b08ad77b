"""Training with Keras ``fit`` (`FitStepper`), `train_and_evaluate`, `evaluate`.

`train_and_evaluate` is the entry point of every TensorFlow run: a `Run` (see
`keras_preact.training.run` for resume and the workdir's files) driven by `FitStepper`
on one host, or by `MultiWorkerStepper` for ``strategy="multiworker"``.
"""

import functools
import logging
import os

from keras_preact import private_api
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import average_replica_statistics
from keras_preact.training.run import Run
from keras_preact.training.run import Stepper
from keras_preact.training.run import as_config
from keras_preact.training.run import build_model
from keras_preact.training.run import compile_model
from keras_preact.training.run import dataset_info
from keras_preact.training.run import dataset_preprocessing
from keras_preact.training.run import load_weights_file
from keras_preact.training.run import optimizer_step
from keras_preact.training.workdir import CHECKPOINT_DIR
from keras_preact.training.workdir import TENSORBOARD_DIR
from keras_preact.training.workdir import Workdir

logger = logging.getLogger("keras_preact.training")


class FitStepper(Stepper):
    """Epochs by ``model.fit`` under the config's tf.distribute strategy (one host)."""

    def start(self, run):
        import keras

        from keras_preact.training import distribute

        if keras.backend.backend() != "tensorflow":
            raise ValueError(
                "train_and_evaluate runs on the TensorFlow backend (tf.data and "
                f"tf.distribute). Received backend: {keras.backend.backend()!r}. "
                "Set KERAS_BACKEND=tensorflow.")
        c = run.config
        distribute.configure_runtime(cpu_devices=c.cpu_devices, intra_op_threads=c.intra_op_threads,
                                     inter_op_threads=c.inter_op_threads, deterministic=c.deterministic)
        self.strategy = distribute.make_strategy(c.strategy)
        self.replicas = self.strategy.num_replicas_in_sync
        distribute.check_global_batch(c.batch_size, self.replicas)

    def scope(self):
        return self.strategy.scope()

    def callbacks(self, run, recorder):
        """The epoch recorder, the stop at the schedule's last step, one set of replica
        statistics (before the checkpoint: callbacks run in order) and TensorBoard."""
        import keras

        class Record(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                recorder.epoch_begin()

            def on_epoch_end(self, epoch, logs=None):
                average_replica_statistics(self.model)
                recorder.epoch_end(self.model, epoch, logs)

            def on_test_begin(self, logs=None):
                average_replica_statistics(self.model)

            def on_train_batch_end(self, batch, logs=None):
                if optimizer_step(self.model.optimizer) >= run.total_steps:
                    self.model.stop_training = True

        callbacks = [Record()]
        if run.owns_files:
            callbacks.append(keras.callbacks.TensorBoard(
                log_dir=run.workdir.file(TENSORBOARD_DIR), write_graph=False, profile_batch=0))
        return callbacks

    def train_epochs(self, run, model, start_epoch, recorder):
        c, remaining = run.config, run.epochs - start_epoch
        train = run.train_data(epoch=start_epoch, repeat_epochs=remaining)
        if int(train.cardinality()) != remaining * run.spe:
            raise ValueError(f"The training data yields {int(train.cardinality())} batches for "
                             f"{remaining} epochs, expected {remaining * run.spe}.")
        model.fit(
            train, epochs=run.epochs, initial_epoch=start_epoch, steps_per_epoch=run.spe,
            shuffle=False,  # the pipeline shuffles, keyed by (seed, epoch)
            validation_data=run.test_data if c.eval_every else None,
            validation_freq=max(1, c.eval_every), callbacks=self.callbacks(run, recorder),
            verbose=c.verbose)

    def finish(self, run, model):
        average_replica_statistics(model)
        return {}


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
        dict: see `Run.train`.

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
    config = as_config(config)
    if config.strategy == "multiworker":
        # model.fit fails under MultiWorkerMirroredStrategy in Keras 3: own loop.
        from keras_preact.training.multiworker import train_multiworker

        return train_multiworker(config, workdir)
    return Run(config, workdir, FitStepper()).train()


def has_preprocessing_layer(model):
    """Whether `model` normalises raw pixels itself (an `ImageNormalization` layer)."""
    from keras_preact.layers.preprocessing import ImageNormalization

    return any(
        isinstance(layer, ImageNormalization)
        for layer in private_api.flatten_layers(model)
    )


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
    load_weights_file(model, ckpt, config.model)
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
    from keras_preact import data

    if workdir is not None:
        net, config, source = load_workdir_model(workdir)
        dataset = dataset or config.dataset
        data_dir = data_dir if data_dir is not None else config.data_dir
        data_path = data_path if data_path is not None else config.data_path
        data_source = config.data_source if data_source == "auto" else data_source
    else:
        if dataset is None or (model is None and weights is None):
            raise ValueError(
                "Give `workdir`, or `dataset` with `weights` (a .keras file, or a "
                "model name and its .weights.h5). Received: workdir=None, "
                f"model={model!r}, weights={weights!r}, dataset={dataset!r}")
        if dataset not in data.list_datasets():
            raise ValueError(f"Unknown dataset. Received: dataset={dataset!r}. "
                             f"Valid: {data.list_datasets()}")
        if weights is not None and not os.path.isfile(weights):
            raise ValueError(f"Weights file not found. Received: weights={weights!r}")
        net, source = _model_for(model, weights, dataset, data_path, model_kwargs), weights
    make = functools.partial(data.make_dataset, dataset, split, data_dir=data_dir,
                             source=data_source, path=data_path, shuffle=False, augment=False,
                             drop_remainder=False)
    compile_model(net, None)
    results = net.evaluate(make(batch_size=batch_size, normalize=not has_preprocessing_layer(net)),
                           return_dict=True, verbose=verbose)
    return {"loss": float(results["loss"]), "accuracy": float(results["accuracy"]),
            "num_examples": int(make(batch_size=1).cardinality()), "dataset": dataset,
            "split": split, "source": source}


def _model_for(model, weights, dataset, data_path, model_kwargs):
    """The model `evaluate` was given: a built one, a ``.keras`` file, or a name with
    its weights (built as `train` builds it for the dataset)."""
    import keras_preact

    if model is not None and not isinstance(model, str):
        if weights is not None:
            load_weights_file(model, weights, getattr(model, "name", "the model"))
        return model
    if weights is not None and str(weights).endswith(".keras"):
        from keras_preact.weights.local import load_keras_file

        return load_keras_file(weights)
    if model not in keras_preact.list_models():
        raise ValueError(f"Unknown model. Received: model={model!r}. "
                         f"Valid: {keras_preact.list_models()}")
    info = dataset_info(dataset, data_path)
    kwargs = {"classes": info["num_classes"], "input_shape": tuple(info["image_shape"]),
              # as `train` builds it (the layer has no weights: weights trained either way load)
              "preprocessing": dataset_preprocessing(info), **(model_kwargs or {})}
    net = keras_preact.get_model(model, **kwargs)
    if weights is not None:
        load_weights_file(net, weights, model)
    return net
