"""Loads a registered dataset into uint8 arrays from a checked source, and describes it
(`dataset_info`). No TensorFlow at import time: TFDS and folders import it."""

import collections
import contextlib
import functools
import hashlib
import json
import logging
import os
import socket
import threading
import urllib.parse

import numpy as np

from keras_preact.checks import check_choice, env_flag, warn_deprecated
from keras_preact.data import cifar_files, folder
from keras_preact.data.digits import read_digits
from keras_preact.data.registry import DATASETS, SPLITS, channel_stats, check_dataset_name
from keras_preact.file_io import atomic_save, keras_preact_home, user_path

logger = logging.getLogger(__name__)

SOURCES = ("auto", "tfds", "archive")
#: Where TFDS downloads CIFAR from: checked first, as without network TFDS retries for minutes.
DOWNLOAD_URLS = {f"cifar{n}": f"https://www.cs.toronto.edu/~kriz/cifar-{n}-binary.tar.gz"
                 for n in (10, 100)}

_CACHE_SIZE = 4  # decoded splits, newest last: a CIFAR split is ~150 MB of uint8
_cache, _cache_lock = collections.OrderedDict(), threading.Lock()


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
        source: CIFAR only: "archive" (the files at `path` or `data_dir`), "tfds" or "auto"
            (archive when `path` is given or `data_dir` holds the files, else TFDS).
        path: CIFAR: an archive or extracted CIFAR folder; "folder": the image folder, or
            an archive of one (extracted once into ``$KERAS_PREACT_HOME/extracted``).
        download: let TFDS download the data (default False: no network); refused at once
            when the download's host cannot be reached or KERAS_PREACT_OFFLINE is set.
        cache: keep the decoded arrays in memory (they are then read-only), and a folder's
            also in ``$KERAS_PREACT_HOME/folders`` (default ``~/.keras/keras_preact/folders``).
        image_size: "folder" only: (height, width), default (32, 32).

    Returns ``(images, labels)``: uint8 (N, H, W, 3) RGB, and int64 (N,) class ids.
    Raises ValueError for invalid or inapplicable arguments, missing data or corrupt files."""
    return load_arrays_with_meta(name, split, data_dir=data_dir, source=source, path=path,
                                 download=download, cache=cache, image_size=image_size)[:2]


def load_arrays_with_meta(name, split, *, data_dir=None, source="auto", path=None,
                          download=False, cache=True, image_size=None):
    """Like `load_arrays`, and also returns the source's metadata dict."""
    check_dataset_name(name)
    check_choice("split", split, SPLITS)
    check_choice("source", source, SOURCES)
    if image_size is not None and name != "folder":
        raise ValueError("`image_size` only applies to the 'folder' dataset. Received: "
                         f"name={name!r}, image_size={image_size!r}")
    if name in ("digits", "folder"):
        extra = {"data_dir": data_dir, "download": download or None,
                 "path": path if name == "digits" else None}
        given = ", ".join(f"{k}={v!r}" for k, v in extra.items() if v is not None)
        if source != "auto" or given:
            also = " or `path`" if name == "digits" else ""
            raise ValueError(f"The {name!r} dataset takes no `source`, `data_dir` or `download`"
                             f"{also}. Received: source={source!r}, {given}")
    if name == "digits":
        return _cached(("digits", split), cache, lambda: read_digits(split))
    if name == "folder":
        size = (32, 32) if image_size is None else image_size
        folder.folder_layout(path)  # Validates `path` before any fingerprinting.
        key = ("folder", split, tuple(size), _fingerprint(path))
        read = functools.partial(folder.read_image_folder, path, split, image_size=size)
        return _cached(key, cache, lambda: _kept_on_disk(path, key, read) if cache else read())
    return _load_cifar(name, split, data_dir, source, path, download, cache)


