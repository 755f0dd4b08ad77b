"""The files of one training run, each written whole or not at all. Layout of a workdir::

    config.json                 the TrainConfig (a restart must match it)
    checkpoints/state.json      the last completed epoch: its checkpoint and history
    checkpoints/ckpt-00012.weights.h5  model and optimizer variables after epoch 12
    metrics.json, metrics.csv   per-epoch metrics; final test_accuracy / test_loss
    training_curve.png          loss and error per epoch
    tensorboard/                TensorBoard event files
    model.keras                 the final model
    .lock                       held by the process training in the workdir
"""

import contextlib
import os
import shutil
from pathlib import Path

from keras_preact.file_io import (atomic_write_bytes, atomic_write_json, figure_png, read_json,
                                user_path, write_csv_rows)

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "state.json"
METRICS_JSON = "metrics.json"
METRICS_CSV = "metrics.csv"
CURVE_PNG = "training_curve.png"
TENSORBOARD_DIR = "tensorboard"
FINAL_MODEL = "model.keras"
LOCK_FILE = ".lock"
STATE_FORMAT = 1
#: What a run writes into its workdir (`Workdir.discard_run` removes them).
RUN_FILES = (CONFIG_FILE, CHECKPOINT_DIR, METRICS_JSON, METRICS_CSV, CURVE_PNG, TENSORBOARD_DIR,
             FINAL_MODEL)
#: The columns of ``metrics.csv``, in this order (then any other key of an epoch's record).
#: ``time_s`` and ``images_per_s`` count the epoch's training, ``eval_time_s`` its
#: evaluation; ``raw_val_*``: a moving-average run's raw weights (``val_*``: the averaged).
METRICS_COLUMNS = ("epoch", "step", "learning_rate", "time_s", "images_per_s", "eval_time_s",
                   "loss", "accuracy", "val_loss", "val_accuracy", "raw_val_loss",
                   "raw_val_accuracy")


class WorkdirInUseError(RuntimeError):
    """Another process is training in the workdir (see `Workdir.lock`)."""


