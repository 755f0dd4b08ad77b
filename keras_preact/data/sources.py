"""Loads any registered dataset into uint8 arrays, choosing and checking the source,
and describes it (`dataset_info`: the registry's facts plus those read from the files).

No TensorFlow at import time: the TFDS and folder sources import it when used.
"""

import collections
import functools
import logging
import os
import threading

import numpy as np

from keras_preact.data import cifar_files
from keras_preact.data.registry import DATASETS
from keras_preact.data.registry import channel_stats
from keras_preact.data.registry import check_dataset_name

logger = logging.getLogger(__name__)

SOURCES = ("auto", "tfds", "archive")
SPLITS = ("train", "test")

# Decoded splits, newest last. Bounded: a CIFAR split is ~150 MB of uint8.
_CACHE_SIZE = 4
_cache = collections.OrderedDict()
_cache_lock = threading.Lock()


def clear_cache():
    """Drops the decoded arrays kept in memory by `load_arrays(..., cache=True)`."""
    with _cache_lock:
        _cache.clear()


def load_arrays(name, split, *, data_dir=None, source="auto", path=None, download=False,
                cache=True, image_size=None):
    """Loads one split of a registered dataset as in-memory arrays.

    Args:
        name: a name from `list_datasets()`: "cifar10", "cifar100", "digits", "folder".
        split: "train" or "test".
        data_dir: CIFAR only: a folder holding the original CIFAR files (extracted or
            ``.tar.gz``) or TFDS' data folder. None: TFDS' default folder.
        source: CIFAR only: "archive" (the original files at `path` or `data_dir`),
            "tfds" (TensorFlow Datasets in `data_dir`) or "auto" (archive when `path`
            is given or `data_dir` holds the files, TFDS otherwise).
        path: CIFAR: an archive or extracted CIFAR folder; "folder": the image folder.
        download: bool, let TFDS download the data (source "tfds"/"auto"); default
            False so nothing touches the network.
        cache: bool, keep the decoded arrays in memory for the next call (the
            returned arrays are then read-only; copy them to modify).
        image_size: "folder" only: (height, width) to resize to; default (32, 32).

    Returns:
        ``(images, labels)``: uint8 (N, H, W, 3) RGB, and int64 (N,) class ids.

    Raises:
        ValueError: for an unknown name, split or source, arguments that do not apply
            to the dataset, data that is not there, or files that are corrupt (the
            message names the file).

    Example:
        >>> images, labels = load_arrays("digits", "test")
        >>> images.shape, images.dtype
        ((359, 32, 32, 3), dtype('uint8'))
    """
    images, labels, _ = load_arrays_with_meta(
        name, split, data_dir=data_dir, source=source, path=path, download=download,
        cache=cache, image_size=image_size,
    )
    return images, labels


def load_arrays_with_meta(name, split, *, data_dir=None, source="auto", path=None,
                          download=False, cache=True, image_size=None):
    """Like `load_arrays`, and also returns the source's metadata dict."""
    check_dataset_name(name)
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {list(SPLITS)}. Received: split={split!r}")
    if source not in SOURCES:
        raise ValueError(f"`source` must be one of {list(SOURCES)}. Received: source={source!r}")
    if image_size is not None and name != "folder":
        raise ValueError(
            "`image_size` only applies to the 'folder' dataset. Received: "
            f"name={name!r}, image_size={image_size!r}"
        )
    if name in ("digits", "folder"):
        extra = {"data_dir": data_dir, "download": download or None}
        if name == "digits":
            extra["path"] = path
        extra = {k: v for k, v in extra.items() if v is not None}
        if source != "auto" or extra:
            raise ValueError(
                f"The {name!r} dataset takes no `source`, `data_dir` or `download`"
                f"{'' if name == 'folder' else ' or `path`'}. Received: source={source!r}, "
                + ", ".join(f"{k}={v!r}" for k, v in extra.items())
            )
    if name == "digits":
        return _cached(("digits", split), cache, lambda: _read_digits(split))
    if name == "folder":
        from keras_preact.data import folder

        size = (32, 32) if image_size is None else image_size
        folder.folder_layout(path)  # Validates `path` before any fingerprinting.
        key = ("folder", split, _fingerprint_tree(path), tuple(size))
        return _cached(key, cache, lambda: folder.read_image_folder(path, split, image_size=size))
    return _load_cifar(name, split, data_dir, source, path, download, cache)


def _read_digits(split):
    from keras_preact.data.digits import read_digits

    return read_digits(split)


