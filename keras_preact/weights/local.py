"""Local `.weights.h5` and `.keras` files, checked before anything loads. Keras matches
`.weights.h5` variables by creation order, so another architecture with equal shapes would
load silently wrong: `save_weights_file` records the variable paths and architecture
arguments, which `load_weights_file` compares. `.keras` files must hold no Lambda layer."""

import io
import itertools
import json
import os
import zipfile

import h5py
import keras

from keras_preact import private_api
from keras_preact.architecture import (DEFAULTS, HEAD_LAYER, HEAD_PATH, STEM_KERNEL_PATH,
                                       WEIGHTS_ARGUMENTS, WEIGHTS_ARGUMENTS_IF_SET)
from keras_preact.checks import shorten
from keras_preact.file_io import atomic_write_bytes, user_path

WEIGHTS_SUFFIX, KERAS_SUFFIX = ".weights.h5", ".keras"
#: Root attributes of the `.weights.h5` files keras-preact saves (see `record_model`).
LAYOUT_ATTR, ARCHITECTURE_ATTR, DEFAULTS_ATTR = (
    "keras_preact_layout", "keras_preact_architecture", "keras_preact_defaults")
#: Architecture keys older files record under another name.
RENAMED_KEYS = {"first_unit_shared_preact": "first_shared_preact"}
#: Arguments recorded only when not at this default (older files lack them); ``stem`` only
#: as "imagenet_preact" (the other stems have other variables).
OPTIONAL_ARCHITECTURE_KEYS = {**{k: DEFAULTS[k] for k in WEIGHTS_ARGUMENTS_IF_SET}, "stem": None}
PRESET_WEIGHTS = "model.weights.h5"  # the weights of a preset folder (`weights.presets`)


def open_hdf5(path, mode="r"):
    """The h5py file at `path` (use it in a ``with`` block); ValueError naming it when it is
    damaged or truncated."""
    try:
        return h5py.File(path, mode)
    except OSError as err:
        raise ValueError(f"The weights file {path} cannot be read ({shorten(err)}): it is "
                         "damaged or incomplete (an interrupted copy or download?); copy or "
                         "fetch it again.") from None


def preset_weights(path):
    """The weights file of a preset folder `path`, else `path` itself; ValueError for a
    folder that is not a preset."""
    if not path or not os.path.isdir(path):
        return path
    if not os.path.isfile(file := os.path.join(path, PRESET_WEIGHTS)):
        raise ValueError(f"The folder is not a preset: it holds no {PRESET_WEIGHTS}. Received: "
                         f"weights={path!r}. Valid: a preset folder (`save_preset`), a "
                         f"'{WEIGHTS_SUFFIX}' or '{KERAS_SUFFIX}' file")
    return file


def resolve_weights_argument(weights):
    """A factory's `weights` (None, a `.weights.h5` path or a preset folder) as None or the
    file's absolute path.

    Args:
        weights: None, or a str or `os.PathLike`: a `.weights.h5` file or a preset folder
            (its weights file is taken).

    Returns:
        None for None, else str: the weights file's absolute path.

    Raises:
        ValueError: for another value, a folder that is not a preset, or a missing or
            non-HDF5 file."""
    if weights is None:
        return None
    path = preset_weights(os.fspath(weights) if isinstance(weights, (str, os.PathLike)) else "")
    if not path.endswith(WEIGHTS_SUFFIX):
        raise ValueError("`weights` must be None or a path to a Keras weights file ending in "
                         f"'{WEIGHTS_SUFFIX}'. Received: weights={weights!r}")
    if not os.path.isfile(path := os.path.abspath(path)):
        raise ValueError(f"The weights file does not exist. Received: weights={weights!r}")
    if not h5py.is_hdf5(path):
        raise ValueError("The weights file is not an HDF5 file (corrupt or of another format). "
                         f"Received: weights={weights!r}")
    return path


