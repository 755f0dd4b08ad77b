"""What a user who gets something wrong meets: one line that names the argument or file and
what is valid, an exit status of 2 from the command line, and no data lost or overwritten
(a full disk, damaged files, folders that are not ours, huge or corrupt images)."""

import argparse
import dataclasses
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from keras_preact import cli
from keras_preact.file_io import file_hash
from tests.helpers import REPO, TINY, run_cli, run_command, run_python, tiny_model

TINY_TRAIN = ["train", "--model", "tiny", "--model-kwargs", json.dumps(TINY), "--dataset", "digits",
              "--batch-size", "64", "--eval-every", "0", "--verbose", "0"]


#: The environment of a user's shell: TensorFlow's start-up log left to the command to quiet.
USER_ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}


def error_lines(err):
    """`err`'s lines less warnings and training's progress ("epoch 1 done: ..."), which a
    run prints when an epoch ends before its disk fills (a race a loaded machine can lose)."""
    return [line for line in err.splitlines()
            if not line.startswith("warning: ") and not re.match(r"epoch \d+ done: ", line)]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished two-epoch run of a tiny network on digits."""
    from keras_preact.training import TrainConfig, train_and_evaluate

    workdir = str(tmp_path_factory.mktemp("runs") / "tiny")
    train_and_evaluate(TrainConfig(model="tiny", model_kwargs=TINY, dataset="digits", batch_size=64,
                                   epochs=2, eval_every=0, verbose=0), workdir)
    return workdir


# --- a full disk -------------------------------------------------------------------------

FULL_DISK = r"""
import json, os, subprocess, sys, time
mnt, argv = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt], check=True)
cmd = [sys.executable, "-m", "keras_preact", *argv]
run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
state = os.path.join(mnt, "run", "checkpoints", "state.json")
while run.poll() is None and not os.path.exists(state):
    time.sleep(0.02)
def fill_disk():
    fd = os.open(os.path.join(mnt, "ballast"), os.O_WRONLY | os.O_CREAT)
    for size in (1 << 20, 4096):  # every page of the disk
        try:
            while True:
                os.write(fd, b"x" * size)
        except OSError:
            pass
    os.close(fd)
fill_disk()
first_err = run.communicate()[1]
left = json.load(open(state))["epoch"]
checkpoints = os.listdir(os.path.dirname(state))
os.remove(os.path.join(mnt, "ballast"))
second = subprocess.run(cmd, capture_output=True, text=True)
export = [sys.executable, "-m", "keras_preact", "export", os.path.join(mnt, "run"), "--out",
          os.path.join(mnt, "exports"), "--no-parity-check"]
fill_disk()
exported = subprocess.run(export, capture_output=True, text=True)
print(json.dumps({"first": [run.returncode, first_err], "left": left, "checkpoints": checkpoints,
                  "second": [second.returncode, second.stdout + second.stderr],
                  "export": [exported.returncode, exported.stderr]}))
"""


def _on_a_small_disk(script, mnt, argv):
    """The JSON `script` prints, run with a tmpfs of its own mounted at `mnt`."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -rm` (a private mount namespace) for a small tmpfs")
    mnt.mkdir()
    out = subprocess.run(["unshare", "-rm", sys.executable, "-c", script, str(mnt),
                          json.dumps(argv)], capture_output=True, text=True, cwd=REPO,
                         env=USER_ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_full_disk_is_one_line_and_a_rerun_with_room_resumes(tmp_path):
    mnt = tmp_path / "disk"
    argv = [*TINY_TRAIN, "--epochs", "6", "--workdir", str(mnt / "run")]
    result = _on_a_small_disk(FULL_DISK, mnt, argv)
    code, err = result["first"]
    # Before: an h5py line, two "Exception ignored" tracebacks and a segmentation fault.
    assert code == cli.EXIT_ERROR, err
    lines = error_lines(err)  # one: the file being written when the disk filled
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"error: No space left on device: '{mnt / 'run'}{os.sep}")
    assert line.endswith("' (free some space, or choose another disk)")
    assert not [n for n in result["checkpoints"] if n.startswith(".tmp-")]
    code, text = result["second"]
    assert code == 0 and f"Resumed from epoch {result['left']}." in text, text
    # An export that does not fit is the user's environment too, named, with nothing left.
    code, err = result["export"]
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        f"error: No space left on device: '{mnt / 'exports' / '1'}' (free some space, or "
        "choose another disk)"]


SMALL_DISK = r"""
import json, os, subprocess, sys
mnt, argv = sys.argv[1], json.loads(sys.argv[2])
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", mnt], check=True)
cmd = [sys.executable, "-m", "keras_preact", *argv]
first = subprocess.run(cmd, capture_output=True, text=True)
left = sorted(os.listdir(mnt))
subprocess.run(["mount", "-o", "remount,size=64m", mnt], check=True)
second = subprocess.run(cmd, capture_output=True, text=True)
print(json.dumps({"first": [first.returncode, first.stderr], "left": left,
                  "second": [second.returncode, second.stdout]}))
"""


