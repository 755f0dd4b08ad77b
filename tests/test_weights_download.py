"""The verified download cache: real bytes from 127.0.0.1 and file:// URLs, never the net."""

import hashlib
import http.server
import json
import os
import socket
import time
import types
import zipfile

import numpy as np
import pytest

import keras_preact as kp
from keras_preact import weights as W
from keras_preact.weights import catalog
from tests.helpers import REPO, serve, to_numpy

INPUT = (16, 16, 3)


def _digest(path, algorithm):
    with open(path, "rb") as f:
        return hashlib.new(algorithm, f.read()).hexdigest()


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """A published keras-preact `.weights.h5` (ResNet-20 at 16x16) and its model's outputs."""
    import keras

    keras.utils.clear_session()
    folder = tmp_path_factory.mktemp("published")
    model = kp.preact_resnet20(input_shape=INPUT)
    path = W.save_weights_file(model, str(folder / "r20.weights.h5"))
    x = np.random.RandomState(0).rand(2, *INPUT).astype("float32")
    with open(path, "rb") as f:
        data = f.read()
    return {"path": path, "bytes": data, "x": x, "y": to_numpy(model(x)), "folder": str(folder)}


def _entry(url, data, *, algorithm="sha1", tag="test", wrong=False, **extra):
    value = hashlib.new(algorithm, data).hexdigest()
    if wrong:
        value = ("0" if value[0] != "0" else "1") + value[1:]
    return {
        "model": "preact_resnet20",
        "tag": tag,
        "url": url,
        "hash": {"algorithm": algorithm, "value": value},
        "converter": "keras_weights",
        "architecture": {"input_shape": list(INPUT)},
        "classes": 10,
        **extra,
    }


class _Files(http.server.BaseHTTPRequestHandler):
    """Serves `files` (path -> (body, announced length, delay)) and counts the requests."""

    files, counts = {}, {}

    def do_GET(self):
        self.counts[self.path] = self.counts.get(self.path, 0) + 1
        if self.path not in self.files:
            return self.send_error(404, "Not Found")
        body, announced, delay = self.files[self.path]
        time.sleep(delay)
        self.send_response(200)
        self.send_header("Content-Length", str(announced))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    """`server.serve(path, body, announced=, delay=)` publishes a file; returns its URL."""
    with serve(_Files) as base:
        def publish(path, body, *, announced=None, delay=0.0):
            _Files.files[path] = (body, len(body) if announced is None else announced, delay)
            return base + path

        yield types.SimpleNamespace(serve=publish, counts=_Files.counts,
                                    port=int(base.rsplit(":", 1)[1]))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KERAS_PREACT_OFFLINE", raising=False)
    monkeypatch.delenv("KERAS_PREACT_WEIGHTS_DIR", raising=False)
    return str(folder)


def _left_in_cache(cache):
    """Every file in the cache except lock files (empty, kept for the next fetch)."""
    out = []
    for root, _, files in os.walk(cache):
        if os.path.basename(root) == ".locks":
            continue
        out += [os.path.relpath(os.path.join(root, f), cache) for f in files]
    return sorted(out)


def _load_and_compare(path, published):
    model = kp.preact_resnet20(weights=path)
    np.testing.assert_allclose(to_numpy(model(published["x"])), published["y"], atol=1e-6)


def test_correct_hash_over_http_loads_and_later_uses_the_cache(published, server, cache):
    url = server.serve("/ok/r20.weights.h5", published["bytes"])
    entry = _entry(url, published["bytes"], algorithm="sha256")
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    assert path == os.path.join(cache, "preact_resnet20.test.weights.h5")
    with open(path + ".json") as f:
        record = json.load(f)
    assert record["sha256"] == _digest(path, "sha256")
    assert record["source"]["url"] == url
    _load_and_compare(path, published)
    # A second fetch is served from the verified cache: no second request.
    assert W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model) == path
    assert server.counts["/ok/r20.weights.h5"] == 1
    assert _left_in_cache(cache) == sorted(
        ["preact_resnet20.test.weights.h5", "preact_resnet20.test.weights.h5.json"]
    )