def inspect_weights_file(path):
    """The stem and head shapes of a keras-preact `.weights.h5` file.

    Args:
        path: str or `os.PathLike`, the `.weights.h5` file.

    Returns:
        dict: "in_channels", "stem_filters", "kernel_size" and "classes" (None without a
        head), as ints.

    Raises:
        ValueError: for another file, or one that is damaged or truncated."""
    with open_hdf5(path) as f:
        if (stem := f.get(STEM_KERNEL_PATH)) is None or len(stem.shape) != 4:
            raise ValueError("The weights file does not hold a keras-preact model's weights (no "
                             f"stem convolution found). Received: weights={path!r}")
        dense = f.get(HEAD_PATH + "vars/0")
        return {"kernel_size": int(stem.shape[0]), "in_channels": int(stem.shape[2]),
                "stem_filters": int(stem.shape[3]),
                "classes": None if dense is None else int(dense.shape[1])}


def model_layout(model):
    """``[[path, shape], ...]`` of the model's variables in creation order, without its name."""
    prefix = model.name + "/"
    return [[v.path.removeprefix(prefix), [int(d) for d in v.shape]] for v in model.weights]


def model_architecture(model):
    """The `architecture_record` of a `PreActResNet` (told apart by its config), else None."""
    try:
        config = model.get_config() or {}
    except NotImplementedError:
        return None
    return architecture_record(config) if set(WEIGHTS_ARGUMENTS) <= set(config) else None


def architecture_record(config, *, only_set=True):
    """The architecture arguments of a `PreActResNet` config as files record them: the
    `OPTIONAL_ARCHITECTURE_KEYS` only when not at their default, unless `only_set` is False."""
    out = {k: _jsonable(config.get(k)) for k in WEIGHTS_ARGUMENTS}
    for key, default in OPTIONAL_ARCHITECTURE_KEYS.items():
        value = config.get(key, default)
        value = default if key == "stem" and value != "imagenet_preact" else value
        if not only_set or value != default:
            out[key] = _jsonable(value)
    return out


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def has_head(model):
    """Whether `model` has the classifier head layer."""
    return any(layer.name == HEAD_LAYER for layer in getattr(model, "layers", []))


def save_weights_file(model, path):
    """Saves `model`'s weights to `path` as a Keras `.weights.h5` with its layout recorded
    (see `record_model`).

    Args:
        model: a built Keras model.
        path: str or `os.PathLike`, the file to write, ending in '.weights.h5'.

    Returns:
        str: the absolute path.

    Raises:
        ValueError: for a `path` not ending in '.weights.h5', or a model that is not
            built.
        TypeError: if `path` is not a path."""
    if not (path := user_path(path)).endswith(WEIGHTS_SUFFIX):
        raise ValueError(f"A weights file name must end in '{WEIGHTS_SUFFIX}'. "
                         f"Received: path={path!r}")
    if not model.built:
        raise ValueError("The model is not built: call it on data or `build()` it first.")
    # Written in memory, then to disk: HDF5 crashes the process on a full disk.
    data = io.BytesIO()
    private_api.write_weights_h5(model, data)
    record_model(model, data)
    atomic_write_bytes(path, data.getvalue())
    return path


def record_model(model, path):
    """Records, as root attributes of the `.weights.h5` at `path` (or file object), `model`'s
    variables (path and shape) in creation order and, for a `PreActResNet`, its architecture
    arguments, preprocessing, input shape and data format."""
    with open_hdf5(path, "a") as f:
        f.attrs[LAYOUT_ATTR] = json.dumps(model_layout(model))
        if (arch := model_architecture(model)) is not None:
            f.attrs[ARCHITECTURE_ATTR] = json.dumps(arch)
            config = model.get_config()
            f.attrs[DEFAULTS_ATTR] = json.dumps(
                {k: config.get(k) for k in ("preprocessing", "input_shape", "data_format")})


