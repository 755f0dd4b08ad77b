"""One training run, whichever loop computes its steps: `Run` and the `Stepper` it drives.

A `Run` owns what every loop shares: the validated config, the dataset and its
schedule, the model and optimizer, the workdir (its lock, checks, checkpoints and
reports), resuming, and the final model and results. A `Stepper` supplies what
differs: the devices, the data's form, how the remaining epochs are computed and how
the test split is evaluated. The steppers are `FitStepper` (Keras ``fit``,
`keras_preact.training.trainer`), `MultiWorkerStepper` (the tf.distribute custom loop,
`keras_preact.training.multiworker`) and `DataParallelStepper` (JAX,
`keras_preact.training.jax_parallel`), so a workdir looks the same whichever wrote it.

Resume. After every epoch the model and optimizer variables (momentum slots and the
iteration counter, which drives the schedule) go to a checkpoint, then
``checkpoints/state.json`` is replaced to point at it. A restart loads that checkpoint
and continues with the data of the next epoch, which depends only on ``(seed,
epoch)``: with ``deterministic=True`` the resumed run's final weights equal an
uninterrupted run's. A workdir belongs to one config: a restart with any other model,
data or recipe setting is refused before anything is written (`RUNTIME_FIELDS` may
change). Importing this module does not import Keras.
"""

import contextlib
import functools
import logging
import os
import time

from keras_preact.files import atomic_save
from keras_preact.training.config import RUNTIME_FIELDS
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import precision_dtype
from keras_preact.training.distribute import shorten
from keras_preact.training.workdir import CHECKPOINT_DIR
from keras_preact.training.workdir import CURVE_PNG
from keras_preact.training.workdir import FINAL_MODEL
from keras_preact.training.workdir import METRICS_JSON
from keras_preact.training.workdir import Workdir
from keras_preact.training.workdir import read_json

logger = logging.getLogger("keras_preact.training")

CONFIG_FORMAT = 1
#: Fewer steps than this in an epoch get a warning: every epoch ends with a checkpoint,
#: the reports and (with eval_every) a test evaluation, which then outweigh training.
FEW_STEPS_PER_EPOCH = 10


def as_config(config):
    """A validated `TrainConfig` from a `TrainConfig` or its dict."""
    if isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if not isinstance(config, TrainConfig):
        raise ValueError(
            f"`config` must be a TrainConfig or its dict. Received: {type(config).__name__}"
        )
    return config.validate()


def build_model(config, info):
    """The config's model for a dataset described by `info` (`dataset_info`).

    ``classes`` and ``input_shape`` default to the dataset's; the precision sets the
    model's dtype policy. ``model_kwargs["architecture"]`` (a `PreActResNet` config)
    builds that network instead of a named one.

    Raises:
        ValueError: for an unknown model or invalid model arguments.
    """
    import keras_preact
    from keras_preact.layers.utils import check_known_arguments
    from keras_preact.models.preact_resnet import MODEL_ARGUMENTS

    kwargs = dict(config.model_kwargs)
    architecture = kwargs.pop("architecture", None)
    # The factories take `name` and `weights` beside the model's own arguments.
    check_known_arguments({**kwargs, **(architecture or {})}, MODEL_ARGUMENTS | {"name", "weights"},
                          where=f"the model_kwargs of {config.model!r}")
    defaults = {"classes": info["num_classes"], "input_shape": tuple(info["image_shape"])}
    if config.preprocessing_in_model:
        defaults["preprocessing"] = dataset_preprocessing(info)
    if config.weights is not None and architecture is None:
        # A catalog tag fixes architecture arguments its weights need (e.g.
        # first_unit_shared_preact=False for the converted pytorchcv nets).
        from keras_preact.finetune import pretrained_architecture

        defaults.update(pretrained_architecture(config.model, config.weights))
    dtype = precision_dtype(config.precision)
    if dtype:
        defaults["dtype"] = dtype
    try:
        if architecture is not None:
            return keras_preact.PreActResNet(
                **{**defaults, "name": config.model, **dict(architecture), **kwargs})
        return keras_preact.get_model(config.model, **{**defaults, **kwargs})
    except TypeError as err:
        raise ValueError(
            f"Invalid model arguments for {config.model!r}: {err}. "
            f"Received: model_kwargs={config.model_kwargs!r}"
        ) from None