def test_file_url_and_zip_member(published, tmp_path, cache):
    entry = _entry("file://" + published["path"], published["bytes"], algorithm="md5", tag="plain")
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    _load_and_compare(path, published)

    archive = tmp_path / "release.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("inner/r20.weights.h5", published["bytes"])
    entry = _entry("file://" + str(archive), published["bytes"], tag="zipped",
                   archive_member="inner/r20.weights.h5")
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    _load_and_compare(path, published)

    missing = dict(entry, tag="missing", archive_member="nope.pth")
    with pytest.raises(ValueError, match="no member 'nope.pth'"):
        W.fetch_weights(missing, cache_dir=cache, progress=False, build=kp.get_model)
    assert not any("missing" in f for f in _left_in_cache(cache))


def test_wrong_hash_raises_and_leaves_nothing(published, server, cache):
    url = server.serve("/bad/r20.weights.h5", published["bytes"])
    entry = _entry(url, published["bytes"], wrong=True)
    with pytest.raises(W.WeightsIntegrityError, match="sha1 hash.*deleted"):
        W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    assert _left_in_cache(cache) == []
    # Also through a factory's URL-with-hash argument.
    bad = url + "#sha256=" + "0" * 64
    with pytest.raises(ValueError, match="hash"):
        kp.preact_resnet20(weights=bad)
    assert not os.path.exists(os.path.join(os.environ["KERAS_PREACT_HOME"], "weights")) or (
        _left_in_cache(os.path.join(os.environ["KERAS_PREACT_HOME"], "weights")) == [])


def test_a_local_file_with_another_hash_is_named_and_kept(published, tmp_path, cache,
                                                          monkeypatch):
    """A file of $KERAS_PREACT_WEIGHTS_DIR was neither downloaded nor is it deleted; a
    failed download says what that folder does (it is read online too)."""
    admin = tmp_path / "admin"
    admin.mkdir()
    local = admin / "r20.weights.h5"
    local.write_bytes(published["bytes"])
    monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(admin))
    entry = _entry("https://example.invalid/releases/r20.weights.h5", published["bytes"],
                   wrong=True)
    with pytest.raises(W.WeightsIntegrityError) as err:
        W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    assert str(err.value) == (
        f"The sha1 hash of the weights 'preact_resnet20.test' in $KERAS_PREACT_WEIGHTS_DIR, "
        f"{local}, is {_digest(local, 'sha1')}, the catalog expects {entry['hash']['value']}. "
        "That file was kept (replace it with the published file, or remove it); nothing was "
        "cached.")
    assert local.read_bytes() == published["bytes"]
    assert _left_in_cache(cache) == []

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(W.WeightsDownloadError) as err:
        W.fetch_weights(_entry(f"http://127.0.0.1:{closed}/x.weights.h5", b"x"),
                        cache_dir=cache, progress=False, build=kp.get_model)
    assert "OFFLINE" not in str(err.value)
    assert str(err.value).endswith(
        "Nothing was cached. To use a local copy, put 'x.weights.h5' into the folder "
        "$KERAS_PREACT_WEIGHTS_DIR names: it is read before the network, online too.")


def test_truncated_transfer_http_error_and_no_network_leave_nothing(published, server, cache):
    body = published["bytes"][: len(published["bytes"]) // 2]
    url = server.serve("/cut/r20.weights.h5", body, announced=len(published["bytes"]))
    with pytest.raises(W.WeightsDownloadError, match="truncated"):
        W.fetch_weights(_entry(url, published["bytes"]), cache_dir=cache, progress=False,
                        build=kp.get_model)
    assert _left_in_cache(cache) == []

    missing = f"http://127.0.0.1:{server.port}/missing.weights.h5"
    with pytest.raises(W.WeightsDownloadError, match="HTTP error"):
        W.fetch_weights(_entry(missing, b"x"), cache_dir=cache, progress=False, build=kp.get_model)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    with pytest.raises(W.WeightsDownloadError, match="no network"):
        W.fetch_weights(_entry(f"http://127.0.0.1:{closed}/x.weights.h5", b"x"),
                        cache_dir=cache, progress=False, build=kp.get_model)
    assert _left_in_cache(cache) == []


def test_offline_mode_never_opens_a_socket(published, tmp_path, cache, monkeypatch):
    opened = []

    class NoSocket(socket.socket):
        def __init__(self, *args, **kwargs):
            opened.append(args)
            raise AssertionError("offline mode opened a socket")

    monkeypatch.setattr(socket, "socket", NoSocket)
    # The URL points at a host; offline mode must not try it.
    entry = _entry("https://example.invalid/releases/r20.weights.h5", published["bytes"])
    with pytest.raises(W.WeightsDownloadError, match="Offline mode: no local copy"):
        W.fetch_weights(entry, cache_dir=cache, offline=True, progress=False, build=kp.get_model)

    # An admin-filled folder holding the published file (under its URL's name).
    admin = tmp_path / "admin"
    admin.mkdir()
    (admin / "r20.weights.h5").write_bytes(published["bytes"])
    monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(admin))
    monkeypatch.setenv("KERAS_PREACT_OFFLINE", "1")
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    _load_and_compare(path, published)
    # Then from the cache, the admin folder emptied.
    (admin / "r20.weights.h5").unlink()
    assert W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model) == path
    assert opened == []