def read_recorded(path):
    """The (layout, architecture, defaults) `record_model` wrote into a file, or Nones."""
    with open_hdf5(path) as f:
        layout, arch, defaults = (None if f.attrs.get(n) is None else json.loads(f.attrs[n])
                                  for n in (LAYOUT_ATTR, ARCHITECTURE_ATTR, DEFAULTS_ATTR))
    return layout, arch and {RENAMED_KEYS.get(k, k): v for k, v in arch.items()}, defaults


def _h5_datasets(path):
    """Dataset name -> shape, without the optimizer's state (in training checkpoints)."""
    names = []
    with open_hdf5(path) as f:
        f.visit(names.append)
        return {n: [int(d) for d in f[n].shape] for n in names
                if isinstance(f[n], h5py.Dataset) and not n.startswith("optimizer")}


def first_difference(expected, found):
    """``(index, expected, found)`` where two lists first differ (None past a list's end)."""
    pairs = enumerate(itertools.zip_longest(expected, found))
    return next((i, a, b) for i, (a, b) in pairs if a != b)


def _mismatch(model, path, detail):
    return ValueError(f"The weights file does not match the architecture of {model.name!r}: "
                      f"{detail}. Nothing was loaded. Received: weights={path!r}")


def _is_head(path):
    return path.startswith(HEAD_LAYER + "/")


def compare_layouts(model, stored_layout, stored_arch, *, source, trunk_only=False):
    """Raises ValueError unless a stored architecture and layout fit `model` (without a
    head, or with `trunk_only`, the head's variables are skipped)."""
    arch = model_architecture(model)
    if arch is not None and stored_arch is not None:  # first: it names what the file is for
        stored, own = (architecture_record(a, only_set=False) for a in (stored_arch, arch))
        if diff := sorted(k for k in own if stored[k] != own[k]):
            made, has = (", ".join(f"{k}={d[k]!r}" for k in diff) for d in (stored, own))
            raise _mismatch(model, source, f"it was made for {made}, the model has {has}")
    expected = [x for x in model_layout(model) if not (trunk_only and _is_head(x[0]))]
    found = [[p, list(s)] for p, s in stored_layout
             if not ((trunk_only or not has_head(model)) and _is_head(p))]
    if found != expected:
        i, want, got = first_difference(expected, found)
        raise _mismatch(model, source, f"the file holds {len(found)} variables, the model "
                        f"{len(expected)}; the first difference is variable {i} "
                        f"(model: {want}, file: {got})")


def check_weights_file_layout(model, path):
    """Raises ValueError unless the `.weights.h5` at `path` fits `model` exactly.

    Args:
        model: the Keras model the file is meant for.
        path: str or `os.PathLike`, the `.weights.h5` file.

    Returns:
        str: how it was checked: "recorded" (a file of `save_weights_file`: by variable
        paths) or "structure" (another Keras file: by its datasets and shapes).

    Raises:
        ValueError: if the file does not fit `model`, or is damaged or truncated."""
    layout, arch, _ = read_recorded(path)
    if layout is not None:
        compare_layouts(model, layout, arch, source=path)
        return "recorded"
    own = io.BytesIO()  # what `model.save_weights` would write
    private_api.write_weights_h5(model, own)
    expected, found = _h5_datasets(own), _h5_datasets(path)
    if not has_head(model):
        found = {k: v for k, v in found.items() if k in expected or not k.startswith(HEAD_PATH)}
    if found != expected:
        missing = sorted(set(expected) - set(found))[:3]
        extra = sorted(set(found) - set(expected))[:3]
        shapes = sorted(k for k in set(found) & set(expected) if found[k] != expected[k])[:3]
        raise _mismatch(model, path, f"the file holds {len(found)} variables, the model "
                        f"{len(expected)} (missing in the file: {missing}; not in the model: "
                        f"{extra}; other shapes: {[(k, found[k], expected[k]) for k in shapes]})")
    return "structure"


def load_weights_file(model, path):
    """Loads `path` into `model` after `check_weights_file_layout` (nothing loads on error).

    Args:
        model: the Keras model to load into.
        path: str or `os.PathLike`, the `.weights.h5` file.

    Returns:
        None.

    Raises:
        ValueError: if the file does not fit `model`, or is damaged or truncated."""
    check_weights_file_layout(model, path)
    try:
        model.load_weights(path)
    except ValueError as err:
        raise _mismatch(model, path, str(err)) from None


