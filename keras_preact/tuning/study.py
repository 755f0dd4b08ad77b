"""A resumable tuning study in a workdir: ``study.json`` (space, tuner, budget; a re-run
must match it), ``search/`` (KerasTuner's project), ``results.csv``, ``results.png`` and
``best/`` (``model.keras``, ``saved_model/1``, ``best.json``). Distributed search is
KerasTuner's chief / worker mode (``KERASTUNER_*`` variables, a shared workdir)."""

import contextlib
import inspect
import json
import logging
import os
import pathlib
import shutil
import time

import keras_tuner

import keras_preact
from keras_preact import private_api
from keras_preact.checks import check_int, check_known_arguments
from keras_preact.export import export_saved_model
from keras_preact.file_io import (atomic_save, atomic_write_bytes, atomic_write_json, figure_png,
                                read_json, write_csv_rows)
from keras_preact.training.distribute import make_strategy
from keras_preact.training.workdir import Workdir
from keras_preact.tuning.hypermodel import (OBJECTIVE, PreActResNetHyperModel, search_space_spec,
                                            valid_blocks)

logger = logging.getLogger("keras_preact.tuning")

TUNERS = ("random", "bayesian", "hyperband")
STUDY_FILE = "study.json"
PROJECT = "search"
RESULTS_CSV = "results.csv"
RESULTS_PNG = "results.png"
BEST_DIR = "best"
STUDY_FORMAT = 1
WORKER_WAIT_S = 600  #: seconds a distributed worker waits for the chief's study.json
RUNTIME_KEYS = ("max_trials",)  #: study settings that may change between runs
_METRICS = ("params", "macs", "val_accuracy", "within_budget", "step_time_s", "train_time_s",
            "replicas")
_HYPERPARAMETERS = ("width", "learning_rate", "weight_decay", "warmup")
CSV_COLUMNS = ("trial", "status", "depth", "block", "unit") + _HYPERPARAMETERS + _METRICS


def _check_tuner(tuner, max_trials):
    if tuner not in TUNERS:
        raise ValueError(f"Unknown tuner. Received: tuner={tuner!r}. Valid: {list(TUNERS)}")
    check_int("max_trials", max_trials, minimum=1)


def make_tuner(hypermodel, tuner="random", *, directory, project_name=PROJECT, max_trials=10,
               overwrite=False, distribution_strategy=None, seed=0, hyperband_factor=3):
    """A KerasTuner tuner for a `PreActResNetHyperModel`, maximising validation accuracy.

    Args:
        tuner: "random", "bayesian" or "hyperband" (``max_epochs``: the hypermodel's
            `epochs`, with `hyperband_factor`; `max_trials` does not apply).
        overwrite: start the project again (default False: continue it).
        distribution_strategy: None, a `tf.distribute.Strategy` (one worker, several
            devices) or a name of `keras_preact.training.STRATEGIES`.
        seed: the oracle's seed."""
    _check_tuner(tuner, max_trials)
    if isinstance(distribution_strategy, str):
        distribution_strategy = make_strategy(distribution_strategy)
    hypermodel.distribution_strategy = distribution_strategy
    common = dict(objective=keras_tuner.Objective(OBJECTIVE, direction="max"),
                  directory=directory, project_name=project_name, overwrite=overwrite,
                  distribution_strategy=distribution_strategy, seed=seed)
    if tuner == "hyperband":
        return keras_tuner.Hyperband(hypermodel, max_epochs=max(2, hypermodel.epochs),
                                     factor=hyperband_factor, **common)
    cls = keras_tuner.RandomSearch if tuner == "random" else keras_tuner.BayesianOptimization
    return cls(hypermodel, max_trials=max_trials, **common)


def study_document(spec, *, tuner, max_trials):
    """The ``study.json`` content of a search space `spec` (`search_space_spec`)."""
    return {"format": STUDY_FORMAT, "keras_preact_version": keras_preact.__version__,
            "tuner": tuner, "max_trials": max_trials, "space": spec}