def _load_cifar(name, split, data_dir, source, path, download, cache):
    """Reads the original files where `path` or `data_dir` holds them, else TFDS."""
    if source == "tfds" and path is not None:
        raise ValueError("`path` names original CIFAR files; with source='tfds' use "
                         f"`data_dir`. Received: source='tfds', path={path!r}")
    arg, location = ("path", path) if path is not None else ("data_dir", data_dir)
    if source == "archive" and location is None:
        raise ValueError("source='archive' needs `path` (CIFAR files) or `data_dir` (a folder "
                         "holding them). Received: path=None, data_dir=None")
    expected = cifar_files.describe_expected(name)
    # Where the original files may be (TFDS finds its own in `data_dir`).
    location = None if source == "tfds" or location is None else user_path(location)
    found = cifar_files.find_cifar_files(name, location) if location is not None else None
    if found is None and (source == "archive" or path is not None):
        raise ValueError(f"No {name} files found. Received: {arg}={location!r}. Expected "
                         f"one of: {expected} (or a path to one of them).")
    if found is not None:
        if download:
            raise ValueError("`download` only applies to TFDS; the original files were found "
                             f"at {location!r}. Received: download=True")
        kind, _, resolved = found
        files = [resolved] if kind == "tar" else [
            os.path.join(resolved, f) for s in cifar_files.LAYOUTS[name].values() for f in s[split]]
        key = ("archive", name, split, _fingerprint(*files))
        return _cached(key, cache, lambda: cifar_files.read_cifar(name, split, location))
    key = ("tfds", name, split, None if data_dir is None else os.path.abspath(data_dir))
    try:
        return _cached(key, cache, lambda: _read_tfds(name, split, data_dir, download))
    except ValueError as err:
        if source != "auto":
            raise
        raise ValueError(f"{err} With source='auto', `data_dir` was also searched for the "
                         f"original files ({expected}) and none were found.") from None


def _read_tfds(name, split, data_dir, download):
    """One CIFAR split from TFDS' `data_dir` (None: TFDS' default)."""
    import tensorflow_datasets as tfds
    data_dir = None if data_dir is None else user_path(data_dir)
    if download and not tfds.builder(name, data_dir=data_dir).is_prepared():
        _check_reachable(name, DOWNLOAD_URLS[name])
    try:
        ds, info = tfds.load(name, split=split, data_dir=data_dir, download=bool(download),
                             as_supervised=True, shuffle_files=False, with_info=True)
    except (AssertionError, FileNotFoundError, tfds.core.registered.DatasetNotFoundError) as err:
        where = data_dir if data_dir is not None else "TFDS' default (~/tensorflow_datasets)"
        raise ValueError(f"The TFDS dataset {name!r} is not prepared in data_dir={where!r} "
                         f"({str(err).splitlines()[0]}). Prepare it there (e.g. `tfds build {name} "
                         "--data_dir ...` on a machine with network, or download=True), or use "
                         "source='archive' with the original CIFAR files.") from None
    # Batched: batch_size=-1 needs split metadata that mocked or partial builders lack.
    if not (batches := list(tfds.as_numpy(ds.batch(4096)))):
        raise ValueError(f"The TFDS dataset {name!r} split {split!r} in data_dir={data_dir!r} "
                         "is empty.")
    images, labels = (np.concatenate(arrays) for arrays in zip(*batches))  # dtypes: `_cached`
    if images.shape[1:] != (32, 32, 3):
        raise ValueError(f"The TFDS dataset {name!r} has images of shape {images.shape[1:]}; "
                         "expected (32, 32, 3).")
    return images, labels, {"source": "tfds", "data_dir": data_dir, "version": str(info.version)}


def _check_reachable(name, url):
    """Raises ValueError at once where `url`'s host refuses, is unknown or silent for 10 s, or
    KERAS_PREACT_OFFLINE is set (as for `keras-preact weights fetch`)."""
    parts = urllib.parse.urlsplit(url)
    try:
        if env_flag("KERAS_PREACT_OFFLINE"):
            raise OSError("KERAS_PREACT_OFFLINE is set")
        socket.create_connection((parts.hostname, parts.port or 443), timeout=10).close()
    except OSError as err:
        raise ValueError(f"Cannot download {name} from {url} ({parts.hostname} cannot be reached: "
                         f"{err.strerror or err}). Received: download=True. Download it where "
                         "there is a network, or pass its original files as `path`.") from None


