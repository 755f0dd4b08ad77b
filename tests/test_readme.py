"""The README's Python examples run as written, offline.

Each ```python block runs in a fresh interpreter in an empty folder. The catalog
weights a block names are served from a local folder (`KERAS_PREACT_WEIGHTS_DIR`,
random weights of the entry's architecture) with `KERAS_PREACT_OFFLINE=1`, so the
real resolve -> verify -> cache -> load path runs and no socket is opened. A block
that cannot run here is preceded by ``<!-- not run: why -->`` and is reported as
skipped with that reason.
"""

import os
import re

import pytest

from tests.helpers import REPO
from tests.helpers import run_python

BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```", re.S)
#: `kp.preact_resnet110(weights="cifar10")`, `fetch_weights("preact_resnet110.cifar10")`.
TAG = re.compile(r"\b(preact_resnet\d+)\(weights=\"([\w.]+)\"|fetch_weights\(\"([\w.]+)\"")


def readme_blocks():
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    blocks = []
    for match in BLOCK.finditer(text):
        line = text[:match.start("code")].count("\n") + 1
        marks = [pytest.mark.skip(reason=f"not run: {match['why']}")] if match["why"] else []
        blocks.append(pytest.param(match["code"], id=f"README.md:{line}", marks=marks))
    return blocks


def catalog_keys(code):
    """The catalog keys a block loads (tags resolved for their model)."""
    from keras_preact.weights import catalog

    keys = set()
    for model, tag, key in TAG.findall(code):
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


def test_the_blocks_are_found():
    blocks = readme_blocks()
    assert len(blocks) >= 8
    quickstart = blocks[0].values[0]
    assert "kp.preact_resnet110(weights=\"cifar10\")" in quickstart
    assert catalog_keys(quickstart) == ["preact_resnet110.cifar10"]
    skipped = [b for b in blocks if b.marks]
    print(f"{len(blocks) - len(skipped)} README blocks run, {len(skipped)} marked not run")


@pytest.mark.slow
@pytest.mark.parametrize("code", readme_blocks())
def test_readme_block_runs_offline(code, tmp_path):
    keys = catalog_keys(code)
    serve_locally(keys, str(tmp_path / "served"))
    env = {
        "KERAS_PREACT_HOME": str(tmp_path / "home"),
        "KERAS_PREACT_WEIGHTS_DIR": str(tmp_path / "served"),
        "KERAS_PREACT_OFFLINE": "1",
        "PYTHONPATH": REPO,
    }
    work = tmp_path / "work"
    work.mkdir()
    # A socket would mean a download: the block must not need one.
    guard = (
        "import socket\n"
        "class _NoSocket(socket.socket):\n"
        "    def __init__(self, *a, **k):\n"
        "        raise AssertionError('the README example opened a socket')\n"
        "socket.socket = _NoSocket\n"
    )
    out = run_python(guard + code, env=env, cwd=str(work))
    assert out.returncode == 0, out.stderr[-3000:]
    cached = os.listdir(tmp_path / "home" / "weights") if keys else []
    assert {f"{k}.weights.h5" for k in keys} <= set(cached)
