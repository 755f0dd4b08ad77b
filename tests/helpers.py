"""Small helpers shared by the tests."""

import base64
import contextlib
import functools
import hashlib
import http.server
import json
import os
import re
import subprocess
import sys
import threading
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


#: The smallest network the training tests train (`--model tiny --model-kwargs` as JSON).
TINY = {"architecture": {"stage_blocks": [1, 1, 1], "stage_filters": [8, 16, 32],
                         "stem_filters": 8}}


def tiny_model(**kwargs):
    """A 3-stage, one-unit-per-stage `PreActResNet` (16x16 input unless `kwargs` say)."""
    import keras_preact as kp

    return kp.PreActResNet(**{**TINY["architecture"], "input_shape": (16, 16, 3), **kwargs})


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


def run_command(argv, *, env=None, timeout=600):
    """Runs `python -m keras_preact *argv` in the repository, in `env` (default: this
    process's, TensorFlow's log quiet); returns the CompletedProcess."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2") if env is None else env
    return subprocess.run([sys.executable, "-m", "keras_preact", *argv], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


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
def serve(handler):
    """An HTTP server of `handler` on 127.0.0.1 (a free port); yields its base URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def serve_directory(root):
    """A static file server over `root` (`serve`)."""
    return serve(functools.partial(_QuietHandler, directory=str(root)))


class _HubHandler(http.server.BaseHTTPRequestHandler):
    """The few endpoints of the Hugging Face Hub that huggingface_hub's `create_repo`,
    `upload_folder` (files sent inline) and `hf_hub_download` use, over a folder
    (``<root>/<owner>/<repo>/<file>``)."""

    root = None

    def log_message(self, *args):
        pass

    def _send(self, code, body=b"", **headers):
        self.send_response(code)
        for key, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(key.replace("_", "-"), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value):
        self._send(200, json.dumps(value).encode(), Content_Type="application/json")

    def do_GET(self):  # /<owner>/<repo>/resolve/<revision>/<file>
        parts = self.path.split("?")[0].strip("/").split("/")
        path = (os.path.join(self.root, *parts[:2], *parts[4:])
                if parts[2:3] == ["resolve"] else "")
        if not os.path.isfile(path):
            return self._send(404, X_Error_Code="EntryNotFound")
        data = open(path, "rb").read()
        self._send(200, data, ETag=f'"{hashlib.sha256(data).hexdigest()}"',
                   X_Repo_Commit="0" * 40)

    do_HEAD = do_GET

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        base = f"http://{self.headers['Host']}"
        if self.path == "/api/repos/create":
            body = json.loads(raw)
            return self._json({"url": f"{base}/{body.get('organization')}/{body['name']}"})
        if self.path == "/api/validate-yaml":
            return self._json({"errors": [], "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(raw)["files"]
            return self._json({"files": [{"path": f["path"], "uploadMode": "regular",
                                          "shouldIgnore": False} for f in files]})
        repo = self.path.split("/api/models/")[1].split("/commit/")[0]  # one JSON line a file
        for item in map(json.loads, raw.decode().splitlines()):
            if item["key"] == "file":
                path = os.path.join(self.root, repo, item["value"]["path"])
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(base64.b64decode(item["value"]["content"]))
        self._json({"commitUrl": f"{base}/{repo}/commit/{'0' * 40}", "commitOid": "0" * 40})


def serve_hugging_face_hub(root):
    """A stand-in Hugging Face Hub storing repositories under `root` (`serve`); its URL is
    what ``HF_ENDPOINT`` takes."""
    return serve(type("Handler", (_HubHandler,), {"root": str(root)}))


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
