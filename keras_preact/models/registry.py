"""The model registry: every named network, discoverable and buildable by name (the
tests are parametrized over it)."""

import fnmatch

_REGISTRY = {}


def register_model(*, depth, block, family="cifar"):
    """Decorator registering a factory under its function name.

    Args:
        depth: int, the network's depth, recorded for `model_info`; `list_models` sorts by it.
        block: str, the unit type recorded for `model_info` ("basic" or "bottleneck" for
            the package's models).
        family: str, the model family, recorded for `model_info`; `list_models` filters and
            sorts by it. Defaults to `"cifar"`.

    Returns:
        A decorator that registers the factory and returns it unchanged.

    Raises:
        ValueError: from the decorator, when a factory of that name is already registered."""

    def wrap(fn):
        name = fn.__name__
        if name in _REGISTRY:
            raise ValueError(f"Model {name!r} is registered twice.")
        _REGISTRY[name] = {"fn": fn, "depth": depth, "block": block, "family": family}
        return fn

    return wrap


def list_models(pattern=None, family=None):
    """Names of the registered models, shallowest first, optionally filtered.

    Args:
        pattern: str or None, a shell-style pattern the names must match
            (e.g. "preact_resnet1*"). Defaults to `None` (every name).
        family: str or None, only the models of this family ("cifar", "imagenet").
            Defaults to `None` (every family).

    Returns:
        list of str: the names, ordered by family, then depth (shallowest first), then name.

    Raises:
        ValueError: if `pattern` or `family` is neither a string nor None."""
    for name, value in (("pattern", pattern), ("family", family)):
        if not isinstance(value, (str, type(None))):
            raise ValueError(f"`{name}` must be a string or None. Received: {name}={value!r}")
    items = sorted(_REGISTRY.items(), key=lambda kv: (kv[1]["family"], kv[1]["depth"], kv[0]))
    names = [n for n, info in items if family is None or info["family"] == family]
    return names if pattern is None else fnmatch.filter(names, pattern)


def model_info(name):
    """Returns the registry's record of a registered model.

    Args:
        name: str, a registered model name (see `list_models`).

    Returns:
        dict with the keys "name", "depth", "block" and "family".

    Raises:
        ValueError: for an unknown name, listing the valid names."""
    _check_name(name)
    return {"name": name, **{k: _REGISTRY[name][k] for k in ("depth", "block", "family")}}


def get_model(name, **kwargs):
    """Builds a registered model by name.

    Args:
        name: str, a registered model name (see `list_models`).
        **kwargs: forwarded to the model's factory (e.g. `classes`, `weights`).

    Returns:
        The model the factory builds (a `PreActResNet` for the registered networks).

    Raises:
        ValueError: for an unknown name, listing the valid names.

    Example:
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
