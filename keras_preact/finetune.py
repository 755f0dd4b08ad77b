"""Fine-tuning a pretrained pre-activation ResNet on a new task: parts "stem", "stage1" ...
"stageN" (with the final BN-ReLU) and "head", frozen with BatchNorm in inference mode (also in
``fit``). No per-layer rates: train the head, then unfreeze and continue at a lower rate."""

import contextlib
import os

from keras_preact.architecture import HEAD_LAYER, STEM_CONV_LAYER
from keras_preact.checks import check_choice
from keras_preact.file_io import user_path
from keras_preact.models.preact_resnet import PreActResNet
from keras_preact.models.registry import get_model
from keras_preact.weights import argument, catalog, local, presets
from keras_preact.weights.download import fetch_weights


_NOT_PLANNED = ("classes", "include_top", "input_shape", "preprocessing",  # the model's task,
                "block", "stage_blocks", "stage_filters", "stage_strides")  # the factory's depth


def _check_model(model):
    if not isinstance(model, PreActResNet):
        raise ValueError("Fine-tuning helpers need a keras-preact PreActResNet. Received: "
                         f"model of type {type(model).__name__}")


def parts(model):
    """The part names of a `PreActResNet`: "stem", "stage1".. and "head" if it has one.

    Args:
        model: a `PreActResNet`.

    Returns:
        list of str: the part names, in the model's order.

    Raises:
        ValueError: if `model` is not a `PreActResNet`."""
    _check_model(model)
    names = ["stem"] + [f"stage{i}" for i in range(1, len(model.stage_blocks) + 1)]
    return names + ["head"] if model.include_top else names


def _layers_of(model, part):
    if part not in (valid := parts(model)):
        raise ValueError(f"Unknown part. Received: part={part!r}. Valid: {valid}")
    names = {"stem": [STEM_CONV_LAYER, "stem_bn"], "head": [HEAD_LAYER]}.get(part, [part])
    if part == f"stage{len(model.stage_blocks)}":
        names.append("post_bn")
    return [layer for layer in model.layers if layer.name in names]


def freeze(model, which="all"):
    """Makes the named parts untrainable (their BatchNorm then runs in inference mode).

    Args:
        model: a `PreActResNet`.
        which: str or list of str, "all", "backbone" (everything but the head), a list of
            parts, or a comma-separated string ("stem,stage1"). Defaults to `"all"`.

    Returns:
        list of str: the parts made untrainable.

    Raises:
        ValueError: for an unknown part, a `which` that is not a list of part names, or a
            `model` that is not a `PreActResNet`."""
    return _set(model, which, False)


def unfreeze(model, which="all"):
    """Makes the named parts trainable again; same arguments as `freeze`.

    Args:
        model: a `PreActResNet`.
        which: str or list of str, the parts, as in `freeze`. Defaults to `"all"`.

    Returns:
        list of str: the parts made trainable.

    Raises:
        ValueError: as `freeze`."""
    return _set(model, which, True)


def _set(model, which, trainable):
    valid = parts(model)
    if isinstance(which, str):
        which = valid if which == "all" else [v.strip() for v in which.split(",") if v.strip()]
    backbone = [p for p in valid if p != "head"]
    try:
        chosen = [c for part in which for c in (backbone if part == "backbone" else [part])]
    except TypeError:
        raise ValueError("`which` must be a list of part names. "
                         f"Received: which={which!r}") from None
    for layer in [layer for part in chosen for layer in _layers_of(model, part)]:  # all checked
        layer.trainable = trainable
    return chosen


def frozen_parts(model):
    """The parts of `model` whose layers are all untrainable.

    Args:
        model: a `PreActResNet`.

    Returns:
        list of str: the frozen part names, in the model's order.

    Raises:
        ValueError: if `model` is not a `PreActResNet`."""
    return [p for p in parts(model) if not any(layer.trainable for layer in _layers_of(model, p))]


def replace_head(model, classes, *, classifier_activation="softmax", name=None):
    """A new `PreActResNet` with a fresh classifier for `classes` and every other
    variable copied from `model` (frozen parts stay frozen).

    Args:
        model: a `PreActResNet`.
        classes: int, the new classifier's number of classes.
        classifier_activation: the new head's activation; None returns logits.
            Defaults to `"softmax"`.
        name: str or None, the new model's name. Defaults to `None` (`model`'s name).

    Returns:
        The new `PreActResNet`, with its head.

    Raises:
        ValueError: if `model` is not a `PreActResNet`, or for an invalid `classes` or
            `classifier_activation`."""
    frozen = frozen_parts(model)
    config = dict(model.get_config(), include_top=True, classes=classes, trainable=True,
                  classifier_activation=classifier_activation, name=name or model.name)
    new = PreActResNet.from_config(config)
    _copy_weights(model, new, copy_head=False)
    freeze(new, [p for p in frozen if p != "head"])
    return new


