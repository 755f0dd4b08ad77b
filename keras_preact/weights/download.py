"""Verified download and cache of pretrained weights.

One chain for every catalog entry (or entry dict):

1. take a file lock for the entry (`filelock`), so concurrent processes and workers
   download once and the others wait, then find the verified result in the cache;
2. download the published file into a private temporary folder of the cache with
   `keras.utils.get_file` (its progress bar; partial files removed on errors);
3. extract the named member when the published file is a zip;
4. verify the publisher's hash (SHA-1, MD5 or SHA-256); a mismatch deletes the file;
5. build the entry's architecture with the caller's `build` (e.g.
   `keras_preact.get_model`: weights/ never imports models/) and run its converter;
6. save a `.weights.h5` to a temporary path, record its SHA-256 in a sidecar
   ``<name>.weights.h5.json`` and rename both into the cache;
7. on every later use, verify that SHA-256 before returning the path.

Offline mode (``offline=True`` or ``KERAS_PREACT_OFFLINE=1``) never opens a socket:
it resolves only from ``$KERAS_PREACT_WEIGHTS_DIR`` (a folder a user or admin fills
with converted ``<model>.<tag>.weights.h5`` files or the published files under their
URL's file name) and from the cache. Online, that folder is also looked at before
downloading. A published file found there is verified against the publisher's hash;
a converted one is checked against the entry's architecture (its layout) and cached
with its SHA-256.

Keras' `get_file` alone keeps a file whose hash failed, writes straight to the final
path and takes no lock, so it is used only for the transfer itself.
"""

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.parse
import zipfile

from keras_preact.files import file_hash
from keras_preact.weights.catalog import get_entry
from keras_preact.weights.catalog import validate_entry

logger = logging.getLogger("keras_preact.weights")

SIDECAR_SUFFIX = ".json"
LOCK_TIMEOUT_S = 3600
#: Sub-folders of the cache: lock files, and private folders of transfers in progress
#: (on the cache's file system, so the final rename is atomic).
LOCK_FOLDER = ".locks"
TMP_FOLDER = ".tmp"
_TRUE = ("1", "true", "yes", "on")


class WeightsDownloadError(OSError):
    """The published file could not be fetched (no network, HTTP error, truncated)."""


class WeightsIntegrityError(ValueError):
    """A file's hash is not the one recorded for it (the file is not used)."""


def resolve_cache_dir(cache_dir=None):
    """The weights cache folder: the argument, ``$KERAS_PREACT_HOME/weights`` or
    ``~/.keras/keras_preact/weights``."""
    if cache_dir is not None:
        return os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
    home = os.environ.get("KERAS_PREACT_HOME")
    if home:
        return os.path.join(os.path.abspath(os.path.expanduser(home)), "weights")
    return os.path.join(os.path.expanduser("~"), ".keras", "keras_preact", "weights")


def is_offline(offline=None):
    """`offline` if given, else whether ``KERAS_PREACT_OFFLINE`` is set to a true value."""
    if offline is not None:
        return bool(offline)
    return os.environ.get("KERAS_PREACT_OFFLINE", "").strip().lower() in _TRUE


def _resolve_entry(key_or_entry):
    if isinstance(key_or_entry, dict):
        return validate_entry(key_or_entry, strict=False)
    return get_entry(key_or_entry)


def cached_paths(entry, cache=None):
    """(weights path, sidecar path) of an entry in the cache."""
    name = entry["key"] + ".weights.h5"
    path = os.path.join(resolve_cache_dir(cache), name)
    return path, path + SIDECAR_SUFFIX


def _source_record(entry):
    # What the cached file was made from: a changed URL, hash, converter or
    # architecture makes the cached file stale.
    return {
        "url": entry["url"],
        "hash": entry["hash"],
        "archive_member": entry.get("archive_member"),
        "converter": entry["converter"],
        "converter_args": entry.get("converter_args") or {},
        "architecture": entry.get("architecture") or {},
    }


def verify_cached(path, sidecar):
    """Checks a cached file against the SHA-256 in its sidecar.

    Returns:
        The sidecar dict.

    Raises:
        WeightsIntegrityError: if the file was altered on disk.
        FileNotFoundError: if either file is missing.
    """
    with open(sidecar) as f:
        record = json.load(f)
    actual = file_hash(path, "sha256")
    if actual != record.get("sha256"):
        raise WeightsIntegrityError(
            f"The cached weights file {path} was altered on disk: its SHA-256 is "
            f"{actual}, the cache recorded {record.get('sha256')}. It was not loaded. "
            "Delete it (`keras-preact weights clear`) and fetch it again."
        )
    return record