def weights_fingerprint(model):
    """``[[name, shape], ...]`` of the model's variables in creation order.

    Weights files are matched by creation order, so two networks with the same
    fingerprint load each other's checkpoints; any other pair is refused before
    loading (Keras may skip a mismatched nested layer with only a warning).
    """
    return [[v.name, [int(d) for d in v.shape]] for v in model.weights]


def optimizer_step(optimizer):
    """The optimizer's iteration count as an int (also for a MirroredVariable)."""
    import numpy as np

    value = optimizer.iterations
    value = getattr(value, "value", value)
    return int(np.asarray(value.numpy() if hasattr(value, "numpy") else value))


def dataset_info(name, path=None):
    """`keras_preact.data.dataset_info`; `path` is passed only where it means something
    (the image folder), since CIFAR's published sizes do not depend on it."""
    from keras_preact import data

    return data.dataset_info(name, path=path if name == "folder" else None)


def dataset_preprocessing(info):
    """The model `preprocessing` dict for a dataset: its per-channel mean and std."""
    return {"mean": [float(m) for m in info["mean"]], "std": [float(v) for v in info["std"]],
            "scale": 1.0 / 255.0}


def compile_model(model, optimizer, **kwargs):
    """Compiles with the recipe's loss and accuracy metric."""
    import keras

    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(),
                  metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")], **kwargs)


def write_reports(workdir, config, history, *, schedule_info, final=None):
    """Writes ``metrics.json`` (``final``: the run's results), ``metrics.csv`` and the
    training curve from the per-epoch `history`."""
    metrics = {"model": config.model, "dataset": config.dataset, "epochs": history,
               "complete": final is not None}
    path = workdir.file(METRICS_JSON)
    if schedule_info is not None:
        metrics["schedule"] = schedule_info
    elif os.path.exists(path):
        with contextlib.suppress(ValueError):  # keep what a previous write knew
            metrics["schedule"] = read_json(path).get("schedule")
    metrics.update(final or {})
    workdir.write_metrics(metrics)
    workdir.write_metrics_csv(history)
    title = f"{config.model} on {config.dataset}"
    if final and "test_accuracy" in final:
        title += f" (test accuracy {100 * final['test_accuracy']:.2f}%)"
    workdir.write_curve(history, title=title)


class EpochRecorder:
    """The per-epoch history entry and, with a workdir, the checkpoint, state and reports.

    Args:
        config: the run's `TrainConfig`.
        workdir: the run's `Workdir`, or None (history only).
        schedule: the learning-rate schedule (for the rate of each entry).
        history: list of the per-epoch entries so far; appended to.
        fingerprint: `weights_fingerprint` of the model, stored in the state.
    """

    def __init__(self, *, config, workdir, schedule, history, fingerprint):
        self.config, self.workdir, self.schedule = config, workdir, schedule
        self.history, self.fingerprint = history, fingerprint
        self._t0 = time.time()

    def epoch_begin(self):
        """Starts the epoch's clock (for its images per second)."""
        self._t0 = time.time()

    def epoch_end(self, model, epoch, logs=None):
        """Records epoch `epoch` (0-based) of `model`, with its Keras `logs`."""
        logs = dict(logs or {})
        step = optimizer_step(model.optimizer)
        elapsed = time.time() - self._t0
        done = step - (self.history[-1]["step"] if self.history else 0)
        entry = {
            "epoch": epoch + 1,
            "step": step,
            "learning_rate": self.schedule.value_at(max(step - 1, 0)),
            "time_s": round(elapsed, 3),
            "images_per_s": round(done * self.config.batch_size / elapsed, 2) if elapsed > 0 else None,
        }
        entry.update({k: float(logs[k]) for k in ("loss", "accuracy", "val_loss", "val_accuracy")
                      if k in logs})
        self.history.append(entry)
        if self.workdir is None:
            return
        path = self.workdir.checkpoint_path(epoch + 1)
        atomic_save(path, model.save_weights)
        # Only now does the state move on: a kill before this line leaves the
        # previous epoch's state and checkpoint intact.
        self.workdir.write_state(
            {"epoch": epoch + 1, "step": step, "checkpoint": os.path.basename(path),
             "history": self.history, "complete": False, "fingerprint": self.fingerprint})
        self.workdir.prune_checkpoints(self.config.keep_checkpoints, os.path.basename(path))
        write_reports(self.workdir, self.config, self.history, schedule_info=None)
        logger.info("epoch %d done: step %d, checkpoint %s", epoch + 1, step, path)


