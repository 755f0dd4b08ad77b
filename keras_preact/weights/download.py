"""Verified download and cache of pretrained weights: `keras.utils.get_file` under a lock per
entry, the publisher's hash, the conversion, and a sidecar ``<name>.weights.h5.json`` holding
the cached file's SHA-256, checked on every use. ``$KERAS_PREACT_WEIGHTS_DIR`` (converted or
published files) is looked at first; offline, nothing else is. `convert_checkpoint` converts
a checkpoint of one's own the same way, without the cache."""

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time
import urllib.parse
import zipfile

import filelock
import h5py
import keras

from keras_preact.checks import env_flag
from keras_preact.file_io import atomic_write_json, file_hash, keras_preact_home, user_path
from keras_preact.weights.catalog import WeightsEntry, get_entry, list_entries, validate_entry
from keras_preact.weights.converters import get_converter
from keras_preact.weights.local import load_weights_file, save_weights_file

logger = logging.getLogger("keras_preact.weights")

SIDECAR_SUFFIX, LOCK_TIMEOUT_S = ".json", 3600
#: Cache sub-folders for lock files and transfers in progress (same file system: atomic renames).
LOCK_FOLDER, TMP_FOLDER = ".locks", ".tmp"


class WeightsDownloadError(OSError):
    """The published file could not be fetched (no network, HTTP error, truncated)."""


class WeightsIntegrityError(ValueError):
    """A file's hash is not the one recorded for it (the file is not used)."""


def resolve_cache_dir(cache_dir=None):
    """The weights cache folder: `cache_dir`, ``$KERAS_PREACT_HOME/weights`` or
    ``~/.keras/keras_preact/weights``.

    Args:
        cache_dir: str, `os.PathLike` or None, the folder; None: the default above.
            Defaults to `None`.

    Returns:
        str: the folder's absolute path (it need not exist yet).

    Raises:
        ValueError: when a file stands where the folder (or one above it) would be.
        TypeError: if `cache_dir` is neither None nor a path."""
    home = os.environ.get("KERAS_PREACT_HOME")
    named = (f"cache_dir={cache_dir!r}" if cache_dir is not None
             else f"KERAS_PREACT_HOME={home!r}" if home else None)
    path = existing = user_path(keras_preact_home("weights") if cache_dir is None else cache_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"The weights cache {path} cannot be a folder: {existing} is a file. "
                         f"Received: {named or 'the default cache'}. Valid: a folder.")
    return path


def cached_paths(entry, cache=None):
    """(weights path, sidecar path) of an entry in the cache."""
    path = os.path.join(resolve_cache_dir(cache), entry.key + ".weights.h5")
    return path, path + SIDECAR_SUFFIX


def verify_cached(path):
    """The sidecar of a cached file, checked against the file's SHA-256:
    WeightsIntegrityError if the file was altered, FileNotFoundError if one is missing."""
    record = json.loads(pathlib.Path(path + SIDECAR_SUFFIX).read_text())
    actual = file_hash(path, "sha256")
    if actual != (recorded := record.get("sha256") if isinstance(record, dict) else None):
        raise WeightsIntegrityError(
            f"The cached weights file {path} was altered on disk: its SHA-256 is {actual}, "
            f"the cache recorded {recorded}. It was not loaded. Delete it "
            f"and {path}{SIDECAR_SUFFIX}, then fetch it again.")
    return record


def _lookup_cache(entry, cache):
    path, sidecar = cached_paths(entry, cache)
    if not (os.path.isfile(path) and os.path.isfile(sidecar)):
        return None
    if verify_cached(path).get("source") != entry.source_record():
        logger.info("The cached %s was made from another source; fetching it again.", path)
        return None
    return path


