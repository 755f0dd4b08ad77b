"""A tuning study in a workdir: resumable search, results table and plot, best export.

Layout of a study's workdir::

    study.json          the search space, tuner and budget (a re-run must match it)
    search/             KerasTuner's project: oracle state, one folder per trial
    results.csv         one row per trial: hyperparameters, params, multiply-adds,
                        accuracy, times
    results.png         accuracy vs depth and vs cost
    best/model.keras    the best trial's model (its best epoch's weights)
    best/saved_model/1  the same model as a SavedModel (`keras_preact.export`)
    best/best.json      the best trial's hyperparameters and metrics

Resume. Running the same study again reloads KerasTuner's state (``overwrite=False``):
finished trials are kept and an interrupted trial is run again. ``overwrite=True``
starts this study again. A workdir holding another study (different space, tuner,
budget or recipe; or files that are not a study) is refused either way, before
anything is written.

Distributed search (KerasTuner's chief / worker mode). Start the same command in
several processes with ``KERASTUNER_ORACLE_IP`` / ``KERASTUNER_ORACLE_PORT`` set to
the chief's address and ``KERASTUNER_TUNER_ID`` set to ``chief`` for one process and
``tuner0``, ``tuner1``, ... for the workers. The chief runs the oracle and trains
nothing; workers train trials and report them. All processes need the same
``--workdir`` on a shared file system (workers write the trial checkpoints the chief
exports); a worker waits for the chief's ``study.json`` before it writes anything.
When the trials are done the workers exit, then the chief writes the results and the
export and exits.
"""

import csv
import io
import json
import logging
import os
import shutil
import time

from keras_preact.files import atomic_save
from keras_preact.files import atomic_write_bytes
from keras_preact.files import atomic_write_json
from keras_preact.files import atomic_write_text
from keras_preact.training.workdir import read_json

logger = logging.getLogger("keras_preact.tuning")

TUNERS = ("random", "bayesian", "hyperband")
STUDY_FILE = "study.json"
PROJECT = "search"
RESULTS_CSV = "results.csv"
RESULTS_PNG = "results.png"
BEST_DIR = "best"
STUDY_FORMAT = 1
#: Seconds a distributed worker waits for the chief's study.json.
WORKER_WAIT_S = 600
#: Study settings that may change between runs of one study.
RUNTIME_KEYS = ("max_trials",)
CSV_COLUMNS = (
    "trial", "status", "depth", "block", "unit", "width", "learning_rate", "weight_decay",
    "warmup", "params", "macs", "val_accuracy", "within_budget", "step_time_s", "train_time_s", "replicas",
)


def _dist_role():
    """"chief", "worker" or None (KerasTuner's environment variables)."""
    from keras_tuner.src.distribute import utils as dist_utils

    if not dist_utils.has_chief_oracle():
        return None
    return "chief" if dist_utils.is_chief_oracle() else "worker"


