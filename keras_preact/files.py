"""Files written whole or not at all (a crash half-way leaves the previous file or none,
never a truncated one), and file hashes: the package's one helper for each."""

import hashlib
import json
import os
import pathlib
import uuid


def atomic_save(path, save_fn):
    """Calls ``save_fn(tmp)``, flushes `tmp` to disk and renames it to `path` (atomic on
    POSIX and Windows); `tmp` is a free path beside `path`, with its suffix (Keras picks a
    format from it). The folder of `path` is created."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    suffix = ".weights.h5" if path.endswith(".weights.h5") else os.path.splitext(path)[1]
    # A name no file has: Keras refuses to overwrite without asking on some paths.
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}{suffix}")
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