def _lookup_cache(entry, cache):
    path, sidecar = cached_paths(entry, cache)
    if not (os.path.isfile(path) and os.path.isfile(sidecar)):
        return None
    record = verify_cached(path, sidecar)
    if record.get("source") != _source_record(entry):
        logger.info("The cached %s was made from another source; fetching it again.", path)
        return None
    return path


def fetch_weights(key_or_entry, *, build, cache_dir=None, offline=None, progress=True):
    """The path of the verified cached `.weights.h5` for a catalog entry.

    Args:
        key_or_entry: a catalog key ("preact_resnet110.cifar10") or an entry dict
            (needs at least model, tag, url, hash, converter; see
            `keras_preact.weights.catalog`).
        build: ``build(model_name, **arguments)`` builds a registered model, e.g.
            `keras_preact.get_model`: the entry's architecture, which a published
            file is converted into (and a converted file is checked against).
        cache_dir: the cache folder (default ``$KERAS_PREACT_HOME/weights`` or
            ``~/.keras/keras_preact/weights``).
        offline: None (``KERAS_PREACT_OFFLINE``), True or False. Offline, the file
            comes only from ``$KERAS_PREACT_WEIGHTS_DIR`` or the cache, and no socket
            is opened.
        progress: bool, default True: progress bar while downloading.

    Returns:
        str, the path of a `.weights.h5` whose SHA-256 matches its record.

    Raises:
        ValueError: for an unknown key or a malformed entry.
        WeightsIntegrityError (a ValueError): the publisher's hash does not match
            the downloaded file (which is deleted), or the cached file was altered.
        WeightsDownloadError (an OSError): no network, an HTTP error or a truncated
            transfer (nothing is left in the cache), or offline mode without a local
            copy.

    Example:
        >>> path = fetch_weights("preact_resnet110.cifar10", build=keras_preact.get_model)
        >>> model = keras_preact.preact_resnet110(weights=path)
    """
    entry = _resolve_entry(key_or_entry)
    cache = resolve_cache_dir(cache_dir)
    offline = is_offline(offline)
    found = _lookup_cache(entry, cache)
    if found is not None:
        return found
    import filelock

    os.makedirs(cache, exist_ok=True)
    os.makedirs(os.path.join(cache, LOCK_FOLDER), exist_ok=True)
    lock = filelock.FileLock(
        os.path.join(cache, LOCK_FOLDER, entry["key"] + ".lock"), timeout=LOCK_TIMEOUT_S
    )
    with lock:
        # Another process may have finished while this one waited for the lock.
        found = _lookup_cache(entry, cache)
        if found is not None:
            return found
        return _fetch_locked(entry, cache, build=build, offline=offline, progress=progress)


def _fetch_locked(entry, cache, *, build, offline, progress):
    os.makedirs(os.path.join(cache, TMP_FOLDER), exist_ok=True)
    work = tempfile.mkdtemp(prefix=entry["key"] + ".", dir=os.path.join(cache, TMP_FOLDER))
    try:
        # A folder filled by a user or admin is used first, online too.
        local = _local_copy(entry, cache)
        if offline and local is None:
            folder = os.environ.get("KERAS_PREACT_WEIGHTS_DIR")
            raise WeightsDownloadError(
                f"Offline mode: no local copy of the weights {entry['key']!r}. Put "
                f"{entry['key']}.weights.h5 or the published file "
                f"{_url_filename(entry['url'])!r} into $KERAS_PREACT_WEIGHTS_DIR "
                f"(now {folder!r}), or fetch it online first "
                f"(`keras-preact weights fetch {entry['key']}`)."
            )
        if local is not None and local[1] == "converted":
            return _install_converted(entry, local[0], cache, work, build)
        published = local[0] if local is not None else _download(entry["url"], work, progress=progress)
        source = _extract_member(entry, published, work)
        _verify_publisher_hash(entry, source, delete=local is None)
        return _convert_and_cache(entry, source, cache, work, build)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _url_filename(url):
    name = os.path.basename(urllib.parse.urlparse(url).path)
    return name or "download"