def read_keras_file_config(path, *, allow_lambda=False):
    """The model config of a `.keras` file, built into nothing; ValueError for a missing or
    damaged file, or (unless `allow_lambda`) one holding a Lambda layer."""
    if os.path.isdir(path):
        model = os.path.join(path, "model.keras")
        hint = f": give its model.keras ({model})" if os.path.isfile(model) else ""
        raise ValueError(f"{path} is a folder, not a .keras file{hint}. Received: path={path!r}")
    if not os.path.isfile(path):
        raise ValueError(f"The .keras file does not exist. Received: path={path!r}")
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, json.JSONDecodeError):
        raise ValueError(f"The file {path} is not a whole Keras .keras archive (no readable "
                         "config.json): it is damaged or incomplete (an interrupted copy?), or "
                         f"of another format. Received: path={path!r}") from None
    if not allow_lambda and (lambdas := list(_find_class(config, "Lambda"))):
        raise ValueError(
            f"The .keras file holds a Lambda layer ({lambdas[0]!r}); Lambda layers run "
            "arbitrary Python code, so keras-preact refuses to load them (it loads "
            "model files only with safe_mode=True). Re-save the model without the "
            f"Lambda layer, or save its weights as a .weights.h5. Received: path={path!r}")
    return config


def _find_class(node, class_name):
    """The names of the layers of class `class_name` in a nested config."""
    if isinstance(node, dict):
        if node.get("class_name") == class_name:
            yield (node.get("config") or {}).get("name", class_name)
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            yield from _find_class(value, class_name)


def keras_file_info(path):
    """What the config of a `.keras` file holding a `PreActResNet` records: a dict like
    `inspect_weights_file`'s plus its defaults and architecture; None for another model."""
    return config_info(read_keras_file_config(path))


def config_info(config):
    """`keras_file_info` of a serialized model config."""
    if config.get("class_name") != "PreActResNet":
        return None
    inner = config.get("config", {})
    shape = inner.get("input_shape") or [None, None, 3]
    data_format = inner.get("data_format", "channels_last")
    return {"in_channels": shape[-1] if data_format == "channels_last" else shape[0],
            "stem_filters": inner.get("stem_filters", DEFAULTS["stem_filters"]),
            "classes": (inner.get("classes")
                        if inner.get("include_top", DEFAULTS["include_top"]) else None),
            "preprocessing": inner.get("preprocessing"), "input_shape": inner.get("input_shape"),
            "data_format": data_format, "architecture": architecture_record(inner)}


def load_keras_file(path, *, compile=False, safe_mode=True):
    """Loads a `.keras` model file checked by `read_keras_file_config` (with `safe_mode`,
    Lambda layers are refused); ValueError naming a file that cannot be loaded."""
    path = user_path(path)
    read_keras_file_config(path, allow_lambda=not safe_mode)
    try:
        return keras.saving.load_model(path, compile=compile, safe_mode=safe_mode)
    except Exception as err:  # Keras raises several types for a bad archive.
        raise ValueError(f"Cannot load the .keras file ({type(err).__name__}: {err}). "
                         f"Received: path={path!r}") from None


def copy_weights_from_model(source, target, *, source_label):
    """Assigns `source`'s weights to `target` (without a head on either side: all but the
    head's); ValueError, with nothing assigned, if `compare_layouts` finds a difference."""
    trunk_only = not (has_head(source) and has_head(target))
    compare_layouts(target, model_layout(source), model_architecture(source),
                    source=source_label, trunk_only=trunk_only)
    # Equal layouts: one to one, in order. Copies: JAX deletes an array a compiled step donates.
    for variable, value in zip(*([v for v in m.weights if not (trunk_only and _is_head(v.path))]
                                 for m in (target, source))):
        variable.assign(keras.ops.copy(value))