def load_weights_file(model, path, label):
    """``model.load_weights(path)`` with one clear error for a damaged or unfitting file."""
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


class Stepper:
    """What one kind of training loop supplies to a `Run`; the defaults suit one process
    with tf.data. Subclasses override `train_epochs` and what else differs."""

    is_chief = True  # the process that reads and writes the workdir
    collective = False  # True: its processes must agree before training (`agree`)
    replicas = 1
    switch_synchronized_bn = True  # `synchronized_bn` switches the layers' flag
    labels = {}  # entries of every result dict (the worker's name, ...)
    schedule_labels = {}  # entries of the schedule record (the number of workers)

    def start(self, run):
        """Sets up devices and runtime (before the first TensorFlow op)."""

    def scope(self):
        """Where the model and optimizer variables are created."""
        return contextlib.nullcontext()

    def load_data(self, run):
        """Returns ``(num_train, num_test)`` and keeps what `train_epochs` reads."""
        return run.tf_data()

    def agree(self, run, state, refused):
        """Returns the state to resume from (all processes must agree on it), or raises
        `refused` (the chief's refusal of its workdir)."""
        if refused is not None:
            raise refused
        return state

    def restore(self, run, model, optimizer, state):
        """Loads the checkpoint to resume from, or the pretrained weights of a fresh run."""
        with self.scope():
            if state is not None:
                run.load_checkpoint(model, optimizer, state)
            elif run.config.weights is not None:
                run.load_pretrained(model)

    def train_epochs(self, run, model, start_epoch, recorder):
        """Trains the remaining epochs, calling `recorder` at each one's start and end."""
        raise NotImplementedError

    def evaluate(self, run, model):
        """``{"loss", "accuracy"}`` of `model` on the test split."""
        out = model.evaluate(run.test_data, return_dict=True, verbose=run.config.verbose)
        return {"loss": float(out["loss"]), "accuracy": float(out["accuracy"])}

    def finish(self, run, model):
        """Extra entries of the result dict, once training is done."""
        return {}