def _local_copy(entry, cache):
    """(path, "converted" | "published") from the admin folder, or None."""
    folder = os.environ.get("KERAS_PREACT_WEIGHTS_DIR")
    if not folder:
        return None
    converted = os.path.join(folder, entry["key"] + ".weights.h5")
    if os.path.isfile(converted):
        return converted, "converted"
    published = os.path.join(folder, _url_filename(entry["url"]))
    if os.path.isfile(published):
        return published, "published"
    return None


@contextlib.contextmanager
def _quiet_keras(enabled):
    import keras

    was = keras.config.is_interactive_logging_enabled()
    if not enabled:
        keras.config.disable_interactive_logging()
    try:
        yield
    finally:
        if was:
            keras.config.enable_interactive_logging()


def _download(url, work, *, progress):
    """Downloads `url` into the private folder `work` with Keras' `get_file`."""
    import keras

    name = _url_filename(url)
    logger.info("Downloading %s", url)
    try:
        with _quiet_keras(progress):
            # Keras' helper does the transfer and the progress bar, and removes a
            # partial file on errors; the hash, lock and rename are done here.
            return keras.utils.get_file(
                fname=name, origin=url, cache_dir=work, cache_subdir="download"
            )
    except Exception as err:  # get_file turns URL errors into a bare Exception.
        text = str(err)
        if "incomplete" in text or "ContentTooShort" in type(err).__name__:
            reason = "the transfer was truncated (fewer bytes than announced)"
        elif "HTTP" in text or any(f" {c} --" in text for c in range(400, 600)):
            reason = "the server answered with an HTTP error"
        else:
            reason = "the file could not be fetched (no network, or the host is unreachable)"
        raise WeightsDownloadError(
            f"Could not download the weights from {url}: {reason} ({text}). Nothing was "
            "cached. Set KERAS_PREACT_OFFLINE=1 and KERAS_PREACT_WEIGHTS_DIR to use a "
            "local copy."
        ) from None


