"""Small helpers shared by the tests."""

import os
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
