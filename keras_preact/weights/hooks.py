"""The `weights=` argument of the model factories.

Accepted forms (validated before any layer is built):

- None: random He initialisation;
- a catalog tag of the model ("cifar10", "cifar100", "svhn", "imagenet",
  "DEFAULT") or a full key ("preact_resnet110.cifar10");
- a local `.weights.h5` path;
- a local `.keras` path: loaded with ``safe_mode=True`` (Lambda layers refused), its
  weights go into the factory's architecture and any mismatch fails loudly;
- a URL plus its hash, as ``"https://host/file.weights.h5#sha256=<hex>"`` (also
  ``sha1=`` or ``md5=``; ``file://`` and ``http://`` too) or as a dict
  ``{"url": ..., "hash": "sha256:<hex>"}``. The file must be a keras-preact
  `.weights.h5` of the factory's architecture; it is verified and cached like the
  catalog's files.

With ``include_top=True`` the requested `classes` must equal the weights' classes
(``classes=None`` takes the weights'). The weights' preprocessing (catalog entries,
`.keras` files, and `.weights.h5` files written by keras-preact) is built into the
model unless `preprocessing=` is passed.
"""

import hashlib
import json
import os
import urllib.parse

from keras_preact.weights import catalog
from keras_preact.weights import local

VALID_FORMS = (
    "None, a tag of the model (see `keras-preact weights list`), a path ending in "
    "'.weights.h5' or '.keras', or a URL with its hash ('https://...#sha256=<hex>' "
    "or {'url': ..., 'hash': 'sha256:<hex>'})"
)
DEFAULT_CLASSES = 10


def _bad(message, weights):
    return ValueError(f"{message} Received: weights={weights!r}. Valid: {VALID_FORMS}")


def parse_url_weights(weights):
    """Returns (url, hash dict) for a URL-with-hash `weights`, or None otherwise.

    Raises:
        ValueError: for a URL without a hash, or a malformed hash.
    """
    if isinstance(weights, dict):
        if set(weights) != {"url", "hash"}:
            raise _bad("A `weights` dict needs exactly the keys 'url' and 'hash'.", weights)
        url, hash_value = weights["url"], weights["hash"]
    elif isinstance(weights, str) and weights.startswith(catalog.URL_SCHEMES):
        url, _, fragment = weights.partition("#")
        algorithm, sep, value = fragment.partition("=")
        if not sep:
            raise _bad(
                "A weights URL needs its hash, e.g. 'https://host/file.weights.h5#sha256=<hex>'.",
                weights,
            )
        hash_value = {"algorithm": algorithm, "value": value}
    else:
        return None
    if not isinstance(url, str) or not url.startswith(catalog.URL_SCHEMES):
        raise _bad(f"The weights URL must start with one of {list(catalog.URL_SCHEMES)}.", weights)
    return url, catalog.parse_hash(hash_value, what=f"the weights at {url}")


def url_entry(model, url, hash_value):
    """The entry dict of a URL-with-hash `weights` argument (cached as published)."""
    digest = hashlib.sha256(f"{url}#{hash_value['value']}".encode()).hexdigest()[:16]
    name = os.path.basename(urllib.parse.urlparse(url).path)
    if not name.endswith(local.WEIGHTS_SUFFIX):
        raise ValueError(
            "A weights URL must point to a keras-preact '.weights.h5' file (published "
            "files of other formats need a catalog entry with a converter). "
            f"Received: url={url!r}"
        )
    return catalog.validate_entry(
        {
            "model": model,
            "tag": f"url-{digest}",
            "url": url,
            "hash": hash_value,
            "converter": "keras_weights",
            "converter_args": {"verbatim": True},
        },
        strict=False,
    )