def make_tuner(hypermodel, tuner="random", *, directory, project_name=PROJECT, max_trials=10,
               overwrite=False, distribution_strategy=None, seed=0, hyperband_factor=3):
    """A KerasTuner tuner for a `PreActResNetHyperModel`, maximising validation accuracy.

    Args:
        hypermodel: a `PreActResNetHyperModel`.
        tuner: "random" (default), "bayesian" or "hyperband" (its ``max_epochs`` is
            the hypermodel's `epochs`; `max_trials` does not apply).
        directory: KerasTuner's folder; project_name: its project, default "search".
        max_trials: int >= 1, default 10.
        overwrite: bool, start the project again (default False: continue it).
        distribution_strategy: None, a `tf.distribute.Strategy` (single worker,
            several devices) or a name of `keras_preact.training.STRATEGIES`.
        seed: the oracle's seed, default 0.
        hyperband_factor: Hyperband's reduction factor, default 3.

    Returns:
        a `keras_tuner.Tuner`.

    Raises:
        ValueError: for an unknown tuner or an invalid `max_trials`.
    """
    import keras_tuner

    from keras_preact.tuning.hypermodel import OBJECTIVE

    if tuner not in TUNERS:
        raise ValueError(f"Unknown tuner. Received: tuner={tuner!r}. Valid: {list(TUNERS)}")
    if isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1:
        raise ValueError(f"`max_trials` must be a positive integer. Received: max_trials={max_trials!r}")
    if isinstance(distribution_strategy, str):
        from keras_preact.training.distribute import make_strategy

        distribution_strategy = make_strategy(distribution_strategy)
    hypermodel.distribution_strategy = distribution_strategy
    objective = keras_tuner.Objective(OBJECTIVE, direction="max")
    common = dict(
        objective=objective, directory=directory, project_name=project_name,
        overwrite=overwrite, distribution_strategy=distribution_strategy, seed=seed,
    )
    if tuner == "random":
        return keras_tuner.RandomSearch(hypermodel, max_trials=max_trials, **common)
    if tuner == "bayesian":
        return keras_tuner.BayesianOptimization(hypermodel, max_trials=max_trials, **common)
    return keras_tuner.Hyperband(
        hypermodel, max_epochs=max(2, hypermodel.epochs), factor=hyperband_factor, **common
    )


def study_document(spec, *, tuner, max_trials):
    import keras_preact

    return {
        "format": STUDY_FORMAT,
        "keras_preact_version": keras_preact.__version__,
        "tuner": tuner,
        "max_trials": max_trials,
        "space": spec,
    }


def check_study_workdir(workdir, document):
    """Refuses a workdir holding anything but this study. Reads only.

    Returns:
        True if the workdir holds this study already, False if it is new or empty.

    Raises:
        ValueError: if it holds another study or files that are not a study.
    """
    path = os.path.join(workdir, STUDY_FILE)
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"`workdir` must be a folder, but a file is there. Received: workdir={workdir!r}")
    if not os.path.exists(path):
        if os.path.isdir(workdir) and os.listdir(workdir):
            raise ValueError(
                f"The workdir {workdir} is not empty and holds no {STUDY_FILE}: it is not a "
                "tuning study. Nothing was changed. Use an empty or new --workdir."
            )
        return False
    stored = read_json(path)
    if not isinstance(stored, dict) or "space" not in stored:
        raise ValueError(f"{path} is not a keras-preact study. Nothing was changed. Use a new --workdir.")
    a = {k: v for k, v in _normal(document).items() if k not in RUNTIME_KEYS + ("keras_preact_version",)}
    b = {k: v for k, v in _normal(stored).items() if k not in RUNTIME_KEYS + ("keras_preact_version",)}
    if a != b:
        diff = []
        for key in sorted(set(a["space"]) | set(b.get("space", {}))):
            if a["space"].get(key) != b.get("space", {}).get(key):
                diff.append(f"{key}: stored {b.get('space', {}).get(key)!r}, requested {a['space'].get(key)!r}")
        if a.get("tuner") != b.get("tuner"):
            diff.append(f"tuner: stored {b.get('tuner')!r}, requested {a.get('tuner')!r}")
        raise ValueError(
            f"The workdir {workdir} holds another study ({'; '.join(diff)}). Nothing was "
            "changed, not even with --overwrite. Re-run with the same settings to resume, "
            "or use a new --workdir."
        )
    return True