def test_a_disk_too_small_for_the_first_checkpoint_leaves_nothing(tmp_path):
    # Before: HDF5 could not close the file it was writing and the process died at exit
    # with a segmentation fault, leaving a half-written run.
    mnt = tmp_path / "disk"
    argv = [*TINY_TRAIN, "--epochs", "1", "--workdir", str(mnt / "run")]
    result = _on_a_small_disk(SMALL_DISK, mnt, argv)
    code, err = result["first"]
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        f"error: No space left on device: '{mnt / 'run' / 'checkpoints' / 'ckpt-00001.weights.h5'}'"
        " (free some space, or choose another disk)"], err
    assert result["left"] == []
    code, text = result["second"]
    assert code == 0 and "test accuracy" in text, text


# --- training: arguments checked before anything is written -------------------------------

def test_classes_are_checked_against_the_dataset_before_anything_is_written(tmp_path, capsys):
    workdir = tmp_path / "run"
    argv = [*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir), "--model-kwargs",
            json.dumps({**TINY, "classes": 5})]
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_ERROR
    assert error_lines(err) == [
        "error: The 'digits' dataset has 10 classes, so the model needs as many. Received: "
        "model_kwargs classes=5. Leave `classes` out (the dataset's is used)."]
    assert not workdir.exists()


def test_a_folder_of_the_users_own_files_is_refused_and_kept(tmp_path, capsys):
    workdir = tmp_path / "mine"
    workdir.mkdir()
    (workdir / "metrics.csv").write_text("my,numbers\n")
    (workdir / "training_curve.png").write_bytes(b"my picture")
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir)], capsys)
    assert code == cli.EXIT_ERROR
    assert error_lines(err) == [
        f"error: The workdir {workdir} is not empty and holds no keras-preact run (no "
        "config.json; it holds metrics.csv, training_curve.png). Nothing was changed. Use an "
        "empty or new --workdir."]
    assert sorted(os.listdir(workdir)) == ["metrics.csv", "training_curve.png"]
    assert (workdir / "metrics.csv").read_text() == "my,numbers\n"


def test_a_tilde_after_an_equals_sign_means_home(tmp_path, monkeypatch):
    import keras_preact as kp
    from keras_preact.export.serving import check_path
    from keras_preact.training.workdir import Workdir

    monkeypatch.setenv("HOME", str(tmp_path))
    assert Workdir("~/runs/x").path == str(tmp_path / "runs" / "x")
    assert check_path("out", "~/exports/x") == str(tmp_path / "exports" / "x")
    pytest.importorskip("keras_hub", reason="save_preset needs the hub extra")
    path = kp.save_preset(tiny_model(), "~/preset")
    assert path == str(tmp_path / "preset") and not os.path.exists("~")
    with pytest.raises(TypeError, match=r"^`preset_dir` must be a path .*preset_dir=5 of"):
        kp.save_preset(tiny_model(), 5)


# --- files that cannot be read ------------------------------------------------------------

def test_damaged_files_are_named_by_the_python_api(tmp_path):
    import keras_preact as kp

    model = kp.preact_resnet20()
    weights, keras_file = str(tmp_path / "r20.weights.h5"), str(tmp_path / "r20.keras")
    model.save_weights(weights)
    model.save(keras_file)
    for path in (weights, keras_file):
        data = open(path, "rb").read()
        open(path, "wb").write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=rf"The weights file {weights} cannot be read \(.*truncated"
                                         r".*\): it is damaged or incomplete"):
        kp.preact_resnet20(weights=weights)
    with pytest.raises(ValueError, match=rf"The file {keras_file} is not a whole Keras .keras "
                                         "archive .*: it is damaged or incomplete"):
        kp.load_model(keras_file)
    with pytest.raises(ValueError, match="The .keras file does not exist"):
        kp.load_model(tmp_path / "missing.keras")
    # A folder that is not a preset is named as the user typed it.
    with pytest.raises(ValueError, match=rf"The folder is not a preset: it holds no "
                                         rf"model.weights.h5. Received: weights='{tmp_path}'"):
        kp.preact_resnet20(weights=str(tmp_path))


def test_an_export_missing_its_variables_is_the_users_environment(tiny_run, tmp_path, capsys):
    out = tmp_path / "export"
    assert run_cli(["export", tiny_run, "--out", str(out), "--no-parity-check"], capsys)[0] == 0
    for name in os.listdir(out / "1" / "variables"):
        if name.startswith("variables.data"):
            os.remove(out / "1" / "variables" / name)
    image = str(tmp_path / "digit.png")
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(image)
    code, _, err = run_cli(["predict", str(out), image], capsys)
    assert code == cli.EXIT_ERROR, err
    assert err.startswith(f"error: The saved_model export {out / '1'} cannot be loaded (")
    assert err.rstrip().endswith("it is damaged or incomplete; export it again.")
    assert err.count("\n") == 1


def test_a_checkpoint_or_a_workdir_exports(tiny_run, tmp_path, capsys):
    pytest.importorskip("ai_edge_litert", reason="a LiteRT export's check needs the export extra")
    checkpoint = os.path.join(tiny_run, "checkpoints", "ckpt-00001.weights.h5")
    code, out, err = run_cli(["export", checkpoint, "--format", "litert",
                              "--out", str(tmp_path / "lite")], capsys)
    assert code == 0, err
    card = json.load(open(tmp_path / "lite" / "model_card.json"))
    assert card["weights"]["file"] == os.path.join("checkpoints", "ckpt-00001.weights.h5")
    assert card["parity"]["images"] > 0  # held out from the run's own dataset
    code, _, err = run_cli(["export", str(tmp_path), "--out", str(tmp_path / "x")], capsys)
    assert code == cli.EXIT_ERROR and "must be a training workdir or one of its checkpoints" in err