def test_cached_file_altered_on_disk_is_detected(published, cache, capsys):
    entry = _entry("file://" + published["path"], published["bytes"])
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    from keras_preact.cli import main

    assert main(["weights", "verify", "--cache-dir", cache]) == 0
    assert "preact_resnet20.test: ok" in capsys.readouterr().out
    data = bytearray(open(path, "rb").read())
    data[-100] ^= 0xFF
    with open(path, "wb") as f:
        f.write(bytes(data))
    with pytest.raises(W.WeightsIntegrityError, match=r"altered on disk.* Delete it and "
                       rf"{path}\.json, then fetch it again\.$"):
        W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    assert main(["weights", "verify", "--cache-dir", cache]) == 1
    assert "ALTERED" in capsys.readouterr().out
    # An altered file may be the user's own work saved there: `clear` keeps it and says so.
    assert main(["weights", "clear", "preact_resnet20.test", "--cache-dir", cache]) == 0
    assert capsys.readouterr().out == (
        f"Removed 0 file(s).\nKept 1 file(s) the cache did not write or that changed since (no "
        f"record of their SHA-256): {path}\n")
    assert _left_in_cache(cache) == [os.path.basename(path), os.path.basename(path) + ".json"]


def test_a_record_that_is_not_a_json_object_is_not_trusted(published, cache, capsys):
    entry = _entry("file://" + published["path"], published["bytes"])
    path = W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    with open(path + ".json", "w") as f:
        f.write("[]")  # valid JSON, but no record
    from keras_preact.cli import main

    with pytest.raises(W.WeightsIntegrityError, match="the cache recorded None"):
        W.fetch_weights(entry, cache_dir=cache, progress=False, build=kp.get_model)
    assert main(["weights", "verify", "--cache-dir", cache]) == 1
    assert "preact_resnet20.test: ALTERED" in capsys.readouterr().out
    assert main(["weights", "clear", "--cache-dir", cache]) == 0
    assert capsys.readouterr().out.startswith("Removed 0 file(s).\nKept 1 file(s)")
    assert _left_in_cache(cache) == [os.path.basename(path), os.path.basename(path) + ".json"]