class Workdir:
    """Paths and state of one run's folder (created on first write, not here)."""

    def __init__(self, path):
        if not isinstance(path, (str, os.PathLike)) or not str(path).strip():  # '' is cwd
            raise ValueError(f"`workdir` (--workdir) must be a folder path. Received: "
                             f"workdir={path!r}")
        self.path = user_path(path)
        self.config_path, self.state_path, self.final_model_path = (
            self.file(CONFIG_FILE), self.file(CHECKPOINT_DIR, STATE_FILE), self.file(FINAL_MODEL))
        existing = next(p for p in (Path(self.path), *Path(self.path).parents) if p.exists())
        if not os.path.isdir(existing):
            raise ValueError(
                f"`workdir` must be a folder, but {existing} is a file. Received: workdir={path!r}")

    @contextlib.contextmanager
    def lock(self):
        """Holds the workdir for this process (a second run fails: `WorkdirInUseError`). A
        folder that holds no run afterwards (one refused, or discarded) is left as it was found."""
        import filelock
        created = not os.path.isdir(self.path)
        new_lock = not os.path.exists(self.file(LOCK_FILE))
        os.makedirs(self.path, exist_ok=True)
        lock = filelock.FileLock(self.file(LOCK_FILE), timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise WorkdirInUseError(f"The workdir {self.path} is in use by another process (it "
                                    f"holds {self.file(LOCK_FILE)}). Nothing was changed. Wait "
                                    "for that run to end, or use another workdir.") from None
        try:
            yield
        finally:
            lock.release()
            if new_lock and not self.holds_run():  # no run (or another's file): as found
                Path(self.file(LOCK_FILE)).unlink(missing_ok=True)
                if created:
                    with contextlib.suppress(OSError):  # not empty, or another run began there
                        os.rmdir(self.path)

    def file(self, *parts):
        return os.path.join(self.path, *parts)

    def checkpoint_path(self, epoch):
        return self.file(CHECKPOINT_DIR, f"ckpt-{epoch:05d}.weights.h5")

    def read_config(self):
        """The stored config dict, or None when the workdir holds no run."""
        return read_json(self.config_path) if os.path.exists(self.config_path) else None

    def read_train_config(self):
        """The stored `TrainConfig` dict, or None; ValueError if config.json is not a run's."""
        stored = self.read_config()
        if stored is None or isinstance(stored, dict) and "train_config" in stored:
            return stored and stored["train_config"]
        raise ValueError(f"{self.config_path} is not a keras-preact run configuration (a JSON "
                         "object with \"train_config\" expected): choose another --workdir. "
                         f"Received: {str(stored)[:200]}")

    def holds_run(self):
        """Whether the folder holds a keras-preact run (its config.json); None where its
        config.json is another program's."""
        with contextlib.suppress(ValueError):
            return self.read_train_config() is not None

    def read_state(self):
        """The last completed epoch's state, or None; ValueError if it is unreadable."""
        if not os.path.exists(self.state_path):
            return None
        state = read_json(self.state_path)
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ValueError(f"{self.state_path} is not a keras-preact training state (format "
                             f"{STATE_FORMAT}). Received: {str(state)[:200]}")
        if not os.path.exists(ckpt := self.file(CHECKPOINT_DIR, state["checkpoint"])):
            raise ValueError(f"{self.state_path} names the checkpoint {ckpt}, which is missing "
                             "(the workdir was changed outside keras-preact). Put that file "
                             "back to resume, or start the run over in a new --workdir.")
        return state

    def write_state(self, state):
        atomic_write_json(self.state_path, {"format": STATE_FORMAT, **state})

    def prune_checkpoints(self, keep, current):
        """Deletes all but the newest `keep` checkpoints (never `current`)."""
        files = sorted(Path(self.file(CHECKPOINT_DIR)).glob("ckpt-*.weights.h5"))
        for path in files[: max(0, len(files) - keep)]:
            if path.name != current:
                path.unlink(missing_ok=True)

    def write_reports(self, metrics, history, *, title):
        """Writes `metrics` (``metrics.json``) and `history` (``metrics.csv``, the curve)."""
        atomic_write_json(self.file(METRICS_JSON), metrics)
        keys = {key for row in history for key in row}
        columns = [c for c in METRICS_COLUMNS if c in keys] + sorted(keys - set(METRICS_COLUMNS))
        write_csv_rows(self.file(METRICS_CSV), history, columns)
        atomic_write_bytes(self.file(CURVE_PNG), plot_training_curve(history, title=title))

    def listing(self):
        """The sorted names in the workdir, hidden ones (the lock, temporaries) aside."""
        names = os.listdir(self.path) if os.path.isdir(self.path) else []
        return sorted(n for n in names if not n.startswith("."))

    def discard_run(self):
        """Removes the files of a run that failed before its first checkpoint."""
        for path in map(Path, map(self.file, RUN_FILES)):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def remove_stale_temporaries(self):
        """Deletes the ``.tmp-*`` files a killed writer left behind; returns their paths."""
        removed = [path for folder in (self.path, self.file(CHECKPOINT_DIR))
                   for path in Path(folder).glob(".tmp-*")]
        for path in removed:
            path.unlink(missing_ok=True)
        return [str(path) for path in removed]


def plot_training_curve(history, *, title=""):
    """PNG bytes of loss and error per epoch (as the paper's Fig. 6), from `history`'s dicts
    ("epoch" and any of "loss", "accuracy", "val_loss", "val_accuracy"); no pyplot."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(9, 3.6), dpi=100)
    panels = (("loss", "loss", float), ("accuracy", "error (%)", lambda v: 100 * (1 - float(v))))
    for ax, (key, ylabel, to_y) in zip(fig.subplots(1, 2), panels):
        for name, label, style in ((key, "train", "-"), ("val_" + key, "test", "--"),
                                   ("raw_val_" + key, "test, raw weights", ":")):
            if rows := [row for row in history if row.get(name) not in (None, "")]:
                ax.plot([r["epoch"] for r in rows], [to_y(r[name]) for r in rows], style,
                        marker="." if len(rows) < 30 else None, label=label)
        ax.set(xlabel="epoch", ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
    return figure_png(fig, title)


def workdir_of(path):
    """The training workdir that `path` is (a folder) or holds (a file in it or one of its
    checkpoints), or None."""
    path = user_path(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path) if os.path.isfile(path) else ""
    if os.path.basename(folder) == CHECKPOINT_DIR:
        folder = os.path.dirname(folder)
    return folder if folder and os.path.isfile(os.path.join(folder, CONFIG_FILE)) else None


def run_metrics(model_path):
    """The held-out metrics of the training run that wrote `model_path` (its
    ``metrics.json``, for a model card), or None. ValueError if that file is not JSON."""
    workdir = workdir_of(model_path)
    if not workdir or not os.path.isfile(path := os.path.join(workdir, METRICS_JSON)):
        return None
    final = read_json(path)
    # Metrics that name another model file (a checkpoint exported by hand) are not its.
    if final.get("model_path", FINAL_MODEL) != os.path.basename(model_path):
        return None
    return {k: final[k] for k in ("dataset", "test_accuracy", "test_loss") if k in final} or None
