"""The `keras-preact` command's manners: one-line errors and exit statuses, no
TensorFlow for `--help`, no TensorFlow start-up log, one run per workdir, plain
progress off a terminal, warnings about lost training images."""

import errno
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from keras_preact import cli
from tests.helpers import TINY, run_cli, run_command, run_python


def tiny_train_args(data_path, workdir, *extra):
    return ["train", "--model", "tiny", "--model-kwargs", json.dumps(TINY), "--dataset", "cifar10",
            "--data-source", "archive", "--data-path", data_path, "--batch-size", "5",
            "--epochs", "1", "--eval-every", "0", "--workdir", str(workdir), "--verbose", "0",
            *extra]


# ----------------------------------------------------------------------------------
# Quiet and quick
# ----------------------------------------------------------------------------------

HELP_PROBE = """
import contextlib, io, sys
from keras_preact import cli
commands = [[], ["train"], ["evaluate"], ["demo"], ["export"], ["predict"], ["weights"],
            ["weights", "list"], ["weights", "fetch"], ["tune"], ["diagnose"], ["list"],
            ["summary"]]
for argv in commands:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        cli.main(argv + ["--help"])
    print(" ".join(argv) or "-", "tensorflow" in sys.modules)
"""


def test_help_does_not_import_tensorflow():
    result = run_python(HELP_PROBE)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(" False\n") == 13, result.stdout


