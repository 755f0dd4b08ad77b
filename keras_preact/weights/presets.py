"""Reading keras-hub preset folders of keras-preact models, without keras-hub: ``config.json``
(a `PreActResNetBackbone`'s config), ``model.weights.h5`` (the backbone's weights) and, with a
head, ``task.json`` and ``task.weights.h5`` (the classifier). `keras_preact.hub.save_preset`
writes them; folders of keras-preact 0.1.0 (``config.json`` holding a `PreActResNet`) load
too. A factory's ``weights=`` takes such a folder; `from_preset` rebuilds the model."""

import importlib
import os

import keras

from keras_preact.architecture import HEAD_LAYER, HEAD_PATH
from keras_preact.file_io import read_json, user_path
from keras_preact.weights import local

CONFIG_FILE, TASK_FILE, TASK_WEIGHTS = "config.json", "task.json", "task.weights.h5"
#: The classes presets name (`keras_preact.hub` registers the backbone's).
MODEL_CLASS, BACKBONE_CLASS = "keras_preact>PreActResNet", "keras_preact>PreActResNetBackbone"
#: Handles fetched file by file, as keras-hub fetches them (its `hub` extra installs both).
REMOTE = {"hf://": "huggingface_hub", "kaggle://": "kagglehub"}


def preset_file(preset, name):
    """The local path of file `name` of a preset: a folder, or an ``hf://`` or ``kaggle://``
    handle fetched (and cached) by huggingface_hub or kagglehub."""
    if (scheme := next((s for s in REMOTE if str(preset).startswith(s)), None)) is None:
        return os.path.join(user_path(preset), name)
    try:
        hub = importlib.import_module(REMOTE[scheme])
    except ImportError:
        raise ModuleNotFoundError(f"A {scheme} preset needs `{REMOTE[scheme]}` "
                                  '(pip install "keras-preact[hub]").') from None
    return (hub.hf_hub_download(repo_id=preset.removeprefix(scheme), filename=name)
            if scheme == "hf://" else hub.model_download(preset.removeprefix(scheme), name))


def model_config(preset):
    """The serialized `PreActResNet` a preset holds (a backbone with its classifier, if any);
    ValueError for a folder that is not a preset of a keras-preact model."""
    path = existing_file(preset, CONFIG_FILE)
    try:
        config = read_json(path)
    except ValueError:
        raise ValueError(f"The preset file {path} is damaged (cut short?): save the preset "
                         f"again. Received: preset={preset!r}") from None
    if config.get("registered_name") == MODEL_CLASS:
        return config
    if config.get("registered_name") != BACKBONE_CLASS:
        raise ValueError(f"The preset holds a {config.get('class_name')!r}, not a keras-preact "
                         f"model. Received: preset={preset!r}")
    inner = {k: v for k, v in config["config"].items() if k not in ("trainable", "name")}
    inner.update(input_shape=inner.pop("image_shape"), include_top=False)
    try:
        task_path = preset_file(preset, TASK_FILE)
    except Exception:  # noqa: BLE001 - each hub library has its own "not found"
        task_path = None
    if task_path is not None and os.path.isfile(task_path):
        task = read_json(task_path)["config"]
        inner.update(include_top=True, classes=task["num_classes"], classifier_activation=(
            task["activation"]), pooling=None if task["pooling"] == "avg" else task["pooling"],
            head_dropout=task.get("dropout") or None)
    return {"module": "keras_preact.models.preact_resnet", "class_name": "PreActResNet",
            "config": inner, "registered_name": MODEL_CLASS}


def existing_file(preset, name):
    """`preset_file`, or ValueError naming the file when the preset lacks it."""
    if not os.path.isfile(path := preset_file(preset, name)):
        raise ValueError(f"The preset file {path!r} is missing: not a preset, or an incomplete "
                         f"copy (save it again). Received: preset={preset!r}")
    return path


def check_preset(preset, load_weights=True):
    """`model_config`, after checking that the weights file is there (with `load_weights`)."""
    config = model_config(preset)
    if load_weights:
        existing_file(preset, local.PRESET_WEIGHTS)
    return config


def is_bare_name(preset):
    """Whether `preset` is a bare name (no "/", no such folder): a model name or catalog key."""
    return isinstance(preset, str) and "/" not in preset and not os.path.exists(preset)


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
            model.get_layer(HEAD_LAYER).set_weights([f[f"{HEAD_PATH}vars/{i}"][()] for i in (0, 1)])
    return model


def from_preset(preset, *, load_weights=True, **kwargs):
    """The `PreActResNet` of a preset (`keras_preact.from_preset`, less the bare names)."""
    config = check_preset(preset, load_weights)
    config["config"] = {**config["config"], **kwargs}
    model = keras.saving.deserialize_keras_object(config)
    return load_preset_weights(model, preset) if load_weights else model
