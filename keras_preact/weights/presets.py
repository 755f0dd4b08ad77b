"""Preset folders in keras-hub's layout: ``config.json`` (the Keras config), ``model.weights.h5``
(with its recorded layout, `local.save_weights_file`) and ``metadata.json``. A factory's
``weights=`` takes such a folder; `from_preset` rebuilds the model from it."""

import datetime
import importlib
import json
import os

import keras

from keras_preact.files import atomic_write_json
from keras_preact.weights import local

CONFIG_FILE, METADATA_FILE = "config.json", "metadata.json"
#: Handles fetched file by file, as keras-hub fetches them (its `hub` extra installs both).
REMOTE = {"hf://": "huggingface_hub", "kaggle://": "kagglehub"}


def save_preset(model, preset_dir, *, overwrite=False):
    """Saves `model` (e.g. a `PreActResNet`) as a preset folder; returns its absolute path.

    Args:
        model: a built Keras model whose class is registered with Keras.
        preset_dir: the folder; created if missing.
        overwrite: replace the files of an existing preset.

    Raises FileExistsError for an existing preset without `overwrite`, ValueError for a
    folder that holds other files (nothing is written)."""
    path = os.path.abspath(os.fspath(preset_dir))
    if os.path.isfile(os.path.join(path, CONFIG_FILE)) and not overwrite:
        raise FileExistsError(f"A preset already exists at {path!r}; pass overwrite=True to "
                              "replace it.")
    ours = {CONFIG_FILE, METADATA_FILE, local.PRESET_WEIGHTS}
    if os.path.exists(path) and not (os.path.isdir(path) and set(os.listdir(path)) <= ours):
        raise ValueError(f"Refusing to write a preset into {path!r}: it is a file or a folder "
                         "of other files; choose an empty or new folder. "
                         f"Received: preset_dir={path!r}")
    config = keras.saving.serialize_keras_object(model)
    for key in ("compile_config", "build_config"):
        config.pop(key, None)
    local.save_weights_file(model, os.path.join(path, local.PRESET_WEIGHTS))
    atomic_write_json(os.path.join(path, METADATA_FILE), {
        "keras_version": keras.__version__,
        "keras_preact_version": importlib.import_module("keras_preact").__version__,
        "parameter_count": model.count_params(),
        "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S")})
    # Written last: a folder without it is not a preset.
    atomic_write_json(os.path.join(path, CONFIG_FILE), config)
    return path


def preset_file(preset, name):
    """The local path of file `name` of a preset: a folder, or an ``hf://`` or ``kaggle://``
    handle fetched (and cached) by huggingface_hub or kagglehub."""
    scheme = next((s for s in REMOTE if str(preset).startswith(s)), None)
    if scheme is None:
        return os.path.join(os.path.abspath(os.fspath(preset)), name)
    try:
        hub = importlib.import_module(REMOTE[scheme])
    except ImportError:
        raise ModuleNotFoundError(f"A {scheme} preset needs `{REMOTE[scheme]}` "
                                  '(pip install "keras-preact[hub]").') from None
    handle = preset[len(scheme):]
    if scheme == "hf://":
        return hub.hf_hub_download(repo_id=handle, filename=name)
    return hub.model_download(handle, name)


def from_preset(preset, *, load_weights=True, **kwargs):
    """Builds the model a preset holds, with its weights.

    Args:
        preset: a folder written by `save_preset`, or an ``hf://`` or ``kaggle://`` handle
            of one (needs the ``hub`` extra and the network).
        load_weights: load ``model.weights.h5`` (checked against the model first).
        **kwargs: config values to change, e.g. ``features=True`` for the backbone of the
            same weights.

    Raises ValueError for a folder that is not a preset or weights that do not fit."""
    config_path = preset_file(preset, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(f"Not a preset: {config_path!r} does not exist. Received: "
                         f"preset={preset!r}")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["config"] = {**config.get("config", {}), **kwargs}
    model = keras.saving.deserialize_keras_object(config)
    if load_weights:
        local.load_weights_file(model, preset_file(preset, local.PRESET_WEIGHTS))
    return model