def fetch_weights(key_or_entry, *, build, cache_dir=None, offline=None, progress=True):
    """The path of the verified cached `.weights.h5` for a catalog entry.

    Args:
        key_or_entry: a catalog key ("preact_resnet110.cifar10"), a `WeightsEntry`,
            or an entry dict (at least model, tag, url, hash, converter).
        build: callable, ``build(model_name, **arguments)``, e.g. `keras_preact.get_model`:
            builds the entry's architecture, which a published file is converted into.
        cache_dir: str or None, the cache folder (see `resolve_cache_dir`).
            Defaults to `None`.
        offline: None (``KERAS_PREACT_OFFLINE``), True or False. Defaults to `None`.
        progress: bool, a progress bar while downloading (on a terminal only).
            Defaults to `True`.

    Returns:
        str: the path of the verified cached `.weights.h5`.

    Raises:
        ValueError: an unknown key or a malformed entry, a cache folder that cannot be
            created (or where a file stands), or a $KERAS_PREACT_WEIGHTS_DIR that is not a
            folder.
        WeightsIntegrityError (a ValueError): the publisher's hash does not match (a
            download is deleted, a file of $KERAS_PREACT_WEIGHTS_DIR kept), or the cached
            file was altered.
        WeightsDownloadError (an OSError): the file could not be fetched, or offline
            without a local copy; nothing is cached."""
    entry = (validate_entry(key_or_entry, strict=False) if isinstance(key_or_entry, dict)
             else key_or_entry if isinstance(key_or_entry, WeightsEntry)
             else get_entry(key_or_entry))
    offline = env_flag("KERAS_PREACT_OFFLINE") if offline is None else bool(offline)
    cache = resolve_cache_dir(cache_dir)
    if (found := _lookup_cache(entry, cache)) is not None:
        return found
    try:
        for folder in (LOCK_FOLDER, TMP_FOLDER):
            os.makedirs(os.path.join(cache, folder), exist_ok=True)
    except OSError as err:
        raise ValueError(f"The weights cache {cache} cannot be created ({err.strerror}): choose "
                         "a folder you can write with `cache_dir` or KERAS_PREACT_HOME.") from None
    lock = os.path.join(cache, LOCK_FOLDER, entry.key + ".lock")
    with filelock.FileLock(lock, timeout=LOCK_TIMEOUT_S):
        # Another process may have finished while this one waited for the lock.
        if (found := _lookup_cache(entry, cache)) is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=entry.key + ".", dir=os.path.join(
                cache, TMP_FOLDER), ignore_cleanup_errors=True) as work:
            source, converted = _local_or_download(entry, work, offline=offline, progress=progress)
            out = os.path.join(work, "converted.weights.h5")
            return _commit(entry, cache, *_convert(entry, source, out, build, converted=converted))


def _local_or_download(entry, work, *, offline, progress):
    """(verified source file, whether it is a converted `.weights.h5`)."""
    if (folder := os.environ.get("KERAS_PREACT_WEIGHTS_DIR")) and not os.path.isdir(folder):
        what = "is a file" if os.path.exists(folder) else "does not exist"
        raise ValueError(f"KERAS_PREACT_WEIGHTS_DIR must be a folder of weights files; {folder} "
                         f"{what}. Received: KERAS_PREACT_WEIGHTS_DIR={folder!r}")
    published_name = _url_filename(entry.url)
    if folder and os.path.isfile(converted := os.path.join(folder, entry.key + ".weights.h5")):
        return converted, True
    download = not (folder and os.path.isfile(local := os.path.join(folder, published_name)))
    if download and offline:
        raise WeightsDownloadError(
            f"Offline mode: no local copy of the weights {entry.key!r}. Put {entry.key}.weights.h5 "
            f"or the published file {published_name!r} into $KERAS_PREACT_WEIGHTS_DIR (now "
            f"{folder!r}), or fetch it online first (`keras-preact weights fetch {entry.key}`).")
    published = _download(entry.url, work, progress=progress) if download else local
    source = _extract_member(entry, published, work, origin=entry.url if download else local)
    if (actual := file_hash(source, entry.hash.algorithm)) != entry.hash.value:
        if download:  # a user's file stays
            os.remove(source)
        origin, fate = (("downloaded from " + entry.url, "The download was deleted") if download
                        else (f"in $KERAS_PREACT_WEIGHTS_DIR, {local},", "That file was kept "
                              "(replace it with the published file, or remove it)"))
        raise WeightsIntegrityError(
            f"The {entry.hash.algorithm} hash of the weights {entry.key!r} {origin} is "
            f"{actual}, the catalog expects {entry.hash.value}. {fate}; nothing was cached.")
    return source, False


def _url_filename(url):
    return os.path.basename(urllib.parse.urlparse(url).path) or "download"


