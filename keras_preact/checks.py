"""Checks of the values users pass (arguments, environment variables), each with a one-line
message naming the value received and what is valid. Imports nothing of the package."""

import contextlib
import importlib.util
import json
import os

#: The values of KERAS_BACKEND that Keras 3 accepts.
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")
#: The spellings an on/off environment variable takes.
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def env_flag(name, default=False):
    """The on/off environment variable `name` (unset: `default`); ValueError for a value
    that is neither an on nor an off spelling."""
    text = os.environ.get(name)
    if text is None:
        return default
    value = text.strip().lower()
    if value not in ON + OFF:
        raise ValueError(f"{name} must be 1, true, yes or on, or else 0, false, no, off or "
                         f"empty. Received: {name}={text!r}")
    return value in ON


def shorten(text, limit=300):
    """`text` (or an error) on one line, cut to `limit` characters, for messages."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_environment():
    """ValueError for an environment variable Keras or TensorFlow would misread without a
    word: KERAS_BACKEND (a backend Keras knows, installed), TF_ENABLE_ONEDNN_OPTS (on/off),
    TF_CPP_MIN_LOG_LEVEL (0 to 3)."""
    backend, source = os.environ.get("KERAS_BACKEND"), "KERAS_BACKEND"
    if backend is None:  # Keras' own file, as Keras reads it (an unreadable one it ignores)
        source = os.path.join(os.environ.get("KERAS_HOME") or os.path.expanduser(
            os.path.join("~", ".keras")), "keras.json")
        with contextlib.suppress(OSError, ValueError, AttributeError):
            with open(source) as f:
                backend = json.load(f).get("backend")
        source = f"the backend of {source}"
    if backend is not None and backend not in KERAS_BACKENDS:
        received = f"{source}={backend!r}" if source == "KERAS_BACKEND" else repr(backend)
        raise ValueError(f"{source} must be one of {', '.join(KERAS_BACKENDS)}. "
                         f"Received: {received}")
    if backend is not None and importlib.util.find_spec(backend) is None:
        raise ValueError(f"{source} is {backend!r}, which needs the {backend} package; it is "
                         "not installed: install it, or choose another backend.")
    for name, valid in (("TF_ENABLE_ONEDNN_OPTS", ("0", "1", "true", "false")),
                        ("TF_CPP_MIN_LOG_LEVEL", ("0", "1", "2", "3"))):
        value = os.environ.get(name)
        if value is not None and value.strip().lower() not in valid:
            raise ValueError(f"{name} must be {', '.join(valid[:-1])} or {valid[-1]}. "
                             f"Received: {name}={value!r}")
