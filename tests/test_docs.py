"""The documentation: the site builds with ``mkdocs build --strict``, the README's model
table is the generated one, and every Python example of the README and of docs/ runs as
written, offline.

Each ```python block runs in a fresh interpreter in an empty folder. The catalog weights a
block names are served from a local folder (`KERAS_PREACT_WEIGHTS_DIR`, random weights of
the entry's architecture) with `KERAS_PREACT_OFFLINE=1`, so the real resolve -> verify ->
cache -> load path runs and no socket is opened. A block that cannot run here is preceded
by ``<!-- not run: why -->`` and is reported as skipped with that reason. The commands of
the ```bash blocks are run by `tests/test_docs_commands.py`.
"""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from tests.helpers import REPO, doc_blocks, run_python

#: `kp.preact_resnet110(weights="cifar10")`, `fetch_weights("preact_resnet110.cifar10")`,
#: `--model preact_resnet20 --weights cifar10`, `weights fetch preact_resnet20.cifar10`.
TAG = re.compile(r"\b(preact_resnet\d+)\(weights=\"([\w.]+)\"|fetch_weights\(\"([\w.]+)\""
                 r"|--model (preact_resnet\d+) [^\n]*--weights ([\w.]+)(?=\s)"
                 r"|weights fetch ([\w.]+)")


def _generate():
    spec = importlib.util.spec_from_file_location("docs_generate",
                                                  os.path.join(REPO, "docs", "generate.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def python_blocks():
    return [pytest.param(b.code, id=f"{b.page}:{b.line}",
                         marks=[pytest.mark.skip(reason=f"not run: {b.arg}")] if b.mark else [])
            for b in doc_blocks("python")]


def catalog_keys(code):
    """The catalog keys a block or a command loads (tags resolved for their model)."""
    from keras_preact.weights import catalog

    keys = set()
    for model, tag, key, cli_model, cli_tag, cli_key in TAG.findall(code):
        model, tag, key = model or cli_model, tag or cli_tag, key or cli_key
        if key:
            keys.add(key)
        elif catalog.looks_like_tag(tag):
            keys.add(catalog.resolve_tag(model, tag).key)
    return sorted(keys)


def serve_locally(keys, folder):
    """Writes a converted file of random weights for each catalog key into `folder`."""
    import keras_preact as kp
    from keras_preact import weights as W

    os.makedirs(folder, exist_ok=True)
    for key in keys:
        entry = W.get_entry(key)
        arch = {"classes": entry.classes or 10, **entry.architecture}
        W.save_weights_file(kp.get_model(entry.model, **arch),
                            os.path.join(folder, f"{key}.weights.h5"))


def offline_env(tmp_path, keys):
    """The environment of an example: the `keys` served from a local folder, no network."""
    serve_locally(keys, str(tmp_path / "served"))
    return {"KERAS_PREACT_HOME": str(tmp_path / "home"),
            "KERAS_PREACT_WEIGHTS_DIR": str(tmp_path / "served"),
            "KERAS_PREACT_OFFLINE": "1", "PYTHONPATH": REPO}


def test_the_blocks_are_found():
    blocks = doc_blocks("python")
    pages = {b.page for b in blocks}
    assert "README.md" in pages and len(pages) >= 5, pages
    quickstart = next(b.code for b in blocks if b.page == "README.md")
    assert catalog_keys(quickstart) == ["preact_resnet110.cifar10"]
    assert catalog_keys("train --model preact_resnet20 --weights cifar10 --epochs 1\n") == [
        "preact_resnet20.cifar10"]
    assert catalog_keys("train --model preact_resnet20 --weights runs/a/model.keras\n") == []


@pytest.mark.slow
@pytest.mark.parametrize("code", python_blocks())
def test_python_example_runs_offline(code, tmp_path):
    keys = catalog_keys(code)
    env = offline_env(tmp_path, keys)
    work = tmp_path / "work"
    work.mkdir()
    # A socket would mean a download: the block must not need one.
    guard = (
        "import socket\n"
        "class _NoSocket(socket.socket):\n"
        "    def __init__(self, *a, **k):\n"
        "        raise AssertionError('the example opened a socket')\n"
        "socket.socket = _NoSocket\n"
    )
    out = run_python(guard + code, env=env, cwd=str(work))
    assert out.returncode == 0, out.stderr[-3000:]
    cached = os.listdir(tmp_path / "home" / "weights") if keys else []
    assert {f"{k}.weights.h5" for k in keys} <= set(cached)


def test_readme_model_table_is_generated():
    generate = _generate()
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    assert generate.readme_with_models_table(text, generate.models_table()) == text, (
        "README.md's model table is stale: run `python docs/generate.py models --write`")


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-5000:]
    for figure in _generate().FIGURES:
        assert (site / "figures" / figure).stat().st_size > 10_000
    from keras_preact.cli import build_parser

    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    commands = build_parser()._actions[-1].choices  # the subcommands
    assert all(f"keras-preact {name}" in cli for name in commands), sorted(commands)
    api = (site / "api" / "models" / "index.html").read_text(encoding="utf-8")
    assert "preact_resnet1001" in api and "PreActResNet" in api
