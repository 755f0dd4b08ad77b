"""The `weights=` argument of the model factories (see `VALID_FORMS`), validated before
any layer is built. A URL may also use ``sha1=``/``md5=``, ``file://`` or ``http://``. With
``include_top=True`` the requested `classes` must equal the weights' (None takes theirs)."""

import dataclasses
import hashlib
import json
import os
import urllib.parse

from keras_preact.architecture import DEFAULTS
from keras_preact.file_io import read_json, user_path
from keras_preact.weights import catalog, local, presets
from keras_preact.weights.download import fetch_weights

VALID_FORMS = ("None, a tag of the model (see `keras-preact weights list`), a path ending in "
               "'.weights.h5' or '.keras', a preset folder, or a URL with its hash "
               "('https://...#sha256=<hex>' or {'url': ..., 'hash': 'sha256:<hex>'})")
DEFAULT_CLASSES = 10
_FACTORY_KEYS = ("classes", "include_top", "input_shape")  # the factory decides these


def _bad(message, weights):
    return ValueError(f"{message} Received: weights={weights!r}. Valid: {VALID_FORMS}")


def url_entry(model, weights):
    """The catalog entry of `model` for a URL-with-hash `weights`, else None; ValueError for
    a URL without a hash, a malformed hash or a file that is not a `.weights.h5`."""
    if isinstance(weights, dict):
        if set(weights) != {"url", "hash"}:
            raise _bad("A `weights` dict needs exactly the keys 'url' and 'hash'.", weights)
        url, hash_value = weights["url"], weights["hash"]
    elif isinstance(weights, str) and weights.startswith(catalog.URL_SCHEMES):
        url, _, fragment = weights.partition("#")
        if "=" not in fragment:
            raise _bad("A weights URL needs its hash, e.g. "
                       "'https://host/file.weights.h5#sha256=<hex>'.", weights)
        hash_value = dict(zip(("algorithm", "value"), fragment.split("=", 1)))
    else:
        return None
    if not isinstance(url, str) or not url.startswith(catalog.URL_SCHEMES):
        raise _bad(f"The weights URL must start with one of {list(catalog.URL_SCHEMES)}.", weights)
    hash_value = catalog.parse_hash(hash_value, what=f"the weights at {url}")
    if not urllib.parse.urlparse(url).path.endswith(local.WEIGHTS_SUFFIX):
        raise ValueError("A weights URL must point to a keras-preact '.weights.h5' file "
                         "(published files of other formats need a catalog entry with a "
                         f"converter). Received: url={url!r}")
    digest = hashlib.sha256(f"{url}#{hash_value.value}".encode()).hexdigest()[:16]
    return catalog.validate_entry(
        {"model": model, "tag": f"url-{digest}", "url": url, "hash": hash_value,
         "converter": "keras_weights", "converter_args": {"verbatim": True}}, strict=False)


@dataclasses.dataclass(frozen=True)
class WeightsRequest:
    """A factory's `weights` argument with what it is checked against: `kwargs`, the other
    `PreActResNet` arguments (read only), and `fixed`, those the model's name fixes."""

    weights: object
    model: str
    include_top: bool
    classes: object
    input_shape: object
    channels_last: bool
    kwargs: dict
    fixed: dict

    def bad(self, message):
        return ValueError(f"{message} Received: weights={self.weights!r}")

    def classes_or_default(self):
        return DEFAULT_CLASSES if self.classes is None else self.classes


def plan_weights(request):
    """Validates `request.weights` against the other factory arguments; builds nothing.
    The weights' recorded architecture, preprocessing and input shape are planned in
    unless passed (ValueError for a conflicting one). Returns a dict: "kind" (None,
    "entry", "url", "weights_h5", "keras" or "preset"), "classes", "overrides", "entry", "path"."""
    weights = request.weights
    plan = {"kind": None, "classes": request.classes_or_default(), "overrides": {},
            "entry": None, "path": None}
    if weights is None:
        return plan
    if (entry := url_entry(request.model, weights)) is not None:
        # The classes are checked once the verified file is there.
        return {**plan, "kind": "url", "classes": request.classes, "entry": entry}
    if not isinstance(weights, (str, os.PathLike)):
        raise _bad("`weights` has an unsupported type.", weights)
    if catalog.looks_like_tag(weights := os.fspath(weights)):
        plan.update(kind="entry", entry=(entry := catalog.resolve_tag(request.model, weights)))
        if request.include_top and entry.architecture.get("include_top") is False:
            raise ValueError(f"The weights {entry.key!r} have no classifier head (a feature-"
                             "extraction file, e.g. keras.applications' '_notop'); use "
                             "include_top=False. Received: include_top=True, "
                             f"weights={request.weights!r}")
        info = {"in_channels": None if entry.input_shape is None else entry.input_shape[-1],
                "classes": entry.classes, "preprocessing": entry.preprocessing,
                "input_shape": entry.input_shape, "architecture": entry.architecture}
        _apply(plan, request, info, f"weights {entry.key!r}")
        return plan
    kind, path = local_weights(weights)
    plan.update(kind=kind, path=path)
    _apply(plan, request, recorded_info(kind, path))
    return plan