def plan_weights(weights, *, model, include_top, classes, input_shape, channels_last, kwargs,
                 fixed):
    """Validates `weights` against the other factory arguments; builds nothing.

    Weights that record their architecture and preprocessing (catalog entries,
    `.keras` files, `.weights.h5` files written by keras-preact) are planned with
    them: the caller's explicit arguments win where they don't conflict (e.g.
    `preprocessing=None`); a conflicting architecture argument is a ValueError
    that says which value to pass.

    Args:
        weights: the factory's `weights` argument.
        model: the registered model name (for tags).
        include_top, classes: the factory's arguments (`classes` may be None).
        input_shape: the requested input shape or None.
        channels_last: bool, the data format.
        kwargs: the other `PreActResNet` arguments (read, not changed).
        fixed: the `PreActResNet` arguments the model's name fixes (its depth,
            unit type and widths).

    Returns:
        dict: "kind" (None, "entry", "url", "weights_h5" or "keras"), "classes"
        (resolved), "overrides" (arguments to add: the weights' architecture,
        preprocessing and input shape), and "entry" / "path" where they apply.

    Raises:
        ValueError: naming the argument, the value and what is valid.
    """
    plan = {"kind": None, "classes": classes, "overrides": {}, "entry": None, "path": None}
    if weights is None:
        plan["classes"] = DEFAULT_CLASSES if classes is None else classes
        return plan
    parsed = parse_url_weights(weights)
    if parsed is not None:
        plan.update(kind="url", entry=url_entry(model, *parsed))
        return plan  # classes are checked once the verified file is there
    if not isinstance(weights, (str, os.PathLike)):
        raise _bad("`weights` has an unsupported type.", weights)
    weights = os.fspath(weights)
    if catalog.looks_like_tag(weights):
        entry = catalog.resolve_tag(model, weights)
        plan.update(kind="entry", entry=entry)
        _apply_entry(plan, entry, include_top=include_top, classes=classes,
                     input_shape=input_shape, channels_last=channels_last, kwargs=kwargs,
                     fixed=fixed, weights=weights)
        return plan
    path = os.path.abspath(os.path.expanduser(weights))
    if weights.endswith(local.KERAS_SUFFIX):
        if not os.path.isfile(path):
            raise _bad("The .keras file does not exist.", weights)
        info = local.keras_file_info(path)
        plan.update(kind="keras", path=path)
        if info is not None:
            _check_info(plan, info, include_top=include_top, classes=classes,
                        input_shape=input_shape, channels_last=channels_last,
                        kwargs=kwargs, weights=weights)
            _apply_recorded(plan, info, info["architecture"], input_shape=input_shape,
                            channels_last=channels_last, kwargs=kwargs, fixed=fixed,
                            weights=weights)
        else:
            plan["classes"] = DEFAULT_CLASSES if classes is None else classes
        return plan
    if not weights.endswith(local.WEIGHTS_SUFFIX):
        raise _bad(
            "`weights` must be None or a path to a Keras weights file ending in "
            f"'{local.WEIGHTS_SUFFIX}' or a model file ending in '{local.KERAS_SUFFIX}'.",
            weights,
        )
    path = local.resolve_weights_argument(path)
    plan.update(kind="weights_h5", path=path)
    check_h5_plan(plan, include_top=include_top, classes=classes, input_shape=input_shape,
                  channels_last=channels_last, kwargs=kwargs, fixed=fixed, weights=weights)
    return plan


def check_h5_plan(plan, *, include_top, classes, input_shape, channels_last, kwargs, fixed,
                  weights):
    """Fills `plan` from a local `.weights.h5`'s stem, head and recorded facts."""
    info = local.inspect_weights_file(plan["path"])
    _check_info(plan, info, include_top=include_top, classes=classes, input_shape=input_shape,
                channels_last=channels_last, kwargs=kwargs, weights=weights)
    recorded = local.read_recorded_defaults(plan["path"])
    _, architecture = local.read_recorded_layout(plan["path"])
    _apply_recorded(plan, recorded, architecture or {}, input_shape=input_shape,
                    channels_last=channels_last, kwargs=kwargs, fixed=fixed, weights=weights)


def _same(a, b):
    """Equal as recorded (a tuple argument equals the list a file records)."""
    return json.dumps(a, default=str) == json.dumps(b, default=str)


def _apply_architecture(plan, architecture, *, kwargs, fixed, weights):
    """Plans the weights' architecture arguments (those the factory doesn't decide).

    Raises:
        ValueError: when the weights belong to another network (a `fixed` argument
            differs) or the caller passed a conflicting value.
    """
    for key, value in architecture.items():
        if key in _FACTORY_KEYS or value is None:  # None: not recorded (an older file)
            continue
        if key in fixed:
            if not _same(fixed[key], value):
                raise ValueError(
                    "The weights file does not match the architecture of this model: it "
                    f"was made for {key}={value!r}, the model has {key}={fixed[key]!r}. "
                    f"Nothing was loaded. Received: weights={weights!r}"
                )
        elif key in kwargs and not _same(kwargs[key], value):
            raise ValueError(
                f"The weights were made for {key}={value!r}. Received: {key}="
                f"{kwargs[key]!r}, weights={weights!r}. Pass {key}={value!r} or leave "
                f"{key} out."
            )
        else:
            plan["overrides"][key] = value


