"""One training run (`Run`) and the `Stepper` that computes its epochs. Each epoch ends
with a checkpoint; a restart continues with the next epoch's data, a function of ``(seed,
epoch)``, so with ``deterministic=True`` a resumed run ends with an uninterrupted run's weights."""

import contextlib
import functools
import logging
import os
import time
import timeit

import keras
import numpy as np
from keras import ops

import keras_preact
from keras_preact import data, finetune
from keras_preact.architecture import DEFAULTS
from keras_preact.checks import check_known_arguments, shorten
from keras_preact.file_io import atomic_save, atomic_write_json, user_path
from keras_preact.models.preact_resnet import MODEL_ARGUMENTS
from keras_preact.training import distribute
from keras_preact.training.config import TrainConfig
from keras_preact.training.losses import compile_model
from keras_preact.training.optimizers import make_optimizer
from keras_preact.training.workdir import (CHECKPOINT_DIR, CURVE_PNG, FINAL_MODEL, METRICS_COLUMNS,
                                           METRICS_JSON, TENSORBOARD_DIR, Workdir, read_json)
from keras_preact.weights.local import first_difference, load_weights_file, save_weights_file

logger = logging.getLogger("keras_preact.training")

CONFIG_FORMAT = 1
#: ``precision="auto"`` keeps mixed_bfloat16 on a CPU only where its training steps are at
#: least this many times as fast as fp32's, measured in the run's process.
BF16_MARGIN = 1.1
#: The training steps `Run.step_seconds` times per model, after one that traces the step.
TIMED_STEPS = 6


def as_config(config):
    """A validated `TrainConfig` from a `TrainConfig` or its dict, its `data_path` absolute
    (as stored: a rerun or `evaluate` from another folder finds the same data)."""
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if not isinstance(config, TrainConfig):
        raise ValueError("`config` must be a TrainConfig or its dict. "
                         f"Received: {type(config).__name__}")
    path = config.validate().data_path
    return config if path is None else config.replace(data_path=user_path(path, "data_path"))


def build_model(config, info):
    """The config's model for the dataset `info` (`dataset_info`) describes, whose ``classes``
    and ``input_shape`` are the defaults; ValueError for an unknown model or bad arguments."""
    kwargs = dict(config.model_kwargs)
    architecture = kwargs.pop("architecture", None)
    # The factories take `name` and `weights` beside the model's own arguments.
    check_known_arguments({**kwargs, **(architecture or {})}, MODEL_ARGUMENTS | {"name", "weights"},
                          where=f"the model_kwargs of {config.model!r}")
    # The pipelines yield channels_last images, whatever keras.json's image_data_format says.
    defaults = {"classes": info["classes"], "input_shape": tuple(info["input_shape"]),
                "data_format": "channels_last"}
    if config.preprocessing_in_model:
        defaults["preprocessing"] = dataset_preprocessing(info)
    if config.weights is not None and architecture is None:
        # A catalog tag fixes architecture arguments its weights need.
        defaults.update(finetune.pretrained_architecture(config.model, config.weights))
    if config.precision not in ("fp32", "auto"):  # "auto": `Run.choose_precision` resolves it
        defaults["dtype"] = config.precision
    if config.stochastic_depth:
        defaults["stochastic_depth"] = config.stochastic_depth
    try:
        if architecture is not None:
            return keras_preact.PreActResNet(
                **{**defaults, "name": config.model, **dict(architecture), **kwargs})
        return keras_preact.get_model(config.model, **{**defaults, **kwargs})
    except TypeError as err:
        raise ValueError(f"Invalid model arguments for {config.model!r}: {err}. "
                         f"Received: model_kwargs={config.model_kwargs!r}") from None
    except ValueError as err:
        if config.dataset != "folder" or "input_shape" not in str(err):
            raise
        raise ValueError(f"{err} A folder's images are resized to the model_kwargs input_shape: "
                         """--model-kwargs '{"input_shape": [64, 64, 3]}'.""") from None


