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
from keras_preact.data import folder
from keras_preact.data.digits import read_digits
from keras_preact.data.registry import DATASETS
from keras_preact.data.registry import channel_stats
from keras_preact.layers.utils import check_choice
from keras_preact.data.registry import check_dataset_name
from keras_preact.data.registry import check_split

logger = logging.getLogger(__name__)

SOURCES = ("auto", "tfds", "archive")

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
    """Loads one split ("train" or "test") of a registered dataset as in-memory arrays.

    Args:
        data_dir: CIFAR only: a folder holding the original files (extracted or
            ``.tar.gz``) or TFDS' data folder (None: TFDS' default).
        source: CIFAR only: "archive" (the original files at `path` or `data_dir`),
            "tfds" (in `data_dir`) or "auto" (archive when `path` is given or `data_dir`
            holds the files, else TFDS).
        path: CIFAR: an archive or extracted CIFAR folder; "folder": the image folder.
        download: let TFDS download the data (default False: no network).
        cache: keep the decoded arrays in memory (they are then read-only).
        image_size: "folder" only: (height, width), default (32, 32).

    Returns:
        ``(images, labels)``: uint8 (N, H, W, 3) RGB, and int64 (N,) class ids.

    Raises:
        ValueError: for an unknown name, split or source, arguments that do not apply,
            missing data, or corrupt files (naming the file).

    Example:
        >>> images, labels = load_arrays("digits", "test")
    """
    return load_arrays_with_meta(name, split, data_dir=data_dir, source=source, path=path,
                                 download=download, cache=cache, image_size=image_size)[:2]


def load_arrays_with_meta(name, split, *, data_dir=None, source="auto", path=None,
                          download=False, cache=True, image_size=None):
    """Like `load_arrays`, and also returns the source's metadata dict."""
    check_dataset_name(name)
    check_split(split)
    check_choice("source", source, SOURCES)
    if image_size is not None and name != "folder":
        raise ValueError("`image_size` only applies to the 'folder' dataset. Received: "
                         f"name={name!r}, image_size={image_size!r}")
    if name in ("digits", "folder"):
        extra = {"data_dir": data_dir, "download": download or None,
                 "path": path if name == "digits" else None}
        extra = {k: v for k, v in extra.items() if v is not None}
        if source != "auto" or extra:
            raise ValueError(f"The {name!r} dataset takes no `source`, `data_dir` or `download`"
                             f"{'' if name == 'folder' else ' or `path`'}. Received: source={source!r}, "
                             + ", ".join(f"{k}={v!r}" for k, v in extra.items()))
    if name == "digits":
        return _cached(("digits", split), cache, lambda: read_digits(split))
    if name == "folder":
        size = (32, 32) if image_size is None else image_size
        folder.folder_layout(path)  # Validates `path` before any fingerprinting.
        key = ("folder", split, _fingerprint([path]), tuple(size))
        return _cached(key, cache, lambda: folder.read_image_folder(path, split, image_size=size))
    return _load_cifar(name, split, data_dir, source, path, download, cache)


def _cifar_location(name, data_dir, source, path):
    """The original files' location, or None for TFDS; raises where neither fits."""
    if source == "tfds":
        if path is not None:
            raise ValueError("`path` names original CIFAR files; with source='tfds' use `data_dir`. "
                             f"Received: source='tfds', path={path!r}")
        return None
    arg, candidate = ("path", path) if path is not None else ("data_dir", data_dir)
    if candidate is None:
        if source == "archive":
            raise ValueError("source='archive' needs `path` (an archive or extracted CIFAR folder) or "
                             "`data_dir` (a folder holding one). Received: path=None, data_dir=None")
        return None
    candidate = os.path.expanduser(os.fspath(candidate))
    if cifar_files.find_cifar_files(name, candidate) is not None:
        return candidate
    if source == "archive" or path is not None:
        raise ValueError(f"No {name} files found. Received: {arg}={candidate!r}. Expected one of: "
                         f"{cifar_files.describe_expected(name)} (or a path to one of them).")
    return None


def _load_cifar(name, split, data_dir, source, path, download, cache):
    location = _cifar_location(name, data_dir, source, path)
    if location is not None:
        if download:
            raise ValueError("`download` only applies to TFDS; the original files were found at "
                             f"{location!r}. Received: download=True")
        kind, layout, resolved = cifar_files.find_cifar_files(name, location)
        files = [resolved] if kind == "tar" else [
            os.path.join(resolved, f) for spec in cifar_files.LAYOUTS[name].values()
            for f in spec[split]
        ]
        key = ("archive", name, split, _fingerprint(files))
        return _cached(key, cache, lambda: cifar_files.read_cifar(name, split, location))
    from keras_preact.data.tfds_source import read_tfds

    key = ("tfds", name, split, None if data_dir is None else os.path.abspath(data_dir))
    try:
        return _cached(key, cache, lambda: read_tfds(name, split, data_dir=data_dir, download=download))
    except ValueError as err:
        if source == "auto":
            raise ValueError(f"{err} With source='auto', `data_dir` was also searched for the original "
                             f"files ({cifar_files.describe_expected(name)}) and none were found.") from None
        raise


def _fingerprint(paths):
    """(path, size, mtime) of every file at or under `paths`: a changed file is a new key."""
    files = []
    for path in paths:
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        if not os.path.isdir(path):
            files.append(path)
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            files += [os.path.join(dirpath, f) for f in sorted(filenames)]
    out = []
    for file in files:
        try:
            st = os.stat(file)
            out.append((file, st.st_size, st.st_mtime_ns))
        except OSError:
            out.append((file, None, None))
    return tuple(out)


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
    return channel_stats(read_digits("train")[0])


def dataset_info(name, *, path=None, image_size=None):
    """What a registered dataset is: classes, shapes, sizes, statistics, augmentation.
    `path` and `image_size` (default (32, 32)) are those of a "folder" dataset.

    Returns:
        dict with "name", "description", "num_classes", "image_shape", "num_train",
        "num_test", "class_names", "mean" and "std" (per channel, [0, 1] units),
        "stats_source", "augmentation" (the train default), "sources" ("path" for folders).

    Raises:
        ValueError: for an unknown name, `path` or `image_size` for another dataset, or
            "folder" without a usable `path`.
    """
    check_dataset_name(name)
    if name != "folder" and (path is not None or image_size is not None):
        raise ValueError("`path` and `image_size` only apply to the 'folder' dataset. Received: "
                         f"name={name!r}, path={path!r}, image_size={image_size!r}")
    info = dict(DATASETS[name], name=name)
    if name == "digits":
        info["mean"], info["std"] = _digits_stats()
    elif name == "folder":
        size = (32, 32) if image_size is None else image_size
        train_x, _, meta = load_arrays_with_meta("folder", "train", path=path, image_size=size)
        test_x, _, _ = load_arrays_with_meta("folder", "test", path=path, image_size=size)
        info.update(class_names=meta["class_names"], num_classes=len(meta["class_names"]),
                    num_train=int(train_x.shape[0]), num_test=int(test_x.shape[0]),
                    image_shape=tuple(int(d) for d in train_x.shape[1:]), path=meta["path"])
        info["mean"], info["std"] = channel_stats(train_x)
    for key in ("mean", "std", "class_names"):
        info[key] = tuple(info[key])
    return info
