"""The model registry: every named network, discoverable and buildable by name (the
tests are parametrized over it)."""

import fnmatch

_REGISTRY = {}


def register_model(*, depth, block, family="cifar"):
    """Decorator registering a factory under its function name."""

    def wrap(fn):
        name = fn.__name__
        if name in _REGISTRY:
            raise ValueError(f"Model {name!r} is registered twice.")
        _REGISTRY[name] = {"fn": fn, "depth": depth, "block": block, "family": family}
        return fn

    return wrap


def list_models(pattern=None, family=None):
    """Names of the registered models, shallowest first, optionally filtered by a
    shell-style `pattern` (e.g. "preact_resnet1*") and `family`."""
    for name, value in (("pattern", pattern), ("family", family)):
        if not isinstance(value, (str, type(None))):
            raise ValueError(f"`{name}` must be a string or None. Received: {name}={value!r}")
    items = sorted(_REGISTRY.items(), key=lambda kv: (kv[1]["family"], kv[1]["depth"], kv[0]))
    names = [n for n, info in items if family is None or info["family"] == family]
    return names if pattern is None else fnmatch.filter(names, pattern)


def model_info(name):
    """Returns {"name", "depth", "block", "family"} of a registered model."""
    _check_name(name)
    return {"name": name, **{k: _REGISTRY[name][k] for k in ("depth", "block", "family")}}


def get_model(name, **kwargs):
    """Builds a registered model by name, `kwargs` forwarded to its factory; ValueError
    listing the valid names for an unknown one:

        >>> import keras_preact
        >>> model = keras_preact.get_model("preact_resnet20", classes=100)
        >>> model.output_shape
        (None, 100)
    """
    _check_name(name)
    return _REGISTRY[name]["fn"](**kwargs)


def _check_name(name):
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"Unknown model name. Received: name={name!r}. Valid: {list_models()}")
