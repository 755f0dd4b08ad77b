"""The `keras-preact` command: a module per command group, each command a thin function over
the library, imported inside it so that ``--help`` loads neither Keras nor TensorFlow. A user's
error becomes one line on stderr and an exit status of `EPILOG` (``--debug``: the traceback)."""

import argparse
import logging
import os
import re
import sys
import tempfile
import traceback

import keras_preact
from keras_preact.checks import check_environment
from keras_preact.cli import diagnostics, export, models, train, tune, weights
from keras_preact.cli.common import (
    EXIT_BUG, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_PARTIAL, error_message, print_error)

__all__ = ["EXIT_BUG", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_PARTIAL", "build_parser", "main"]

EPILOG = """\
exit status:
  0    done
  1    done, but some items failed (each named in an "error: ..." line on stderr)
  2    bad input, or a file or folder that cannot be used (or every item failed):
       "error: ..." on stderr says what to change; argparse's usage errors too
  3    unexpected error (a bug): one line; rerun with --debug for the traceback
  130  interrupted (Ctrl-C): run the same command again to resume

TensorFlow's C++ start-up log is kept off the terminal unless TF_CPP_MIN_LOG_LEVEL is
set or --debug is given.
"""

#: TensorFlow's C++ start-up lines: absl's notice, absl log lines, the CPU-feature note's 2nd.
_TENSORFLOW_STARTUP_LOG = re.compile(r"WARNING: All log messages before absl::InitializeLog\(\)"
                                     r"|[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
                                     r"|To enable the following instructions:")


#: TensorFlow's errors that come from the user's files, disks or memory.
_TENSORFLOW_ENVIRONMENT_ERRORS = ("NotFoundError", "PermissionDeniedError", "DataLossError",
                                  "ResourceExhaustedError", "AlreadyExistsError")


class _Parser(argparse.ArgumentParser):
    """Also its subcommands': a usage error is one line and where help is, not every option."""

    def error(self, message):
        self.exit(EXIT_ERROR, f"error: {message} (see {self.prog} --help)\n")


def build_parser():
    """The `keras-preact` parser; each subcommand sets ``func`` (args -> exit status)."""
    parser = _Parser(
        prog="keras-preact", description="Pre-activation ResNets (He et al. 2016) for Keras 3.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"keras-preact {keras_preact.__version__}")
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks and "
                        "TensorFlow's start-up log (before the command: keras-preact --debug "
                        "train ...)")
    parser.set_defaults(uses_keras=True)  # a command that does not sets False
    sub = parser.add_subparsers(dest="command", required=True)
    # In the order `keras-preact --help` lists the commands.
    for module in (models, train, export, weights, diagnostics, tune):
        module.add_commands(sub)
    return parser


def _quiet_tensorflow():
    """Loads Keras (and TensorFlow) without TensorFlow's C++ start-up lines on descriptor 2,
    unless the user set TF_CPP_MIN_LOG_LEVEL. That variable misses lines written before absl
    starts, hence the filter; the device probe (a cuInit error without a GPU) runs inside."""
    if "tensorflow" not in sys.modules and "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keeps TensorFlow's errors
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)  # the C++ runtime writes there, past `sys.stderr`
        try:
            import keras
            if keras.backend.backend() == "tensorflow":
                import tensorflow as tf
                tf.config.list_physical_devices()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines = capture.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.writelines(x for x in lines if not _TENSORFLOW_STARTUP_LOG.match(x))


def _setup_logging():
    """The package's warnings, and the progress of training and tuning, on stderr."""
    class Formatter(logging.Formatter):
        def format(self, record):
            text = super().format(record)
            return text if record.levelno < logging.WARNING else f"warning: {text}"

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(Formatter("%(message)s"))
    log = logging.getLogger("keras_preact")
    log.handlers = [handler]  # bound to this call's stderr (tests swap it)
    log.setLevel(logging.WARNING)
    for name in ("keras_preact.training", "keras_preact.tuning"):
        logging.getLogger(name).setLevel(logging.INFO)


def _is_users_error(err):
    """Whether `err` is the user's input or environment, not a bug: also ModuleNotFoundError,
    the package's errors, TensorFlow's of files, disks and memory, and h5py's (damaged files)."""
    if (isinstance(err, (ValueError, OSError, ModuleNotFoundError))
            or type(err).__module__.startswith("keras_preact.")
            or type(err).__name__ in _TENSORFLOW_ENVIRONMENT_ERRORS
            and type(err).__module__.startswith("tensorflow.")):
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "h5py/" in frames[-1].filename.replace(os.sep, "/")


def main(argv=None):
    """Runs ``keras-preact`` with `argv` (default: the command line); returns the exit status."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    if args.debug:  # tracebacks and TensorFlow's log as they come
        check_environment()
        return args.func(args)
    try:
        if args.uses_keras:
            check_environment()
            if getattr(args, "precision", None) == "mixed_float16":
                # oneDNN's float16 kernels need AVX-512 FP16: elsewhere it logs an error line
                # once training starts, then runs Eigen's, as this does from the start.
                os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
            _quiet_tensorflow()
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted; run the same command again to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        if _is_users_error(err):
            print_error(err)
            return EXIT_ERROR
        print(f"error: unexpected {type(err).__name__}: {error_message(err)} (a bug; rerun "
              "with --debug for the traceback and report it)", file=sys.stderr)
        return EXIT_BUG
