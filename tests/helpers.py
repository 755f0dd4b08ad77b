"""Small helpers shared by the tests."""

import contextlib
import functools
import http.server
import os
import re
import threading
import subprocess
import sys
from typing import NamedTuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


#: Python that makes TensorFlow unimportable in the process that runs it (a GPU machine
#: has only JAX): a `sitecustomize` or the head of a `python -c` script.
NO_TENSORFLOW = """
import sys
class _NoTensorFlow:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ModuleNotFoundError("No module named 'tensorflow' (blocked)", name=name)
sys.meta_path.insert(0, _NoTensorFlow())
"""


def to_numpy(x):
    import keras

    return np.asarray(keras.ops.convert_to_numpy(x))


def run_python(code, *, env=None, timeout=600, cwd=None):
    """Runs `code` in a fresh interpreter; returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if env:
        full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full_env,
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_cli(argv, capsys):
    """Runs `keras-preact` in this process; returns (exit status, stdout, stderr)."""
    from keras_preact import cli

    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's own errors and --help
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve_directory(root):
    """A static file server on 127.0.0.1 (a free port) over `root`; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


#: The documentation's pages with examples: the README and the site's sources.
DOC_PAGES = ["README.md"] + sorted(
    os.path.relpath(os.path.join(folder, name), REPO)
    for folder, _, names in os.walk(os.path.join(REPO, "docs")) for name in names
    if name.endswith(".md"))
#: A fenced block, and the marker line that may precede it: ``<!-- not run: why -->``, or
#: for commands ``<!-- run with: --epochs 1 -->`` (the tests run them with those values).
_FENCE = re.compile(r"(?:<!-- (?P<mark>not run|run with): (?P<arg>[^>]*) -->\n)?"
                    r"```(?P<lang>\w+)\n(?P<code>.*?)```", re.S)


class DocBlock(NamedTuple):
    page: str
    line: int
    code: str
    mark: str  # "", "not run" or "run with"
    arg: str  # why it is not run, or the flags it runs with


def doc_blocks(lang):
    """Every fenced `lang` block ("python", "bash") of `DOC_PAGES`, in order."""
    blocks = []
    for page in DOC_PAGES:
        text = open(os.path.join(REPO, page), encoding="utf-8").read()
        for m in _FENCE.finditer(text):
            if m["lang"] == lang:
                line = text[:m.start("code")].count("\n") + 1
                blocks.append(DocBlock(page, line, m["code"], m["mark"] or "", m["arg"] or ""))
    return blocks