def _copy_weights(source, target, *, copy_head):
    """Copies variables by path, the head's if `copy_head` and shapes fit (then True)."""
    by_path = {v.path: v for v in source.weights}
    copied_head = False
    for variable in target.weights:
        other = by_path.get(variable.path)
        if not variable.path.startswith(f"{HEAD_LAYER}/"):
            variable.assign(other)
        elif copy_head and other is not None and tuple(other.shape) == tuple(variable.shape):
            variable.assign(other)
            copied_head = True
    return copied_head


def load_pretrained(model, weights, *, model_name=None, copy_head="auto"):
    """Loads pretrained weights into the `PreActResNet` `model`, whose head may be for
    another task.

    Args:
        model: a `PreActResNet`; its variables are overwritten.
        weights: str, a catalog tag, a `.weights.h5` or `.keras` path, a preset folder, or
            a URL with its hash.
        model_name: str or None, the registered name for tags (default: `model.name`).
        copy_head: "auto", True or False. "auto": copy the classifier too when its shape
            fits (True does the same); False: keep the model's fresh head.
            Defaults to `"auto"`.

    Returns:
        dict: "source" (the file loaded), "copied_head" (bool), "classes" (of the weights'
        head, or None).

    Raises:
        ValueError: if the weights hold another architecture (nothing is loaded), for an
            invalid `copy_head`, or if `model` is not a `PreActResNet`."""
    _check_model(model)
    check_choice("copy_head", copy_head, ("auto", True, False))
    model_name = model_name or model.name
    entry = argument.url_entry(model_name, weights)
    if entry is None and catalog.looks_like_tag(weights):
        entry = catalog.resolve_tag(model_name, weights)
    kind, path = argument.local_weights(weights if entry is None else fetch_weights(
        entry, build=get_model))
    if (info := argument.recorded_info(kind, path)) is None:  # a .keras file of another model
        other = local.read_keras_file_config(path).get("class_name")
        raise ValueError(f"{path} holds a {other}, not a keras-preact PreActResNet: its "
                         f"weights cannot be loaded. Received: weights={weights!r}")
    classes = info["classes"]
    # A donor of the model's architecture and the weights' head checks and takes them.
    config = dict(model.get_config(), include_top=classes is not None, classes=classes or 1,
                  pooling=None, preprocessing=None, name=model.name, trainable=True)
    donor = PreActResNet.from_config(config)
    if kind == "preset":  # through the whole model, so that its architecture is compared
        local.copy_weights_from_model(presets.from_preset(path), donor, source_label=path)
    else:
        argument.load_planned_weights(donor, {"kind": kind, "path": path})
    copied = _copy_weights(donor, model, copy_head=copy_head)
    return {"source": path, "copied_head": copied, "classes": classes}


def pretrained_architecture(model_name, weights):
    """Architecture arguments the weights need: a catalog tag's, or what a local file records.

    Args:
        model_name: str, the registered model name the tag belongs to.
        weights: a catalog tag, or the path of a local weights file or folder; anything else
            (a URL, a missing path) gives an empty dict.

    Returns:
        dict: the architecture arguments, without those set to None and those the model's
        task or its depth decides (`classes`, `include_top`, `input_shape`, `preprocessing`,
        `block`, `stage_blocks`, `stage_filters`, `stage_strides`). A local file that cannot
        be read gives an empty dict (it is reported on load).

    Raises:
        ValueError: for a tag unknown for `model_name`, or another model's key."""
    arch = {}
    if catalog.looks_like_tag(weights):
        arch = catalog.resolve_tag(model_name, weights).architecture
    elif isinstance(weights, str) and os.path.exists(user_path(weights)):
        with contextlib.suppress(ValueError):  # a damaged or unfit file: reported on load
            info = argument.recorded_info(*argument.local_weights(weights))
            arch = (info or {}).get("architecture", {})
    return {k: v for k, v in arch.items() if v is not None and k not in _NOT_PLANNED}
