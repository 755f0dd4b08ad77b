"""Files written whole or not at all, and file hashes: the package's one helper for each.

A crash or a full disk half-way through a write leaves the previous file (or none),
never a truncated one: the content goes to a temporary file beside the target, which
is flushed to disk and renamed over it (`os.replace` is atomic on POSIX and Windows).
"""

import hashlib
import json
import os
import tempfile


def atomic_save(path, save_fn):
    """Calls ``save_fn(temporary_path)`` and renames the result to `path`.

    The temporary name is beside `path` and keeps its suffix (Keras picks a format
    from it: ``.keras``, ``.weights.h5``); it does not exist when `save_fn` runs.

    Args:
        path: the file to write; its folder is created.
        save_fn: callable writing a complete file at the path it is given.
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    base = os.path.basename(path)
    suffix = ".weights.h5" if base.endswith(".weights.h5") else os.path.splitext(base)[1]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=suffix)
    os.close(fd)
    os.remove(tmp)  # Keras refuses to overwrite without asking on some paths.
    try:
        save_fn(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_bytes(path, data):
    """Writes `data` (bytes) to `path` with `atomic_save`."""

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_save(path, write)


def atomic_write_text(path, text):
    """Writes `text` to `path` as UTF-8 with `atomic_save`."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path, value, *, indent=2):
    """Writes `value` as JSON (sorted keys, a final newline) with `atomic_save`."""
    atomic_write_text(path, json.dumps(value, indent=indent, sort_keys=True, default=_plain) + "\n")


def _plain(value):
    """JSON for what `json` does not know: NumPy scalars and arrays, tuples' kin."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"Not JSON serialisable: {type(value).__name__}")


def file_hash(path, algorithm="sha256"):
    """Hex digest of a file, read in chunks (any `hashlib` algorithm name)."""
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