def tune(workdir, *, tuner="random", max_trials=10, overwrite=False, export=True,
         distribution_strategy=None, verbose=1, **space):
    """Runs (or resumes) a depth sweep and writes its results.

    Args:
        workdir: the study's folder (see the module doc for its layout).
        tuner: "random", "bayesian" or "hyperband".
        max_trials: int, default 10 (may grow between runs to extend a search).
        overwrite: bool, start this study again (never another study's workdir).
        export: bool, default True: save the best trial as ``.keras`` and SavedModel.
        distribution_strategy: see `make_tuner`.
        verbose: KerasTuner and fit verbosity (0, 1, 2 or "auto").
        **space: the `PreActResNetHyperModel` arguments (dataset, depths, blocks,
            units, width_multipliers, learning_rates, weight_decays, warmups,
            epochs, batch_size, validation_fraction, seed, budget, data_*).

    Returns:
        dict: ``rows`` (the results table), ``best`` (the best row or None),
        ``csv``, ``png``, ``best_model``, ``saved_model`` (paths or None),
        ``role`` (None, "chief" or "worker") and ``workdir``.

    Raises:
        ValueError: for an invalid space, a budget no candidate fits, or a workdir
            holding another study -- before anything is written.
    """
    from keras_preact.tuning.hypermodel import PreActResNetHyperModel
    from keras_preact.tuning.hypermodel import search_space_spec

    if not isinstance(workdir, (str, os.PathLike)) or not os.fspath(workdir):
        raise ValueError(f"`workdir` must be a folder path. Received: workdir={workdir!r}")
    workdir = os.path.abspath(os.fspath(workdir))
    if tuner not in TUNERS:
        raise ValueError(f"Unknown tuner. Received: tuner={tuner!r}. Valid: {list(TUNERS)}")
    if isinstance(max_trials, bool) or not isinstance(max_trials, int) or max_trials < 1:
        raise ValueError(f"`max_trials` must be a positive integer. Received: max_trials={max_trials!r}")
    role = _dist_role()
    spec = search_space_spec(**space)
    document = study_document(spec, tuner=tuner, max_trials=max_trials)
    if role == "worker":
        # The chief owns the workdir: a worker writes nothing there before the
        # chief's study.json exists, and then only for that same study.
        _wait_for_study(workdir)
        check_study_workdir(workdir, document)
        overwrite = False
    else:
        exists = check_study_workdir(workdir, document)
        if not exists:
            overwrite = False
    hypermodel = PreActResNetHyperModel(**space)  # may refuse the budget
    if role != "worker":
        if overwrite:
            for name in (PROJECT, BEST_DIR):
                shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
            for name in (RESULTS_CSV, RESULTS_PNG):
                if os.path.exists(os.path.join(workdir, name)):
                    os.remove(os.path.join(workdir, name))
        atomic_write_json(os.path.join(workdir, STUDY_FILE), document)
    kt_tuner = make_tuner(
        hypermodel, tuner, directory=workdir, max_trials=max_trials, overwrite=False,
        distribution_strategy=distribution_strategy, seed=spec["seed"],
    )
    if role == "chief":
        serve_chief(kt_tuner, verbose=verbose)
    else:
        kt_tuner.search(verbose=verbose)
    result = {"role": role, "workdir": workdir, "rows": None, "best": None, "csv": None,
              "png": None, "best_model": None, "saved_model": None}
    if role == "worker":
        return result
    result.update(write_results(kt_tuner, hypermodel, workdir, export=export))
    return result


def _wait_for_study(workdir, timeout_s=WORKER_WAIT_S):
    path = os.path.join(workdir, STUDY_FILE)
    deadline = time.time() + timeout_s
    while not os.path.exists(path):
        if time.time() > deadline:
            raise ValueError(
                f"No {STUDY_FILE} appeared in {workdir} within {timeout_s} s: start the chief "
                "(KERASTUNER_TUNER_ID=chief) with the same --workdir on a shared disk."
            )
        time.sleep(0.5)