def _download(url, work, *, progress):
    logger.info("Downloading %s", url)
    interactive = keras.config.is_interactive_logging_enabled()
    if not (progress and getattr(sys.stdout, "isatty", bool)()):
        keras.config.disable_interactive_logging()
    try:
        return keras.utils.get_file(fname=_url_filename(url), origin=url, cache_dir=work,
                                    cache_subdir="download")
    except Exception as err:  # get_file turns URL errors into a bare Exception.
        text = str(err)
        reason = ("the transfer was truncated (fewer bytes than announced)"
                  if "incomplete" in text or "ContentTooShort" in type(err).__name__
                  else "the server answered with an HTTP error"
                  if "HTTP" in text or any(f" {c} --" in text for c in range(400, 600))
                  else "the file could not be fetched (no network, or the host is unreachable)")
        raise WeightsDownloadError(
            f"Could not download the weights from {url}: {reason} ({text}). Nothing was "
            f"cached. To use a local copy, put {_url_filename(url)!r} into the folder "
            "$KERAS_PREACT_WEIGHTS_DIR names: it is read before the network, online too.") from None
    finally:
        if interactive:
            keras.config.enable_interactive_logging()


def _extract_member(entry, published, work, *, origin):
    """The entry's member of the archive `published` (`origin`: its URL or local path)."""
    if (member := entry.archive_member) is None:
        return published
    if not zipfile.is_zipfile(published):
        raise WeightsIntegrityError(f"The weights {entry.key!r} should be a zip holding "
                                    f"{member!r}, but {origin} is not a zip file. "
                                    "Nothing was cached.")
    with zipfile.ZipFile(published) as archive:
        if member not in (names := archive.namelist()):
            raise ValueError(f"The archive {origin} has no member {member!r} (it holds "
                             f"{names[:10]}). Nothing was cached.")
        return archive.extract(member, os.path.join(work, "member"))


def _convert(entry, source, out, build, *, converted):
    """(out, facts): the `.weights.h5` made from a verified file, saved as `out`."""
    if entry.converter_args.get("verbatim") and not converted:
        if not h5py.is_hdf5(source):
            raise ValueError(f"The file at {entry.url} is not a Keras .weights.h5 (HDF5) file.")
        shutil.copyfile(source, out)
        return out, {"verbatim": True}
    # The saved file records the preprocessing, so `weights=path` normalises as the entry.
    architecture = {"classes": entry.classes, **entry.architecture,
                    "preprocessing": entry.preprocessing}
    model = build(entry.model, **{k: v for k, v in architecture.items()
                                  if k != "classes" or v is not None})
    if converted:
        load_weights_file(model, source)
        facts = {"copied_from": source}
    else:
        facts = get_converter(entry.converter)(source, model, entry) or {}
    save_weights_file(model, out)
    return out, facts


def convert_checkpoint(source, out, *, model, build, converter="pytorchcv", classes=None,
                       overwrite=False):
    """Converts a checkpoint of one's own in a publisher's layout (e.g. a pytorchcv `.pth`,
    read without torch) into a `.weights.h5` that ``weights=out`` loads. The model is built
    as the catalog's `converter` entries for `model` build it, without preprocessing (the
    checkpoint's normalisation is not known: pass ``preprocessing=`` when loading).

    Args:
        source: str or `os.PathLike`, the checkpoint file.
        out: str or `os.PathLike`, the `.weights.h5` file to write.
        model: str, a model name with `converter` entries in the catalog, e.g.
            "preact_resnet20".
        build: callable, ``build(model_name, **arguments)``, e.g. `keras_preact.get_model`.
        converter: str, the checkpoint's layout: "pytorchcv" or "keras_applications".
            Defaults to `"pytorchcv"`.
        classes: int or None, the classes of the checkpoint's head (default: the catalog
            entry's).
        overwrite: bool, replace an existing `out`. Defaults to `False`.

    Returns:
        str: the absolute path of `out`.

    Raises:
        ValueError: an unknown converter, a `model` without `converter` entries, a
            checkpoint that does not match the model (the first missing, extra or
            other-shaped tensors named), or an `out` not ending in '.weights.h5'; nothing
            is written then.
        FileExistsError: `out` exists and `overwrite` is False.
        FileNotFoundError: `source` does not exist.
        TypeError: `source` or `out` is not a path."""
    source, out = user_path(source, "source"), user_path(out, "out")
    os.stat(source)  # a missing file: FileNotFoundError, before a model is built
    get_converter(converter)
    entries = [e for e in list_entries() if e.converter == converter]
    if (entry := next((e for e in entries if e.model == model), None)) is None:
        raise ValueError(f"No {converter} layout is known for the model. Received: "
                         f"model={model!r}. Valid: {sorted({e.model for e in entries})}")
    if os.path.exists(out) and not overwrite:
        raise FileExistsError(f"{out} exists; pass overwrite=True (--overwrite) to replace it. "
                              f"Received: out={out!r}")
    entry = dataclasses.replace(entry, preprocessing=None, architecture={
        **entry.architecture, **({} if classes is None else {"classes": classes})})
    return _convert(entry, source, out, build, converted=False)[0]


