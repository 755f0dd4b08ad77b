"""Depth sweeps with KerasTuner (`keras_preact.tuning`, `keras-preact tune`).

The sweeps run real training on scikit-learn's digits with the smallest networks that
prove the point: basic depths 8 and 14 at width x0.25 (6k and 10k parameters), one
epoch per trial, batch 64.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO

# The search space of every sweep here: 2 depths x 2 learning rates = 4 candidates.
TINY_SPACE = dict(
    dataset="digits", depths=[8, 14], width_multipliers=[0.25], learning_rates=[0.1, 0.05],
    epochs=1, batch_size=64, seed=0,
)
TINY_ARGS = [
    "--dataset", "digits", "--depths", "8,14", "--widths", "0.25", "--lrs", "0.1,0.05",
    "--epochs", "1", "--batch-size", "64", "--seed", "0", "--verbose", "2",
]
#: Retraining the best trial with the study's seed must give its accuracy within this
#: (absolute): 2 of the 144 validation images. The same seed fixes initialisation,
#: data order and augmentation; what remains is float summation order in TF's CPU kernels.
RETRAIN_TOLERANCE = 2 / 144


def _cli(args, *, env=None, **kwargs):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "keras_preact", "tune", *args], cwd=REPO, env=full_env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs,
    )


def _trial_status(workdir, trial_id):
    path = os.path.join(workdir, "search", f"trial_{trial_id}", "trial.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None  # being written


def _read_csv(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------
# Bad input: clear errors before anything is written
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    (dict(depths=[20, 32], blocks=["bottleneck"]),
     r"depth 32 is invalid for the block\(s\) \['bottleneck'\]"),
    (dict(depths=[10]), "depth 10 is invalid"),
    (dict(depths=[20], blocks=["wide"]), "Unknown block"),
    (dict(depths=[8], width_multipliers=[0.3]), "width multiplier 0.3 gives 4.8 filters"),
    (dict(depths=[8], units=["full_preact", "nope"]), "Unknown unit"),
    *[({**TINY_SPACE, argument: []}, rf"Empty search space: `{argument}` has no values")
      for argument in ("depths", "blocks", "width_multipliers", "learning_rates",
                       "weight_decays", "warmups", "units")],
])
def test_bad_search_spaces_raise(kwargs, match):
    from keras_preact.tuning import PreActResNetHyperModel

    with pytest.raises(ValueError, match=match):
        PreActResNetHyperModel(**{"dataset": "digits", **kwargs})


def test_unit_and_width_hyperparameters_build_library_models():
    import keras_tuner

    import keras_preact
    from keras_preact.tuning import PreActResNetHyperModel

    hm = PreActResNetHyperModel(**{**TINY_SPACE, "depths": [8],
                                   "units": ["full_preact", "original"],
                                   "width_multipliers": [1, 0.5]})
    hp = keras_tuner.HyperParameters()
    hm.declare(hp)
    assert [h.name for h in hp.space] == ["depth", "width", "unit", "learning_rate",
                                          "weight_decay", "warmup"]
    hp.values.update(unit="original", width=0.5)
    config = hm.build(hp).get_config()
    assert config["unit"] == "original"
    assert (tuple(config["stage_filters"]) == (8, 16, 32)
            and tuple(config["stage_blocks"]) == (1, 1, 1))
    hp.values.update(unit="full_preact", width=1)
    model = hm.build(hp)
    reference = keras_preact.preact_resnet_cifar(8, input_shape=(32, 32, 3), classes=10)
    assert keras_preact.count_params(model) == keras_preact.count_params(reference)


def test_budget_prunes_candidates_and_refuses_one_nothing_fits():
    from keras_preact.tuning import Budget, PreActResNetHyperModel

    hm = PreActResNetHyperModel(**TINY_SPACE, budget=Budget("params", 8_000))
    # Depth 8 at x0.25 has 6,010 parameters, depth 14 12,170: only 8 is searched.
    assert hm.cost({"depth": 8, "block": "basic", "width": 0.25})["params"] <= 8_000
    assert hm.cost({"depth": 14, "block": "basic", "width": 0.25})["params"] > 8_000
    assert hm.depths == [8]
    with pytest.raises(ValueError, match=r"No candidate fits the budget: the cheapest, "
                                         r"depth 8 basic x0.25, has 6,010 parameters"):
        PreActResNetHyperModel(**TINY_SPACE, budget=Budget("params", 1_000))
    with pytest.raises(ValueError, match="No candidate fits the budget.*multiply-adds"):
        PreActResNetHyperModel(**TINY_SPACE, budget={"kind": "macs", "limit": 10})
    with pytest.raises(ValueError, match="No candidate fits the budget.*per step"):
        PreActResNetHyperModel(**{**TINY_SPACE, "depths": [8]}, budget=Budget("step_time", 1e-7))
    with pytest.raises(ValueError, match="Unknown budget kind"):
        Budget("flops", 1)


def test_workdir_of_another_study_is_refused_and_kept(tmp_path, capsys):
    from keras_preact import cli
    from keras_preact.file_io import atomic_write_json
    from keras_preact.tuning import search_space_spec, tune
    from keras_preact.tuning.study import study_document

    workdir = tmp_path / "study"
    os.makedirs(workdir / "search")
    atomic_write_json(str(workdir / "study.json"),
                      study_document(search_space_spec(**TINY_SPACE), tuner="random", max_trials=3))
    (workdir / "search" / "oracle.json").write_text('{"kept": true}')
    before = (workdir / "study.json").read_bytes()
    other = {**TINY_SPACE, "depths": [8]}
    with pytest.raises(ValueError, match=r"holds another study \(depths: stored \[8, 14\], "
                                         r"requested \[8\]\).*--overwrite to start this study"):
        tune(str(workdir), max_trials=3, **other)
    with pytest.raises(ValueError, match=r"tuner: stored 'random', requested 'bayesian'"):
        tune(str(workdir), tuner="bayesian", max_trials=3, **TINY_SPACE)
    assert (workdir / "study.json").read_bytes() == before
    assert (workdir / "search" / "oracle.json").read_text() == '{"kept": true}'

    # A folder that is not a study at all.
    stranger = tmp_path / "stranger"
    os.makedirs(stranger)
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="holds no study.json: it is not a tuning study"):
        tune(str(stranger), overwrite=True, **TINY_SPACE)
    assert os.listdir(stranger) == ["notes.txt"]

    # The command line turns the same errors into exit status 2.
    status = cli.main(["tune", *TINY_ARGS[:2], "--depths", "8,20", "--workdir", str(workdir)])
    assert status == 2
    assert "error: The workdir" in capsys.readouterr().err
    status = cli.main(["tune", "--dataset", "digits", "--depths", "20,32", "--blocks",
                       "bottleneck", "--workdir", str(tmp_path / "new")])
    assert status == 2
    assert "depth 32 is invalid" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "new")


def test_overwrite_replaces_another_study_and_a_failed_start_leaves_nothing(tmp_path, monkeypatch):
    from keras_preact.file_io import atomic_write_json
    from keras_preact.tuning import PreActResNetHyperModel, search_space_spec, tune
    from keras_preact.tuning.study import study_document

    # Missing data is refused before anything is written.
    with pytest.raises(ValueError, match="The 'folder' dataset needs `path`"):
        tune(str(tmp_path / "new"), max_trials=1, **{**TINY_SPACE, "dataset": "folder"})
    assert not (tmp_path / "new").exists()
    # A study stopped before its first trial completes (Ctrl-C) leaves nothing behind.
    original_fit = PreActResNetHyperModel.fit

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(PreActResNetHyperModel, "fit", interrupt)
    with pytest.raises(KeyboardInterrupt):
        tune(str(tmp_path / "new"), max_trials=1, export=False, **TINY_SPACE)
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(PreActResNetHyperModel, "fit", original_fit)

    # --overwrite replaces whatever study the workdir holds.
    workdir = tmp_path / "study"
    os.makedirs(workdir / "search")
    atomic_write_json(str(workdir / "study.json"),
                      study_document(search_space_spec(**TINY_SPACE), tuner="random", max_trials=3))
    (workdir / "search" / "oracle.json").write_text('{"stale": true}')
    space = {**TINY_SPACE, "depths": [8], "learning_rates": [0.1]}
    result = tune(str(workdir), max_trials=1, overwrite=True, export=False, **space)
    assert [(r["depth"], r["status"]) for r in result["rows"]] == [(8, "COMPLETED")]
    assert json.load(open(workdir / "study.json"))["space"]["depths"] == [8]


def test_tuner_kinds_and_search_space(tmp_path):
    import keras_tuner

    from keras_preact.tuning import PreActResNetHyperModel, make_tuner

    hm = PreActResNetHyperModel(**{**TINY_SPACE, "depths": [8, 20],
                                   "blocks": ["basic", "bottleneck"]})
    expected = {
        "random": keras_tuner.oracles.RandomSearchOracle,
        "bayesian": keras_tuner.oracles.BayesianOptimizationOracle,
        "hyperband": keras_tuner.oracles.HyperbandOracle,
    }
    for kind, oracle_class in expected.items():
        tuner = make_tuner(hm, kind, directory=str(tmp_path), project_name=kind, max_trials=2)
        assert isinstance(tuner.oracle, oracle_class)
        space = {hp.name: hp for hp in tuner.oracle.get_space().space}
        assert space["depth"].values == [8, 20]
        # 20 is 6n+2 and 9n+2: "block" is searched for it; 8 is basic only.
        assert space["block"].values == ["basic", "bottleneck"]
        assert space["learning_rate"].values == [0.1, 0.05]
    with pytest.raises(ValueError, match="Unknown tuner"):
        make_tuner(hm, "grid", directory=str(tmp_path))


# ---------------------------------------------------------------------------------
# A real sweep on digits: killed after one trial, resumed, results written
# ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def resumed_sweep(tmp_path_factory):
    """Starts a 2-trial sweep, kills it (SIGKILL) once trial 0 is recorded, re-runs it."""
    workdir = str(tmp_path_factory.mktemp("tune") / "sweep")
    args = [*TINY_ARGS, "--max-trials", "2", "--workdir", workdir]
    proc = _cli(args)
    first = None
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        first = _trial_status(workdir, 0)
        if first and first.get("status") == "COMPLETED":
            break
        time.sleep(0.5)
    still_running = proc.poll() is None
    proc.kill()
    out_killed = proc.communicate()[0]
    assert first is not None and first["status"] == "COMPLETED", out_killed[-3000:]
    assert still_running, "the search ended before it could be killed:\n" + out_killed[-3000:]
    proc = _cli(args)
    out, _ = proc.communicate(timeout=600)
    return {"workdir": workdir, "first": first, "rc": proc.returncode, "out": out,
            "killed_out": out_killed}


@pytest.mark.e2e
def test_resumed_sweep_keeps_finished_trials_and_writes_results(resumed_sweep):
    workdir, out = resumed_sweep["workdir"], resumed_sweep["out"]
    assert resumed_sweep["rc"] == 0, out[-4000:]
    assert "Reloading Tuner" in out
    rows = _read_csv(os.path.join(workdir, "results.csv"))
    assert [r["trial"] for r in rows] == ["0", "1"]
    assert all(r["status"] == "COMPLETED" for r in rows)
    # Trial 0 is the one finished before the kill, kept as it was (not run again).
    first = resumed_sweep["first"]
    assert rows[0]["depth"] == str(first["hyperparameters"]["values"]["depth"])
    assert float(rows[0]["val_accuracy"]) == pytest.approx(first["score"], abs=1e-9)
    # The re-run trained only the missing trial.
    assert out.count(" Complete [") == 1, out[-4000:]
    # Every candidate at most once, costs from the model itself.
    combos = {(r["depth"], r["learning_rate"]) for r in rows}
    assert len(combos) == 2
    from keras_preact.tuning import PreActResNetHyperModel

    hm = PreActResNetHyperModel(**TINY_SPACE)
    for r in rows:
        cost = hm.cost({"depth": int(r["depth"]), "block": r["block"], "width": 0.25})
        assert (int(r["params"]), int(r["macs"])) == (cost["params"], cost["macs"])
        assert float(r["weight_decay"]) == 1e-4 and float(r["warmup"]) == 400
        assert r["replicas"] == "1"
        assert 0.0 <= float(r["val_accuracy"]) <= 1.0 and float(r["train_time_s"]) > 0
    with open(os.path.join(workdir, "results.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # The best trial exported as .keras and SavedModel (with its model card).
    best = max(rows, key=lambda r: (float(r["val_accuracy"]), -int(r["trial"])))
    with open(os.path.join(workdir, "best", "best.json")) as f:
        assert json.load(f)["trial"] == best["trial"]
    assert os.path.isfile(os.path.join(workdir, "best", "model.keras"))
    assert os.path.isfile(os.path.join(workdir, "best", "saved_model", "1", "saved_model.pb"))
    assert os.path.isfile(os.path.join(workdir, "best", "saved_model", "1", "model_card.json"))


@pytest.mark.e2e
def test_retraining_the_best_trial_reproduces_its_accuracy(resumed_sweep):
    import keras
    import numpy as np

    import keras_preact
    from keras_preact.tuning import retrain

    workdir = resumed_sweep["workdir"]
    assert resumed_sweep["rc"] == 0
    result = retrain(workdir)
    rows = _read_csv(os.path.join(workdir, "results.csv"))
    best = max(rows, key=lambda r: (float(r["val_accuracy"]), -int(r["trial"])))
    assert result["trial"] == best["trial"]
    assert abs(result["val_accuracy"] - float(best["val_accuracy"])) <= RETRAIN_TOLERANCE, result
    # The exported best model is the trial's network (same architecture and size).
    exported = keras.saving.load_model(os.path.join(workdir, "best", "model.keras"), compile=False)
    assert exported.count_params() == result["model"].count_params()
    assert int(best["params"]) == keras_preact.count_params(exported)
    x = np.zeros((2, 32, 32, 3), "float32")
    assert exported.predict(x, verbose=0).shape == (2, 10)


# ---------------------------------------------------------------------------------
# KerasTuner's distributed mode: one chief and two workers on 127.0.0.1
# ---------------------------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.e2e
def test_chief_and_two_workers_record_every_trial_once(tmp_path):
    workdir = str(tmp_path / "dist")
    port = str(_free_port())
    # The workers also train each trial on two devices (MirroredStrategy over two
    # logical CPUs): the tuner's single-worker `distribution_strategy`.
    args = [*TINY_ARGS, "--max-trials", "2", "--workdir", workdir, "--no-export",
            "--strategy", "mirrored", "--cpu-devices", "2"]
    base = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": port}
    procs = {
        name: _cli(args, env={**base, "KERASTUNER_TUNER_ID": name}, start_new_session=True)
        for name in ("chief", "tuner0", "tuner1")
    }
    outs = {}
    try:
        for name, proc in procs.items():
            try:
                outs[name] = proc.communicate(timeout=300)[0]
            except subprocess.TimeoutExpired:
                break
    finally:
        for name, proc in procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                outs[name] = "(killed: still running)\n" + proc.communicate()[0]
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name}:\n{outs.get(name, '')[-3000:]}"
    assert "Worker done" in outs["tuner0"] and "Worker done" in outs["tuner1"]
    rows = _read_csv(os.path.join(workdir, "results.csv"))
    assert sorted(r["trial"] for r in rows) == ["0", "1"]
    assert all(r["status"] == "COMPLETED" and r["val_accuracy"] for r in rows)
    assert [r["replicas"] for r in rows] == ["2", "2"]
    with open(os.path.join(workdir, "search", "oracle.json")) as f:
        oracle = json.load(f)
    assert oracle["ongoing_trials"] == {}
    # Each trial ran on one worker and was recorded once (one trial folder each).
    assert sorted(d for d in os.listdir(os.path.join(workdir, "search"))
                  if d.startswith("trial_")) == ["trial_0", "trial_1"]


def test_a_worker_says_once_whom_it_waits_for_and_how_long(tmp_path, monkeypatch, capsys):
    from keras_preact.tuning import study
    from tests.helpers import run_cli

    # Before: a worker started without its chief printed nothing for ten minutes.
    monkeypatch.setattr(study, "WORKER_WAIT_S", 1)
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
    monkeypatch.setenv("KERASTUNER_ORACLE_PORT", "8000")
    workdir = tmp_path / "study"
    code, out, err = run_cli(["tune", "--workdir", str(workdir), *TINY_ARGS], capsys)
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"Waiting up to 1 s for the chief at 127.0.0.1:8000 to write study.json in {workdir}.",
        f"error: No study.json appeared in {workdir} within 1 s: start the chief "
        "(KERASTUNER_TUNER_ID=chief) with the same --workdir on a shared disk."]
    assert not workdir.exists()


# ---------------------------------------------------------------------------------
# A trial trains what `train` trains
# ---------------------------------------------------------------------------------


@pytest.mark.e2e
def test_a_trial_equals_a_train_run_of_its_config(tmp_path):
    """The fast recipe (cosine schedule, Nesterov, label smoothing) with cutout: a trial
    scored on the test split (validation_fraction=0) against `train_and_evaluate` of the
    trial's `TrainConfig`, 2 epochs on digits. Same seed, same batches, same model built the
    same way: equal within the asserted 1e-6 on this CPU (an Intel Xeon, 2 cores)."""
    import keras_tuner

    from keras_preact.training import recipe, train_and_evaluate
    from keras_preact.tuning import PreActResNetHyperModel

    base = recipe("fast", cutout=4)
    space = {**TINY_SPACE, "depths": [8], "learning_rates": [0.2], "warmups": [1], "epochs": 2,
             "validation_fraction": 0, "config": base}
    hypermodel = PreActResNetHyperModel(**space)
    hp = keras_tuner.HyperParameters()
    arch = hypermodel.declare(hp)
    trial = hypermodel.fit(hp, hypermodel.build(hp), verbose=0)
    config = hypermodel.trial_config(arch, hp.values)
    assert (config.schedule, config.label_smoothing, config.cutout) == ("cosine", 0.1, 4)
    result = train_and_evaluate(config, str(tmp_path / "run"))
    best = max(e["val_accuracy"] for e in result["history"])
    assert trial["val_accuracy"] == pytest.approx(best, abs=1e-6)
    assert trial["within_budget"] == 1.0 and trial["train_time_s"] > 0


def test_tune_takes_the_recipe_and_every_training_flag(capsys):
    from keras_preact import cli

    with pytest.raises(SystemExit):
        cli.main(["tune", "--help"])
    out = capsys.readouterr().out
    for flag in ("--recipe", "--label-smoothing", "--cutout", "--ema-momentum", "--precision",
                 "--stochastic-depth", "--nesterov", "--schedule"):
        assert flag in out, flag
    code = cli.main(["tune", "--dataset", "digits", "--lr", "0.3", "--workdir", "unused"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_ERROR
    assert err == ("error: tune searches `learning_rate`: use --lrs. Received: "
                   "--learning-rate 0.3\n")