def test_tensorflow_startup_log_is_silenced():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = run_command(["list", "preact_resnet2*"], env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "preact_resnet20 " in result.stdout
    for line in ("cuInit", "oneDNN custom operations", "TensorFlow binary is optimized",
                 "absl::InitializeLog"):
        assert line not in result.stderr


def test_verbose_auto_is_a_line_per_epoch_off_a_terminal(monkeypatch):
    parser = cli.build_parser()
    for argv in (["train", "--workdir", "w"], ["evaluate"], ["demo"], ["tune", "--workdir", "w"]):
        assert parser.parse_args(argv).verbose == 2, argv  # stdout is captured: no terminal
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    assert parser.parse_args(["train", "--workdir", "w"]).verbose == 1


def test_help_documents_exit_statuses_and_debug(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for text in ("--debug", "exit status:", "  2    bad input", "  3    unexpected error",
                 "  130  interrupted"):
        assert text in out


# ----------------------------------------------------------------------------------
# One line for a user's error
# ----------------------------------------------------------------------------------


def _refuse_os_open(monkeypatch, folder, code):
    """`os.open` fails with `code` under `folder`, as on a read-only or foreign disk."""
    real_open = os.open

    def fake_open(path, *args, **kwargs):
        if os.fspath(path).startswith(str(folder)):
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)


@pytest.mark.parametrize(
    "code, message",
    [(errno.EACCES, "Permission denied: '{lock}' (check its permissions, or choose another path)"),
     (errno.EROFS, "Read-only file system: '{lock}' (choose a path on a writable file system)")],
)
def test_unwritable_workdir_is_one_line(cifar_dir, tmp_path, capsys, monkeypatch, code, message):
    workdir = tmp_path / "run"
    workdir.mkdir()
    _refuse_os_open(monkeypatch, workdir, code)
    code_, _, err = run_cli(tiny_train_args(cifar_dir, workdir), capsys)
    assert code_ == cli.EXIT_ERROR
    assert err == "error: " + message.format(lock=workdir / ".lock") + "\n"


def test_workdir_under_a_file_is_one_line(cifar_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli(tiny_train_args(cifar_dir, tmp_path / "file" / "run"), capsys)
    assert code == cli.EXIT_ERROR
    assert err == (f"error: `workdir` must be a folder, but {tmp_path / 'file'} is a file. "
                   f"Received: workdir='{tmp_path / 'file' / 'run'}'\n")


@pytest.mark.parametrize("command", ["train", "evaluate"])
def test_truncated_weights_file_is_one_line(tmp_path, capsys, command):
    import keras_preact as kp

    path = str(tmp_path / "r20.weights.h5")
    kp.preact_resnet20(input_shape=(8, 8, 1)).save_weights(path)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    argv = {"train": ["train", "--model", "preact_resnet20", "--dataset", "digits", "--epochs", "1",
                      "--weights", path, "--workdir", str(tmp_path / "run")],
            "evaluate": ["evaluate", "--dataset", "digits", "--model", "preact_resnet20",
                         "--weights", path]}
    code, _, err = run_cli(argv[command], capsys)
    assert code == cli.EXIT_ERROR
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith(f"error: The weights file {path} cannot be read")
    assert "truncated file" in err and "damaged or incomplete" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["predict", "export", "evaluate"])
def test_keras_file_with_a_lambda_layer_says_what_to_do(tmp_path, capsys, command):
    import keras

    inputs = keras.Input((8, 8, 1))
    outputs = keras.layers.Dense(10, activation="softmax")(
        keras.layers.Flatten()(keras.layers.Lambda(lambda x: x / 255.0)(inputs)))
    path = str(tmp_path / "lambda.keras")
    keras.Model(inputs, outputs).save(path)
    image = str(tmp_path / "grey.png")
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(image)
    argv = {"predict": ["predict", path, image],
            "export": ["export", path, "--out", str(tmp_path / "x")],
            "evaluate": ["evaluate", "--dataset", "digits", "--weights", path]}
    code, _, err = run_cli(argv[command], capsys)
    assert code == cli.EXIT_ERROR
    assert err.count("\n") == 1 and err.startswith("error: The .keras file holds a Lambda layer")
    assert "Re-save the model without the Lambda layer" in err
    assert "safe_mode=False" not in err  # Keras' advice: the CLI has no such switch


def test_ctrl_c_during_training_is_one_line_exit_130(cifar_dir, tmp_path, capsys, monkeypatch):
    import keras

    from keras_preact.training.run import Stepper

    class CtrlC(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise KeyboardInterrupt

    callbacks = Stepper.callbacks
    monkeypatch.setattr(Stepper, "callbacks", lambda *a, **k: [*callbacks(*a, **k), CtrlC()])
    workdir = tmp_path / "run"
    code, _, err = run_cli(tiny_train_args(cifar_dir, workdir), capsys)
    assert code == cli.EXIT_INTERRUPTED == 130, err
    assert err.splitlines()[-1] == "interrupted; run the same command again to resume"
    assert "Traceback" not in err
    # Stopped before its first checkpoint, the run leaves nothing (a rerun starts afresh).
    assert not workdir.exists()
    monkeypatch.undo()
    assert run_cli(tiny_train_args(cifar_dir, workdir), capsys)[0] == 0


def test_debug_shows_the_traceback_and_bugs_point_to_it(tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="must be a folder"):
        cli.main(["--debug", "evaluate", "--workdir", str(tmp_path / "file" / "run")])

    def bug(args):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(cli.models, "cmd_summary", bug)
    code, _, err = run_cli(["summary", "preact_resnet20"], capsys)
    assert code == cli.EXIT_BUG
    assert err == ("error: unexpected ZeroDivisionError: division by zero (a bug; rerun with "
                   "--debug for the traceback and report it)\n")


# ----------------------------------------------------------------------------------
# One run per workdir
# ----------------------------------------------------------------------------------


def test_a_second_process_on_a_workdir_is_refused_and_changes_nothing(cifar_dir, tmp_path, capsys):
    workdir = tmp_path / "run"
    workdir.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import filelock, sys; lock = filelock.FileLock(sys.argv[1]); "
         "lock.acquire(); print('held', flush=True); sys.stdin.read()", str(workdir / ".lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        code, _, err = run_cli(tiny_train_args(cifar_dir, workdir), capsys)
    finally:
        holder.communicate("", timeout=60)
    assert code == cli.EXIT_ERROR
    assert err == (f"error: The workdir {workdir} is in use by another process (it holds "
                   f"{workdir / '.lock'}). Nothing was changed. Wait for that run to end, or "
                   "use another workdir.\n")
    assert os.listdir(workdir) == [".lock"]


# ----------------------------------------------------------------------------------
# What training and the catalog say
# ----------------------------------------------------------------------------------


def test_train_warns_when_an_epoch_drops_images_or_has_few_steps(cifar_dir, tmp_path, capsys):
    # 20 training images at batch 6: 3 steps an epoch, the last 2 images left out.
    code, _, err = run_cli(tiny_train_args(cifar_dir, tmp_path / "run", "--batch-size", "6"),
                           capsys)
    assert code == 0, err
    assert "warning: Training drops the last 2 of 20 training images each epoch (batch 6).\n" in err
    assert "warning: The whole run is 3 step(s) (20 training images at batch 6): too few to " \
        "learn from scratch. Start from pretrained weights (--weights" in err
    assert "An epoch is only" not in err
    # 34 epochs are 102 steps: enough to learn from, but each epoch is short.
    code, _, err = run_cli(tiny_train_args(cifar_dir, tmp_path / "long", "--batch-size", "6",
                                           "--epochs", "34"), capsys)
    assert code == 0, err
    assert "warning: An epoch is only 3 step(s) (20 training images at batch 6)" in err
    assert "The whole run is" not in err


def test_weights_list_shows_no_none(tmp_path, capsys):
    code, out, _ = run_cli(["weights", "list", "--cache-dir", str(tmp_path)], capsys)
    assert code == 0
    assert "None" not in out
    row = next(line for line in out.splitlines() if line.startswith("preact_resnet101.imagenet "))
    assert row.split()[-1] == "-"  # the catalog gives no error rate for it


def test_version(capsys):
    import keras_preact

    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out == f"keras-preact {keras_preact.__version__}\n"


@pytest.mark.parametrize("argv, command", [
    (["train", "--epochs", "2"], "train"),  # no --workdir
    (["train", "--workdir", "w", "--verbose", "7"], "train"),
    (["tune", "--max-trials", "x"], "tune"),
    (["--no-such-flag"], ""),
])
def test_a_usage_error_is_one_line_pointing_to_help(capsys, argv, command):
    # Not the usage of every option (31 lines for `train`) above it.
    code, _, err = run_cli(argv, capsys)
    assert code == cli.EXIT_ERROR
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert err.endswith(f"(see {' '.join(['keras-preact', command]).strip()} --help)\n")


def test_an_error_found_after_planning_comes_without_the_epoch_warnings(cifar_dir, tmp_path,
                                                                        capsys):
    # Batch 6 drops 2 of the 20 images: a run warns of it, a refused one only says why.
    assert run_cli(tiny_train_args(cifar_dir, tmp_path / "a", "--batch-size", "6"), capsys)[0] == 0
    weights = str(tmp_path / "a" / "checkpoints" / "ckpt-00001.weights.h5")
    code, _, err = run_cli(tiny_train_args(cifar_dir, tmp_path / "b", "--batch-size", "6",
                                           "--weights", weights, "--freeze",
                                           "stem,stage1,stage2,stage3,head"), capsys)
    assert code == cli.EXIT_ERROR
    assert err.startswith("error: Every part is frozen") and err.count("\n") == 1, err


def test_demo_reports_one_accuracy_and_where_its_files_are(tmp_path, capsys, monkeypatch):
    from keras_preact.training import demo

    result = {"test_accuracy": 0.975, "test_loss": 0.1, "epochs": 8, "steps": 352,
              "model_path": "runs/demo/model.keras", "curve_path": "runs/demo/training_curve.png",
              "export": {"saved_model": "runs/demo/export/saved_model/1"}}
    monkeypatch.setattr(demo, "run_demo", lambda *args, **kwargs: result)
    code, out, _ = run_cli(["demo"], capsys)
    assert code == 0 and out.lower().count("accuracy") == 1
    assert out.startswith("Held-out accuracy on digits: 97.50%")
    assert out.splitlines()[-1] == "export:  runs/demo/export/saved_model/1"  # not a dict
