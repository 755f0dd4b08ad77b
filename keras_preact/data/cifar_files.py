"""Readers for the original CIFAR-10/100 files (https://www.cs.toronto.edu/~kriz/cifar.html),
extracted or as the ``.tar.gz`` archive (streamed, never extracted to disk). NumPy only.
Python layout: pickled dicts, read with `safe_pickle`; binary layout: fixed-size records."""

import os
import pathlib
import tarfile
import zlib

import numpy as np

from keras_preact.data.registry import DATASETS
from keras_preact.data.safe_pickle import safe_load_pickle
from keras_preact.file_io import user_path

_PIXELS = 32 * 32 * 3


def _layouts(n, folders, train, test):
    """CIFAR-`n`'s python and binary layouts, extracted to `folders`: archives named
    ``cifar-<n>-<layout>.tar.gz``, the binary files named as the python ones plus ".bin"."""
    return {layout: {"dir": folder, "archive": f"cifar-{n}-{layout}.tar.gz",
                     "train": tuple(f + suffix for f in train), "test": (test + suffix,)}
            for layout, folder, suffix in zip(("python", "binary"), folders, ("", ".bin"))}


#: Per dataset and layout: folder name inside the archive, archive name, files per split.
LAYOUTS = {
    "cifar10": _layouts(10, ("cifar-10-batches-py", "cifar-10-batches-bin"),
                        [f"data_batch_{i}" for i in range(1, 6)], "test_batch"),
    "cifar100": _layouts(100, ("cifar-100-python", "cifar-100-binary"), ["train"], "test")}
# Python layout: the labels' key (CIFAR-100: the 100 fine classes, as the paper's results).
_LABEL_KEY = {"cifar10": b"labels", "cifar100": b"fine_labels"}
# Binary layout: number of label bytes before the pixels and which one is used.
_BINARY_LABELS = {"cifar10": (1, 0), "cifar100": (2, 1)}
_ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")


def find_cifar_files(name, location):
    """Finds the CIFAR files of `name` at `location` (an archive, an extracted folder or a
    folder holding one): ``(kind, layout, path)``, kind "dir" or "tar", layout "python",
    "binary" or None (a tar: read from its members); None when nothing is found."""
    if os.path.isfile(location := user_path(location)):
        return ("tar", None, location) if location.endswith(_ARCHIVE_SUFFIXES) else None
    if not os.path.isdir(location):
        return None
    # hits: (preference, kind, layout, path); python before binary at equal preference
    base, hits = os.path.basename(location.rstrip(os.sep)), []
    for layout, spec in LAYOUTS[name].items():
        inner, archive = (os.path.join(location, spec[k]) for k in ("dir", "archive"))
        batch_files = [os.path.join(location, spec[s][0]) for s in ("test", "train")]
        checks = ((base == spec["dir"], "dir", location),  # the extracted folder itself
                  (any(map(os.path.isfile, batch_files)), "dir", location),  # renamed folder
                  (os.path.isdir(inner), "dir", inner),  # a folder holding the extracted one
                  (os.path.isfile(archive), "tar", archive))  # a folder holding the archive
        hits += [(rank, kind, layout, path) for rank, (ok, kind, path) in enumerate(checks) if ok]
    return min(hits, key=lambda hit: hit[0])[1:] if hits else None


def describe_expected(name):
    """The folders and archives `find_cifar_files` looks for."""
    specs = LAYOUTS[name].values()
    return ", ".join([s["dir"] + "/" for s in specs] + [s["archive"] for s in specs])