class Run:
    """One training run of `config` in `workdir`, its epochs computed by `stepper`.

    Args:
        config: a `TrainConfig` (or its dict).
        workdir: the run's folder (see `keras_preact.training.workdir`), or None for a
            run without files (no resume).
        stepper: a `Stepper`.
    """

    def __init__(self, config, workdir, stepper):
        self.config = as_config(config)
        self.workdir = Workdir(workdir) if workdir is not None else None
        self.stepper = stepper
        self.info = dataset_info(self.config.dataset, self.config.data_path)
        self.history = []
        self.test_data = None

    # -- the sequence ---------------------------------------------------------------
    def train(self):
        """Trains (or resumes, or returns the stored results of a complete run).

        Returns:
            dict: ``test_accuracy``, ``test_loss``, ``history`` (per-epoch dicts),
            ``epochs``, ``steps``, ``resumed_from_epoch`` (0 for a fresh start, None
            when the run was already complete), ``train_time_s``, ``num_replicas``,
            ``model_path`` and ``workdir`` (None where this process writes no files),
            plus the stepper's `Stepper.labels`.
        """
        self.owns_files = self.workdir is not None and self.stepper.is_chief
        with self.workdir.lock() if self.owns_files else contextlib.nullcontext():
            return self._train()

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
        state = self.stepper.agree(self, state, refused)
        if self.complete(state):
            return self.stored_results(state)
        start_epoch = state["epoch"] if state else 0
        self.history = list(state.get("history", [])) if state else []
        self.model, optimizer = self.build()
        fingerprint = weights_fingerprint(self.model)
        self.stepper.restore(self, self.model, optimizer, state)
        if self.owns_files:
            self.start_files(state)
        recorder = EpochRecorder(config=self.config, workdir=self.workdir if self.owns_files else None,
                                 schedule=self.config.make_schedule(self.spe),
                                 history=self.history, fingerprint=fingerprint)
        t0 = time.time()
        if start_epoch < self.epochs:
            self.stepper.train_epochs(self, self.model, start_epoch, recorder)
        train_time = time.time() - t0
        extra = self.stepper.finish(self, self.model)
        results = self.stepper.evaluate(self, self.model)
        return {**self.finish(self.model, results, extra), "resumed_from_epoch": start_epoch,
                "train_time_s": train_time}

    # -- its steps --------------------------------------------------------------------
    def check_workdir(self):
        """Refuses a workdir that holds another run; returns its state or None. Reads only.

        Raises:
            ValueError: if the workdir holds a run with a different config, checkpoints
                without a config, or an unreadable state.
        """
        wd = self.workdir
        stored = wd.read_config()
        if stored is None:
            if wd.checkpoint_files() or any(map(os.path.exists, (wd.state_path, wd.final_model_path))):
                raise ValueError(
                    f"The workdir {wd.path} holds checkpoints but no config.json, so it cannot "
                    "be checked against this run. Use an empty or new --workdir.")
            return None
        if not isinstance(stored, dict) or "train_config" not in stored:
            raise ValueError(f"{wd.config_path} is not a keras-preact training config. "
                             "Use an empty or new --workdir.")
        diff = self.config.differences(TrainConfig.from_dict(stored["train_config"]),
                                       ignore=RUNTIME_FIELDS)
        if diff:
            lines = ", ".join(f"{k}: stored {b!r}, requested {a!r}" for k, (a, b) in diff.items())
            raise ValueError(
                f"The workdir {wd.path} holds a run with a different config ({lines}). "
                "Nothing was changed. Restart with the same settings to resume, or use a "
                "new --workdir.")
        return wd.read_state()

    def complete(self, state):
        """Whether `state` is that of a finished run (whose final model exists)."""
        return bool(state and state.get("complete") and (
            not self.owns_files or os.path.exists(self.workdir.final_model_path)))

    def stored_results(self, state):
        """The results of a finished run, as `train` returns them."""
        if not self.owns_files:
            return {"test_accuracy": float("nan"), "test_loss": float("nan"), "history": [],
                    "epochs": None, "steps": None, "resumed_from_epoch": None,
                    "train_time_s": 0.0, "num_replicas": self.stepper.replicas,
                    "model_path": None, "workdir": None, **self.stepper.labels}
        metrics = read_json(self.workdir.file(METRICS_JSON))
        logger.info("The run in %s is complete; returning its results.", self.workdir.path)
        return {"test_accuracy": metrics.get("test_accuracy"), "test_loss": metrics.get("test_loss"),
                "history": metrics["epochs"], "epochs": state["epoch"], "steps": state["step"],
                "resumed_from_epoch": None, "train_time_s": 0.0,
                "num_replicas": metrics.get("num_replicas"),
                "model_path": self.workdir.final_model_path, "workdir": self.workdir.path,
                **self.stepper.labels}

    def tf_data(self):
        """The tf.data test split and a maker of training data; returns the split sizes
        counted from the files read (not the published ones)."""
        from keras_preact import data

        c = self.config
        make = functools.partial(
            data.make_dataset, c.dataset, batch_size=c.batch_size, data_dir=c.data_dir,
            source=c.data_source, path=c.data_path, download=c.download, seed=c.seed,
            normalize=not c.model_normalizes())
        test = functools.partial(make, "test", shuffle=False, augment=False, drop_remainder=False)
        # The test split first: missing or corrupt files fail before the workdir is touched.
        self.test_data = test()
        self.train_data = functools.partial(make, "train", augment=c.augment, drop_remainder=True)
        return int(self.train_data(batch_size=1).cardinality()), int(test(batch_size=1).cardinality())

    def _plan(self):
        """Steps per epoch and the schedule for the training split's size."""
        c, n = self.config, self.num_train
        self.spe, dropped = divmod(n, c.batch_size)
        if self.spe < 1:
            raise ValueError(f"batch_size={c.batch_size} is larger than the {c.dataset!r} "
                             f"training split ({n} images).")
        if dropped:  # whole batches only: say so rather than lose images silently
            logger.warning("Training drops the last %d of %d training images each epoch "
                           "(batch %d).", dropped, n, c.batch_size)
        if self.spe < FEW_STEPS_PER_EPOCH:
            logger.warning(
                "An epoch is only %d step(s) (%d training images at batch %d): its checkpoint and "
                "evaluation cost more than its training; a smaller batch size gives more steps.",
                self.spe, n, c.batch_size)
        sched = c.resolve_schedule(self.spe)
        self.epochs, self.total_steps = sched["epochs"], sched["total_steps"]
        replicas = self.stepper.replicas
        self.schedule_info = {**sched, "num_replicas": replicas,
                              "per_replica_batch": c.batch_size // replicas,
                              **self.stepper.schedule_labels}

    def build(self):
        """The compiled model and its built optimizer, in the stepper's scope."""
        import keras

        from keras_preact.training import distribute
        from keras_preact.training.optimizers import make_optimizer

        c = self.config
        distribute.seed_everything(c.seed)
        with self.stepper.scope():
            model = build_model(c, self.info)
            if c.synchronized_bn and self.stepper.switch_synchronized_bn:
                # On the built layers, not through the constructor: the saved model's
                # config stays free of a TensorFlow-only training setting.
                distribute.set_synchronized_batch_norm(model, True)
            if c.freeze:  # before compiling: the optimizer holds only the trainable part
                from keras_preact import finetune

                finetune.freeze(model, list(c.freeze))
            optimizer = make_optimizer(c, self.spe)
            if c.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            compile_model(model, optimizer, jit_compile=bool(c.jit_compile))
            optimizer.build(model.trainable_variables)
        return model, optimizer

    def checkpoint_path(self, state, fingerprint):
        """The checkpoint `state` names, refused unless it was written for `fingerprint`."""
        from keras_preact.weights.local import first_difference

        path = self.workdir.file(CHECKPOINT_DIR, state["checkpoint"])
        stored = state.get("fingerprint")
        if stored is not None and stored != fingerprint:
            first, a, b = first_difference(stored, fingerprint)
            raise ValueError(
                f"The checkpoint {path} does not fit the model {self.config.model!r}: it holds "
                f"{len(stored)} variables, the model {len(fingerprint)}; the first difference is "
                f"variable {first} (checkpoint: {a}, model: {b}). Nothing was changed. "
                "Use a new --workdir.")
        return path

    def load_checkpoint(self, model, optimizer, state):
        """Loads the checkpoint of `state` into `model` and `optimizer`."""
        path = self.checkpoint_path(state, weights_fingerprint(model))
        load_weights_file(model, path, self.config.model)
        if optimizer_step(optimizer) != int(state["step"]):
            raise ValueError(f"The checkpoint {path} holds {optimizer_step(optimizer)} optimizer "
                             f"steps but its state says {state['step']}; refusing to resume.")
        logger.info("Resuming %s from epoch %d (step %d) in %s.", self.config.model,
                    state["epoch"], state["step"], self.workdir.path)

    def load_pretrained(self, model):
        """Loads the config's pretrained `weights` into a fresh run's model."""
        from keras_preact import finetune

        loaded = finetune.load_pretrained(model, self.config.weights, model_name=self.config.model)
        logger.info("Fine-tuning from %s (%s).", loaded["source"],
                    "classifier loaded too" if loaded["copied_head"] else "new classifier")

    def start_files(self, state):
        """Tidies the workdir; a fresh run writes its config and empty reports (its
        first write: everything that can fail on bad input has run by now)."""
        for path in self.workdir.remove_stale_temporaries():
            logger.info("Removed %s (a write interrupted by a crash).", path)
        if state is None:
            import keras_preact

            os.makedirs(self.workdir.path, exist_ok=True)
            self.workdir.write_config({"format": CONFIG_FORMAT,
                                       "keras_preact_version": keras_preact.__version__,
                                       "train_config": self.config.to_dict()})
            write_reports(self.workdir, self.config, self.history, schedule_info=self.schedule_info)

    def finish(self, model, results, extra):
        """Writes the final model and reports (in the workdir) and returns the results."""
        final = {
            "test_accuracy": results["accuracy"], "test_loss": results["loss"],
            "num_train_examples": self.num_train, "num_test_examples": self.num_test,
            "num_params": int(model.count_params()), "num_replicas": self.stepper.replicas,
            "input_normalization": {"in_model": self.config.model_normalizes(),
                                    **dataset_preprocessing(self.info)},
            "schedule": self.schedule_info, "curve_path": CURVE_PNG,
            "model_path": FINAL_MODEL, **extra,
        }
        if self.owns_files:
            wd = self.workdir
            atomic_save(wd.final_model_path, model.save)
            write_reports(wd, self.config, self.history, schedule_info=self.schedule_info, final=final)
            state = {k: v for k, v in wd.read_state().items() if k != "format"}
            wd.write_state({**state, "complete": True})
        return {"test_accuracy": final["test_accuracy"], "test_loss": final["test_loss"],
                "history": self.history,
                "epochs": self.history[-1]["epoch"] if self.history else 0,
                "steps": optimizer_step(model.optimizer), "num_replicas": self.stepper.replicas,
                "model_path": self.workdir.final_model_path if self.owns_files else None,
                "workdir": self.workdir.path if self.owns_files else None,
                **self.stepper.labels, **extra}