# --- images -------------------------------------------------------------------------------

def _png_header_only(path, width, height):
    """A PNG that claims `width` x `height` grey pixels and holds one empty row."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(b"\0" * (width + 1))) + chunk(b"IEND", b""))


def test_huge_images_are_named_and_the_others_still_classified(tiny_run, tmp_path):
    bomb, big, good = (str(tmp_path / n) for n in ("bomb.png", "big.png", "good.png"))
    _png_header_only(bomb, 16000, 16000)  # over twice Pillow's limit: refused on opening
    Image.new("L", (10000, 10000)).save(big)  # over the limit: Pillow warns
    Image.fromarray(np.zeros((32, 32, 3), np.uint8)).save(good)
    out = run_command(["predict", os.path.join(tiny_run, "model.keras"), bomb, big, good],
                      env=USER_ENV, timeout=300)
    assert out.returncode == cli.EXIT_PARTIAL, out.stderr
    assert out.stdout.startswith(good + "\n")
    lines = error_lines(out.stderr)
    assert len(lines) == 2 and "Warning" not in out.stderr
    assert lines[0].startswith(f"error: image {bomb!r} is too large to read safely (")
    assert lines[1] == (f"error: image {big!r} has 1 channel(s); the model takes 3 (RGB): "
                        "pass resize=True (--resize) to convert it")


def test_a_corrupt_image_in_a_folder_dataset_is_named(tmp_path):
    from keras_preact.data.folder import read_image_folder
    from tests.data_fixtures import write_png_folder

    root = str(tmp_path / "images")
    write_png_folder(root, ["cat", "dog"], per_class=3)
    broken = os.path.join(root, "dog", "broken.png")
    open(broken, "wb").write(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(ValueError, match=rf"Cannot decode '{broken}' \(.*\)\. Remove or replace"):
        read_image_folder(root, "train")


# --- arguments, environment variables and help ----------------------------------------------

def test_python_api_refuses_values_of_the_wrong_kind():
    import keras_preact as kp

    with pytest.raises(ValueError, match=r"`input_tensor` must be None or a Keras tensor .* "
                                         r"Received: input_tensor='x'"):
        kp.preact_resnet20(input_tensor="x")
    assert kp.count_params("preact_resnet20") == 272_282  # a name, as the command line takes
    assert kp.count_macs("preact_resnet20") == 40_813_184
    with pytest.raises(ValueError, match=r"count_params needs a Keras model or a registered "
                                         r"model name. Received: model=42"):
        kp.count_params(42)
    with pytest.raises(ValueError, match="Unknown model name"):
        kp.count_macs("preact_resnet21")



def test_weights_clear_deletes_only_what_the_cache_wrote(tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.txt").write_text("precious")
    (mine / "mymodel.weights.h5").write_bytes(b"my weights")
    (mine / "preact_resnet20.cifar10.weights.h5").write_bytes(b"no record beside it")
    code, out, _ = run_cli(["weights", "clear", "--cache-dir", str(mine)], capsys)
    assert (code, out) == (0, f"Removed 0 file(s).\nKept 2 file(s) the cache did not write or "
                              "that changed since (no record of their SHA-256): "
                              f"{mine / 'mymodel.weights.h5'}, "
                              f"{mine / 'preact_resnet20.cifar10.weights.h5'}\n")
    assert sorted(os.listdir(mine)) == ["mymodel.weights.h5",
                                        "preact_resnet20.cifar10.weights.h5", "thesis.txt"]
    # A cached file with its record goes, with the record; the user's files stay.
    cached = mine / "preact_resnet20.cifar10.weights.h5"
    (mine / "preact_resnet20.cifar10.weights.h5.json").write_text(json.dumps(
        {"sha256": file_hash(str(cached))}))
    # Before: a record beside the user's own file, whatever its hash, had the file deleted.
    (mine / "my_run.weights.h5").write_bytes(b"a week of training")
    (mine / "my_run.weights.h5.json").write_text('{"sha256": "00"}')
    code, out, _ = run_cli(["weights", "clear", "--cache-dir", str(mine)], capsys)
    assert (code, out) == (0, "Removed 2 file(s).\nKept 2 file(s) the cache did not write or "
                              "that changed since (no record of their SHA-256): "
                              f"{mine / 'my_run.weights.h5'}, {mine / 'mymodel.weights.h5'}\n")
    assert sorted(os.listdir(mine)) == ["my_run.weights.h5", "my_run.weights.h5.json",
                                        "mymodel.weights.h5", "thesis.txt"]
    assert (mine / "my_run.weights.h5").read_bytes() == b"a week of training"
    code, _, err = run_cli(["weights", "clear", "preact_resnet21.cifar10", "--cache-dir",
                            str(mine)], capsys)
    assert code == cli.EXIT_ERROR and err.startswith(
        "error: Unknown weights. Received: weights='preact_resnet21.cifar10'. Valid: [")
    code, _, err = run_cli(["weights", "clear", "--cache-dir", str(tmp_path / "nowhere")], capsys)
    assert code == cli.EXIT_ERROR and err == (
        "error: The weights cache folder does not exist. Received: "
        f"cache_dir='{tmp_path / 'nowhere'}'\n")
    code, _, err = run_cli(["weights", "list", "--cache-dir", str(mine / "thesis.txt")], capsys)
    assert code == cli.EXIT_ERROR and err == (
        f"error: The weights cache {mine / 'thesis.txt'} cannot be a folder: "
        f"{mine / 'thesis.txt'} is a file. Received: cache_dir='{mine / 'thesis.txt'}'. Valid: "
        "a folder.\n")


def test_weights_commands_name_what_is_wrong(tmp_path, capsys, monkeypatch):
    code, out, err = run_cli(["weights", "path", "preact_resnet20.cifar10", "--cache-dir",
                              str(tmp_path)], capsys)
    assert code == 1 and out == f"{tmp_path / 'preact_resnet20.cifar10.weights.h5'}\n"
    assert err == ("preact_resnet20.cifar10 is not cached yet: `keras-preact weights fetch "
                   "preact_resnet20.cifar10` puts it there.\n")
    code, _, err = run_cli(["weights", "readme", "--output", str(tmp_path)], capsys)
    assert code == cli.EXIT_ERROR and err == (
        f"error: Is a directory: '{tmp_path}' (give a file, not a folder)\n")
    for folder, what in ((tmp_path / "nowhere", "does not exist"),
                         (tmp_path / "file", "is a file")):
        if what == "is a file":
            folder.write_text("x")
        monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(folder))
        code, _, err = run_cli(["weights", "fetch", "preact_resnet20.cifar10", "--cache-dir",
                                str(tmp_path / "cache"), "--offline"], capsys)
        assert code == cli.EXIT_ERROR and err == (
            f"error: KERAS_PREACT_WEIGHTS_DIR must be a folder of weights files; {folder} "
            f"{what}. Received: KERAS_PREACT_WEIGHTS_DIR='{folder}'\n"), err


def test_a_bad_distributed_tuning_environment_is_refused_at_once(tmp_path, monkeypatch):
    from keras_preact.tuning import tune

    # Before: a port that is not a number made the worker wait forever, silently.
    monkeypatch.setenv("KERASTUNER_TUNER_ID", "tuner0")
    monkeypatch.setenv("KERASTUNER_ORACLE_IP", "127.0.0.1")
    monkeypatch.setenv("KERASTUNER_ORACLE_PORT", "notaport")
    with pytest.raises(ValueError, match=r"^KERASTUNER_ORACLE_PORT must be a port number "
                                         r"1..65535. Received: KERASTUNER_ORACLE_PORT='notaport'$"):
        tune(str(tmp_path / "t"), depths=(20,), max_trials=1)
    # Before: a tuner id alone ran a one-process study without a word.
    monkeypatch.delenv("KERASTUNER_ORACLE_IP")
    monkeypatch.delenv("KERASTUNER_ORACLE_PORT")
    with pytest.raises(ValueError, match=r"^KerasTuner's chief / worker mode needs "
                                         r"KERASTUNER_TUNER_ID, KERASTUNER_ORACLE_IP, "
                                         r"KERASTUNER_ORACLE_PORT; KERASTUNER_ORACLE_IP, "
                                         r"KERASTUNER_ORACLE_PORT is not set"):
        tune(str(tmp_path / "t"), depths=(20,), max_trials=1)
    assert not (tmp_path / "t").exists()


def test_python_api_refuses_what_it_used_to_misread(tmp_path):
    import keras_preact as kp
    from keras_preact import finetune
    from keras_preact.export import load_export
    from keras_preact.training import TrainConfig, recipe, train_and_evaluate
    from keras_preact.tuning import tune

    cases = [  # each raised a Python error naming no argument, or was accepted silently
        (lambda: kp.load_model(123), TypeError,
         "`path` must be a path (str or os.PathLike). Received: path=123 of type int"),
        (lambda: kp.load_model(str(tmp_path)), ValueError,
         f"{tmp_path} is a folder, not a .keras file. Received: path='{tmp_path}'"),
        (lambda: kp.preact_resnet20(depth=56), ValueError,
         "`depth` is fixed by the registered model; use another depth "
         "(`keras_preact.list_models()`) or PreActResNet directly to change it. Received: "
         "depth=56"),
        (lambda: kp.preact_resnet20(include_top="no"), ValueError,
         "`include_top` must be True or False. Received: include_top='no'"),
        (lambda: kp.PreActResNet(features="yes"), ValueError,
         "`features` must be True or False. Received: features='yes'"),
        (lambda: kp.preact_resnet20(dtype="int8"), ValueError,
         "`dtype` must be a floating-point dtype or policy (float32, float16, bfloat16, "
         "mixed_float16, mixed_bfloat16, ...). Received: dtype='int8'"),
        (lambda: finetune.load_pretrained(kp.preact_resnet20(), "x.weights.h5",
                                          copy_head="maybe"), ValueError,
         "Unknown `copy_head`. Received: copy_head='maybe'. Valid: ['auto', True, False]"),
        (lambda: load_export(str(tmp_path), top_k=-1), ValueError,
         "`top_k` must be None or an integer >= 1. Received: top_k=-1"),
        (lambda: tune(str(tmp_path / "t"), depth=[20]), ValueError,
         "Unknown argument `depth` for tune. Did you mean `depths`? Received: depth=[20]. "
         "Valid: batch_size, blocks, budget, config, data_dir, data_path, data_source, dataset, "
         "depths, epochs, learning_rates, seed, units, validation_fraction, warmups, "
         "weight_decays, width_multipliers"),
        (lambda: kp.list_models(5), ValueError,  # TypeError from posixpath
         "`pattern` must be a string or None. Received: pattern=5"),
        (lambda: kp.list_models(family=["cifar"]), ValueError,
         "`family` must be a string or None. Received: family=['cifar']"),
        (lambda: tune(str(tmp_path / "t"), depths="20"), ValueError,  # 20 refused as invalid
         "`depths` must be a list of integers (CIFAR depths, e.g. [20, 56]). Received: "
         "depths='20'"),
        (lambda: train_and_evaluate(TrainConfig(model="tiny", model_kwargs=TINY), None),
         TypeError, "`workdir` must be a path (str or os.PathLike). Received: workdir=None of "
         "type NoneType"),
        # A softmax over one class always said 1.0; a billion classes ran out of memory.
        (lambda: kp.preact_resnet20(classes=1), ValueError, "A softmax over one class always "
         "outputs 1.0. Received: classes=1, classifier_activation='softmax'. Valid: classes >= "
         "2, or classifier_activation='sigmoid' (one class: a yes/no output) or None"),
        (lambda: kp.preact_resnet20(classes=10**9), ValueError, "`classes` is too large: the "
         "head would hold 64,000,000,000 weights (64 per class), over 2**31. Received: "
         "classes=1000000000"),
        (lambda: recipe("fast", lr=0.1), ValueError, "Unknown argument `lr` for TrainConfig. "
         "Did you mean `learning_rate`? Received: lr=0.1. Valid: " + ", ".join(sorted(
             f.name for f in dataclasses.fields(TrainConfig)))),
    ]
    for value, name, message in (
            ("boundaries", 5, "a list of numbers > 0"), ("freeze", 5, "a list of part names"),
            ("model_kwargs", "x", "a dict of model arguments"),
            ("learning_rate", float("inf"), "a finite number >= 0"),
            ("momentum", "x", "in [0, 1]")):
        cases.append((lambda v=value, n=name: TrainConfig(**{v: n}).validate(), ValueError,
                      f"`{value}` must be {message}. Received: {value}={name!r}"))
    cases.append((lambda: TrainConfig(model_kwargs={"architecture": "small"}).validate(),
                  ValueError, "`architecture` of `model_kwargs` must be a dict of PreActResNet "
                  "arguments. Received: architecture='small'"))
    cases.append((lambda: kp.PreActResNet(kernel_initializer="he_normall"), ValueError,
                  "Unknown `kernel_initializer`. Received: kernel_initializer='he_normall'. "
                  "Valid: a keras.initializers name ('he_normal', 'glorot_uniform', ...) or "
                  "instance"))
    cases.append((lambda: TrainConfig(model_kwargs={"data_format": "channels_first"}).validate(),
                  ValueError, "Training takes channels_last models: the data pipelines yield "
                  "channels_last images. Received: model_kwargs data_format='channels_first'. A "
                  "trained model converts with `PreActResNet.from_config({**config, "
                  "'data_format': ...})`."))
    (tmp_path / "file").write_text("x")
    cases.append((lambda: TrainConfig(data_dir=str(tmp_path / "file")).validate(), ValueError,
                  f"`data_dir` must be a folder (TFDS data or CIFAR files); {tmp_path / 'file'} "
                  f"is a file. Received: data_dir='{tmp_path / 'file'}'"))
    for call, kind, message in cases:
        with pytest.raises(kind) as raised:
            call()
        assert str(raised.value) == message
    assert not (tmp_path / "t").exists()


def test_contradictions_and_empty_work_are_refused(tiny_run, tmp_path, capsys):
    from tests.data_fixtures import write_png_folder

    workdir = tmp_path / "run"
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir), "--augment",
                            "pad_crop", "--no-augment"], capsys)
    assert code == 2 and "argument --no-augment: not allowed with argument --augment" in err
    weights = os.path.join(tiny_run, "checkpoints", "ckpt-00002.weights.h5")
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir), "--freeze",
                            "stem,stage1,stage2,stage3,head", "--weights", weights], capsys)
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        "error: Every part is frozen: nothing would train. Received: freeze=['stem', 'stage1', "
        "'stage2', 'stage3', 'head']. Leave one part out."]
    assert not workdir.exists()
    code, _, err = run_cli(["evaluate", "--workdir", tiny_run, "--weights", weights], capsys)
    assert code == cli.EXIT_ERROR and err.startswith(
        "error: Give `workdir` (its model is evaluated) or `model` / `weights`, not both.")
    code, _, err = run_cli(["evaluate", "--weights", weights, "--dataset", "digits"], capsys)
    assert code == cli.EXIT_ERROR and err.startswith(
        "error: A weights file needs `model`, the architecture it belongs to")
    folder = str(tmp_path / "three")
    write_png_folder(folder, ["a", "b", "c"], per_class=3)
    code, _, err = run_cli(["evaluate", "--workdir", tiny_run, "--dataset", "folder",
                            "--data-path", folder], capsys)
    assert code == cli.EXIT_ERROR and err == (
        "error: The 'folder' dataset has 3 classes and the model "
        f"({os.path.join(tiny_run, 'model.keras')}) 10 outputs: it cannot be scored on it.\n")
    names = tmp_path / "names.txt"
    names.write_text("cat\n" * 10)
    code, _, err = run_cli(["export", tiny_run, "--out", str(tmp_path / "e"), "--class-names",
                            str(names), "--no-parity-check"], capsys)
    assert code == cli.EXIT_ERROR and err == (
        "error: `class_names` must name each class differently. Received ['cat'] more than "
        "once.\n")
    (tmp_path / "f").write_text("x")
    code, out, err = run_cli(["diagnose", "preact_resnet20", "--out-dir", str(tmp_path / "f")],
                             capsys)
    assert (code, out) == (cli.EXIT_ERROR, "") and err == (
        f"error: `--out-dir` must be a folder; {tmp_path / 'f'} is a file. Received: "
        f"--out-dir={tmp_path / 'f'}\n")


def test_the_dataset_and_the_weights_must_fit_the_model(tmp_path, capsys):
    import keras

    workdir = tmp_path / "run"
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir),
                            "--model-kwargs", json.dumps({**TINY, "input_shape": [8, 8, 1]})],
                           capsys)
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        "error: The 'digits' images are (32, 32, 3) (height, width, channels). Received: "
        "model_kwargs input_shape=[8, 8, 1]. Leave `input_shape` out (the dataset's is used)."]
    other = str(tmp_path / "other.keras")
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(10)]).save(other)
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir),
                            "--weights", other], capsys)
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        f"error: {other} holds a Sequential, not a keras-preact PreActResNet: its weights "
        f"cannot be loaded. Received: weights='{other}'"]
    assert not workdir.exists()


def test_weights_of_another_depth_are_named_as_by_the_python_api(tmp_path, capsys):
    import keras_preact as kp

    weights = str(tmp_path / "r20.weights.h5")
    kp.preact_resnet20().save_weights(weights)
    with pytest.raises(ValueError, match=r"made for stage_blocks=\[3, 3, 3\], the model has "
                                         r"stage_blocks=\(9, 9, 9\)"):
        kp.preact_resnet56(weights=weights)
    workdir = tmp_path / "run"
    code, _, err = run_cli(["train", "--model", "preact_resnet56", "--weights", weights,
                            "--dataset", "digits", "--epochs", "1", "--workdir", str(workdir)],
                           capsys)
    # Before: "... of 'preact_resnet56_pretrained': the file holds 69 variables, the model 69".
    assert code == cli.EXIT_ERROR and error_lines(err) == [
        "error: The weights file does not match the architecture of 'preact_resnet56': it was "
        "made for stage_blocks=[3, 3, 3], the model has stage_blocks=[9, 9, 9]. Nothing was "
        f"loaded. Received: weights='{weights}'"]
    assert not workdir.exists()


def test_a_damaged_last_checkpoint_or_lost_report_is_explained(tiny_run, tmp_path, capsys,
                                                               caplog):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    os.remove(run / "metrics.json")
    code, out, _ = run_cli([*TINY_TRAIN, "--epochs", "2", "--workdir", str(run)], capsys)
    assert code == 0 and "test accuracy nan%" in out
    assert f"The run in {run} is complete but its metrics.json is gone" in caplog.text
    os.remove(run / "model.keras")
    checkpoint = run / "checkpoints" / "ckpt-00002.weights.h5"
    os.truncate(checkpoint, 5000)
    code, _, err = run_cli([*TINY_TRAIN, "--epochs", "3", "--workdir", str(run)], capsys)
    assert code == cli.EXIT_ERROR and error_lines(err)[0].startswith(
        f"error: The run's last checkpoint {checkpoint} cannot be read (")
    assert err.rstrip().endswith("the run cannot resume. Use a new --workdir, or delete this "
                                 "one to start the run over.")


def test_an_animated_image_says_which_frame_is_classified(tiny_run, tmp_path, caplog):
    from keras_preact.export.load import read_image_file

    path = str(tmp_path / "anim.gif")
    frames = [Image.new("RGB", (32, 32), color) for color in ("red", "blue")]
    frames[0].save(path, save_all=True, append_images=frames[1:])
    [(_, image)] = read_image_file(path, (32, 32, 3))
    assert tuple(image[0, 0]) == (255, 0, 0)
    assert f"image {path!r} has 2 frames: the first is classified." in caplog.text


@pytest.mark.parametrize("variable, value, argv, message", [
    ("KERAS_PREACT_OFFLINE", "yes-please", ["weights", "fetch", "preact_resnet20.cifar10"],
     "error: KERAS_PREACT_OFFLINE must be 1, true, yes or on, or else 0, false, no, off or "
     "empty. Received: KERAS_PREACT_OFFLINE='yes-please'"),
    ("KERAS_BACKEND", "nope", ["summary", "preact_resnet20"],
     "error: KERAS_BACKEND must be one of tensorflow, jax, torch, numpy, openvino. Received: "
     "KERAS_BACKEND='nope'"),
    ("KERAS_BACKEND", "openvino", ["summary", "preact_resnet20"],
     "error: KERAS_BACKEND is 'openvino', which needs the openvino package; it is not "
     "installed: install it, or choose another backend."),
    ("TF_ENABLE_ONEDNN_OPTS", "maybe", ["summary", "preact_resnet20"],
     "error: TF_ENABLE_ONEDNN_OPTS must be 0, 1, true or false. Received: "
     "TF_ENABLE_ONEDNN_OPTS='maybe'"),
    ("TF_CPP_MIN_LOG_LEVEL", "quiet", ["summary", "preact_resnet20"],
     "error: TF_CPP_MIN_LOG_LEVEL must be 0, 1, 2 or 3. Received: TF_CPP_MIN_LOG_LEVEL='quiet'"),
    ("KERAS_HOME", "{tmp}", ["summary", "preact_resnet20"],
     "error: the backend of {tmp}/keras.json must be one of tensorflow, jax, torch, numpy, "
     "openvino. Received: 'theano'"),
])
def test_environment_variables_with_unknown_values_are_refused(variable, value, argv, message,
                                                               tmp_path):
    (tmp_path / "keras.json").write_text('{"backend": "theano"}')  # Keras' own file
    value, message = (text.replace("{tmp}", str(tmp_path)) for text in (value, message))
    out = run_command([*argv, *(["--cache-dir", str(tmp_path)] if argv[0] == "weights" else [])],
                      env={**{k: v for k, v in USER_ENV.items() if k != "KERAS_BACKEND"},
                           variable: value}, timeout=300)
    assert out.returncode == cli.EXIT_ERROR
    assert error_lines(out.stderr) == [message]


def test_every_flag_of_every_command_has_a_help_text():
    def actions(parser, prefix):
        for action in parser._actions:  # argparse keeps subparsers only here
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from actions(sub, f"{prefix} {name}")
            elif not isinstance(action, argparse._HelpAction):
                yield prefix, action

    missing = [(where, a.option_strings or a.dest) for where, a in
               actions(cli.build_parser(), "keras-preact") if not a.help]
    assert missing == []


def test_list_builds_no_model_and_loads_no_tensorflow():
    out = run_python("import sys\nfrom keras_preact import cli\nassert cli.main(['list']) == 0\n"
                     "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.splitlines()
    assert rows[-1] == "[]" and len(rows) == 2 + 16 + 1
    assert rows[2].split() == ["preact_resnet20", "20", "basic", "272,282", "40.8M"]


def test_weights_readme_replaces_a_zoo_table_but_never_a_users_file(tmp_path, capsys):
    from keras_preact.weights.catalog import README_HEADER, render_zoo_readme

    notes = tmp_path / "notes.md"
    notes.write_text("user notes\n")
    code, _, err = run_cli(["weights", "readme", "--output", str(notes)], capsys)
    assert code == cli.EXIT_ERROR and notes.read_text() == "user notes\n"
    assert err.startswith("error: The file is not a zoo table") and "--output=" in err
    assert len(err.splitlines()) == 1
    table = tmp_path / "README.md"
    table.write_text(README_HEADER + "| an old table |\n")
    code, out, _ = run_cli(["weights", "readme", "--output", str(table)], capsys)
    assert code == 0 and table.read_text() == render_zoo_readme()


def test_evaluate_refuses_a_model_name_without_weights(capsys):
    # It used to score the untrained network ("accuracy 10.31% ... None").
    code, out, err = run_cli(["evaluate", "--model", "preact_resnet20", "--dataset", "digits"],
                             capsys)
    assert code == cli.EXIT_ERROR and out == ""
    assert error_lines(err) == ["error: A model name needs `weights` (--weights), or the untrained "
                                "network would be scored. Received: model='preact_resnet20', "
                                "weights=None"]


def test_a_folder_of_larger_images_says_they_are_resized(tmp_path, caplog):
    from keras_preact.data.folder import read_image_folder
    from tests.data_fixtures import write_png_folder

    for split in ("train", "test"):
        write_png_folder(tmp_path / split, ["cat", "dog"], 3, size=64)
    with caplog.at_level("WARNING", logger="keras_preact"):
        images, _, _ = read_image_folder(str(tmp_path), "train")
    assert images.shape[1:] == (32, 32, 3)
    assert "are resized to 32x32 (bilinear, aspect ratio not kept)" in caplog.text
    assert "is 64x64" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="keras_preact"):
        read_image_folder(str(tmp_path), "train", image_size=(64, 64))
    assert "resized" not in caplog.text


def test_a_mistyped_catalog_key_is_named_with_the_valid_keys(tmp_path, monkeypatch):
    import keras_preact as kp

    monkeypatch.chdir(tmp_path)  # no folder of that name
    with pytest.raises(ValueError) as info:
        kp.from_preset("preact_resnet20.cifar1O", load_weights=False)
    assert str(info.value).startswith("Unknown catalog key. Received: "
                                      "preset='preact_resnet20.cifar1O'. Valid: [")
    assert "'preact_resnet20.cifar10'" in str(info.value)


def test_the_folder_dataset_without_a_path_names_the_flag(capsys, tmp_path):
    code, _, err = run_cli(["train", "--model", "preact_resnet20", "--dataset", "folder",
                            "--workdir", str(tmp_path / "run")], capsys)
    assert code == cli.EXIT_ERROR and "needs `path` (--data-path)" in err
    assert not (tmp_path / "run").exists()


def test_flags_that_would_do_nothing_are_refused(tmp_path, capsys):
    workdir = tmp_path / "run"
    for flags, message in [
            (["--cutout", "100"], "`cutout` must be smaller than the 'digits' images (32x32), "
             "or every image is blanked. Received: cutout=100"),
            (["--recipe", "fast", "--schedule", "step"], "schedule='step' needs `boundaries` "
             "(--boundaries, e.g. 15,25): the 'fast' recipe has none, so the rate would never "
             "drop. Received: recipe='fast', schedule='step'"),
            (["--schedule", "cosine", "--boundaries", "10,20"], "The cosine schedule has no rate "
             "drops (`boundaries`). Received: schedule='cosine', boundaries=[10.0, 20.0]. Leave "
             "--boundaries out, or use --schedule step.")]:
        code, _, err = run_cli([*TINY_TRAIN, "--epochs", "1", "--workdir", str(workdir),
                                *flags], capsys)
        assert code == cli.EXIT_ERROR and error_lines(err) == [f"error: {message}"]
        assert not workdir.exists()
    code, _, err = run_cli(["export", "preact_resnet20", "--classes", "1", "--out",
                            str(tmp_path / "export")], capsys)
    [line] = error_lines(err)
    assert code == cli.EXIT_ERROR and line.startswith("error: A softmax over one class always ")
    assert not (tmp_path / "export").exists()


def test_a_loss_that_is_not_finite_stops_the_run_keeping_the_last_checkpoint(tmp_path, capsys):
    # One epoch at the warm-up rate, then 1e6 (5e5 at batch 64): the weights overflow in
    # epoch 2. It used to go on to "loss nan", exit 0 and save the NaN model as model.keras.
    workdir = tmp_path / "run"
    code, _, err = run_cli([*TINY_TRAIN, "--workdir", str(workdir), "--schedule-unit", "epochs",
                            "--warmup", "1", "--boundaries", "2", "--total", "3",
                            "--warmup-lr", "0.01", "--lr", "1e6"], capsys)
    assert code == cli.EXIT_ERROR, err
    [line] = error_lines(err)
    assert re.fullmatch(r"error: The loss became nan at step (2[3-9]|3\d|4[0-4]) \(learning "
                        r"rate 500000\.0\): training stopped, keeping the completed epochs' "
                        r"checkpoints\. Try a lower --lr in a new --workdir\.", line), line
    state = json.loads((workdir / "checkpoints" / "state.json").read_text())
    assert state["epoch"] == 1 and not (workdir / "model.keras").exists()
    assert (workdir / "checkpoints" / state["checkpoint"]).exists()


def test_steps_end_the_progress_bar_where_training_stops(tmp_path, capsys):
    code, out, _ = run_cli([*TINY_TRAIN[:-2], "--steps", "2", "--verbose", "1", "--workdir",
                            str(tmp_path / "run")], capsys)
    assert code == 0 and "2/2" in out and "22/22" not in out, out


def test_mixed_float16_on_a_cpu_is_quiet_but_says_it_is_slow(tmp_path):
    run = run_command([*TINY_TRAIN, "--steps", "1", "--precision", "mixed_float16",
                       "--workdir", str(tmp_path / "run")], env=USER_ENV)
    assert run.returncode == 0, run.stderr
    # It used to print TensorFlow's "E0000 ... oneDNN supports DT_HALF only on platforms
    # with AVX-512. Falling back to the default Eigen-based implementation if present."
    assert "oneDNN" not in run.stderr and "E0000" not in run.stderr, run.stderr
    assert run.stderr.count("warning: float16 is slow on CPUs: use --precision fp32 or "
                            "mixed_bfloat16.") == 1, run.stderr


def test_weights_take_a_training_run_or_a_preset_folder_by_its_bare_name(tmp_path, monkeypatch):
    import keras
    import numpy as np

    import keras_preact as kp
    from keras_preact.training import TrainConfig, train_and_evaluate
    from tests.helpers import to_numpy

    monkeypatch.chdir(tmp_path)
    train_and_evaluate(TrainConfig(model="preact_resnet20", dataset="digits", batch_size=256,
                                   steps=1, eval_every=0, verbose=0), "run")
    images = np.random.default_rng(0).uniform(0, 1, (2, 32, 32, 3)).astype("float32")
    trained = keras.saving.load_model(os.path.join("run", "model.keras"), compile=False)
    np.testing.assert_array_equal(to_numpy(kp.preact_resnet20(weights="run")(images)),
                                  to_numpy(trained(images)))
    os.makedirs("unfinished")
    with open(os.path.join("unfinished", "config.json"), "w") as f:
        json.dump({"train_config": {}}, f)
    with pytest.raises(ValueError, match=r"/unfinished is a training run's workdir without its "
                                         r"final model.keras \(not finished\?\): pass one of its "
                                         r"checkpoints/\*.weights.h5. Received: "
                                         r"weights='unfinished'"):
        kp.preact_resnet20(weights="unfinished")
    pytest.importorskip("keras_hub", reason="save_preset needs the hub extra")
    kp.save_preset(trained, "p")
    np.testing.assert_array_equal(to_numpy(kp.preact_resnet20(weights="p")(images)),
                                  to_numpy(trained(images)))