def _extract_member(entry, published, work):
    member = entry.get("archive_member")
    if member is None:
        return published
    if not zipfile.is_zipfile(published):
        raise WeightsIntegrityError(
            f"The weights {entry['key']!r} should be a zip holding {member!r}, but "
            f"{entry['url']} is not a zip file. Nothing was cached."
        )
    with zipfile.ZipFile(published) as archive:
        names = archive.namelist()
        if member not in names:
            raise ValueError(
                f"The archive {entry['url']} has no member {member!r} (it holds "
                f"{names[:10]}). Nothing was cached."
            )
        target = os.path.join(work, "member", os.path.basename(member))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with archive.open(member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def _verify_publisher_hash(entry, path, *, delete):
    expected = entry["hash"]
    actual = file_hash(path, expected["algorithm"])
    if actual != expected["value"]:
        if delete:
            os.remove(path)
        raise WeightsIntegrityError(
            f"The {expected['algorithm']} hash of the weights {entry['key']!r} from "
            f"{entry['url']} is {actual}, the catalog expects {expected['value']}. The "
            "file was deleted and nothing was cached."
        )


def _build_entry_model(entry, build):
    architecture = dict(entry.get("architecture") or {})
    if entry.get("classes") is not None:
        architecture.setdefault("classes", entry["classes"])
    # The preprocessing has no weights, but the saved file records it, so that a
    # model built from the file alone (`weights=path`) normalises as the entry says.
    architecture["preprocessing"] = entry.get("preprocessing")
    return build(entry["model"], **architecture)


def _convert_and_cache(entry, source, cache, work, build):
    from keras_preact.weights.converters import get_converter
    from keras_preact.weights.local import save_weights_file

    if (entry.get("converter_args") or {}).get("verbatim"):
        # A URL-with-hash `weights=` argument: the verified file is cached as
        # published and checked against the model when it is loaded.
        import h5py

        if not h5py.is_hdf5(source):
            raise ValueError(
                f"The file at {entry['url']} is not a Keras .weights.h5 (HDF5) file."
            )
        tmp = os.path.join(work, "verbatim.weights.h5")
        shutil.copyfile(source, tmp)
        return _commit(entry, tmp, cache, {"verbatim": True})
    model = _build_entry_model(entry, build)
    facts = get_converter(entry["converter"])(source, model, entry) or {}
    tmp = os.path.join(work, "converted.weights.h5")
    save_weights_file(model, tmp)
    return _commit(entry, tmp, cache, facts)


def _install_converted(entry, path, cache, work, build):
    """A converted file from the admin folder: checked against the architecture."""
    from keras_preact.weights.local import load_weights_file
    from keras_preact.weights.local import save_weights_file

    model = _build_entry_model(entry, build)
    load_weights_file(model, path)
    tmp = os.path.join(work, "converted.weights.h5")
    # Saved again (not copied) so that the cached file records the entry's
    # architecture and preprocessing, as a converted download does.
    save_weights_file(model, tmp)
    return _commit(entry, tmp, cache, {"copied_from": path})


def _commit(entry, tmp, cache, facts):
    path, sidecar = cached_paths(entry, cache)
    record = {
        "key": entry["key"],
        "sha256": file_hash(tmp, "sha256"),
        "source": _source_record(entry),
        "conversion": _plain(facts),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp_sidecar = tmp + SIDECAR_SUFFIX
    with open(tmp_sidecar, "w") as f:
        json.dump(record, f, indent=2)
    # The sidecar first: a weights file without its record is never trusted, and a
    # record without its file is ignored.
    os.replace(tmp_sidecar, sidecar)
    os.replace(tmp, path)
    logger.info("Cached %s (sha256 %s)", path, record["sha256"])
    return path


def _plain(value):
    try:
        json.dumps(value)
        return value
    except TypeError:
        return {k: str(v) for k, v in dict(value).items()}


def cached_entries(cache=None):
    """The cache's files: list of dicts with key, path, size and recorded sha256."""
    folder = resolve_cache_dir(cache)
    if not os.path.isdir(folder):
        return []
    out = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".weights.h5"):
            continue
        path = os.path.join(folder, name)
        sidecar = path + SIDECAR_SUFFIX
        record = {}
        if os.path.isfile(sidecar):
            with open(sidecar) as f:
                record = json.load(f)
        out.append({
            "key": name[: -len(".weights.h5")],
            "path": path,
            "size": os.path.getsize(path),
            "sha256": record.get("sha256"),
        })
    return out


def clear_cache(key=None, cache=None):
    """Deletes cached weights (all, or one key's); returns the paths removed."""
    folder = resolve_cache_dir(cache)
    removed = []
    if not os.path.isdir(folder):
        return removed
    for name in sorted(os.listdir(folder)):
        full = os.path.join(folder, name)
        if key is not None and not name.startswith(key + ".weights.h5"):
            continue
        if os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)
        else:
            os.remove(full)
        removed.append(full)
    return removed


def list_weights(model=None, cache=None):
    """The catalog's entries (of `model`, default all), each with where it is cached.

    Returns:
        list of entry dicts (as `list_entries` orders them), each with ``cached``:
        the cached file's path, or None.
    """
    from keras_preact.weights.catalog import list_entries

    cached = {e["key"]: e["path"] for e in cached_entries(cache)}
    return [{**e, "cached": cached.get(e["key"])} for e in list_entries(model)]


def verify_cache(keys=None, cache=None):
    """Checks cached weights files against the SHA-256 their sidecars recorded.

    Args:
        keys: catalog keys (default: every file in the cache).
        cache: the cache folder (default `resolve_cache_dir()`).

    Returns:
        list of dicts, one per key: ``key``, ``path`` and ``status``: "ok" (then
        ``sha256``), "not cached", "no record" (no sidecar: the file is not trusted)
        or "altered" (then ``error``, what differs).

    Raises:
        ValueError: for a key the catalog does not have (before anything is read).
    """
    cached = {e["key"]: e["path"] for e in cached_entries(cache)}
    keys = list(keys or sorted(cached))
    paths = {key: cached.get(key) or cached_paths(get_entry(key), cache)[0] for key in keys}
    out = []
    for key in keys:
        row = {"key": key, "path": paths[key]}
        if not os.path.isfile(row["path"]):
            row["status"] = "not cached"
        else:
            try:
                row["sha256"] = verify_cached(row["path"], row["path"] + SIDECAR_SUFFIX)["sha256"]
                row["status"] = "ok"
            except FileNotFoundError:
                row["status"] = "no record"
            except ValueError as err:  # a changed hash, or a sidecar that is not JSON
                row.update(status="altered", error=str(err))
        out.append(row)
    return out