def _commit(entry, cache, tmp, facts):
    path, sidecar = cached_paths(entry, cache)
    record = {"key": entry.key, "sha256": file_hash(tmp, "sha256"), "source": entry.source_record(),
              "conversion": facts, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    # The sidecar first: a file without its record is never trusted, a lone record ignored.
    atomic_write_json(sidecar, record)
    os.replace(tmp, path)
    logger.info("Cached %s (sha256 %s)", path, record["sha256"])
    return path


def cached_entries(cache=None):
    """The cache's files: dicts with key, path, size and sha256 (None without a record).

    Args:
        cache: str or None, the cache folder (see `resolve_cache_dir`). Defaults to `None`.

    Returns:
        list of dict: one per cached `.weights.h5`, sorted by path, with "key", "path",
        "size" (bytes) and "sha256" (None without a readable record).

    Raises:
        ValueError: as `resolve_cache_dir`."""
    out = []
    for path in sorted(pathlib.Path(resolve_cache_dir(cache)).glob("*.weights.h5")):
        try:
            record = json.loads(pathlib.Path(f"{path}{SIDECAR_SUFFIX}").read_text())
        except (OSError, ValueError):
            record = None
        out.append({"key": path.name[: -len(".weights.h5")], "path": str(path),
                    "size": path.stat().st_size,
                    "sha256": record.get("sha256") if isinstance(record, dict) else None})
    return out


def clear_cache(key=None, cache=None):
    """Deletes cached weights (all, or `key`'s) and their records.

    Only files the cache wrote go: a weights file whose record holds its SHA-256 (a user's
    file, or one changed since, stays).

    Args:
        key: str or None, the catalog key of the weights to delete; None: all.
            Defaults to `None`.
        cache: str or None, the cache folder (see `resolve_cache_dir`). Defaults to `None`.

    Returns:
        list of str: the paths removed.

    Raises:
        ValueError: for a key neither cached nor in the catalog, or a `cache` folder that
            does not exist."""
    if cache is not None and not os.path.isdir(resolve_cache_dir(cache)):
        raise ValueError(f"The weights cache folder does not exist. Received: cache_dir={cache!r}")
    removed = [p for row in verify_cache(None if key is None else [key], cache)
               if row["status"] == "ok" for p in (row["path"], row["path"] + SIDECAR_SUFFIX)]
    for path in removed:
        os.remove(path)
    return removed


def verify_cache(keys=None, cache=None):
    """Checks cached weights files (of `keys`, default all) against their sidecars: one
    dict per key with ``key``, ``path`` and ``status``: "ok" (then ``sha256``), "not
    cached", "no record" (not trusted) or "altered" (then ``error``). ValueError for a key
    the catalog does not have, before anything is read."""
    cached = {e["key"]: e["path"] for e in cached_entries(cache)}
    rows = [{"key": key, "path": cached.get(key) or cached_paths(get_entry(key), cache)[0],
             "status": "not cached"} for key in keys or sorted(cached)]
    for row in (row for row in rows if os.path.isfile(row["path"])):
        try:
            row.update(status="ok", sha256=verify_cached(row["path"])["sha256"])
        except FileNotFoundError:
            row["status"] = "no record"
        except ValueError as err:  # a changed hash, or a sidecar that is not JSON
            row.update(status="altered", error=str(err))
    return rows
