"""Every command in the README's and the guides' ```bash blocks runs, offline, on the
settings the page gives, or with the smaller values of a ``<!-- run with: --epochs 1 -->``
line before its block; a block that cannot run here (a GPU, the network, several hosts,
CIFAR-10) is preceded by ``<!-- not run: why -->``, and counted at the end of the run.

A page's blocks run in order in one folder, as a reader would type them. The folder holds
`my_images/` (three classes of digits as PNG files, for the image-folder and `predict`
examples) and links to the repository's `examples/` and `benchmarks/`.
"""

import os
import re
import subprocess
import sys

import pytest

from tests.helpers import DOC_PAGES, REPO, doc_blocks
from tests.test_docs import catalog_keys, offline_env

#: A flag and its value, as a "run with:" line gives them.
FLAG = re.compile(r"(--[\w-]+)[ =](\S+)")


def with_values(code, flags):
    """`code` with each flag of `flags` ("--epochs 1 --steps 2") set to that value."""
    for flag, value in FLAG.findall(flags):
        code, n = re.subn(rf"{flag}[ =]\S+", f"{flag} {value}", code)
        assert n, f"run with: {flag} is not in the block"
    return code


def write_image_folder(root, classes=3, per_class=20):
    from PIL import Image

    from keras_preact.data.digits import read_digits

    images, labels, _ = read_digits("test")
    for label in range(classes):
        os.makedirs(root / str(label))
        for i, image in enumerate(images[labels == label][:per_class]):
            Image.fromarray(image).save(root / str(label) / f"{i}.png")


def pages():
    """The pages with a command block to run (the marked blocks are counted by conftest)."""
    found = {}
    for b in doc_blocks("bash"):
        if b.mark != "not run":
            found.setdefault(b.page, []).append(b)
    return [pytest.param(found[p], id=p) for p in DOC_PAGES if p in found]


def test_with_values_sets_the_given_flags():
    code = "keras-preact tune --epochs 30 \\\n    --max-trials=8 --workdir runs/t"
    assert with_values(code, "--epochs 1 --max-trials 1") == (
        "keras-preact tune --epochs 1 \\\n    --max-trials 1 --workdir runs/t")
    with pytest.raises(AssertionError, match="--steps"):
        with_values(code, "--steps 2")


@pytest.mark.slow
@pytest.mark.parametrize("blocks", pages())
def test_page_commands_run(blocks, tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               **offline_env(tmp_path, catalog_keys("".join(b.code for b in blocks))))
    work = tmp_path / "work"
    write_image_folder(work / "my_images")
    for name in ("examples", "benchmarks"):
        os.symlink(os.path.join(REPO, name), work / name)
    for b in blocks:
        script = with_values(b.code, b.arg) if b.mark == "run with" else b.code
        out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=work, env=env,
                             capture_output=True, text=True, timeout=1200)
        assert out.returncode == 0, (
            f"{b.page}:{b.line}\n{script}\n--- stdout\n{out.stdout[-2000:]}\n"
            f"--- stderr\n{out.stderr[-3000:]}")