def check_study_workdir(workdir, document, *, overwrite=False):
    """True if the workdir holds this study already (with `overwrite`: any study), False if
    it is new or empty; raises ValueError if it holds another study or files that are not one.
    Reads only."""
    if not os.path.exists(path := os.path.join(workdir, STUDY_FILE)):
        if os.path.isdir(workdir) and os.listdir(workdir):
            raise ValueError(f"The workdir {workdir} is not empty and holds no {STUDY_FILE}: it "
                             "is not a tuning study. Nothing was changed. Use an empty or new "
                             "--workdir.")
        return False
    if not isinstance(stored := read_json(path), dict) or "space" not in stored:
        raise ValueError(f"{path} is not a keras-preact study. Nothing was changed. "
                         "Use a new --workdir.")
    ignored = RUNTIME_KEYS + ("keras_preact_version",)
    # Through JSON, as stored: tuples become lists.
    a, b = ({k: v for k, v in json.loads(json.dumps(d)).items() if k not in ignored}
            for d in (document, stored))
    if a == b or overwrite:
        return True
    a, b = ({**d["space"], "tuner": d.get("tuner")} for d in (a, b))
    diff = [f"{key}: stored {b.get(key)!r}, requested {a.get(key)!r}"
            for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    raise ValueError(f"The workdir {workdir} holds another study ({'; '.join(diff)}). Nothing "
                     "was changed. Re-run with the same settings to resume, --overwrite to start "
                     "this study there instead, or use a new --workdir.")


def tune(workdir, *, tuner="random", max_trials=10, overwrite=False, export=True,
         distribution_strategy=None, verbose=1, **space):
    """Runs (or resumes) a depth sweep and writes its results.

    Args:
        workdir: the study's folder (see the module doc for its layout).
        tuner, distribution_strategy: see `make_tuner`.
        max_trials: may grow between runs to extend a search.
        overwrite: start this study again, replacing the study the workdir holds.
        export: save the best trial as ``.keras`` and SavedModel.
        **space: the `PreActResNetHyperModel` arguments.

    Returns:
        dict: ``rows``, ``best`` (a row or None), ``csv``, ``png``, ``best_model``,
        ``saved_model`` (paths or None), ``role`` and ``workdir``.

    Raises ValueError for an invalid space, a budget no candidate fits, missing data or a
    workdir holding another study, before anything is written. A study that fails before its
    first trial completes leaves nothing behind."""
    check_known_arguments(space, inspect.signature(search_space_spec).parameters, where="tune")
    workdir = Workdir(workdir).path  # a folder path, not under a file
    _check_tuner(tuner, max_trials)
    role = distributed_role()
    spec = search_space_spec(**space)
    document = study_document(spec, tuner=tuner, max_trials=max_trials)
    # The chief owns the workdir: a worker waits for its study.json and writes nothing.
    deadline = time.time() + WORKER_WAIT_S
    if role == "worker" and not os.path.exists(os.path.join(workdir, STUDY_FILE)):
        logger.info("Waiting up to %s s for the chief at %s:%s to write %s in %s.", WORKER_WAIT_S,
                    os.environ["KERASTUNER_ORACLE_IP"], os.environ["KERASTUNER_ORACLE_PORT"],
                    STUDY_FILE, workdir)
    while role == "worker" and not os.path.exists(os.path.join(workdir, STUDY_FILE)):
        if time.time() > deadline:
            raise ValueError(f"No {STUDY_FILE} appeared in {workdir} within {WORKER_WAIT_S} s: "
                             "start the chief (KERASTUNER_TUNER_ID=chief) with the same "
                             "--workdir on a shared disk.")
        time.sleep(0.5)
    exists = check_study_workdir(workdir, document, overwrite=overwrite)
    hypermodel = PreActResNetHyperModel(**space)  # may refuse the budget
    _ = hypermodel.arrays  # missing or bad data fails here, before anything is written
    fresh, created = role != "worker" and (overwrite or not exists), not os.path.isdir(workdir)
    if fresh:
        _discard_study(workdir)
    if role != "worker":
        atomic_write_json(os.path.join(workdir, STUDY_FILE), document)
    kt_tuner = None
    try:
        kt_tuner = make_tuner(hypermodel, tuner, directory=workdir, max_trials=max_trials,
                              distribution_strategy=distribution_strategy, seed=spec["seed"])
        if role == "chief":
            serve_chief(kt_tuner, verbose=verbose)
        else:
            kt_tuner.search(verbose=verbose)
    except BaseException:
        if fresh and not (kt_tuner and any(t.status == "COMPLETED"
                                           for t in kt_tuner.oracle.trials.values())):
            _discard_study(workdir, remove_folder=created)  # the failed start leaves nothing
        raise
    result = dict.fromkeys(("rows", "best", "csv", "png", "best_model", "saved_model"))
    if role != "worker":
        result.update(write_results(kt_tuner, hypermodel, workdir, export=export))
    return {**result, "role": role, "workdir": workdir}


def distributed_role():
    """KerasTuner's distributed role from its environment variables: None (one process),
    "chief" or "worker"; ValueError for a partial set or a port that is not a number."""
    names = ("KERASTUNER_TUNER_ID", "KERASTUNER_ORACLE_IP", "KERASTUNER_ORACLE_PORT")
    values = {name: os.environ.get(name, "") for name in names}
    if not any(values.values()):
        return None
    if missing := [name for name in names if not values[name]]:
        received = ", ".join(f"{n}={v!r}" for n, v in values.items() if v)
        raise ValueError(f"KerasTuner's chief / worker mode needs {', '.join(names)}; "
                         f"{', '.join(missing)} is not set. Received: {received}. Unset them "
                         "all for a study in one process.")
    port = values["KERASTUNER_ORACLE_PORT"]
    if not (port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError("KERASTUNER_ORACLE_PORT must be a port number 1..65535. Received: "
                         f"KERASTUNER_ORACLE_PORT={port!r}")
    return "chief" if "chief" in values["KERASTUNER_TUNER_ID"] else "worker"


def _discard_study(workdir, *, remove_folder=False):
    """Removes a study's files from `workdir` (with `remove_folder`, the folder if empty)."""
    for name in (PROJECT, BEST_DIR):
        shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
    for name in (STUDY_FILE, RESULTS_CSV, RESULTS_PNG):
        pathlib.Path(workdir, name).unlink(missing_ok=True)
    if remove_folder:
        with contextlib.suppress(OSError):  # not empty
            os.rmdir(workdir)


def serve_chief(kt_tuner, *, verbose=1, poll_s=0.5):
    """Runs the oracle for the workers until every trial is done and every worker left,
    polling every `poll_s` seconds (KerasTuner's chief `search()` polls every 20 s)."""
    from concurrent import futures

    import grpc
    kt_tuner.oracle.verbose = verbose
    kt_tuner.save()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    done = private_api.add_oracle_servicer(server, kt_tuner.oracle)
    address = f"{os.environ['KERASTUNER_ORACLE_IP']}:{os.environ['KERASTUNER_ORACLE_PORT']}"
    server.add_insecure_port(address)
    server.start()
    logger.info("Chief oracle serving on %s.", address)
    try:
        while not done():
            time.sleep(poll_s)
    finally:
        server.stop(grace=2).wait()
    kt_tuner.oracle.save()


def results_rows(oracle, hypermodel):
    """The results table: one dict per trial (`CSV_COLUMNS`), in trial order."""
    rows = []
    for trial_id, trial in sorted(oracle.trials.items()):
        values = trial.hyperparameters.values
        depth, block = values.get("depth"), values.get("block")
        if depth is not None and (block is None or not trial.hyperparameters.is_active("block")):
            block = valid_blocks(depth, hypermodel.blocks)[0]
        row = {"trial": trial_id, "status": trial.status, "depth": depth, "block": block,
               "unit": values.get("unit", ""), **{k: values.get(k) for k in _HYPERPARAMETERS}}
        for name in _METRICS:
            value = trial.metrics.get_last_value(name) if trial.metrics.exists(name) else None
            if value is not None and name in ("params", "macs", "within_budget", "replicas"):
                value = int(round(value))
            row[name] = value
        rows.append(row)
    return rows


def best_row(rows):
    """The completed, within-budget row with the highest validation accuracy (first on ties)."""
    done = [r for r in rows if r["status"] == "COMPLETED" and r["val_accuracy"] is not None
            and r["within_budget"] == 1]
    return max(done, key=lambda r: (r["val_accuracy"], -int(r["trial"])), default=None)


def write_results(kt_tuner, hypermodel, workdir, *, export=True):
    """Writes results.csv, results.png and, with `export`, the best trial's model as
    ``best/model.keras``, ``best/saved_model/1`` and ``best/best.json``."""
    rows = results_rows(kt_tuner.oracle, hypermodel)
    out = {"rows": rows, "best": (row := best_row(rows)), "csv": os.path.join(workdir, RESULTS_CSV),
           "png": os.path.join(workdir, RESULTS_PNG)}
    write_csv_rows(out["csv"], rows, CSV_COLUMNS)
    atomic_write_bytes(out["png"], plot_results(rows, budget=hypermodel.spec["budget"],
                                                title=hypermodel.dataset))
    if export and row is not None:
        trial = kt_tuner.oracle.get_trial(row["trial"])
        model = kt_tuner.load_model(trial)
        best_dir = os.path.join(workdir, BEST_DIR)
        out["best_model"] = os.path.join(best_dir, "model.keras")
        atomic_save(out["best_model"], model.save)
        out["saved_model"] = export_saved_model(
            model, os.path.join(best_dir, "saved_model"), overwrite=True,
            metrics={"val_accuracy": row["val_accuracy"]},
            weights_info={"source": "keras-preact tune", "trial": row["trial"]})
        atomic_write_json(os.path.join(best_dir, "best.json"), {
            "trial": row["trial"], "row": row, "hyperparameters": trial.hyperparameters.values})
    return out


def retrain(workdir, trial=None, *, verbose=0):
    """Trains a finished trial's hyperparameters again (default `trial`: the best) with the
    study's seed (`verbose`: Keras' `fit` verbosity). Returns a dict with ``trial``,
    ``val_accuracy`` (this run), ``recorded`` (the search's) and ``model``. Raises ValueError
    if the workdir holds no study or the trial is unknown or unfinished."""
    if not os.path.exists(path := os.path.join(os.path.abspath(workdir), STUDY_FILE)):
        raise ValueError(f"No study in {workdir} ({STUDY_FILE} missing). "
                         f"Received: workdir={workdir!r}")
    doc = read_json(path)
    hypermodel = PreActResNetHyperModel(**doc["space"])
    kt_tuner = make_tuner(hypermodel, doc["tuner"], directory=os.path.abspath(workdir),
                          max_trials=doc["max_trials"])
    rows = results_rows(kt_tuner.oracle, hypermodel)
    row = best_row(rows) if trial is None else next((r for r in rows if r["trial"] == trial), None)
    if row is None or row["status"] != "COMPLETED":
        raise ValueError(f"No finished trial {trial!r} in {workdir}. "
                         f"Trials: {[r['trial'] for r in rows]}")
    hp = kt_tuner.oracle.get_trial(row["trial"]).hyperparameters.copy()
    model = hypermodel.build(hp)
    metrics = hypermodel.fit(hp, model, callbacks=[], verbose=verbose)
    return {"trial": row["trial"], "val_accuracy": metrics["val_accuracy"],
            "recorded": row["val_accuracy"], "model": model}


def plot_results(rows, *, budget=None, title=""):
    """Validation accuracy vs depth and vs multiply-adds, as PNG bytes."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(10, 4), dpi=100)
    done = [r for r in rows if r["val_accuracy"] is not None and r["within_budget"] == 1]
    best = best_row(rows)
    panels = (("depth", 1, "depth"), ("macs", 1e6, "multiply-adds per image (M)"))
    for (key, scale, xlabel), ax in zip(panels, fig.subplots(1, 2)):
        for block, marker in (("basic", "o"), ("bottleneck", "s")):
            if pts := [r for r in done if r["block"] == block]:
                ax.scatter([r[key] / scale for r in pts], [100 * r["val_accuracy"] for r in pts],
                           marker=marker, label=block)
        if best is not None:
            ax.scatter([best[key] / scale], [100 * best["val_accuracy"]], s=160,
                       facecolors="none", edgecolors="red", label="best")
        if key == "macs" and budget and budget["kind"] == "macs":
            ax.axvline(budget["limit"] / scale, color="gray", linestyle="--", label="budget")
        costs = [r[key] for r in done]
        if key == "macs" and costs and max(costs) > 10 * max(1, min(costs)):
            ax.set_xscale("log")
        ax.set(xlabel=xlabel, ylabel="validation accuracy (%)")
        ax.grid(True, alpha=0.3)
        if ax.collections:
            ax.legend()
    return figure_png(fig, f"Depth sweep{': ' + title if title else ''} ({len(done)} trials)")
