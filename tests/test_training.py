"""`train_and_evaluate`, `evaluate` and the `train`/`evaluate` commands (TensorFlow).

Tiny networks on real data (scikit-learn's digits) and on CIFAR-10 files the tests
write in the original python-pickle layout. The heavier checks (kill and resume,
two replicas, the demo's accuracy) are in the e2e test files.
"""

import glob
import hashlib
import json
import os
import shutil

import numpy as np
import pytest

from tests.helpers import TINY


def tiny_config(**kw):
    from keras_preact.training import TrainConfig

    values = dict(model="tiny", model_kwargs=TINY, dataset="digits", batch_size=64, epochs=2,
                  seed=0, verbose=0)
    values.update(kw)
    return TrainConfig(**values)


def file_hashes(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A complete two-epoch run of a tiny network on digits."""
    from keras_preact.training import train_and_evaluate

    workdir = str(tmp_path_factory.mktemp("runs") / "tiny")
    config = tiny_config()
    result = train_and_evaluate(config, workdir)
    return config, workdir, result


def cifar_config(folder, **kw):
    values = dict(dataset="cifar10", data_source="archive", data_path=folder, batch_size=5,
                  epochs=1, eval_every=0)
    values.update(kw)
    return tiny_config(**values)


def test_run_writes_checkpoints_metrics_curve_logs_and_model(digits_run):
    import keras

    from keras_preact.training import evaluate

    config, workdir, result = digits_run
    stored = json.load(open(os.path.join(workdir, "config.json")))
    assert stored["train_config"] == config.to_dict()

    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert [e["epoch"] for e in metrics["epochs"]] == [1, 2]
    assert [e["step"] for e in metrics["epochs"]] == [22, 44]  # 1438 // 64 per epoch
    for entry in metrics["epochs"]:
        assert {"loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"} <= set(entry)
    assert metrics["complete"] is True
    assert metrics["test_accuracy"] == result["test_accuracy"]
    assert metrics["test_loss"] == result["test_loss"]
    assert metrics["num_train_examples"] == 1438 and metrics["num_test_examples"] == 359
    # The last epoch's evaluation and the final one see the same weights and data.
    assert metrics["epochs"][-1]["val_accuracy"] == pytest.approx(metrics["test_accuracy"],
                                                                  abs=1e-6)
    assert metrics["epochs"][0]["learning_rate"] == pytest.approx(0.05)  # 0.1 * 64 / 128
    for entry in metrics["epochs"]:  # the rate counts the epoch's training, not its evaluation
        assert entry["images_per_s"] == pytest.approx(22 * 64 / entry["time_s"], rel=1e-3)
        assert entry["eval_time_s"] > 0 and "raw_val_accuracy" not in entry  # no moving average

    rows = open(os.path.join(workdir, "metrics.csv")).read().splitlines()
    assert rows[0].split(",")[:3] == ["epoch", "step", "learning_rate"]
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]
    with open(os.path.join(workdir, "training_curve.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert glob.glob(os.path.join(workdir, "tensorboard", "*", "events.out.tfevents.*"))

    state = json.load(open(os.path.join(workdir, "checkpoints", "state.json")))
    assert (state["epoch"], state["step"], state["complete"]) == (2, 44, True)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == [
        "ckpt-00001.weights.h5", "ckpt-00002.weights.h5", "state.json",
    ]
    assert not [n for n in os.listdir(workdir) if n.startswith(".tmp-")]

    # The saved model takes raw pixels (it carries the dataset's normalisation) and
    # reproduces the reported accuracy.
    model = keras.saving.load_model(os.path.join(workdir, "model.keras"), compile=False)
    assert model.get_layer("preprocessing") is not None
    again = evaluate(workdir, verbose=0)
    assert again["accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-6)
    assert again["num_examples"] == 359
    from_file = evaluate(weights=os.path.join(workdir, "model.keras"), dataset="digits", verbose=0)
    assert from_file["accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-6)


def test_rerunning_a_complete_run_changes_nothing(digits_run):
    from keras_preact.training import train_and_evaluate

    config, workdir, result = digits_run
    before = file_hashes(workdir)
    again = train_and_evaluate(config.replace(verbose=2), workdir)  # verbosity may change
    assert again["resumed_from_epoch"] is None
    assert again["test_accuracy"] == result["test_accuracy"]
    assert file_hashes(workdir) == before


def test_a_run_stopped_before_its_final_step_finishes_it(digits_run, tmp_path):
    # Killed after the last epoch's checkpoint, before evaluating and saving.
    from keras_preact.training import train_and_evaluate

    config, workdir, result = digits_run
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    os.remove(os.path.join(copy, "model.keras"))
    ckpts = {k: v for k, v in file_hashes(copy).items() if k.endswith(".weights.h5")}
    again = train_and_evaluate(config, copy)
    assert again["resumed_from_epoch"] == 2 and again["steps"] == 44
    assert again["test_accuracy"] == pytest.approx(result["test_accuracy"], abs=1e-6)
    assert os.path.exists(os.path.join(copy, "model.keras"))
    assert {k: v for k, v in file_hashes(copy).items() if k.endswith(".weights.h5")} == ckpts


def _another_network(copy, config):
    """Rewrites the copy's config.json to claim another network than its checkpoints hold."""
    other = config.replace(model_kwargs={"architecture": {**TINY["architecture"],
                                                          "stage_filters": [8, 16, 24]}})
    doc = json.load(open(os.path.join(copy, "config.json")))
    doc["train_config"] = other.to_dict()
    with open(os.path.join(copy, "config.json"), "w") as f:
        json.dump(doc, f)
    return other


@pytest.mark.parametrize(
    "change, message",
    [
        ({"epochs": 1}, r"different config \(epochs: stored"),  # shorter: a longer run extends
        ({"epochs": None, "steps": 60}, r"different config \(epochs: stored"),
        ({"model_kwargs": {"architecture": {**TINY["architecture"], "stem_filters": 16}}},
         r"different config \(model_kwargs: stored"),
        ({"model": "preact_resnet20", "model_kwargs": {}}, r"different config \(model: stored"),
        ({"seed": 1}, r"different config \(seed: stored"),
        ({"weight_decay": 5e-4}, r"different config \(weight_decay: stored"),
        (_another_network, r"checkpoint .*ckpt-00002.weights.h5 does not fit the model 'tiny'"),
        ("config.json", "is not empty and holds no keras-preact run"),  # checkpoints alone
    ],
)
def test_a_workdir_of_another_run_is_refused_and_kept(digits_run, tmp_path, change, message):
    from keras_preact.training import train_and_evaluate

    config, workdir, _ = digits_run
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    os.remove(os.path.join(copy, "model.keras"))  # so a matching config would resume
    if change == "config.json":
        os.remove(os.path.join(copy, "config.json"))
    else:
        config = change(copy, config) if callable(change) else config.replace(**change)
    before = file_hashes(copy)
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(config, copy)
    assert file_hashes(copy) == before


def test_a_larger_epochs_extends_a_finished_run_keeping_its_history(digits_run, tmp_path):
    from keras_preact.training import train_and_evaluate

    config, workdir, result = digits_run
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    header = open(os.path.join(copy, "metrics.csv")).readline()
    longer = config.replace(epochs=3)
    again = train_and_evaluate(longer, copy)
    assert again["resumed_from_epoch"] == 2 and again["epochs"] == 3 and again["steps"] == 66
    metrics = json.load(open(os.path.join(copy, "metrics.json")))
    assert metrics["epochs"][:2] == result["history"] and metrics["complete"] is True
    rows = open(os.path.join(copy, "metrics.csv")).read().splitlines()
    assert rows[0] + "\n" == header and [r.split(",")[0] for r in rows[1:]] == ["1", "2", "3"]
    stored = json.load(open(os.path.join(copy, "config.json")))["train_config"]
    assert stored["epochs"] == 3
    # Now complete at 3 epochs: the same command changes nothing, a shorter one is refused.
    before = file_hashes(copy)
    assert train_and_evaluate(longer, copy)["resumed_from_epoch"] is None
    with pytest.raises(ValueError, match=r"different config \(epochs: stored 3, requested 2\)"):
        train_and_evaluate(config, copy)
    assert file_hashes(copy) == before


def test_a_run_knows_its_data_from_any_folder(tmp_path, monkeypatch):
    from keras_preact.training import evaluate, train_and_evaluate
    from tests.data_fixtures import write_png_folder

    # Two folders of one name: cat/dog under a/, frog/ship under b/.
    for place, classes in (("a", ["cat", "dog"]), ("b", ["frog", "ship"])):
        for split, per_class in (("train", 24), ("test", 4)):
            write_png_folder(tmp_path / place / "c10_2x50" / split, classes, per_class)
    workdir = str(tmp_path / "run")
    config = tiny_config(dataset="folder", data_path="c10_2x50", batch_size=16, epochs=1,
                         eval_every=0)
    monkeypatch.chdir(tmp_path / "a")
    train_and_evaluate(config, workdir)
    stored = json.load(open(os.path.join(workdir, "config.json")))
    assert stored["train_config"]["data_path"] == str(tmp_path / "a" / "c10_2x50")
    assert (stored["class_names"], stored["num_examples"]) == (["cat", "dog"], [48, 8])
    # The same spelling in b/ is other data: refused, as it used to be trained on.
    monkeypatch.chdir(tmp_path / "b")
    before = file_hashes(workdir)
    with pytest.raises(ValueError, match=r"different config \(epochs: stored 1, requested 2, "
                                         r"class_names: stored \['cat', 'dog'\], requested "
                                         r"\['frog', 'ship'\]\)"):
        train_and_evaluate(config.replace(epochs=2), workdir)
    assert file_hashes(workdir) == before
    # From b/, `evaluate` finds the run's data; the same folder spelt otherwise extends it.
    assert evaluate(workdir)["num_examples"] == 8
    with pytest.raises(ValueError, match=r"trained on the classes \['cat', 'dog'\]; the 'folder' "
                                         r"data has \['frog', 'ship'\], which would be scored by "
                                         r"position. Received: data_path='c10_2x50'"):
        evaluate(workdir, data_path="c10_2x50")
    longer = config.replace(epochs=2, data_path="../a/c10_2x50")
    assert train_and_evaluate(longer, workdir)["resumed_from_epoch"] == 1
    # A workdir written before (its data_path as typed, no num_examples) still resumes.
    del stored["num_examples"]
    stored["train_config"].update(data_path="c10_2x50", epochs=2)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump(stored, f)
    monkeypatch.chdir(tmp_path / "a")
    assert train_and_evaluate(config.replace(epochs=2), workdir)["resumed_from_epoch"] is None


def test_a_folder_is_read_at_the_model_kwargs_input_shape(tmp_path):
    """A model whose smallest input exceeds a folder's 32x32 trains on the images resized."""
    import keras

    from keras_preact.training import evaluate, train_and_evaluate
    from tests.data_fixtures import write_png_folder

    for split, per_class in (("train", 4), ("test", 2)):
        write_png_folder(tmp_path / "imgs" / split, ["cat", "dog"], per_class)
    config = tiny_config(model="preact_resnet18", model_kwargs={}, dataset="folder",
                         data_path=str(tmp_path / "imgs"), batch_size=8, epochs=1, eval_every=0)
    with pytest.raises(ValueError, match=r"at least 64.*A folder's images are resized to the "
                                         r"model_kwargs input_shape: --model-kwargs "):
        train_and_evaluate(config, str(tmp_path / "refused"))
    assert not (tmp_path / "refused").exists()
    workdir = str(tmp_path / "run")
    sized = config.replace(model_kwargs={"input_shape": [64, 64, 3]})
    train_and_evaluate(sized, workdir)
    stored = json.load(open(os.path.join(workdir, "config.json")))
    assert stored["num_examples"] == [8, 4]
    model = keras.saving.load_model(os.path.join(workdir, "model.keras"), compile=False)
    assert tuple(model.input_shape) == (None, 64, 64, 3)
    assert evaluate(workdir)["num_examples"] == 4  # read at 64x64, as the model takes


def test_extending_by_steps_trains_exactly_to_the_new_count(tmp_path):
    from keras_preact.training import train_and_evaluate

    # 1438 digits at batch 512: 2 steps an epoch. From the end of epoch 1, 5 steps are 2 more
    # epochs, the last one cut at step 5.
    workdir = str(tmp_path / "run")
    train_and_evaluate(tiny_config(batch_size=512, epochs=None, steps=2, eval_every=0), workdir)
    result = train_and_evaluate(tiny_config(batch_size=512, epochs=None, steps=5, eval_every=0),
                                workdir)
    assert result["steps"] == 5 and result["resumed_from_epoch"] == 1
    state = json.load(open(os.path.join(workdir, "checkpoints", "state.json")))
    assert (state["step"], state["complete"]) == (5, True)
    assert [e["step"] for e in result["history"]] == [2, 4, 5]


def test_a_run_stopped_inside_an_epoch_is_not_extended(tmp_path):
    from keras_preact.training import train_and_evaluate

    # Stopped at step 1 of a 2-step epoch: its data is not where a longer run's would be,
    # so a longer --steps (which used to train 3 steps for 4) is refused and changes nothing.
    workdir = str(tmp_path / "run")
    train_and_evaluate(tiny_config(batch_size=512, epochs=None, steps=1, eval_every=0), workdir)
    before = file_hashes(workdir)
    with pytest.raises(ValueError, match=r"stopped at step 1, inside epoch 1 \(2 steps an epoch\)"
                                         r": it cannot be extended. Nothing was changed. Train "
                                         r"the longer run in a new --workdir"):
        train_and_evaluate(tiny_config(batch_size=512, epochs=None, steps=4, eval_every=0),
                           workdir)
    assert file_hashes(workdir) == before


@pytest.mark.parametrize("workdir", ["", "  "])
def test_an_empty_workdir_is_refused(tmp_path, monkeypatch, workdir):
    from keras_preact.training import train_and_evaluate

    monkeypatch.chdir(tmp_path)  # '' would be this folder
    with pytest.raises(ValueError, match=r"`workdir` \(--workdir\) must be a folder path. "
                                         f"Received: workdir={workdir!r}"):
        train_and_evaluate(tiny_config(), workdir)
    assert os.listdir(tmp_path) == []


def test_a_missing_checkpoint_says_how_to_go_on(digits_run, tmp_path):
    from keras_preact.training import train_and_evaluate

    config, workdir, _ = digits_run
    copy = str(tmp_path / "copy")
    shutil.copytree(workdir, copy)
    for name in ("model.keras", os.path.join("checkpoints", "ckpt-00002.weights.h5")):
        os.remove(os.path.join(copy, name))
    before = file_hashes(copy)
    with pytest.raises(ValueError, match=r"names the checkpoint .*ckpt-00002.weights.h5, which is "
                                         r"missing .*Put that file back to resume, or start the "
                                         r"run over in a new --workdir"):
        train_and_evaluate(config, copy)
    assert file_hashes(copy) == before


@pytest.mark.parametrize("stored", ["[]", '"train_config"', "{}"])
def test_a_config_json_that_is_not_a_run_configuration_is_named(tmp_path, capsys, stored):
    from keras_preact.cli import main

    (tmp_path / "config.json").write_text(stored)
    for argv in (["evaluate", "--workdir", str(tmp_path)],
                 ["train", "--model", "tiny", "--model-kwargs", json.dumps(TINY), "--dataset",
                  "digits", "--workdir", str(tmp_path)]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            f"error: {tmp_path / 'config.json'} is not a keras-preact run configuration (a JSON "
            f'object with "train_config" expected): choose another --workdir. Received: '
            f"{json.loads(stored)}\n")
    assert os.listdir(tmp_path) == ["config.json"]  # left as found: no lock file
    assert (tmp_path / "config.json").read_text() == stored


def test_training_ignores_a_channels_first_keras_json(tmp_path):
    # ~/.keras/keras.json's image_data_format used to build channels_first models that the
    # channels_last pipelines cannot feed ("`input_shape` is too small").
    import keras

    from keras_preact.training import train_and_evaluate

    keras.config.set_image_data_format("channels_first")
    try:
        result = train_and_evaluate(tiny_config(batch_size=512, epochs=None, steps=1),
                                    str(tmp_path))
    finally:
        keras.config.set_image_data_format("channels_last")
    model = keras.saving.load_model(result["model_path"], compile=False)
    assert result["steps"] == 1 and model.get_config()["data_format"] == "channels_last"


def test_tensorflow_datasets_can_prepare_a_download():
    # TFDS imports importlib_resources lazily, to download, but does not require it.
    from tensorflow_datasets.core import dataset_builder

    assert dataset_builder.importlib_resources.files("keras_preact").is_dir()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "preact_resnet21", "model_kwargs": {}},
         r"Unknown model.*preact_resnet21.*Valid"),
        ({"dataset": "mnist"}, r"Unknown dataset.*'mnist'.*Valid.*cifar10"),
        ({"strategy": "tpu"}, r"strategy='tpu' was requested but no TPU was found"),
        ({"batch_size": 2048},
         r"batch_size=2048 is larger than the 'digits' training split \(1438"),
        ({"model_kwargs": {"architecture": {"stage_blocks": [1, 1], "stage_filters": [8, 16, 32]}}},
         r"one entry per stage"),
        ({"model_kwargs": {"architecture": TINY["architecture"], "no_such_argument": 1}},
         r"Unknown argument `no_such_argument` for the model_kwargs of .tiny."),
        # A random backbone kept frozen would never learn.
        ({"freeze": "backbone"}, r"Freezing the stem or stages \(--freeze\) needs pretrained "
         r"`weights` \(--weights\).*Received: freeze=\['backbone'\], weights=None"),
        ({"freeze": "stem,head"}, r"needs pretrained `weights`"),
        # The height and width too, not only the channels (else Keras' shape error in `fit`).
        ({"model_kwargs": {**TINY, "input_shape": [8, 8, 3]}},
         r"The 'digits' images are \(32, 32, 3\).*Received: model_kwargs input_shape=\[8, 8, 3\]"),
        ({"data_path": "my_images"},
         r"takes no .*path.*For a folder of images, add --dataset folder"),
    ],
)
def test_bad_input_fails_before_anything_is_written(tmp_path, kwargs, message):
    from keras_preact.training import train_and_evaluate

    workdir = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        train_and_evaluate(tiny_config(**kwargs), str(workdir))
    assert not workdir.exists()


