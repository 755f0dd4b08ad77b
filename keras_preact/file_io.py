"""Files and folders written whole or not at all (a crash half-way leaves the previous one or
none), JSON read back, file hashes, pickles read without running code and the paths users
type: the package's one helper for each."""

import contextlib
import csv
import errno
import hashlib
import io
import json
import os
import pathlib
import pickle
import shutil
import uuid

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


def user_path(path, name="path"):
    """The absolute path of a path a user typed, ``~`` expanded (also after ``--flag=``,
    where the shell leaves it); TypeError naming argument `name` for a non-path."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`{name}` must be a path (str or os.PathLike). Received: "
                        f"{name}={path!r} of type {type(path).__name__}")
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def keras_preact_home(*parts):
    """``$KERAS_PREACT_HOME`` (default ``~/.keras/keras_preact``) joined with `parts`."""
    home = os.getenv("KERAS_PREACT_HOME") or "~/.keras/keras_preact"
    return user_path(os.path.join(home, *parts))


def is_no_space(err):
    """Whether `err` says the disk is full (an OSError, or a library's error naming ENOSPC)."""
    return getattr(err, "errno", None) == errno.ENOSPC or NO_SPACE in str(err)


def atomic_save(path, save_fn):
    """Calls ``save_fn(tmp)``, flushes `tmp` to disk and renames it to `path` (atomic); `tmp`
    is a free path beside `path` with its suffix (Keras picks a format from it). Creates the
    folder; a full disk raises ``OSError(ENOSPC)`` naming `path`, with `tmp` removed."""
    if os.path.isdir(path := user_path(path)):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    suffix = ".weights.h5" if path.endswith(".weights.h5") else os.path.splitext(path)[1]
    # A name no file has: Keras refuses to overwrite without asking on some paths.
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}{suffix}")
    with _undone_on_error(path, lambda: pathlib.Path(tmp).unlink(missing_ok=True)):
        save_fn(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)


@contextlib.contextmanager
def _undone_on_error(path, undo):
    """Calls ``undo()`` when the block raises; a full disk raises ``OSError(ENOSPC)`` naming
    `path` instead (TensorFlow's error names no path)."""
    try:
        yield
    except BaseException as err:
        undo()
        if isinstance(err, Exception) and is_no_space(err):
            raise OSError(errno.ENOSPC, NO_SPACE, path) from None
        raise


@contextlib.contextmanager
def staged_folder(target, *, check, what, name="path"):
    """Yields a temporary folder beside `target`, renamed onto it if the block succeeds (an
    exception removes it and leaves `target` as it was). ``check()`` raises to refuse
    `target`, before and after the block; ValueError naming `what` (e.g. "an export") and
    argument `name` for an unwritable parent."""
    check()
    parent, base = os.path.split(target)
    try:
        os.makedirs(parent, exist_ok=True)
        # Made with the umask's permissions, not private (as mkdtemp's): a server running as
        # another user must read it.
        staging = os.path.join(parent, f".{base}.partial-{uuid.uuid4().hex[:8]}")
        os.mkdir(staging)
    except OSError as err:
        raise ValueError(f"Cannot write {what} under {parent!r}: {err.strerror or err}. "
                         f"Received: {name}={target!r}") from None
    with _undone_on_error(target, lambda: shutil.rmtree(staging, ignore_errors=True)):
        yield staging
        check()  # it may have appeared meanwhile
        if not os.path.lexists(target):
            os.replace(staging, target)
            return
        # The old folder is moved aside, and back if the final rename fails.
        backup = os.path.join(parent, f".{base}.replaced-{uuid.uuid4().hex[:8]}")
        os.replace(target, backup)
        try:
            os.replace(staging, target)
        except BaseException:
            os.replace(backup, target)
            raise
        shutil.rmtree(backup, ignore_errors=True)


def atomic_write_bytes(path, data):
    """Writes `data` to `path` with `atomic_save`."""
    atomic_save(path, lambda tmp: pathlib.Path(tmp).write_bytes(data))


def atomic_write_text(path, text):
    """Writes `text` to `path` as UTF-8 with `atomic_save`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, value, *, indent=2):
    """Writes `value` as JSON (sorted keys, NumPy values as lists and numbers)."""
    atomic_write_text(path, json.dumps(value, indent=indent, sort_keys=True, default=_plain) + "\n")


def _plain(value):
    if hasattr(value, "tolist"):  # NumPy scalars and arrays
        return value.tolist()
    raise TypeError(f"Not JSON serialisable: {type(value).__name__}")


def file_hash(path, algorithm="sha256"):
    """Hex digest of a file, read in chunks (any `hashlib` algorithm name)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_json(path):
    """The content of a JSON file; ValueError naming it if it is not JSON."""
    try:
        return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it was not written by keras-preact "
                         "or was edited.") from None


def write_csv_rows(path, rows, columns, lineterminator="\n"):
    """Writes the dicts `rows` as CSV under the header `columns` (a missing key or None: "")."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator=lineterminator)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buf.getvalue())


def figure_png(fig, title="", dpi=None):
    """PNG bytes of a matplotlib `Figure` (no pyplot) under `title`, its layout tightened."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


class PickleRefused(Exception):
    """What a `RestrictedUnpickler` or its caller refuses; `pickle_errors` names the file."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing and so runs no code from the file: a global
    resolves only through `admitted` ((module, name) -> object) and a persistent id only
    through `persistent_load`; `what` (e.g. "a CIFAR batch file") words the refusals."""

    def __init__(self, file, admitted, what, persistent_load=None, **kwargs):
        super().__init__(file, **kwargs)
        self.admitted, self.what, self.load_persistent = admitted, what, persistent_load

    def find_class(self, module, name):
        if (module, name) not in self.admitted:
            raise PickleRefused(f"the pickle asks for the global {module}.{name}, which "
                                f"{self.what} never needs (it would let the file run code)")
        return self.admitted[(module, name)]

    def persistent_load(self, pid):
        if self.load_persistent is None:
            raise PickleRefused("persistent ids are not allowed")
        return self.load_persistent(pid)


@contextlib.contextmanager
def pickle_errors(source):
    """Turns what the block raises into one ValueError line naming the file `source`: a
    `PickleRefused` as a refusal, any other error as a truncated or corrupt file."""
    try:
        yield
    except PickleRefused as err:
        raise ValueError(f"Refusing to load the pickle file {source!r}: {err}.") from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file.
        raise ValueError(f"The pickle file {source!r} is truncated or corrupt "
                         f"({type(err).__name__}: {' '.join(str(err).split())}).") from None