def serve_chief(kt_tuner, *, verbose=1, poll_s=0.5):
    """Runs the oracle for the workers until every trial is done and every worker left.

    KerasTuner's own `search()` on the chief does the same but polls every 20 s
    once the first worker is told to stop; this polls every `poll_s` seconds and
    shuts the gRPC server down before returning.
    """
    from concurrent import futures

    import grpc
    from keras_tuner.src import protos
    from keras_tuner.src.distribute import oracle_chief

    kt_tuner.oracle.verbose = verbose
    kt_tuner.save()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = oracle_chief.OracleServicer(kt_tuner.oracle)
    protos.get_service_grpc().add_OracleServicer_to_server(servicer, server)
    address = f"{os.environ['KERASTUNER_ORACLE_IP']}:{os.environ['KERASTUNER_ORACLE_PORT']}"
    server.add_insecure_port(address)
    server.start()
    logger.info("Chief oracle serving on %s.", address)
    try:
        while not (servicer.stop_triggered and oracle_chief.exit_chief(kt_tuner.oracle)):
            time.sleep(poll_s)
    finally:
        server.stop(grace=2).wait()
    kt_tuner.oracle.save()


def results_rows(oracle, hypermodel):
    """The results table: one dict per trial (`CSV_COLUMNS`), in trial order."""
    rows = []
    for trial_id in sorted(oracle.trials):
        trial = oracle.trials[trial_id]
        values = trial.hyperparameters.values
        depth = values.get("depth")
        block = values.get("block") if "block" in values else None
        if depth is not None and (block is None or not trial.hyperparameters.is_active("block")):
            block = hypermodel._candidate_blocks(depth)[0]

        def metric(name):
            if trial.metrics.exists(name):
                value = trial.metrics.get_last_value(name)
                return value
            return None

        row = {
            "trial": trial_id,
            "status": trial.status,
            "depth": depth,
            "block": block,
            "unit": values.get("unit", ""),
            "width": values.get("width"),
            "learning_rate": values.get("learning_rate"),
            "weight_decay": values.get("weight_decay"),
            "warmup": values.get("warmup"),
        }
        for name in ("params", "macs", "val_accuracy", "within_budget", "step_time_s",
                     "train_time_s", "replicas"):
            value = metric(name)
            if value is not None and name in ("params", "macs", "within_budget", "replicas"):
                value = int(round(value))
            row[name] = value
        rows.append(row)
    return rows


def best_row(rows):
    """The completed, within-budget row with the highest validation accuracy (first on ties)."""
    done = [r for r in rows if r["status"] == "COMPLETED" and r["val_accuracy"] is not None
            and r["within_budget"] == 1]
    if not done:
        return None
    return max(done, key=lambda r: (r["val_accuracy"], -int(r["trial"])))


def write_results(kt_tuner, hypermodel, workdir, *, export=True):
    """Writes results.csv, results.png and (with `export`) the best trial's exports."""
    rows = results_rows(kt_tuner.oracle, hypermodel)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in CSV_COLUMNS})
    csv_path = os.path.join(workdir, RESULTS_CSV)
    atomic_write_text(csv_path, buf.getvalue())
    png_path = os.path.join(workdir, RESULTS_PNG)
    budget = hypermodel.budget.to_dict() if hypermodel.budget else None
    atomic_write_bytes(png_path, plot_results(rows, budget=budget, title=f"{hypermodel.dataset}"))
    out = {"rows": rows, "best": best_row(rows), "csv": csv_path, "png": png_path}
    if export and out["best"] is not None:
        out.update(export_best(kt_tuner, out["best"], workdir))
    return out


def export_best(kt_tuner, row, workdir):
    """Saves the best trial's model as ``best/model.keras`` and ``best/saved_model/1``."""
    from keras_preact.export import export_saved_model

    trial = kt_tuner.oracle.get_trial(row["trial"])
    model = kt_tuner.load_model(trial)
    best_dir = os.path.join(workdir, BEST_DIR)
    os.makedirs(best_dir, exist_ok=True)
    keras_path = os.path.join(best_dir, "model.keras")
    atomic_save(keras_path, model.save)
    saved = export_saved_model(
        model, os.path.join(best_dir, "saved_model"), overwrite=True,
        metrics={"val_accuracy": row["val_accuracy"]},
        weights_info={"source": "keras-preact tune", "trial": row["trial"]},
    )
    atomic_write_json(os.path.join(best_dir, "best.json"), {
        "trial": row["trial"], "row": row, "hyperparameters": trial.hyperparameters.values,
    })
    return {"best_model": keras_path, "saved_model": saved}


