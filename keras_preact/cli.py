"""The `keras-preact` command.

Errors are reported here, once for every command: a user's error (bad input, a file
or folder that cannot be used, a missing optional package, Ctrl-C) becomes one line on
stderr and an exit status from `EPILOG`; ``keras-preact --debug`` shows the traceback
instead. Commands raise; they print ``error: ...`` themselves only for the items of
a batch that fail while the others go on (`predict`).
"""

import argparse
import contextlib
import errno
import os
import re
import sys
import tempfile
import traceback

EXIT_PARTIAL = 1
EXIT_ERROR = 2
EXIT_BUG = 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C

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

INTERRUPTED = "interrupted; run the same command again to resume"

#: What to do about the operating-system errors users meet, by errno.
_OS_ADVICE = {
    errno.EACCES: "check its permissions, or choose another path",
    errno.EPERM: "check its permissions, or choose another path",
    errno.EROFS: "choose a path on a writable file system",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.ENOSPC: "free some space, or choose another disk",
    errno.ENOENT: "check the path",
    errno.EISDIR: "give a file, not a folder",
}

#: TensorFlow's C++ start-up lines: absl's pre-initialisation notice, absl-format
#: log lines and the CPU-feature note's second line. TF_CPP_MIN_LOG_LEVEL does not
#: reach the lines written before absl is initialised, hence the filter.
_TENSORFLOW_STARTUP_LOG = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
    r"|To enable the following instructions:"
)


def verbosity(value):
    """The argparse type of ``--verbose``: auto, 0, 1 or 2.

    "auto" is a progress bar (1) on a terminal and one line per epoch (2) otherwise,
    so that logs and CI output hold no bar redrawn in place.
    """
    if value == "auto":
        return 1 if sys.stdout.isatty() else 2
    if value not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"must be auto, 0, 1 or 2, not {value!r}")
    return int(value)


def partial_status(failed, total):
    """The exit status of a command over `total` items of which `failed` failed."""
    if not failed:
        return 0
    return EXIT_ERROR if failed == total else EXIT_PARTIAL


def print_table(header, rows, *, right=()):
    """Prints rows of strings as aligned columns under `header` and a rule.

    Args:
        header: tuple of column titles.
        rows: list of tuples of str, one a row.
        right: indices of right-aligned (numeric) columns.
    """
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


def _cmd_list(args):
    from keras_preact import models

    names = models.list_models(args.pattern)
    if not names:
        raise ValueError(f"No model matches the pattern. Received: pattern={args.pattern!r}. "
                         f"Models: {', '.join(models.list_models())}")
    bar = None
    if sys.stderr.isatty():
        from keras.utils import Progbar

        bar = Progbar(len(names), unit_name="model")
    rows = []
    for i, name in enumerate(names):
        info = models.model_info(name)
        model = models.get_model(name)
        rows.append((name, str(info["depth"]), info["block"], f"{models.count_params(model):,}",
                     f"{models.count_macs(model) / 1e6:,.1f}M"))
        del model
        if bar is not None:
            bar.update(i + 1)
    print_table(("model", "depth", "block", "parameters", "multiply-adds"), rows, right=(3, 4))
    return 0


def _cmd_summary(args):
    from keras_preact import models

    model = models.get_model(args.name, classes=args.classes)
    model.summary(expand_nested=args.expand)
    print(f"Trainable parameters: {models.count_params(model):,}")
    print(f"Multiply-adds per image: {models.count_macs(model):,}")
    return 0


#: Modules that add subcommands: each defines `add_commands(subparsers)`, where every
#: subparser sets `func` (called with the parsed args, returning an exit code).
#: They are imported only when the CLI runs, so the library never imports the CLI.
COMMAND_MODULES = (
    "keras_preact.training.commands",
    "keras_preact.export_commands",
    "keras_preact.weights.commands",
    "keras_preact.diagnostics_commands",
    "keras_preact.tuning.commands",
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-preact",
        description="Pre-activation ResNets (He et al. 2016) for Keras 3.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--debug", action="store_true",
                        help="show Python tracebacks and TensorFlow's start-up log "
                             "(before the command: keras-preact --debug train ...)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="list the models with parameters and multiply-adds")
    p.add_argument("pattern", nargs="?", default=None, help="shell wildcard, e.g. 'preact_resnet1*'")
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("summary", help="print a model's layers and costs")
    p.add_argument("name", help="a model name from `keras-preact list`")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--expand", action="store_true", help="expand the units' sub-layers")
    p.set_defaults(func=_cmd_summary)
    import importlib

    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name and module_name.startswith(err.name):
                continue  # that part of the package is not there yet
            raise
        module.add_commands(sub)
    return parser


@contextlib.contextmanager
def _without_tensorflow_startup_log():
    """Drops TensorFlow's start-up lines from what the block writes to file descriptor 2.

    The C++ runtime writes there directly, past `sys.stderr`; other lines are kept.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode("utf-8", "replace").splitlines(keepends=True):
                if not _TENSORFLOW_STARTUP_LOG.match(line):
                    sys.stderr.write(line)


def _quiet_tensorflow():
    """Loads Keras (and TensorFlow) without their C++ start-up log.

    Unless the user set TF_CPP_MIN_LOG_LEVEL: level 2 keeps TensorFlow's errors and
    drops its notes. The device probe runs here, inside the filter, because on a
    machine without a GPU it logs a "failed call to cuInit" error. Once TensorFlow is
    loaded it has set the variable itself (to 1), so the user's choice is known only
    before.
    """
    if "tensorflow" not in sys.modules and "TF_CPP_MIN_LOG_LEVEL" in os.environ:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _without_tensorflow_startup_log():
        import keras

        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            tf.config.list_physical_devices()


def _setup_logging():
    """The package's warnings, and the progress of training and tuning, on stderr."""
    import logging

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
    """Whether `err` is about the user's input or environment rather than a bug.

    ValueError (bad values), OSError (files, folders, permissions, the network),
    ModuleNotFoundError (a missing optional package; other ImportErrors, such as a
    circular import, are bugs), anything h5py raises (damaged files) and the
    package's own error types, which are raised on purpose with a message.
    """
    if isinstance(err, (ValueError, OSError, ModuleNotFoundError)):
        return True
    if type(err).__module__.startswith("keras_preact."):
        return True
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "h5py/" in frames[-1].filename.replace(os.sep, "/")


def error_message(err):
    """One line saying what went wrong and, for an operating-system error, what to do."""
    if isinstance(err, OSError) and err.filename and err.strerror:
        advice = _OS_ADVICE.get(err.errno)
        text = f"{err.strerror}: {err.filename!r}" + (f" ({advice})" if advice else "")
    else:
        text = str(err) or type(err).__name__
    return " ".join(text.split())


def main(argv=None):
    """Runs ``keras-preact`` with `argv` (default: the command line); returns the exit status."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    try:
        if not args.debug:
            _quiet_tensorflow()
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(INTERRUPTED, file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        if args.debug:
            raise
        if _is_users_error(err):
            print(f"error: {error_message(err)}", file=sys.stderr)
            return EXIT_ERROR
        print(f"error: unexpected {type(err).__name__}: {error_message(err)} (a bug; rerun "
              "with --debug for the traceback and report it)", file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