def _load_cifar(name, split, data_dir, source, path, download, cache):
    if source == "tfds" and path is not None:
        raise ValueError(
            "`path` names original CIFAR files; with source='tfds' use `data_dir`. "
            f"Received: source='tfds', path={path!r}"
        )
    location = None
    if source in ("archive", "auto"):
        candidate = path if path is not None else data_dir
        if candidate is not None:
            candidate = os.path.expanduser(os.fspath(candidate))
            if cifar_files.find_cifar_files(name, candidate) is not None:
                location = candidate
            elif source == "archive" or path is not None:
                arg = "path" if path is not None else "data_dir"
                raise ValueError(
                    f"No {name} files found. Received: {arg}={candidate!r}. Expected "
                    f"one of: {cifar_files.describe_expected(name)} (or a path to one "
                    "of them)."
                )
        elif source == "archive":
            raise ValueError(
                "source='archive' needs `path` (an archive or extracted CIFAR folder) or "
                "`data_dir` (a folder holding one). Received: path=None, data_dir=None"
            )
    if location is not None:
        if download:
            raise ValueError(
                "`download` only applies to TFDS; the original files were found at "
                f"{location!r}. Received: download=True"
            )
        kind, _, resolved = cifar_files.find_cifar_files(name, location)
        key = ("archive", name, split, _fingerprint_cifar(name, split, kind, resolved))
        return _cached(key, cache, lambda: cifar_files.read_cifar(name, split, location))
    from keras_preact.data.tfds_source import read_tfds

    key = ("tfds", name, split, None if data_dir is None else os.path.abspath(data_dir))
    try:
        return _cached(
            key, cache, lambda: read_tfds(name, split, data_dir=data_dir, download=download)
        )
    except ValueError as err:
        if source == "auto":
            raise ValueError(
                f"{err} With source='auto', `data_dir` was also searched for the original "
                f"files ({cifar_files.describe_expected(name)}) and none were found."
            ) from None
        raise


def _stat(path):
    try:
        st = os.stat(path)
    except OSError:
        return (path, None, None)
    return (path, st.st_size, st.st_mtime_ns)


def _fingerprint_cifar(name, split, kind, resolved):
    if kind == "tar":
        return (_stat(resolved),)
    files = []
    for spec in cifar_files.LAYOUTS[name].values():
        for fname in spec[split]:
            files.append(_stat(os.path.join(resolved, fname)))
    return tuple(files)


def _fingerprint_tree(path):
    root = os.path.abspath(os.path.expanduser(os.fspath(path)))
    entries = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fname in sorted(filenames):
            entries.append(_stat(os.path.join(dirpath, fname)))
    return (root, tuple(entries))


def _cached(key, cache, read):
    if cache:
        with _cache_lock:
            if key in _cache:
                _cache.move_to_end(key)
                return _cache[key]
    images, labels, meta = read()
    images = np.ascontiguousarray(images, dtype=np.uint8)
    labels = np.ascontiguousarray(labels, dtype=np.int64)
    logger.info("Loaded %s: %d images of shape %s", key[:3], len(images), images.shape[1:])
    if not cache:
        return images, labels, meta
    # Read-only, so a caller cannot corrupt what the next caller gets.
    images.setflags(write=False)
    labels.setflags(write=False)
    with _cache_lock:
        _cache[key] = (images, labels, meta)
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return images, labels, meta


@functools.lru_cache(maxsize=1)
def _digits_stats():
    images, _, _ = _read_digits("train")
    return channel_stats(images)


def dataset_info(name, *, path=None, image_size=None):
    """What a registered dataset is: classes, shapes, sizes, statistics, augmentation.

    Args:
        name: a name from `list_datasets()`.
        path: the image folder, needed for (and only used by) "folder".
        image_size: (height, width) for "folder"; default (32, 32).

    Returns:
        dict with "name", "description", "num_classes", "image_shape", "num_train",
        "num_test", "class_names" (tuple), "mean" and "std" (per channel, [0, 1] units),
        "stats_source", "augmentation" (the default for the train split) and "sources".

    Raises:
        ValueError: for an unknown name (the message lists the valid names), or
            "folder" without a usable `path`.

    Example:
        >>> dataset_info("cifar10")["num_classes"]
        10
    """
    check_dataset_name(name)
    if name != "folder" and (path is not None or image_size is not None):
        # Silently ignoring them would hide a mistake (the published sizes and
        # statistics do not depend on where the files are).
        raise ValueError(
            "`path` and `image_size` only apply to the 'folder' dataset. Received: "
            f"name={name!r}, path={path!r}, image_size={image_size!r}"
        )
    info = dict(DATASETS[name])
    info["name"] = name
    if name == "digits":
        info["mean"], info["std"] = _digits_stats()
    elif name == "folder":
        size = (32, 32) if image_size is None else image_size
        train_x, _, meta = load_arrays_with_meta("folder", "train", path=path, image_size=size)
        test_x, _, _ = load_arrays_with_meta("folder", "test", path=path, image_size=size)
        info["class_names"] = tuple(meta["class_names"])
        info["num_classes"] = len(meta["class_names"])
        info["num_train"] = int(train_x.shape[0])
        info["num_test"] = int(test_x.shape[0])
        info["image_shape"] = tuple(int(d) for d in train_x.shape[1:])
        info["mean"], info["std"] = channel_stats(train_x)
        info["path"] = meta["path"]
    info["mean"] = tuple(info["mean"])
    info["std"] = tuple(info["std"])
    info["class_names"] = tuple(info["class_names"])
    return info