def check_classes(config, info):
    """ValueError unless the model's `classes` and input channels, and the `cutout`, fit the
    dataset."""
    kwargs = {**config.model_kwargs.get("architecture", {}), **config.model_kwargs}
    classes = kwargs.get("classes", info["classes"])
    shape, size = kwargs.get("input_shape"), info["input_shape"]
    if shape is not None and (len(shape) != len(size)
                              or any(a not in (None, b) for a, b in zip(shape, size))):
        raise ValueError(f"The {config.dataset!r} images are {tuple(info['input_shape'])} "
                         f"(height, width, channels). Received: model_kwargs input_shape="
                         f"{shape!r}. Leave `input_shape` out (the dataset's is used).")
    if config.cutout >= min(size[:2]):
        raise ValueError(f"`cutout` must be smaller than the {config.dataset!r} images ({size[0]}x"
                         f"{size[1]}), or every image is blanked. Received: cutout={config.cutout}")
    if kwargs.get("include_top", DEFAULTS["include_top"]) and classes != info["classes"]:
        raise ValueError(
            f"The {config.dataset!r} dataset has {info['classes']} classes, so the model needs "
            f"as many. Received: model_kwargs classes={classes!r}. Leave `classes` out (the "
            "dataset's is used).")


def weights_fingerprint(model):
    """``[[name, shape], ...]`` of the model's variables in the order weights files load by."""
    return [[v.name, [int(d) for d in v.shape]] for v in model.weights]


def optimizer_step(optimizer):
    """The optimizer's iteration count as an int (also for a MirroredVariable)."""
    value = getattr(optimizer.iterations, "value", optimizer.iterations)
    return int(np.asarray(value.numpy() if hasattr(value, "numpy") else value))


def dataset_preprocessing(info):
    """The model `preprocessing` dict for a dataset: its per-channel mean and std."""
    return {"mean": [float(m) for m in info["mean"]], "std": [float(v) for v in info["std"]],
            "scale": 1.0 / 255.0}


def score(predict, dataset, *, flip=False):
    """Test loss and accuracy, the one evaluation of every path and of `evaluate`.

    Args:
        predict: a function of a dataset of ``(images, labels)`` batches to the probabilities
            of its images, in order (rows past the last image are left out).
        dataset: the ``(images, labels)`` batches, channels last.
        flip: average the probabilities of each image and its mirror image.

    Returns:
        dict: ``loss``, the mean cross-entropy against the plain labels (also for a model
        trained on smoothed ones; probabilities clipped at Keras' epsilon, as its loss does),
        and ``accuracy``."""
    import tensorflow as tf
    labels = np.concatenate([np.reshape(y, (-1,)) for _, y in dataset.as_numpy_iterator()])
    n = len(labels)
    probs = np.asarray(predict(dataset), "float64")[:n]
    if flip:
        mirrored = dataset.map(lambda x, y: (tf.reverse(x, [2]), y))
        probs = (probs + np.asarray(predict(mirrored), "float64")[:n]) / 2
    eps = keras.config.epsilon()
    picked = np.clip(probs[np.arange(n), labels.astype(int)], eps, 1.0 - eps)
    return {"loss": float(np.mean(-np.log(picked))),
            "accuracy": float(np.mean(np.argmax(probs, axis=-1) == labels))}