def _fingerprint(*paths):
    """(path, size, mtime) of every file at or under `paths` (as a folder's are read: links
    followed, hidden files skipped): a changed file is a new key."""
    out = []
    for path in map(user_path, paths):
        for file in folder.visible_files(path) if os.path.isdir(path) else [path]:
            with contextlib.suppress(OSError):  # removed since the walk: not in the folder
                out.append((file, (st := os.stat(file)).st_size, st.st_mtime_ns))
    return tuple(out)


def _kept_on_disk(path, key, read):
    """`read()`, or the arrays it gave for `key` kept in ``$KERAS_PREACT_HOME/folders``: one
    .npz per folder, split and size, used while its files (paths, sizes, mtimes) are the same.
    An unreadable .npz is read again; an unwritable cache folder is no cache."""
    name, stamp = (hashlib.sha256(repr(v).encode()).hexdigest()
                   for v in ((user_path(path), key[:3]), key))
    file = keras_preact_home("folders", name[:24] + ".npz")
    with contextlib.suppress(Exception), np.load(file) as kept:  # else missing or damaged
        if str(kept["stamp"]) == stamp:
            return kept["images"], kept["labels"], json.loads(str(kept["meta"]))
    images, labels, meta = read()
    try:
        atomic_save(file, lambda tmp: np.savez(tmp, images=images, labels=labels, stamp=stamp,
                                               meta=json.dumps(meta)))
    except OSError as err:
        if folder._once("not kept", where := os.path.dirname(file), err.strerror):
            logger.warning("Decoded image folders are not kept in %s (%s).", where, err.strerror)
    return images, labels, meta


def _cached(key, cache, read):
    with _cache_lock:
        if cache and key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    images, labels, meta = read()
    images, labels = np.ascontiguousarray(images, np.uint8), np.ascontiguousarray(labels, np.int64)
    logger.info("Loaded %s: %d images of shape %s", key[:3], len(images), images.shape[1:])
    if cache:
        for array in (images, labels):  # read-only: a caller cannot corrupt the next one's
            array.setflags(write=False)
        with _cache_lock:
            _cache[key] = (images, labels, meta)
            while len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    return images, labels, meta


@functools.lru_cache(maxsize=1)
def _digits_stats():
    return channel_stats(read_digits("train")[0])


class DatasetInfo(dict):
    """`dataset_info`'s dict, with the deprecated keys "num_classes" and "image_shape"."""

    _RENAMED = {"num_classes": "classes", "image_shape": "input_shape"}

    def __missing__(self, key):
        if key not in self._RENAMED:
            raise KeyError(key)
        warn_deprecated(key, self._RENAMED[key], "dataset_info()")
        return self[self._RENAMED[key]]


def dataset_info(name, *, path=None, image_size=None):
    """What a registered dataset is: classes, shapes, sizes, statistics, augmentation.
    `path` and `image_size` are those of a "folder" dataset (see `load_arrays`), ignored
    for the others.

    Returns:
        dict with "name", "description", "classes", "input_shape", "num_train",
        "num_test", "class_names", "mean" and "std" (per channel, [0, 1] units),
        "stats_source", "augmentation" (the train default), "sources" ("path" for folders)."""
    check_dataset_name(name)
    info = DatasetInfo(DATASETS[name], name=name)
    if name == "digits":
        info["mean"], info["std"] = _digits_stats()
    elif name == "folder":
        (train_x, _, meta), (test_x, _, _) = (load_arrays_with_meta(
            "folder", split, path=path, image_size=image_size) for split in SPLITS)
        info.update(class_names=meta["class_names"], classes=len(meta["class_names"]),
                    num_train=int(train_x.shape[0]), num_test=int(test_x.shape[0]),
                    input_shape=tuple(int(d) for d in train_x.shape[1:]), path=meta["path"])
        info["mean"], info["std"] = channel_stats(train_x)
    info.update({key: tuple(info[key]) for key in ("mean", "std", "class_names")})
    return info