def read_cifar(name, split, location):
    """Reads one split of CIFAR-10/100 from its original files at `location`: ``(images,
    labels, meta)``, uint8 (N, 32, 32, 3) RGB, int64 (N,) and a dict with "layout", "kind",
    "path" and "files". ValueError, naming the file, for missing, corrupt or bad files."""
    if (found := find_cifar_files(name, location)) is None:
        raise ValueError(f"No {name} files found at {os.fspath(location)!r}. Expected one of: "
                         f"{describe_expected(name)} (or a path to one of them).")
    kind, layout, path = found
    if kind == "tar":
        layout, members = _read_tar(name, split, path, layout)
        where = f"{path}:{LAYOUTS[name][layout]['dir']}/"
    else:
        where = path + os.sep
        members = {f: pathlib.Path(where + f).read_bytes() for f in LAYOUTS[name][layout][split]
                   if os.path.isfile(where + f)}
    files = LAYOUTS[name][layout][split]
    if missing := [f for f in files if f not in members]:
        raise ValueError(f"The {name} file {where + missing[0]!r} is missing (the {layout} "
                         f"layout needs {', '.join(files)} for split={split!r}).")
    blobs = [(where + f, members[f]) for f in files]
    parse = _parse_pickle_batch if layout == "python" else _parse_binary_batch
    images, labels = zip(*(parse(name, source, data) for source, data in blobs))
    meta = {"layout": layout, "kind": kind, "path": path, "files": [s for s, _ in blobs]}
    return np.concatenate(images), np.concatenate(labels), meta


def _read_tar(name, split, archive, layout):
    """`split`'s files, in one pass over the archive stream: ``(layout, {name: bytes})``;
    without a `layout`, the python one if the archive holds both."""
    specs = {k: v for k, v in LAYOUTS[name].items() if layout in (None, k)}
    wanted = {(spec["dir"], f) for spec in specs.values() for f in spec[split]}
    found, tops = {}, set()
    try:
        with tarfile.open(archive, mode="r|*") as tar:
            for member in tar:
                top, _, file = member.name.removeprefix("./").partition("/")
                tops.add(top)
                if (top, file) in wanted and member.isfile():
                    found[(top, file)] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        raise ValueError(f"The archive {archive!r} is truncated or corrupt "
                         f"({type(err).__name__}: {err}).") from None
    if (layout := next((k for k, spec in specs.items() if spec["dir"] in tops), None)) is None:
        raise ValueError(f"The archive {archive!r} holds no {name} folder (expected "
                         f"{' or '.join(spec['dir'] + '/' for spec in specs.values())}).")
    return layout, {f: data for (top, f), data in found.items() if top == specs[layout]["dir"]}


def _parse_pickle_batch(name, source, data):
    batch = safe_load_pickle(data, source=source)
    label_key = _LABEL_KEY[name]
    batch = batch if isinstance(batch, dict) else {}
    pixels, labels = (batch.get(k, batch.get(k.decode())) for k in (b"data", label_key))
    if pixels is None or labels is None:
        raise ValueError(f"The {name} batch file {source!r} is not a dict with the keys "
                         f"{b'data'!r} and {label_key!r}.")
    ok = isinstance(pixels, np.ndarray) and pixels.dtype == np.uint8 and pixels.ndim == 2
    if not ok or pixels.shape[1] != _PIXELS:
        raise ValueError(f"In {source!r}, {b'data'!r} has shape {getattr(pixels, 'shape', None)}"
                         f" and type {getattr(pixels, 'dtype', type(pixels).__name__)}; expected "
                         f"uint8 (N, {_PIXELS}).")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"In {source!r}, {label_key!r} is not a list of ints.") from None
    if labels.shape != (pixels.shape[0],):
        raise ValueError(f"In {source!r}, {label_key!r} has shape {labels.shape} for "
                         f"{pixels.shape[0]} images.")
    return _to_nhwc(name, source, pixels, labels)


def _parse_binary_batch(name, source, data):
    num_label_bytes, label_index = _BINARY_LABELS[name]
    record = num_label_bytes + _PIXELS
    if len(data) == 0 or len(data) % record:
        raise ValueError(f"The {name} binary file {source!r} has {len(data)} bytes, not a "
                         f"positive multiple of the {record}-byte record ({num_label_bytes} "
                         f"label byte(s) + {_PIXELS} pixels): truncated or of the wrong layout.")
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, record)
    return _to_nhwc(name, source, rows[:, num_label_bytes:], rows[:, label_index].astype(np.int64))


def _to_nhwc(name, source, pixels, labels):
    """Checks the labels' range; each pixel row is the R, G, B planes, each row-major."""
    num_classes = DATASETS[name]["classes"]
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"In {source!r}, labels range over [{labels.min()}, {labels.max()}]; "
                         f"{name} has classes 0..{num_classes - 1}.")
    return np.ascontiguousarray(pixels.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)), labels