def local_weights(weights):
    """``(kind, path)`` of a local `weights` path: "preset" (a preset folder), "keras" (a
    `.keras` file) or "weights_h5" (a checked `.weights.h5`, also a preset's); ValueError for
    a missing `.keras` file or another path."""
    path = user_path(weights)
    if os.path.isfile(config := os.path.join(path, presets.CONFIG_FILE)):
        if "train_config" not in read_json(config):
            return "preset", path
        # A training run's workdir: its final model (model.keras, `keras_preact.training`).
        if not os.path.isfile(final := os.path.join(path, "model.keras")):
            raise _bad(f"{path} is a training run's workdir without its final model.keras (not "
                       "finished?): pass one of its checkpoints/*.weights.h5.", weights)
        return "keras", final
    if (path := local.preset_weights(path)).endswith(local.KERAS_SUFFIX):
        if not os.path.isfile(path):
            raise _bad("The .keras file does not exist.", weights)
        return "keras", path
    if not path.endswith(local.WEIGHTS_SUFFIX):
        raise _bad("`weights` must be None, a path to a Keras weights file ending in "
                   f"'{local.WEIGHTS_SUFFIX}', a model file ending in '{local.KERAS_SUFFIX}' "
                   "or a preset folder.", weights)
    return "weights_h5", local.resolve_weights_argument(path)


def recorded_info(kind, path):
    """What the local weights of `local_weights` record: a dict like `local.config_info`'s
    (a `.weights.h5` records its shapes and, if keras-preact saved it, its architecture and
    defaults); None for a `.keras` file of another model."""
    if kind == "preset":
        return local.config_info(presets.model_config(path))
    if kind == "keras":
        return local.keras_file_info(path)
    shapes = local.inspect_weights_file(path)
    _, architecture, defaults = local.read_recorded(path)
    return {**(defaults or {}), **shapes, "architecture": architecture or {}}


def _same(a, b):
    """Equal as recorded (a tuple equals the list a file records)."""
    return json.dumps(a, default=str) == json.dumps(b, default=str)


def _apply(plan, request, info, name="weights"):
    """Checks what the weights record (`info`: input channels, stem, classes, architecture;
    None: nothing) against the request, and plans in their architecture, preprocessing and
    input shape."""
    if info is None:  # a .keras file of another model
        return
    shape, channels = request.input_shape, info["in_channels"]
    want = None if shape is None else shape[-1] if request.channels_last else shape[0]
    if None not in (want, channels) and want != channels:
        raise ValueError(
            f"The {name} expect {channels}-channel input, but the model was asked for {want} "
            f"channels. Received: input_shape={tuple(shape)}, weights={request.weights!r}")
    stem = {**DEFAULTS, **request.fixed, **request.kwargs}["stem_filters"]
    if info.get("stem_filters", stem) != stem:
        raise request.bad(f"The weights have a stem of {info['stem_filters']} filters; this "
                          f"model has {stem}.")
    plan["classes"] = _resolve_classes(info["classes"], request)
    fixed, kwargs, overrides = request.fixed, request.kwargs, plan["overrides"]
    for key, value in info["architecture"].items():
        # None: not recorded (an older file). A value the model's name fixes must only match.
        if key in _FACTORY_KEYS or value is None or key in fixed and _same(fixed[key], value):
            continue
        if key in fixed:
            raise request.bad("The weights file does not match the architecture of this model: "
                              f"it was made for {key}={value!r}, the model has {key}="
                              f"{fixed[key]!r}. Nothing was loaded.")
        if key in kwargs and not _same(kwargs[key], value):
            raise ValueError(f"The weights were made for {key}={value!r}. Received: {key}="
                             f"{kwargs[key]!r}, weights={request.weights!r}. Pass "
                             f"{key}={value!r} or leave {key} out.")
        overrides[key] = value
    if info.get("preprocessing") is not None and "preprocessing" not in kwargs:
        overrides["preprocessing"] = info["preprocessing"]
    if request.input_shape is None and (shape := info.get("input_shape")) is not None:
        recorded_last = info.get("data_format", "channels_last") == "channels_last"
        h, w, c = shape if recorded_last else (shape[1], shape[2], shape[0])
        overrides["input_shape"] = (h, w, c) if request.channels_last else (c, h, w)


def _resolve_classes(weights_classes, request):
    if not request.include_top:
        return request.classes_or_default()
    if weights_classes is None:
        raise ValueError("The weights have no classifier head; use include_top=False. "
                         f"Received: include_top=True, weights={request.weights!r}")
    if request.classes not in (None, weights_classes):
        raise ValueError(f"The weights' classifier has {weights_classes} classes. Received: "
                         f"classes={request.classes}. Pass classes={weights_classes} (or leave it "
                         "out), or include_top=False to reuse the features.")
    return weights_classes


def materialize(plan, request, *, build):
    """Fetches the plan's catalog or URL weights with `fetch_weights` (a URL's file then
    planned like a local one); returns the local path or None."""
    if plan["kind"] in ("entry", "url"):
        plan["path"] = fetch_weights(plan["entry"], build=build)
        if plan["kind"] == "url":
            _apply(plan, request, recorded_info("weights_h5", plan["path"]))
    return plan["path"]


def load_planned_weights(model, plan):
    """Loads the plan's weights into `model` (mismatch: ValueError)."""
    if plan["kind"] == "keras":
        source = local.load_keras_file(plan["path"])
        local.copy_weights_from_model(source, model, source_label=plan["path"])
    elif plan["kind"] == "preset":
        presets.load_preset_weights(model, plan["path"])
    elif plan["kind"] is not None:
        local.load_weights_file(model, plan["path"])
    return model
