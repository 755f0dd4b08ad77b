"""Checks of the values users pass (arguments, environment variables), each with a one-line
message naming the value received and what is valid. Imports neither the package nor Keras
(the command line checks the environment before Keras starts)."""

import contextlib
import difflib
import importlib.util
import json
import os
import warnings

import numpy as np

#: The values of KERAS_BACKEND that Keras 3 accepts.
KERAS_BACKENDS = ("tensorflow", "jax", "torch", "numpy", "openvino")
#: The spellings an on/off environment variable takes.
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def is_int(value, minimum=None):
    """Whether `value` is an integer (Python or NumPy, not a bool) of at least `minimum`."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)


def is_number(value):
    """Whether `value` is a Python int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(name, value, *, minimum=None, maximum=None, extra=""):
    """ValueError unless `value` is an integer (not a bool) in [minimum, maximum]."""
    if not (is_int(value, minimum) and (maximum is None or value <= maximum)):
        bounds = (f"in [{minimum}, {maximum}]" if maximum is not None
                  else "" if minimum is None else f">= {minimum}")
        kind = "a positive integer" if (minimum, maximum) == (1, None) else f"an int {bounds}"
        raise ValueError(f"`{name}` must be {extra}{kind.rstrip()}. Received: {name}={value!r}")
    return value


def check_bool(name, value, *, allow_none=False):
    """ValueError unless `value` is a bool (or None with `allow_none`)."""
    if not (isinstance(value, (bool, np.bool_)) or (allow_none and value is None)):
        either = "None, True or False" if allow_none else "True or False"
        raise ValueError(f"`{name}` must be {either}. Received: {name}={value!r}")


def check_choice(name, value, valid):
    """ValueError unless `value` is one of `valid`; returns it."""
    if isinstance(value, (list, dict)) or value not in valid:
        raise ValueError(f"Unknown `{name}`. Received: {name}={value!r}. Valid: {list(valid)}")
    return value


def check_known_arguments(given, valid, *, where, aliases=None):
    """ValueError, with the closest valid name, for the first key of `given` not in `valid`;
    `where` names the receiver (e.g. "preact_resnet20"); `aliases` maps other names users
    know (e.g. command-line ones) to valid ones, for the hint."""
    valid, aliases = sorted(valid), aliases or {}
    for name in sorted(set(given) - set(valid)):
        close = difflib.get_close_matches(name, valid + list(aliases), n=1)
        hint = f" Did you mean `{aliases.get(close[0], close[0])}`?" if close else ""
        raise ValueError(f"Unknown argument `{name}` for {where}.{hint} Received: "
                         f"{name}={given[name]!r}. Valid: {', '.join(valid)}")


def warn_deprecated(old, new, where):
    """Warns that `old` of `where` is now `new` (a FutureWarning: users see it by default)."""
    warnings.warn(f"`{old}` of {where} is deprecated and will be removed in the next "
                  f"release; use `{new}`.", FutureWarning, stacklevel=3)


def pop_deprecated(kwargs, old, new, where):
    """Pops the deprecated argument `old` from `kwargs` (None when absent), warning."""
    if old in kwargs:
        warn_deprecated(old, new, where)
    return kwargs.pop(old, None)


def env_flag(name, default=False):
    """The on/off environment variable `name` (unset: `default`); ValueError for another value."""
    if (text := os.environ.get(name)) is None:
        return default
    if (value := text.strip().lower()) not in ON + OFF:
        raise ValueError(f"{name} must be 1, true, yes or on, or else 0, false, no, off or "
                         f"empty. Received: {name}={text!r}")
    return value in ON


def shorten(text, limit=300):
    """`text` (or an error) on one line, cut to `limit` characters, for messages."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_environment():
    """ValueError for an environment variable Keras or TensorFlow would silently misread:
    KERAS_BACKEND, TF_ENABLE_ONEDNN_OPTS, TF_CPP_MIN_LOG_LEVEL."""
    backend, source = os.environ.get("KERAS_BACKEND"), "KERAS_BACKEND"
    if backend is None:  # Keras' own file, as Keras reads it (an unreadable one it ignores)
        source = os.path.join(os.environ.get("KERAS_HOME") or os.path.expanduser(
            os.path.join("~", ".keras")), "keras.json")
        with contextlib.suppress(OSError, ValueError, AttributeError), open(source) as f:
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
        if (value := os.environ.get(name)) is not None and value.strip().lower() not in valid:
            raise ValueError(f"{name} must be {', '.join(valid[:-1])} or {valid[-1]}. "
                             f"Received: {name}={value!r}")
