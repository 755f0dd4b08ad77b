"""What the commands share: exit statuses, one-line errors, tables and argparse types."""

import argparse
import errno
import json
import sys

from keras_preact.checks import shorten

EXIT_PARTIAL, EXIT_ERROR, EXIT_BUG = 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a Ctrl-C

#: What to do about the operating-system errors users meet, by errno.
_OS_ADVICE = {
    **dict.fromkeys((errno.EACCES, errno.EPERM), "check its permissions, or choose another path"),
    errno.EROFS: "choose a path on a writable file system",
    errno.ENOTDIR: "a part of that path is a file, not a folder: choose another path",
    errno.ENOSPC: "free some space, or choose another disk", errno.ENOENT: "check the path",
    errno.EISDIR: "give a file, not a folder"}


def error_message(err):
    """One line saying what went wrong and, for an operating-system error, what to do."""
    text = getattr(err, "message", None) or str(err) or type(err).__name__  # TF's: .message
    if isinstance(err, OSError) and err.strerror:
        text = (err.strerror + (f": {err.filename!r}" if err.filename else "")
                + (f" ({advice})" if (advice := _OS_ADVICE.get(err.errno)) else ""))
    return shorten(text, 1000)


def print_error(err):
    """Prints `err` as one ``error: ...`` line on stderr."""
    print(f"error: {error_message(err)}", file=sys.stderr)


def partial_status(failed, total):
    """The exit status of a command over `total` items of which `failed` failed."""
    return 0 if not failed else EXIT_ERROR if failed == total else EXIT_PARTIAL


def print_table(header, rows, *, right=()):
    """Prints rows (tuples of str) as aligned columns under `header` and a rule;
    `right` holds the indices of the right-aligned columns."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line, "-" * len(line), sep="\n")
    for row in rows:
        print("  ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))))


def verbosity(value):
    """``--verbose``: auto, 0, 1 or 2. "auto" is a progress bar (1) on a terminal and a line
    per epoch (2) otherwise, so that logs hold no bar redrawn in place."""
    if value == "auto":
        return 1 if sys.stdout.isatty() else 2
    if value not in ("0", "1", "2"):
        raise argparse.ArgumentTypeError(f"must be auto, 0, 1 or 2, not {value!r}")
    return int(value)


def _list_of(kind, what):
    def parse(value):
        try:
            return [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be comma-separated {what}, "
                                             f"not {value!r}") from None
    return parse


int_list = _list_of(int, "integers")
float_list = _list_of(float, "numbers")
str_list = _list_of(str, "names")


def json_dict(value):
    try:
        out = json.loads(value)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON ({err}): {value!r}") from None
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, not {value!r}")
    return out
