"""Small helpers shared by the tests."""

import contextlib
import functools
import http.server
import os
import threading
import subprocess
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