def retrain(workdir, trial=None, *, verbose=0):
    """Trains a finished trial's hyperparameters again, with the study's seed.

    Args:
        workdir: a study's workdir.
        trial: trial id; default the best trial.
        verbose: fit verbosity.

    Returns:
        dict: ``trial``, ``val_accuracy`` (this run), ``recorded`` (the search's)
        and ``model``.

    Raises:
        ValueError: if the workdir holds no study or the trial is unknown / unfinished.
    """
    from keras_preact.tuning.hypermodel import PreActResNetHyperModel

    path = os.path.join(os.path.abspath(workdir), STUDY_FILE)
    if not os.path.exists(path):
        raise ValueError(f"No study in {workdir} ({STUDY_FILE} missing). Received: workdir={workdir!r}")
    doc = read_json(path)
    hypermodel = PreActResNetHyperModel(**doc["space"])
    kt_tuner = make_tuner(hypermodel, doc["tuner"], directory=os.path.abspath(workdir),
                          max_trials=doc["max_trials"], overwrite=False)
    rows = results_rows(kt_tuner.oracle, hypermodel)
    row = best_row(rows) if trial is None else next((r for r in rows if r["trial"] == trial), None)
    if row is None or row["status"] != "COMPLETED":
        raise ValueError(f"No finished trial {trial!r} in {workdir}. Trials: {[r['trial'] for r in rows]}")
    hp = kt_tuner.oracle.get_trial(row["trial"]).hyperparameters.copy()
    model = hypermodel.build(hp)
    metrics = hypermodel.fit(hp, model, callbacks=[], verbose=verbose)
    return {"trial": row["trial"], "val_accuracy": metrics["val_accuracy"],
            "recorded": row["val_accuracy"], "model": model}


def plot_results(rows, *, budget=None, title=""):
    """Validation accuracy vs depth and vs multiply-adds, as PNG bytes (Agg canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax_depth, ax_cost = fig.subplots(1, 2)
    done = [r for r in rows if r["val_accuracy"] is not None and r["within_budget"] == 1]
    for block, marker in (("basic", "o"), ("bottleneck", "s")):
        pts = [r for r in done if r["block"] == block]
        if not pts:
            continue
        ax_depth.scatter([r["depth"] for r in pts], [100 * r["val_accuracy"] for r in pts],
                         marker=marker, label=block)
        ax_cost.scatter([r["macs"] / 1e6 for r in pts], [100 * r["val_accuracy"] for r in pts],
                        marker=marker, label=block)
    best = best_row(rows)
    if best is not None:
        ax_depth.scatter([best["depth"]], [100 * best["val_accuracy"]], s=160, facecolors="none",
                         edgecolors="red", label="best")
        ax_cost.scatter([best["macs"] / 1e6], [100 * best["val_accuracy"]], s=160,
                        facecolors="none", edgecolors="red", label="best")
    if budget and budget["kind"] == "macs":
        ax_cost.axvline(budget["limit"] / 1e6, color="gray", linestyle="--", label="budget")
    ax_depth.set_xlabel("depth")
    ax_cost.set_xlabel("multiply-adds per image (M)")
    if done and max(r["macs"] for r in done) > 10 * max(1, min(r["macs"] for r in done)):
        ax_cost.set_xscale("log")
    for ax in (ax_depth, ax_cost):
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(True, alpha=0.3)
        if ax.collections:
            ax.legend()
    fig.suptitle(f"Depth sweep{': ' + title if title else ''} ({len(done)} trials)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _normal(value):
    return json.loads(json.dumps(value))