class Stepper:
    """What a kind of training loop supplies to a `Run` (the defaults: TensorFlow, tf.data)."""

    is_chief = True  # the process that reads and writes the workdir
    collective = False  # True: its processes must agree before training (`agree`)
    replicas = 1
    strategy = None  # a tf.distribute strategy or Keras distribution: its scope() holds variables
    labels = {}  # entries of every result dict (the worker's name, ...)
    schedule_labels = {}  # entries of the schedule record (the number of workers)

    def start(self, run, make_strategy=None):
        """Sets up the runtime, then `make_strategy()` (default: the config's strategy);
        ValueError for a batch the replicas cannot split."""
        c = run.config
        distribute.configure_runtime(**{k: getattr(c, k) for k in (
            "cpu_devices", "intra_op_threads", "inter_op_threads", "deterministic")})
        self.strategy = make_strategy() if make_strategy else distribute.make_strategy(c.strategy)
        self.replicas = self.strategy.num_replicas_in_sync
        distribute.check_global_batch(c.batch_size, self.replicas)
        if c.precision == "mixed_float16" and not distribute.accelerated():
            logger.warning("float16 is slow on CPUs: use --precision fp32 or mixed_bfloat16.")

    def load_data(self, run):
        """Returns ``(num_train, num_test)``; keeps the data `train_epochs` reads."""
        c = run.config
        make = functools.partial(data.make_dataset, c.dataset, batch_size=c.batch_size,
                                 data_dir=c.data_dir, source=c.data_source, download=c.download,
                                 **c.data_arguments(), seed=c.seed,
                                 normalize=not c.model_normalizes())
        test = functools.partial(make, "test", shuffle=False, augment=False, drop_remainder=False)
        try:  # the test split first: missing or corrupt files fail before the workdir is touched
            run.test_data = test()
        except ValueError as err:
            if c.data_path is None or c.dataset == "folder":
                raise
            raise ValueError(f"{err} For a folder of images, add --dataset folder.") from None
        run.train_data = functools.partial(make, "train", augment=c.augment, cutout=c.cutout,
                                           drop_remainder=True)
        return (int(run.train_data(batch_size=1).cardinality()),
                int(test(batch_size=1).cardinality()))

    def agree(self, run, state, refused):
        """The state to resume from, on which all processes agree; raises `refused`."""
        if refused is not None:
            raise refused
        return state

    def restore(self, run, model, optimizer, state):
        """Loads the checkpoint to resume from, or the pretrained weights of a fresh run."""
        with self.strategy.scope():
            if state is not None:
                run.load_checkpoint(model, optimizer, state)
            elif run.config.weights is not None:
                run.load_pretrained(model)

    def train_epochs(self, run, model, start_epoch):
        """Trains the remaining epochs by Keras ``fit``, with `callbacks`."""
        c, remaining = run.config, run.epochs - start_epoch
        train = run.train_data(epoch=start_epoch, repeat_epochs=remaining)
        model.fit(train, epochs=run.epochs, initial_epoch=start_epoch, steps_per_epoch=run.spe,
                  shuffle=False,  # the pipeline shuffles, keyed by (seed, epoch)
                  callbacks=self.callbacks(run), verbose=c.verbose)

    def callbacks(self, run):
        """What every path does around its epochs, as Keras callbacks (`fit` calls them; the
        multi-worker loop too): the epoch's clock, the replicas' BatchNorm statistics made
        one, the evaluation every `eval_every` epochs, the epoch's record and checkpoint, the
        stop after the schedule's last step or at a loss that is not finite, the progress bar
        (on the chief) and TensorBoard's logs (where files are written)."""
        stepper, every = self, run.config.eval_every

        class Record(keras.callbacks.Callback):
            def on_epoch_begin(self, epoch, logs=None):
                run.clock = [time.time()]

            def on_epoch_end(self, epoch, logs=None):
                run.clock.append(time.time())  # the epoch's training ends; evaluation follows
                distribute.average_replica_statistics(stepper.strategy, self.model)
                if every and (epoch + 1) % every == 0:  # `logs` goes on to TensorBoard
                    with averaged_weights(self.model) as averaged:  # a moving average's own
                        logs.update(prefixed("val_", stepper.evaluate(run, self.model)))
                    if averaged:  # and the raw weights', which it follows
                        logs.update(prefixed("raw_val_", stepper.evaluate(run, self.model)))
                run.epoch_end(self.model, epoch, logs)

            def on_train_batch_end(self, batch, logs=None):
                step, loss = optimizer_step(self.model.optimizer), float(logs.get("loss", 0))
                if not np.isfinite(loss):  # no later step can undo it: stop, save nothing
                    raise ValueError(f"The loss became {loss} at step {step} (learning rate "
                                     f"{run.rate_at(step)}): training stopped, keeping the "
                                     "completed epochs' checkpoints. Try a lower --lr in a new "
                                     "--workdir.")
                if step >= run.total_steps:
                    self.model.stop_training = True

        class Progress(keras.callbacks.ProgbarLogger):
            def on_epoch_begin(self, epoch, logs=None):  # the last epoch may stop early
                self.target = min(run.spe, run.total_steps - epoch * run.spe)
                super().on_epoch_begin(epoch, logs)

        return [Record()] + [Progress()] * self.is_chief + ([keras.callbacks.TensorBoard(
            log_dir=run.workdir.file(TENSORBOARD_DIR), write_graph=False, profile_batch=0)]
            if run.owns_files else [])

    def predict(self, model, dataset):
        """The probabilities of `dataset`'s images (every image, in order, maybe followed by
        more rows). JAX's DataParallel splits every batch evenly: the last one is padded."""
        if self.replicas > 1 and keras.backend.backend() == "jax":
            import tensorflow as tf
            pad = lambda t: tf.pad(t, [[0, -tf.shape(t)[0] % self.replicas]]  # noqa: E731
                                   + [[0, 0]] * (len(t.shape) - 1))
            dataset = dataset.map(lambda x, y: (pad(x), pad(y)))
        with self.strategy.scope():
            return model.predict(dataset, verbose=0)

    def evaluate(self, run, model):
        """``{"loss", "accuracy"}`` of `model` on the test split (`score`)."""
        return score(functools.partial(self.predict, model), run.test_data)

    def finish(self, run, model):
        """Extra entries of the result dict, once training is done."""
        distribute.average_replica_statistics(self.strategy, model)
        if getattr(model.optimizer, "use_ema", False):
            own_arrays(model)  # `fit` assigned each weight its moving average
        return {}


