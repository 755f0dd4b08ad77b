"""Readers for the original CIFAR-10/100 files (https://www.cs.toronto.edu/~kriz/cifar.html).

Both layouts the dataset's authors publish are read, extracted or as the ``.tar.gz``
archive (read as a stream, never extracted to disk):

* python: ``cifar-10-batches-py/data_batch_1..5, test_batch`` and
  ``cifar-100-python/train, test``: pickled dicts with ``b"data"`` (N x 3072 uint8: the
  1024 red values, then green, then blue, each a row-major 32 x 32 plane) and
  ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100). Read with
  `keras_preact.data.safe_pickle`, which never runs code from the file.
* binary: ``cifar-10-batches-bin/data_batch_1..5.bin, test_batch.bin`` (records of one
  label byte + 3072 pixel bytes) and ``cifar-100-binary/train.bin, test.bin`` (coarse
  label byte, fine label byte, 3072 pixel bytes).

NumPy only: nothing here imports TensorFlow.
"""

import os
import tarfile
import zlib

import numpy as np

from keras_preact.data.safe_pickle import safe_load_pickle

IMAGE_SHAPE = (32, 32, 3)
_PIXELS = 32 * 32 * 3

#: Per dataset and layout: folder name inside the archive, archive name, files per split.
LAYOUTS = {
    "cifar10": {
        "python": {
            "dir": "cifar-10-batches-py",
            "archive": "cifar-10-python.tar.gz",
            "train": tuple(f"data_batch_{i}" for i in range(1, 6)),
            "test": ("test_batch",),
        },
        "binary": {
            "dir": "cifar-10-batches-bin",
            "archive": "cifar-10-binary.tar.gz",
            "train": tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
            "test": ("test_batch.bin",),
        },
    },
    "cifar100": {
        "python": {
            "dir": "cifar-100-python",
            "archive": "cifar-100-python.tar.gz",
            "train": ("train",),
            "test": ("test",),
        },
        "binary": {
            "dir": "cifar-100-binary",
            "archive": "cifar-100-binary.tar.gz",
            "train": ("train.bin",),
            "test": ("test.bin",),
        },
    },
}
_NUM_CLASSES = {"cifar10": 10, "cifar100": 100}
# Python layout: the key of the labels used for training (CIFAR-100: the 100 fine
# classes, as in the paper's CIFAR-100 results; the 20 coarse ones are not used).
_LABEL_KEY = {"cifar10": b"labels", "cifar100": b"fine_labels"}
# Binary layout: number of label bytes before the pixels and which one is used.
_BINARY_LABELS = {"cifar10": (1, 0), "cifar100": (2, 1)}
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def find_cifar_files(name, location):
    """Finds the CIFAR files of dataset `name` at `location`.

    Args:
        name: "cifar10" or "cifar100".
        location: a ``.tar.gz`` archive, an extracted folder (``cifar-10-batches-py``,
            ``cifar-10-batches-bin``, ``cifar-100-python``, ``cifar-100-binary``), or a
            folder holding one of those or one of the archives.

    Returns:
        ``(kind, layout, path)`` with kind "dir" or "tar", layout "python", "binary" or
        None (a tar whose layout is read from its members), or None when nothing is found.
    """
    _check_name(name)
    location = os.path.abspath(os.fspath(location))
    layouts = LAYOUTS[name]
    if os.path.isfile(location):
        if location.endswith(_ARCHIVE_SUFFIXES):
            return ("tar", None, location)
        return None
    if not os.path.isdir(location):
        return None
    base = os.path.basename(location.rstrip(os.sep))
    for layout, spec in layouts.items():
        if base == spec["dir"]:
            return ("dir", layout, location)
    # A folder holding the batch files themselves, under another name.
    for layout, spec in layouts.items():
        if os.path.isfile(os.path.join(location, spec["test"][0])) or os.path.isfile(
            os.path.join(location, spec["train"][0])
        ):
            return ("dir", layout, location)
    for layout, spec in layouts.items():
        if os.path.isdir(os.path.join(location, spec["dir"])):
            return ("dir", layout, os.path.join(location, spec["dir"]))
    for layout, spec in layouts.items():
        archive = os.path.join(location, spec["archive"])
        if os.path.isfile(archive):
            return ("tar", layout, archive)
    return None


def describe_expected(name):
    """A sentence naming the folders and archives `find_cifar_files` looks for."""
    layouts = LAYOUTS[name]
    names = [spec["dir"] + "/" for spec in layouts.values()]
    names += [spec["archive"] for spec in layouts.values()]
    return ", ".join(names)


def read_cifar(name, split, location):
    """Reads one split of CIFAR-10/100 from its original files.

    Args:
        name: "cifar10" or "cifar100".
        split: "train" or "test".
        location: see `find_cifar_files`.

    Returns:
        ``(images, labels, meta)``: images uint8 (N, 32, 32, 3) in RGB order, labels
        int64 (N,), meta a dict with "layout", "kind", "path" and "files".

    Raises:
        ValueError: when no CIFAR files are at `location`, a batch file is missing, or a
            file is truncated, corrupt or of the wrong shape (the message names the file).

    Example:
        >>> images, labels, meta = read_cifar("cifar10", "test", "~/data/cifar-10-python.tar.gz")
    """
    _check_name(name)
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")
    found = find_cifar_files(name, location)
    if found is None:
        raise ValueError(
            f"No {name} files found at {os.fspath(location)!r}. Expected one of: "
            f"{describe_expected(name)} (or a path to one of them)."
        )
    kind, layout, path = found
    if kind == "dir":
        files = LAYOUTS[name][layout][split]
        blobs = []
        for fname in files:
            fpath = os.path.join(path, fname)
            if not os.path.isfile(fpath):
                raise ValueError(
                    f"The {name} file {fpath!r} is missing (the {layout} layout needs "
                    f"{', '.join(files)} for split={split!r})."
                )
            with open(fpath, "rb") as f:
                blobs.append((fpath, f.read()))
    else:
        layout, blobs = _read_tar(name, split, path, layout)
    parts = [_parse(name, layout, source, data) for source, data in blobs]
    images = np.concatenate([p[0] for p in parts], axis=0)
    labels = np.concatenate([p[1] for p in parts], axis=0)
    meta = {
        "layout": layout,
        "kind": kind,
        "path": path,
        "files": [source for source, _ in blobs],
    }
    return images, labels, meta