@pytest.mark.e2e
def test_four_concurrent_processes_download_once(published, server, cache, tmp_path):
    url = server.serve("/many/r20.weights.h5", published["bytes"], delay=1.0)
    # Cached as published (no conversion) so the four processes need only Keras'
    # download helper: they start fast and overlap on the lock.
    entry = _entry(url, published["bytes"], tag="many", converter_args={"verbatim": True})
    gate = tmp_path / "gate"
    gate.mkdir()
    code = f"""
import json, os, sys, time
import keras_preact as kp
from keras_preact.weights import fetch_weights
# All four start fetching together (after their slow imports).
open(os.path.join({str(gate)!r}, str(os.getpid())), "w").close()
while len(os.listdir({str(gate)!r})) < 4:
    time.sleep(0.05)
print("PATH", fetch_weights(json.loads({json.dumps(json.dumps(entry))}), cache_dir={cache!r},
                            progress=False, build=kp.get_model))
"""
    import subprocess
    import sys

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO, KERAS_BACKEND="numpy")
    procs = [
        subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    paths = {line.split(" ", 1)[1] for out, _ in outs for line in out.splitlines()
             if line.startswith("PATH ")}
    assert len(paths) == 1
    assert server.counts["/many/r20.weights.h5"] == 1
    path = paths.pop()
    with open(path + ".json") as f:
        assert json.load(f)["sha256"] == _digest(path, "sha256")
    assert _left_in_cache(cache) == ["preact_resnet20.many.weights.h5",
                                     "preact_resnet20.many.weights.h5.json"]


# --- the catalog ----------------------------------------------------------------------


ENTRIES = W.list_entries()


@pytest.mark.parametrize("key", [e.key for e in ENTRIES])
def test_catalog_entry_is_consistent_with_the_registry(key):
    e = W.get_entry(key)
    assert e.model in kp.list_models()
    assert e.key == f"{e.model}.{e.tag}" == key
    assert len(e.class_names) == e.classes == e.architecture["classes"]
    assert e.manifest and e.license and e.params and e.input_shape


@pytest.mark.slow
@pytest.mark.parametrize("key", [e.key for e in ENTRIES])
def test_catalog_parameter_count_is_the_built_models(key):
    import keras

    e = W.get_entry(key)
    model = kp.get_model(e.model, **e.architecture)
    assert kp.count_params(model) == e.params
    if e.params_keras_count_params is not None:  # Keras' count (BatchNorm statistics too)
        assert model.count_params() == e.params_keras_count_params
    del model
    keras.utils.clear_session()


def test_catalog_defaults_and_tags():
    defaults = {}
    for e in ENTRIES:
        defaults[e.model] = defaults.get(e.model, 0) + int(e.default)
    assert set(defaults.values()) == {1}
    assert ENTRIES[0].key == "preact_resnet20.cifar10"  # the registry's order
    with pytest.raises(ValueError, match="Valid: .*cifar10"):
        catalog.resolve_tag("preact_resnet20", "imagenet")
    assert catalog.resolve_tag("preact_resnet20", "DEFAULT").default is True
    e = W.get_entry("preact_resnet20.cifar10")
    assert e.hash.algorithm == "sha1" and e.metrics.top1_error is not None


def test_entries_are_validated():
    good = _entry("https://example.invalid/a.weights.h5", b"x")
    assert catalog.validate_entry(good, strict=False).key == "preact_resnet20.test"
    for change, match in (
        ({"converter": "nope"}, "`converter` must be one of.*Received: converter='nope'"),
        ({"hash": {"algorithm": "crc32", "value": "00"}}, "Unknown hash algorithm"),
        ({"hash": {"algorithm": "sha1", "value": "abc"}}, "40 hex digits"),
        ({"url": "ftp://x/y"}, "`url` must be a URL starting with.*Received: url='ftp://x/y'"),
        ({"tag": "a.b"}, "without dots"),
        ({"classes": 0}, "`classes` must be an int >= 1"),
        ({"class_names": "nope"}, "`class_names` must be the name of a list in zoo/classes/"),
        ({"class_names": "cifar100"}, "a list of 10 names"),
        ({"input_shape": [32, 32]}, r"`input_shape` must be \[height, width, channels\]"),
        ({"metrics": {"top9_error": 1}}, "`metrics` must be a dict with the keys"),
        ({"architecture": {"classes": 100}}, "classes=10 but its architecture has classes=100"),
        ({"colour": "red"}, r"unknown fields \['colour'\]"),
    ):
        with pytest.raises(ValueError, match=match):
            catalog.validate_entry({**good, **change}, strict=False)
    with pytest.raises(ValueError, match="'preact_resnet20.x' of m.json says model="):
        catalog.validate_entry(good, key="preact_resnet20.x", strict=False, manifest="m.json")
    with pytest.raises(ValueError, match="lacks the fields"):
        catalog.validate_entry(good, strict=True)


def test_weights_cli_list_path_and_zoo_readme_is_current(tmp_path, capsys):
    from keras_preact.cli import main

    assert main(["weights", "list", "--model", "preact_resnet110"]) == 0
    out = capsys.readouterr().out
    assert "preact_resnet110.cifar10" in out and "preact_resnet20.cifar10" not in out
    assert main(["weights", "path", "preact_resnet110.cifar10", "--cache-dir", str(tmp_path)]) == 1
    assert capsys.readouterr().out.strip() == str(tmp_path / "preact_resnet110.cifar10.weights.h5")
    assert main(["weights", "fetch", "preact_resnet_nope.x", "--cache-dir", str(tmp_path)]) == 2
    assert "error: Unknown weights" in capsys.readouterr().err
    # zoo/README.md is generated from the manifests and must be regenerated with them.
    with open(os.path.join(REPO, "zoo", "README.md"), encoding="utf-8") as f:
        assert f.read() == W.render_zoo_readme(), (
            "zoo/README.md is stale: run `keras-preact weights readme --output zoo/README.md`"
        )