def own_arrays(model):
    """Gives each trainable weight an array of its own: after Keras assigns a weight its
    moving average's array, JAX's `predict`, which donates the weights', would delete both."""
    for variable in model.trainable_variables:
        variable.assign(ops.copy(variable))


@contextlib.contextmanager
def averaged_weights(model):
    """Within: the model of a moving-average run holds the averaged weights, and the context
    value is True; its own weights come back after. Other models are left as they are."""
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    if not getattr(optimizer, "use_ema", False):
        yield False
        return
    raw = [ops.copy(v) for v in model.trainable_variables]
    optimizer.finalize_variable_values(model.trainable_variables)
    own_arrays(model)
    try:
        yield True
    finally:
        for variable, value in zip(model.trainable_variables, raw):
            variable.assign(value)


def prefixed(prefix, values):
    return {prefix + k: v for k, v in values.items()}


class Run:
    """One training run of `config` (a `TrainConfig` or its dict) in `workdir` (a folder,
    or None for a run without files or resume), its epochs computed by a `Stepper`; `model`:
    a built Keras model to train instead of the config's (a tuning trial's)."""

    def __init__(self, config, workdir, stepper, model=None):
        self.config, self.given_model = as_config(config), model
        self.workdir, self.stepper = Workdir(workdir) if workdir is not None else None, stepper
        self.info = data.dataset_info(self.config.dataset, **self.config.data_arguments())
        check_classes(self.config, self.info)
        # What the data is, wherever it is: a resumed run must find the same.
        self.data = {"class_names": list(self.info["class_names"]), "num_examples": [
            int(self.info["num_train"]), int(self.info["num_test"])]}
        self.extends = self.wrote_config = False
        self.precision = None  # {"chosen": ..., maybe "images_per_s": ...} of precision="auto"

    def train(self):
        """Trains (or resumes, or returns the stored results of a complete run).

        Returns:
            dict: ``test_accuracy``, ``test_loss``, ``history`` (per-epoch dicts), ``epochs``,
            ``steps``, ``resumed_from_epoch`` (0 for a fresh start, None when the run was
            already complete), ``train_time_s``, ``num_replicas``, ``model_path`` and
            ``workdir`` (None where this process writes no files), plus `Stepper.labels`."""
        self.owns_files = self.workdir is not None and self.stepper.is_chief
        with self.workdir.lock() if self.owns_files else contextlib.nullcontext():
            try:
                return self._train()
            except BaseException:
                if self.wrote_config and self.workdir.read_state() is None:
                    # Nothing to resume: a rerun starts afresh, so the failed start leaves nothing.
                    self.workdir.discard_run()
                raise

    def _train(self):
        state = refused = None
        if self.owns_files:
            try:
                state = self.check_workdir()
            except ValueError as err:
                if not self.stepper.collective:
                    raise
                refused = err  # the other workers hear of it in `agree`
        if not self.stepper.collective and self.complete(state):
            return self.stored_results(state)
        self.stepper.start(self)
        self.num_train, self.num_test = self.stepper.load_data(self)
        self._plan()
        if refused is None and state is not None and state["epoch"] > self.epochs:
            refused = ValueError(
                f"The workdir's checkpoint is at epoch {state['epoch']}, past this run's "
                f"{self.epochs} epochs; the workdir does not belong to this run.")
        elif refused is None and self.extends and state["step"] != state["epoch"] * self.spe:
            refused = ValueError(  # epoch e's data is a function of (seed, e): whole epochs only
                f"The run in {self.workdir.path} stopped at step {state['step']}, inside epoch "
                f"{state['epoch']} ({self.spe} steps an epoch): it cannot be extended. Nothing "
                "was changed. Train the longer run in a new --workdir.")
        state = self.stepper.agree(self, state, refused)
        if self.complete(state):
            return self.stored_results(state)
        start_epoch = state["epoch"] if state else 0
        self.history = list(state.get("history", [])) if state else []
        self.choose_precision()
        self.model, optimizer = self.build()
        self.fingerprint = weights_fingerprint(self.model)
        self.stepper.restore(self, self.model, optimizer, state)
        if self.owns_files:
            self.start_files(state)
        self.schedule = self.config.make_schedule(self.spe)
        t0 = time.time()
        if start_epoch < self.epochs:
            self._warn_about_epochs()
            self.stepper.train_epochs(self, self.model, start_epoch)
        train_time = time.time() - t0
        extra = self.stepper.finish(self, self.model)
        results = self.stepper.evaluate(self, self.model)
        return {**self.finish(self.model, results, extra), "resumed_from_epoch": start_epoch,
                "train_time_s": train_time}

    def rate_at(self, step):
        """The learning rate of update `step` (counted from 1)."""
        return getattr(self.schedule, "value_at", lambda s: float(self.schedule(s)))(
            max(step - 1, 0))

    def epoch_end(self, model, epoch, logs=None):
        """Records epoch `epoch` (0-based) with its Keras `logs`; writes checkpoint and reports.
        `clock` holds the times the epoch's training began and ended: its ``time_s`` and
        ``images_per_s`` count training only, ``eval_time_s`` the evaluation after it."""
        logs, (began, trained) = dict(logs or {}), self.clock
        step, train_s = optimizer_step(model.optimizer), trained - began
        done = step - (self.history[-1]["step"] if self.history else 0)
        entry = {"epoch": epoch + 1, "step": step, "learning_rate": self.rate_at(step),
                 "time_s": round(train_s, 3), "eval_time_s": round(time.time() - trained, 3),
                 "images_per_s": round(done * self.config.batch_size / train_s, 2)
                 if train_s > 0 else None}
        # The metrics (the columns after the clock's).
        entry.update({k: float(v) for k, v in logs.items() if k in METRICS_COLUMNS[6:]})
        self.history.append(entry)
        if not self.owns_files:
            return
        path = self.workdir.checkpoint_path(epoch + 1)
        save_weights_file(model, path)
        # Only now does the state move on: a kill before leaves the previous epoch intact.
        self.workdir.write_state(
            {"epoch": epoch + 1, "step": step, "checkpoint": os.path.basename(path),
             "history": self.history, "complete": False, "fingerprint": self.fingerprint})
        self.workdir.prune_checkpoints(self.config.keep_checkpoints, os.path.basename(path))
        self.write_reports()
        logger.info("epoch %d done: step %d, checkpoint %s", epoch + 1, step, path)

    def write_reports(self, final=None):
        """Writes the metrics (with `final`, the run's results) and the training curve."""
        c = self.config
        metrics = {"model": c.model, "dataset": c.dataset, "epochs": self.history,
                   "complete": final is not None, "schedule": self.schedule_info, **(final or {})}
        title = f"{c.model} on {c.dataset}" + (
            f" (test accuracy {100 * final['test_accuracy']:.2f}%)" if final else "")
        self.workdir.write_reports(metrics, self.history, title=title)

    def check_workdir(self):
        """The workdir's state or None; ValueError (before any write) if it is another run's."""
        wd = self.workdir
        if (stored := wd.read_train_config()) is None:
            if others := wd.listing():
                raise ValueError(f"The workdir {wd.path} is not empty and holds no keras-preact "
                                 f"run (no {os.path.basename(wd.config_path)}; it holds "
                                 f"{', '.join(others[:3])}{', ...' if len(others) > 3 else ''}). "
                                 "Nothing was changed. Use an empty or new --workdir.")
            return None
        diff = self.config.differences(TrainConfig.from_dict(stored))
        stored = wd.read_config()  # a run written before has no num_examples
        self.precision = stored.get("precision")
        diff.update({k: (v, stored[k]) for k, v in self.data.items()
                     if stored.get(k) not in (None, v)})
        state = wd.read_state()
        # A longer --epochs (or --steps) extends the run: its history is kept.
        self.extends = bool(diff) and state is not None and all(
            key in ("epochs", "steps") and None not in (new, old) and new > old
            for key, (new, old) in diff.items())
        if diff and not self.extends:
            lines = ", ".join(f"{k}: stored {b!r}, requested {a!r}" for k, (a, b) in diff.items())
            raise ValueError(
                f"The workdir {wd.path} holds a run with a different config ({lines}). Nothing was "
                "changed. Restart with the same settings to resume, a larger --epochs (or "
                "--steps) to extend it, or use a new --workdir.")
        return state

    def complete(self, state):
        """Whether `state` is that of a finished run (whose final model exists)."""
        return bool(state and state.get("complete") and not self.extends and (
            not self.owns_files or os.path.exists(self.workdir.final_model_path)))

    def results(self, metrics, **more):
        """The result dict of `metrics` (``metrics.json``'s entries; NaN results if unknown)."""
        nan, files = float("nan"), self.owns_files
        return {"test_accuracy": metrics.get("test_accuracy", nan),
                "test_loss": metrics.get("test_loss", nan), "history": metrics.get("epochs", []),
                "num_replicas": metrics.get("num_replicas", self.stepper.replicas),
                "model_path": self.workdir.final_model_path if files else None,
                "workdir": self.workdir.path if files else None, **self.stepper.labels, **more}

    def stored_results(self, state):
        metrics = {}  # the workers without files know no results
        if self.owns_files and not os.path.isfile(path := self.workdir.file(METRICS_JSON)):
            logger.warning("The run in %s is complete but its %s is gone: its test results "
                           "are unknown (`keras-preact evaluate --workdir %s` measures them).",
                           self.workdir.path, METRICS_JSON, self.workdir.path)
        elif self.owns_files:
            metrics = read_json(path)
            logger.info("The run in %s is complete; returning its results.", self.workdir.path)
        return self.results(metrics, epochs=state.get("epoch"), steps=state.get("step"),
                            resumed_from_epoch=None, train_time_s=0.0)

    def _plan(self):
        """Steps per epoch and the schedule for the training split's size."""
        c, n = self.config, self.num_train
        self.spe = n // c.batch_size
        if self.spe < 1:
            raise ValueError(f"batch_size={c.batch_size} is larger than the {c.dataset!r} "
                             f"training split ({n} images).")
        sched = c.resolve_schedule(self.spe)
        self.epochs, self.total_steps = sched["epochs"], sched["total_steps"]
        self.schedule_info = {**sched, "num_replicas": self.stepper.replicas,
                              "per_replica_batch": c.batch_size // self.stepper.replicas,
                              **self.stepper.schedule_labels}

    def _warn_about_epochs(self):
        """Warns of training images left out of every epoch, and of very short epochs."""
        c, n = self.config, self.num_train
        if dropped := n % c.batch_size:  # whole batches only: say so, lose no image silently
            logger.warning("Training drops the last %d of %d training images each epoch "
                           "(batch %d).", dropped, n, c.batch_size)
        # The README's folder example (ResNet-20, batch 32, 10 epochs of 900 images: 280
        # steps) learns; 14 steps of the defaults stay at chance (docs/performance.md).
        if self.total_steps < 100 and c.weights is None:
            logger.warning("The whole run is %d step(s) (%d training images at batch %d): too "
                           "few to learn from scratch. Start from pretrained weights (--weights, "
                           "`keras-preact weights list`), or take more steps: more --epochs, a "
                           "smaller --batch-size and, on small data, --model preact_resnet20.",
                           self.total_steps, n, c.batch_size)
        elif self.spe < 10:
            logger.warning("An epoch is only %d step(s) (%d training images at batch %d): its "
                           "checkpoint and evaluation cost more than its training; a smaller "
                           "batch size gives more steps.", self.spe, n, c.batch_size)

    def choose_precision(self):
        """Resolves ``precision="auto"`` (`self.precision`): a resumed run keeps its stored
        choice; else mixed_float16 on a GPU or TPU, and on a CPU mixed_bfloat16 where its
        steps run at least `BF16_MARGIN` times as fast as fp32's (`step_seconds`), else fp32."""
        c, stored = self.config, self.precision is not None
        if c.precision != "auto":
            return
        if not stored and distribute.accelerated():
            self.precision = {"chosen": "mixed_float16"}
        elif not stored:
            began, seconds = time.time(), self.step_seconds(("fp32", "mixed_bfloat16"))
            rates = {p: round(c.batch_size / s, 1) for p, s in seconds.items()}
            self.precision = {"images_per_s": rates, "timing_s": round(time.time() - began, 1),
                              "chosen": "mixed_bfloat16" if rates["mixed_bfloat16"]
                              >= BF16_MARGIN * rates["fp32"] else "fp32"}
        rates = ", ".join(f"{p} {r} images/s" for p, r in self.precision.get(
            "images_per_s", {}).items()) or "on an accelerator"
        logger.info("--precision auto: training in %s (%s at the run's start: %s; bf16 is kept "
                    "from %.2fx fp32's rate).", self.precision["chosen"], "as chosen" if stored
                    else "timed", rates, BF16_MARGIN)

    def step_seconds(self, precisions):
        """Median seconds of a training step (a batch of random images) of a throwaway model
        built and compiled as this run's, in each of `precisions`, timed in turns: ``{precision:
        seconds}``. Needs the steps per epoch (`spe`), for the learning-rate schedule."""
        c, rng = self.config, np.random.default_rng(0)
        x = rng.uniform(0, 255, (c.batch_size, *self.info["input_shape"])).astype("float32")
        y = rng.integers(0, self.info["classes"], c.batch_size)
        models = {p: self.build(contextlib.nullcontext(), precision=p)[0] for p in precisions}
        for model in models.values():
            model.train_on_batch(x, y)  # traces the step
        times = {p: [] for p in models}
        for _ in range(TIMED_STEPS // 2):
            for p, m in models.items():
                times[p] += timeit.repeat(lambda m=m: m.train_on_batch(x, y), number=1, repeat=2)
        return {p: float(np.median(t)) for p, t in times.items()}

    def build(self, scope=None, precision=None):
        """The compiled model and its built optimizer, in `scope` (default: the stepper's), in
        `precision` (default: the config's, or the one `choose_precision` chose)."""
        c = self.config.replace(precision=precision or (self.precision or {}).get(
            "chosen", self.config.precision))
        keras.utils.set_random_seed(int(c.seed))
        with scope or self.stepper.strategy.scope():
            model = (self.given_model if precision is None else None) or build_model(c, self.info)
            if c.synchronized_bn and keras.backend.backend() == "tensorflow":
                # On the built layers: the saved model config keeps no training setting. (JAX's
                # SPMD BatchNorm sees the global batch already.)
                distribute.set_synchronized_batch_norm(model, True)
            if c.freeze:  # before compiling: the optimizer holds only the trainable part
                finetune.freeze(model, list(c.freeze))
                if not model.trainable_variables:
                    raise ValueError("Every part is frozen: nothing would train. Received: "
                                     f"freeze={list(c.freeze)!r}. Leave one part out.")
            optimizer = make_optimizer(c, self.spe)
            if c.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            # JAX runs an uncompiled step op by op, each op compiled apart (9 s a ResNet-20
            # step here): its step is always compiled; `jit_compile` is TensorFlow's XLA.
            compile_model(model, optimizer, c.label_smoothing,
                          jit_compile=bool(c.jit_compile) or keras.backend.backend() == "jax")
            optimizer.build(model.trainable_variables)
        return model, optimizer

    def load_checkpoint(self, model, optimizer, state):
        """Loads the checkpoint of `state` into `model` and `optimizer`."""
        path = self.workdir.file(CHECKPOINT_DIR, state["checkpoint"])
        stored, fingerprint = state.get("fingerprint"), weights_fingerprint(model)
        if stored is not None and stored != fingerprint:
            first, a, b = first_difference(stored, fingerprint)
            raise ValueError(
                f"The checkpoint {path} does not fit the model {self.config.model!r}: it holds "
                f"{len(stored)} variables, the model {len(fingerprint)}; the first difference is "
                f"variable {first} (checkpoint: {a}, model: {b}). Nothing was changed. "
                "Use a new --workdir.")
        try:
            load_weights_file(model, path)
        except ValueError as err:
            raise ValueError(f"The run's last checkpoint {path} cannot be read ("
                             f"{shorten(err, 200)}): the run cannot resume. Use a new "
                             "--workdir, or delete this one to start the run over.") from None
        if optimizer_step(optimizer) != int(state["step"]):
            raise ValueError(f"The checkpoint {path} holds {optimizer_step(optimizer)} optimizer "
                             f"steps but its state says {state['step']}; refusing to resume.")
        logger.info("Resuming %s from epoch %d (step %d) in %s.", self.config.model,
                    state["epoch"], state["step"], self.workdir.path)

    def load_pretrained(self, model):
        """Loads the config's pretrained `weights` into a fresh run's model."""
        loaded = finetune.load_pretrained(model, self.config.weights, model_name=self.config.model)
        logger.info("Fine-tuning from %s (%s).", loaded["source"],
                    "classifier loaded too" if loaded["copied_head"] else "new classifier")

    def start_files(self, state):
        """Tidies the workdir; a fresh run writes its config and empty reports (the first write)."""
        for path in self.workdir.remove_stale_temporaries():
            logger.info("Removed %s (a write interrupted by a crash).", path)
        if state is None or self.extends:
            atomic_write_json(self.workdir.config_path, {
                "format": CONFIG_FORMAT, "keras_preact_version": keras_preact.__version__,
                "train_config": self.config.to_dict(), **self.data,
                **({"precision": self.precision} if self.precision else {})})
            self.wrote_config = state is None
        if state is None:
            self.write_reports()
        elif self.extends:
            self.workdir.write_state({**state, "complete": False})
            logger.info("Extending the run in %s from epoch %d to %d epochs.", self.workdir.path,
                        state["epoch"], self.epochs)

    def finish(self, model, results, extra):
        """Writes the final model and reports (in the workdir) and returns the results."""
        final = {"test_accuracy": results["accuracy"], "test_loss": results["loss"],
                 "num_train_examples": self.num_train, "num_test_examples": self.num_test,
                 "num_params": int(model.count_params()), "num_replicas": self.stepper.replicas,
                 "input_normalization": {"in_model": self.config.model_normalizes(),
                                         **dataset_preprocessing(self.info)},
                 "schedule": self.schedule_info, "curve_path": CURVE_PNG, "precision": (
                     self.precision or {}).get("chosen", self.config.precision),
                 "model_path": FINAL_MODEL, **extra}
        if self.owns_files:
            atomic_save(self.workdir.final_model_path, model.save)
            self.write_reports(final)
            self.workdir.write_state({**self.workdir.read_state(), "complete": True})
        return self.results({**final, "epochs": self.history},
                            epochs=self.history[-1]["epoch"] if self.history else 0,
                            steps=optimizer_step(model.optimizer), **extra)
