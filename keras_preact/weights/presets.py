"""Reading keras-hub preset folders of keras-preact models, without keras-hub: ``config.json``
(a `PreActResNetBackbone`'s config), ``model.weights.h5`` (the backbone's weights) and, with a
head, ``task.json`` and ``task.weights.h5`` (the classifier). `keras_preact.hub.save_preset`
writes them; folders of keras-preact 0.1.0 (``config.json`` holding a `PreActResNet`) load
too. A factory's ``weights=`` takes such a folder; `from_preset` rebuilds the model."""

import importlib
import os

import keras

from keras_preact.architecture import HEAD_LAYER, HEAD_PATH
from keras_preact.files import read_json, user_path
from keras_preact.weights import local

CONFIG_FILE, TASK_FILE, TASK_WEIGHTS = "config.json", "task.json", "task.weights.h5"
#: The classes presets name (`keras_preact.hub` registers the backbone's).
MODEL_CLASS, BACKBONE_CLASS = "keras_preact>PreActResNet", "keras_preact>PreActResNetBackbone"
#: Handles fetched file by file, as keras-hub fetches them (its `hub` extra installs both).
REMOTE = {"hf://": "huggingface_hub", "kaggle://": "kagglehub"}


def preset_file(preset, name):
    """The local path of file `name` of a preset: a folder, or an ``hf://`` or ``kaggle://``
    handle fetched (and cached) by huggingface_hub or kagglehub."""
    scheme = next((s for s in REMOTE if str(preset).startswith(s)), None)
    if scheme is None:
        return os.path.join(user_path(preset), name)
    try:
        hub = importlib.import_module(REMOTE[scheme])
    except ImportError:
        raise ModuleNotFoundError(f"A {scheme} preset needs `{REMOTE[scheme]}` "
                                  '(pip install "keras-preact[hub]").') from None
    handle = preset[len(scheme):]
    if scheme == "hf://":
        return hub.hf_hub_download(repo_id=handle, filename=name)
    return hub.model_download(handle, name)


def model_config(preset):
    """The serialized `PreActResNet` a preset holds (a backbone with its classifier, if any);
    ValueError for a folder that is not a preset of a keras-preact model."""
    config_path = preset_file(preset, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(f"Not a preset: {config_path!r} does not exist. Received: "
                         f"preset={preset!r}")
    config = read_json(config_path)
    if config.get("registered_name") == MODEL_CLASS:
        return config
    if config.get("registered_name") != BACKBONE_CLASS:
        raise ValueError(f"The preset holds a {config.get('class_name')!r}, not a keras-preact "
                         f"model. Received: preset={preset!r}")
    inner = {k: v for k, v in config["config"].items()
             if k not in ("image_shape", "trainable", "name")}
    inner.update(input_shape=config["config"]["image_shape"], include_top=False)
    try:
        task_path = preset_file(preset, TASK_FILE)
    except Exception:  # noqa: BLE001 - each hub library has its own "not found"
        task_path = None
    if task_path is not None and os.path.isfile(task_path):
        task = read_json(task_path)["config"]
        inner.update(include_top=True, classes=task["num_classes"], classifier_activation=(
            task["activation"]), pooling=None if task["pooling"] == "avg" else task["pooling"])
    return {"module": "keras_preact.models.preact_resnet", "class_name": "PreActResNet",
            "config": inner, "registered_name": MODEL_CLASS}


def load_preset_weights(model, preset):
    """Loads a preset's weights into `model` (its architecture; with or without a head)."""
    path = preset_file(preset, local.PRESET_WEIGHTS)
    if read_json(preset_file(preset, CONFIG_FILE)).get("registered_name") == MODEL_CLASS:
        local.load_weights_file(model, path)
        return model
    # The backbone's file, through a model without a head; then the classifier's kernel.
    trunk = type(model).from_config({**model.get_config(), "include_top": False,
                                     "pooling": None, "features": False})
    local.load_weights_file(trunk, path)
    local.copy_weights_from_model(trunk, model, source_label=path)
    if local.has_head(model):
        with local.open_hdf5(preset_file(preset, TASK_WEIGHTS)) as f:
            head = [f[f"{HEAD_PATH}vars/{i}"][()] for i in (0, 1)]
        model.get_layer(HEAD_LAYER).set_weights(head)
    return model


def from_preset(preset, *, load_weights=True, **kwargs):
    """Builds the `PreActResNet` a preset holds, with its weights.

    Args:
        preset: a folder written by `keras_preact.save_preset` (or keras-preact 0.1.0), or an
            ``hf://`` or ``kaggle://`` handle of one (needs the ``hub`` extra and the network).
        load_weights: load the weights (checked against the model first).
        **kwargs: config values to change, e.g. ``features=True`` for the backbone of the
            same weights.

    Raises ValueError for a folder that is not a preset or weights that do not fit."""
    config = model_config(preset)
    config["config"] = {**config["config"], **kwargs}
    model = keras.saving.deserialize_keras_object(config)
    return load_preset_weights(model, preset) if load_weights else model