def test_missing_data_files_fail_before_anything_is_written(tmp_path):
    from keras_preact.training import train_and_evaluate

    empty = tmp_path / "empty"
    empty.mkdir()
    workdir = tmp_path / "run"
    config = tiny_config(dataset="cifar10", data_source="archive", data_dir=str(empty))
    with pytest.raises(ValueError, match=r"No cifar10 files"):
        train_and_evaluate(config, str(workdir))
    assert not workdir.exists()


def test_corrupt_data_on_restart_loses_no_checkpoint(cifar_dir, tmp_path):
    from keras_preact.training import train_and_evaluate

    workdir = str(tmp_path / "run")
    config = cifar_config(cifar_dir)
    result = train_and_evaluate(config, workdir)
    assert result["steps"] == 4  # 20 images // 5
    # The final step (evaluate + save the model) has to run again ...
    os.remove(os.path.join(workdir, "model.keras"))
    # ... but a train file is now truncated.
    path = os.path.join(cifar_dir, "data_batch_2")
    blob = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(blob[: len(blob) // 2])
    from keras_preact.data import clear_cache

    clear_cache()
    before = file_hashes(workdir)
    with pytest.raises(ValueError, match=r"data_batch_2.*truncated or corrupt"):
        train_and_evaluate(config, workdir)
    assert file_hashes(workdir) == before


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains(cifar_dir, tmp_path, precision):
    import keras

    from keras_preact.training import train_and_evaluate

    workdir = str(tmp_path / "run")
    result = train_and_evaluate(cifar_config(cifar_dir, precision=precision, steps=2, epochs=None),
                                workdir)
    assert np.isfinite(result["test_loss"])
    model = keras.saving.load_model(result["model_path"], compile=False)
    assert model.get_layer("stem_conv").dtype_policy.name == precision
    assert model.output.dtype == "float32"  # softmax in float32
    history = json.load(open(os.path.join(workdir, "metrics.json")))["epochs"]
    assert np.isfinite(history[0]["loss"])


def test_an_epochs_evaluation_time_is_not_counted_as_training(tmp_path, monkeypatch):
    import time

    from keras_preact.training import run, train_and_evaluate

    evaluate = run.Stepper.evaluate
    monkeypatch.setattr(run.Stepper, "evaluate",
                        lambda *a: (time.sleep(1.0), evaluate(*a))[1])  # a slow evaluation
    epoch, = train_and_evaluate(tiny_config(epochs=1), str(tmp_path / "run"))["history"]
    assert epoch["eval_time_s"] >= 1.0 and epoch["time_s"] < epoch["eval_time_s"] + 60
    assert epoch["images_per_s"] == pytest.approx(22 * 64 / epoch["time_s"], rel=1e-3)


@pytest.mark.parametrize("seconds, chosen", [
    ({"fp32": 1.0, "mixed_bfloat16": 0.5}, "mixed_bfloat16"),  # 2x: kept
    ({"fp32": 1.0, "mixed_bfloat16": 0.95}, "fp32")])  # 1.05x: not a clear margin
def test_precision_auto_keeps_bfloat16_only_where_its_steps_are_clearly_faster(
        tmp_path, monkeypatch, seconds, chosen):
    import keras

    from keras_preact.training import train_and_evaluate
    from keras_preact.training.run import Run

    timed = []
    monkeypatch.setattr(Run, "step_seconds", lambda self, precisions: (
        timed.append(tuple(precisions)), seconds)[1])  # the timing faked: the test times nothing
    workdir = str(tmp_path / "run")
    result = train_and_evaluate(tiny_config(precision="auto", epochs=1), workdir)
    assert timed == [("fp32", "mixed_bfloat16")]
    record = {"chosen": chosen, "images_per_s": {p: round(64 / s, 1) for p, s in seconds.items()}}
    stored = json.load(open(os.path.join(workdir, "config.json")))["precision"]
    assert stored.pop("timing_s") >= 0 and stored == record
    assert json.load(open(os.path.join(workdir, "metrics.json")))["precision"] == chosen
    model = keras.saving.load_model(result["model_path"], compile=False)
    assert model.get_layer("stem_conv").dtype_policy.name == (
        "float32" if chosen == "fp32" else chosen)
    # Extended (as a resumed run), it keeps the stored choice and measures nothing again.
    result = train_and_evaluate(tiny_config(precision="auto", epochs=2), workdir)
    assert timed == [("fp32", "mixed_bfloat16")] and result["resumed_from_epoch"] == 1
    model = keras.saving.load_model(result["model_path"], compile=False)
    assert model.get_layer("stem_conv").dtype_policy.name == (
        "float32" if chosen == "fp32" else chosen)


def test_step_seconds_times_each_precision_of_the_runs_own_model():
    from keras_preact.training.run import Run, Stepper

    run = Run(tiny_config(precision="auto"), None, Stepper())
    run.spe = 22
    seconds = run.step_seconds(("fp32", "mixed_bfloat16"))
    assert set(seconds) == {"fp32", "mixed_bfloat16"} and all(s > 0 for s in seconds.values())


@pytest.mark.parametrize("where, message", [
    (dict(strategy="multiworker"), "multi-worker loop cannot honour precision='auto'"),
    (dict(tune=True), "Every trial trains in one precision")])
def test_precision_auto_is_refused_where_it_cannot_choose_once(where, message):
    from keras_preact.training.config import training_path
    from keras_preact.tuning.hypermodel import search_space_spec

    with pytest.raises(ValueError, match=message):
        if where.get("tune"):
            search_space_spec(config=tiny_config(precision="auto"))
        else:
            training_path(tiny_config(precision="auto", **where), "tensorflow")


@pytest.mark.slow
def test_jit_compile_trains(cifar_dir, tmp_path):
    from keras_preact.training import train_and_evaluate

    result = train_and_evaluate(cifar_config(cifar_dir, jit_compile=True, steps=2, epochs=None),
                                str(tmp_path / "run"))
    assert result["steps"] == 2 and np.isfinite(result["test_loss"])


def test_synchronized_batch_norm_switch_reaches_every_batch_norm(tiny_model_kwargs):
    import keras

    import keras_preact
    from keras_preact.training.distribute import batch_norm_layers, set_synchronized_batch_norm

    model = keras_preact.PreActResNet(**tiny_model_kwargs)
    layers = batch_norm_layers(model)
    # post_bn plus the units' own BatchNorm (as layers or as the units themselves).
    assert any(isinstance(layer, keras.layers.BatchNormalization) for layer in layers)
    assert len(layers) >= 2
    assert set_synchronized_batch_norm(model, True) == len(layers)
    assert all(layer.synchronized is True for layer in layers)
    set_synchronized_batch_norm(model, False)
    assert all(layer.synchronized is False for layer in layers)


def test_global_batch_must_divide_across_replicas():
    from keras_preact.training.distribute import check_global_batch

    assert check_global_batch(128, 2) == 64
    with pytest.raises(ValueError,
                       match=r"divide evenly across the 3 replicas.*batch_size=128.*126 or 129"):
        check_global_batch(128, 3)


# ----------------------------------------------------------------------------------
# The commands
# ----------------------------------------------------------------------------------


def test_train_and_evaluate_commands(cifar_dir, tmp_path, capsys):
    from keras_preact.cli import main

    workdir = str(tmp_path / "run")
    argv = ["train", "--model", "tiny", "--model-kwargs", json.dumps(TINY), "--dataset", "cifar10",
            "--data-source", "archive", "--data-path", cifar_dir, "--batch-size", "5",
            "--epochs", "1", "--eval-every", "0", "--workdir", workdir, "--verbose", "0"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))
    assert f"test accuracy {100 * metrics['test_accuracy']:.2f}%" in out
    stored = json.load(open(os.path.join(workdir, "config.json")))["train_config"]
    assert (stored["batch_size"], stored["epochs"], stored["boundaries"]) == (5, 1, [32000, 48000])

    assert main(["evaluate", "--workdir", workdir, "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert f"accuracy {100 * metrics['test_accuracy']:.2f}%" in out and "(6 images" in out

    # The same command again: nothing to do.
    assert main(argv) == 0
    assert "already complete" in capsys.readouterr().out
    # Another batch size in that workdir: refused, exit 2.
    argv[argv.index("--batch-size") + 1] = "4"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "batch_size: stored 5, requested 4" in err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--model", "preact_resnet7", "--dataset", "digits"], "Unknown model"),
        (["train", "--dataset", "svhn"], "Unknown dataset"),
        (["train", "--dataset", "digits", "--strategy", "tpu", "--model", "preact_resnet20"],
         "no TPU was found"),
        (["evaluate"], "Give `workdir`, or `dataset` with `weights`"),
        (["evaluate", "--workdir", "{tmp}/nothing-here"], "No training run in"),
        (["evaluate", "--dataset", "digits", "--weights", "{tmp}/missing.keras"],
         "Weights file not found"),
        (["evaluate", "--dataset", "digits", "--model", "preact_resnet20",
          "--weights", "{tmp}/bad.weights.h5"], "bad.weights.h5 cannot be read"),
    ],
)
def test_commands_report_bad_input_as_error_exit_2(tmp_path, capsys, argv, message):
    from keras_preact.cli import main

    (tmp_path / "bad.weights.h5").write_bytes(b"not an hdf5 file")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "train":
        argv += ["--workdir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
