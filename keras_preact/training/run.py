"""The parts of one training run that every training loop shares (TensorFlow).

`model.fit` (`keras_preact.training.trainer`) and the multi-worker loop
(`keras_preact.training.multiworker`) both build the model from the config, check and
fill the same workdir and record every epoch the same way, so a workdir looks the same
whichever loop wrote it. Importing this module does not import Keras.
"""

import logging
import os
import time

from keras_preact.training.config import RUNTIME_FIELDS
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import precision_dtype
from keras_preact.training.workdir import METRICS_JSON
from keras_preact.files import atomic_save
from keras_preact.training.workdir import read_json

logger = logging.getLogger("keras_preact.training")

CONFIG_FORMAT = 1


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
    dtype = precision_dtype(config.precision)
    defaults = {"classes": info["num_classes"], "input_shape": tuple(info["image_shape"])}
    if config.preprocessing_in_model:
        defaults["preprocessing"] = dataset_preprocessing(info)
    if getattr(config, "weights", None) is not None and architecture is None:
        # A catalog tag fixes architecture arguments its weights need (e.g.
        # first_unit_shared_preact=False for the converted pytorchcv nets).
        from keras_preact.finetune import pretrained_architecture

        defaults.update(pretrained_architecture(config.model, config.weights))
    try:
        if architecture is not None:
            arch = {**defaults, "name": config.model, **dict(architecture), **kwargs}
            if dtype:
                arch["dtype"] = dtype
            return keras_preact.PreActResNet(**arch)
        kwargs = {**defaults, **kwargs}
        if dtype:
            kwargs["dtype"] = dtype
        return keras_preact.get_model(config.model, **kwargs)
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
    return {
        "mean": [float(m) for m in info["mean"]],
        "std": [float(v) for v in info["std"]],
        "scale": 1.0 / 255.0,
    }


def config_document(config):
    """The ``config.json`` of a run: its `TrainConfig` with the format and version."""
    import keras_preact

    return {
        "format": CONFIG_FORMAT,
        "keras_preact_version": keras_preact.__version__,
        "train_config": config.to_dict(),
    }


def check_workdir(config, workdir):
    """Refuses a workdir that holds another run; returns the stored state or None.

    Reads only: nothing is written or deleted.

    Raises:
        ValueError: if `workdir` holds a run with a different config, or
            checkpoints without a config, or an unreadable state.
    """
    stored = workdir.read_config()
    if stored is None:
        if workdir.checkpoint_files() or os.path.exists(workdir.state_path) or os.path.exists(
            workdir.final_model_path
        ):
            raise ValueError(
                f"The workdir {workdir.path} holds checkpoints but no config.json, so "
                "it cannot be checked against this run. Use an empty or new --workdir."
            )
        return None
    if not isinstance(stored, dict) or "train_config" not in stored:
        raise ValueError(
            f"{workdir.config_path} is not a keras-preact training config. "
            "Use an empty or new --workdir."
        )
    stored_config = TrainConfig.from_dict(stored["train_config"])
    diff = config.differences(stored_config, ignore=RUNTIME_FIELDS)
    if diff:
        lines = ", ".join(f"{k}: stored {b!r}, requested {a!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"The workdir {workdir.path} holds a run with a different config ({lines}). "
            "Nothing was changed. Restart with the same settings to resume, or use a "
            "new --workdir."
        )
    return workdir.read_state()


def write_reports(workdir, config, history, *, schedule_info, final=None):
    """Writes ``metrics.json`` (``final``: the run's results), ``metrics.csv`` and the
    training curve from the per-epoch `history`."""
    metrics = {
        "model": config.model,
        "dataset": config.dataset,
        "epochs": history,
        "complete": final is not None,
    }
    if schedule_info is not None:
        metrics["schedule"] = schedule_info
    if final:
        metrics.update(final)
    else:
        # Keep what a previous write knew about the schedule.
        path = workdir.file(METRICS_JSON)
        if os.path.exists(path):
            try:
                previous = read_json(path)
                if "schedule" in previous:
                    metrics["schedule"] = previous["schedule"]
            except ValueError:
                pass
    workdir.write_metrics(metrics)
    workdir.write_metrics_csv(history)
    title = f"{config.model} on {config.dataset}"
    if final and "test_accuracy" in final:
        title += f" (test accuracy {100 * final['test_accuracy']:.2f}%)"
    workdir.write_curve(history, title=title)


class EpochRecorder:
    """Checkpoint, state and reports after every completed epoch, atomically.

    Both training loops record their epochs with it: `model.fit` through a callback
    (`keras_preact.training.trainer`), the multi-worker loop on its chief.

    Args:
        config: the run's `TrainConfig`.
        workdir: the run's `Workdir`.
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
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            if key in logs:
                entry[key] = float(logs[key])
        self.history.append(entry)
        name = os.path.basename(self.workdir.checkpoint_path(epoch + 1))
        atomic_save(self.workdir.checkpoint_path(epoch + 1), model.save_weights)
        # Only now does the state move on: a kill before this line leaves the
        # previous epoch's state and checkpoint intact.
        self.workdir.write_state(
            {"epoch": epoch + 1, "step": step, "checkpoint": name, "history": self.history,
             "complete": False, "fingerprint": self.fingerprint}
        )
        self.workdir.prune_checkpoints(self.config.keep_checkpoints, name)
        write_reports(self.workdir, self.config, self.history, schedule_info=None)
        logger.info("epoch %d done: step %d, checkpoint %s", epoch + 1, step, name)