def _apply_recorded(plan, recorded, architecture, *, input_shape, channels_last, kwargs, fixed,
                    weights):
    """The file's architecture, and its preprocessing and input size unless given
    explicitly."""
    _apply_architecture(plan, architecture, kwargs=kwargs, fixed=fixed, weights=weights)
    if recorded.get("preprocessing") is not None and "preprocessing" not in kwargs:
        plan["overrides"]["preprocessing"] = recorded["preprocessing"]
    shape = recorded.get("input_shape")
    if input_shape is None and shape is not None:
        recorded_last = recorded.get("data_format", "channels_last") == "channels_last"
        h, w, c = shape if recorded_last else (shape[1], shape[2], shape[0])
        plan["overrides"]["input_shape"] = (h, w, c) if channels_last else (c, h, w)


def _channels(input_shape, channels_last):
    if input_shape is None:
        return None
    return input_shape[-1] if channels_last else input_shape[0]


def _check_info(plan, info, *, include_top, classes, input_shape, channels_last, kwargs, weights):
    want = _channels(input_shape, channels_last)
    if want is not None and info["in_channels"] is not None and want != info["in_channels"]:
        raise ValueError(
            f"The weights expect {info['in_channels']}-channel input, but the model "
            f"was asked for {want} channels. Received: input_shape with {want} "
            f"channels, weights={weights!r}"
        )
    stem = kwargs.get("stem_filters", 16)
    if info["stem_filters"] != stem:
        raise ValueError(
            f"The weights have a stem of {info['stem_filters']} filters; this model "
            f"has {stem}. Received: weights={weights!r}"
        )
    plan["classes"] = _resolve_classes(info["classes"], include_top, classes, weights)


def _resolve_classes(weights_classes, include_top, classes, weights):
    if not include_top:
        return DEFAULT_CLASSES if classes is None else classes
    if weights_classes is None:
        raise ValueError(
            "The weights have no classifier head; use include_top=False. "
            f"Received: include_top=True, weights={weights!r}"
        )
    if classes is None:
        return weights_classes
    if classes != weights_classes:
        raise ValueError(
            f"The weights' classifier has {weights_classes} classes. Received: "
            f"classes={classes}. Pass classes={weights_classes} (or leave it out), or "
            "include_top=False to reuse the features."
        )
    return classes


#: Entry architecture keys the factory itself decides.
_FACTORY_KEYS = ("classes", "include_top", "input_shape")


def _apply_entry(plan, entry, *, include_top, classes, input_shape, channels_last, kwargs, fixed,
                 weights):
    if include_top and (entry.get("architecture") or {}).get("include_top") is False:
        raise ValueError(
            f"The weights {entry['key']!r} have no classifier head (a feature-extraction "
            "file, e.g. keras.applications' '_notop'); use include_top=False. "
            f"Received: include_top=True, weights={weights!r}"
        )
    plan["classes"] = _resolve_classes(entry.get("classes"), include_top, classes, weights)
    overrides = plan["overrides"]
    _apply_architecture(plan, entry.get("architecture") or {}, kwargs=kwargs, fixed=fixed,
                        weights=weights)
    if "preprocessing" not in kwargs and entry.get("preprocessing") is not None:
        overrides["preprocessing"] = entry["preprocessing"]
    size = entry.get("input_size")
    if size is not None:
        channels = size[-1]
        want = _channels(input_shape, channels_last)
        if want is not None and want != channels:
            raise ValueError(
                f"The weights {entry['key']!r} expect {channels}-channel input, but the "
                f"model was asked for {want} channels. Received: input_shape="
                f"{tuple(input_shape)}"
            )
        if input_shape is None:
            h, w, c = size
            overrides["input_shape"] = (h, w, c) if channels_last else (c, h, w)


def materialize(plan, *, build, include_top, classes, input_shape, channels_last, kwargs, fixed,
                weights):
    """Fetches what the plan needs (catalog or URL weights); returns the local path.

    For URL weights the verified file's classes are checked here, still before the
    model is built. `build` is `fetch_weights`' model builder (the factory's
    `get_model`). Returns None for ``weights=None``.
    """
    if plan["kind"] is None:
        return None
    if plan["kind"] in ("entry", "url"):
        from keras_preact.weights.download import fetch_weights

        path = fetch_weights(plan["entry"], build=build)
        plan["path"] = path
        if plan["kind"] == "url":
            check_h5_plan(plan, include_top=include_top, classes=classes,
                          input_shape=input_shape, channels_last=channels_last,
                          kwargs=kwargs, fixed=fixed, weights=weights)
        return path
    return plan["path"]


def load_planned_weights(model, plan):
    """Loads the plan's weights into the freshly built `model` (mismatch: ValueError)."""
    if plan["kind"] is None:
        return model
    if plan["kind"] == "keras":
        source = local.load_keras_file(plan["path"])
        local.copy_weights_from_model(source, model, source_label=plan["path"])
        return model
    local.load_weights_file(model, plan["path"])
    return model