def _read_tar(name, split, archive, layout):
    """Reads the members of `split` in one pass over the (compressed) archive stream."""
    layouts = LAYOUTS[name]
    candidates = [layout] if layout else list(layouts)
    wanted = {}
    for lay in candidates:
        for fname in layouts[lay][split]:
            wanted[f"{layouts[lay]['dir']}/{fname}"] = lay
    found = {}
    seen_layouts = set()
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                member_name = member.name.removeprefix("./")
                top = member_name.split("/", 1)[0]
                for lay in candidates:
                    if top == layouts[lay]["dir"]:
                        seen_layouts.add(lay)
                if member_name in wanted and member.isfile():
                    found[member_name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ValueError(
            f"The archive {archive!r} is truncated or corrupt ({type(err).__name__}: "
            f"{err})."
        ) from None
    if layout is None:
        if not seen_layouts:
            raise ValueError(
                f"The archive {archive!r} holds no {name} folder (expected "
                f"{' or '.join(spec['dir'] + '/' for spec in layouts.values())})."
            )
        # Prefer the python layout when an archive somehow holds both.
        layout = "python" if "python" in seen_layouts else "binary"
    spec = layouts[layout]
    blobs = []
    for fname in spec[split]:
        member_name = f"{spec['dir']}/{fname}"
        if member_name not in found:
            raise ValueError(
                f"The archive {archive!r} has no member {member_name!r} (the {layout} "
                f"layout needs {', '.join(spec[split])} for split={split!r})."
            )
        blobs.append((f"{archive}:{member_name}", found[member_name]))
    return layout, blobs


def _parse(name, layout, source, data):
    if layout == "python":
        return _parse_pickle_batch(name, source, data)
    return _parse_binary_batch(name, source, data)


def _parse_pickle_batch(name, source, data):
    batch = safe_load_pickle(data, source=source)
    if not isinstance(batch, dict):
        raise ValueError(
            f"The {name} batch file {source!r} does not hold a dict (found "
            f"{type(batch).__name__})."
        )
    label_key = _LABEL_KEY[name]
    pixels = _get(batch, b"data")
    labels = _get(batch, label_key)
    if pixels is None or labels is None:
        raise ValueError(
            f"The {name} batch file {source!r} lacks the key {b'data'!r} or "
            f"{label_key!r} (found keys {sorted(map(repr, batch))})."
        )
    if not isinstance(pixels, np.ndarray) or pixels.dtype != np.uint8:
        raise ValueError(
            f"In {source!r}, {b'data'!r} must be a uint8 numpy array; found "
            f"{type(pixels).__name__} {getattr(pixels, 'dtype', '')}."
        )
    if pixels.ndim != 2 or pixels.shape[1] != _PIXELS:
        raise ValueError(
            f"In {source!r}, {b'data'!r} has shape {pixels.shape}; expected (N, {_PIXELS})."
        )
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"In {source!r}, {label_key!r} is not a list of ints.") from None
    if labels.shape != (pixels.shape[0],):
        raise ValueError(
            f"In {source!r}, {label_key!r} has shape {labels.shape} for "
            f"{pixels.shape[0]} images."
        )
    _check_labels(name, source, labels)
    return _planes_to_nhwc(pixels), labels


def _parse_binary_batch(name, source, data):
    num_label_bytes, label_index = _BINARY_LABELS[name]
    record = num_label_bytes + _PIXELS
    if len(data) == 0 or len(data) % record:
        raise ValueError(
            f"The {name} binary file {source!r} has {len(data)} bytes, not a positive "
            f"multiple of the {record}-byte record ({num_label_bytes} label byte(s) + "
            f"{_PIXELS} pixels): truncated or of the wrong layout."
        )
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, record)
    labels = rows[:, label_index].astype(np.int64)
    _check_labels(name, source, labels)
    return _planes_to_nhwc(rows[:, num_label_bytes:]), labels


def _planes_to_nhwc(pixels):
    # Each row is 1024 R, then 1024 G, then 1024 B values, every plane row-major 32 x 32.
    return np.ascontiguousarray(pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def _check_labels(name, source, labels):
    num_classes = _NUM_CLASSES[name]
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"In {source!r}, labels range over [{labels.min()}, {labels.max()}]; "
            f"{name} has classes 0..{num_classes - 1}."
        )


def _get(batch, key):
    if key in batch:
        return batch[key]
    return batch.get(key.decode("ascii"))


def _check_name(name):
    if name not in LAYOUTS:
        raise ValueError(
            f"No original-file reader for dataset {name!r}. Valid: {sorted(LAYOUTS)}"
        )
