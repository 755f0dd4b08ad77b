"""Fine-tuning a pretrained pre-activation ResNet on a new task.

- `load_pretrained`: loads weights (a catalog tag, `.weights.h5`, `.keras` or URL with
  hash) into a model whose head may differ: every other variable is checked and copied,
  the head too when its shape fits.
- `replace_head`: the same network with a fresh classifier for another class count.
- `freeze` / `unfreeze`: by part, "stem", "stage1" ... "stageN", "head" (the final
  BN-ReLU `post_bn` belongs to the last stage). Frozen parts keep BatchNorm in inference
  mode: Keras' and keras-preact's BN use their moving statistics whenever
  ``trainable=False``, even inside ``fit``, so freezing never uses batch statistics.

No per-layer learning rates (Keras 3 optimizers have none): freeze stages, train the
head, then unfreeze and continue at a lower rate.

Example:
    >>> import keras_preact as kp
    >>> from keras_preact import finetune
    >>> model = finetune.replace_head(kp.preact_resnet56(weights="cifar10"), classes=5)
    >>> finetune.freeze(model, ["stem", "stage1", "stage2"])
    >>> model.compile(...)  # compile after changing what is trainable
"""

import os

HEAD_PARTS = ("logits",)
STEM_PARTS = ("stem_conv",)
LAST_STAGE_EXTRA = ("post_bn",)
_HEAD_PREFIX = HEAD_PARTS[0] + "/"


def parts(model):
    """The part names of a `PreActResNet`: "stem", "stage1".. and "head" if it has one."""
    _check_model(model)
    names = ["stem"] + [f"stage{i}" for i in range(1, len(model.stage_blocks) + 1)]
    if model.include_top:
        names.append("head")
    return names


def _check_model(model):
    from keras_preact.models.preact_resnet import PreActResNet

    if not isinstance(model, PreActResNet):
        raise ValueError("Fine-tuning helpers need a keras-preact PreActResNet. Received: "
                         f"model of type {type(model).__name__}")


def _layers_of(model, part):
    valid = parts(model)
    if part not in valid:
        raise ValueError(f"Unknown part. Received: part={part!r}. Valid: {valid}")
    if part == "stem":
        names = STEM_PARTS
    elif part == "head":
        names = HEAD_PARTS
    else:
        names = (part,)
        if part == valid[-2 if model.include_top else -1]:
            names = names + LAST_STAGE_EXTRA
    return [model.get_layer(n) for n in names]


def freeze(model, which="all"):
    """Makes the named parts untrainable (their BatchNorm then runs in inference mode);
    returns them. `which`: "all", "backbone" (everything but the head), a list of parts,
    or a comma-separated string ("stem,stage1"). Compile the model after calling this."""
    return _set(model, which, False)


def unfreeze(model, which="all"):
    """Makes the named parts trainable again; same arguments as `freeze`."""
    return _set(model, which, True)


def _set(model, which, trainable):
    valid = parts(model)
    backbone = [p for p in valid if p != "head"]
    if which == "all":
        chosen = valid
    else:
        if isinstance(which, str):
            which = [v.strip() for v in which.split(",") if v.strip()]
        try:
            chosen = [c for part in which for c in (backbone if part == "backbone" else [part])]
        except TypeError:
            raise ValueError(f"`which` must be a list of part names. Received: which={which!r}") from None
    layers = [layer for part in chosen for layer in _layers_of(model, part)]
    for layer in layers:
        layer.trainable = trainable
    return chosen


def frozen_parts(model):
    """The parts of `model` whose layers are all untrainable."""
    return [p for p in parts(model) if not any(layer.trainable for layer in _layers_of(model, p))]


def replace_head(model, classes, *, classifier_activation="softmax", name=None):
    """A new `PreActResNet` with a fresh classifier for `classes` and every other
    variable copied from `model` (frozen parts stay frozen)."""
    _check_model(model)
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ValueError(f"`classes` must be an integer >= 1. Received: classes={classes!r}")
    from keras_preact.models.preact_resnet import PreActResNet

    frozen = frozen_parts(model)
    config = dict(model.get_config(), include_top=True, classes=classes, trainable=True,
                  classifier_activation=classifier_activation, name=name or model.name)
    new = PreActResNet.from_config(config)
    _copy_backbone(model, new, source_label=f"model {model.name!r}")
    if frozen:
        freeze(new, [p for p in frozen if p != "head"])
    return new


def _backbone_layout(model):
    from keras_preact.weights.local import model_layout

    return [x for x in model_layout(model) if not x[0].startswith(_HEAD_PREFIX)]


def _copy_backbone(source, target, *, source_label, copy_head="auto"):
    """Copies every non-head variable (and the head when its shapes fit)."""
    from keras_preact.weights.local import model_architecture

    src, dst = _backbone_layout(source), _backbone_layout(target)
    if src != dst:
        from keras_preact.weights.local import first_difference

        i, want, got = first_difference(dst, src)
        raise ValueError(f"The weights from {source_label} do not match the architecture of "
                         f"{target.name!r}: {len(src)} backbone variables vs {len(dst)}; the first "
                         f"difference is variable {i} (model: {want}, weights: {got}). Nothing was loaded.")
    arch_src, arch_dst = model_architecture(source), model_architecture(target)
    if arch_src is not None and arch_dst is not None and arch_src != arch_dst:
        # Optional keys (the keras.applications layout) are recorded only when set.
        diff = sorted(k for k in set(arch_src) | set(arch_dst) if arch_src.get(k) != arch_dst.get(k))
        raise ValueError(f"The weights from {source_label} were made for another architecture "
                         f"({', '.join(f'{k}={arch_src.get(k)!r}' for k in diff)}; the model has "
                         f"{', '.join(f'{k}={arch_dst.get(k)!r}' for k in diff)}). Nothing was loaded.")
    by_path = {v.path: v for v in source.weights}
    copied_head = False
    for variable in target.weights:
        if variable.path.startswith(_HEAD_PREFIX):
            other = by_path.get(variable.path)
            if copy_head and other is not None and tuple(other.shape) == tuple(variable.shape):
                variable.assign(other)
                copied_head = True
            continue
        variable.assign(by_path[variable.path])
    return copied_head


def load_pretrained(model, weights, *, model_name=None, copy_head="auto"):
    """Loads pretrained weights into `model`, whose head may be for another task.

    Args:
        weights: as the factories' `weights=` (a catalog tag, a `.weights.h5` or
            `.keras` path, or a URL with its hash).
        model_name: the registered name for tags (default: `model.name`).
        copy_head: "auto": copy the classifier too when its shape fits; False: keep
            the model's fresh head.

    Returns:
        dict: "source" (the file loaded), "copied_head" (bool), "classes" (of the
        weights' head, or None).

    Raises:
        ValueError: if the weights hold another architecture (another depth,
            unit, stem, or the same shapes in another order); nothing is loaded.
    """
    _check_model(model)
    from keras_preact.models.preact_resnet import PreActResNet
    from keras_preact.models.registry import get_model
    from keras_preact.weights import catalog
    from keras_preact.weights import hooks
    from keras_preact.weights import local
    from keras_preact.weights.download import fetch_weights

    model_name = model_name or model.name
    parsed = hooks.parse_url_weights(weights)
    if parsed is not None:
        path = fetch_weights(hooks.url_entry(model_name, *parsed), build=get_model)
    elif isinstance(weights, str) and catalog.looks_like_tag(weights):
        path = fetch_weights(catalog.resolve_tag(model_name, weights), build=get_model)
    else:
        path = os.path.abspath(os.path.expanduser(os.fspath(weights)))
        if path.endswith(local.KERAS_SUFFIX):
            if not os.path.isfile(path):
                raise ValueError(f"The .keras file does not exist. Received: weights={weights!r}")
            source = local.load_keras_file(path)
            _check_model(source)
            copied = _copy_backbone(source, model, source_label=path, copy_head=copy_head)
            return {"source": path, "copied_head": copied,
                    "classes": source.classes if source.include_top else None}
        path = local.resolve_weights_argument(path)
    try:
        info = local.inspect_weights_file(path)
    except OSError as err:  # h5py's error for a truncated or damaged file names no file
        raise ValueError(
            f"The weights file {path} cannot be read ({err}): it is damaged or incomplete "
            f"(an interrupted copy or download?); copy or fetch it again. Received: weights={weights!r}"
        ) from None
    config = dict(model.get_config(), include_top=info["classes"] is not None,
                  classes=info["classes"] or 1, pooling=None, preprocessing=None,
                  name=f"{model.name}_pretrained", trainable=True)
    donor = PreActResNet.from_config(config)
    local.load_weights_file(donor, path)
    copied = _copy_backbone(donor, model, source_label=path, copy_head=copy_head)
    return {"source": path, "copied_head": copied, "classes": info["classes"]}


def pretrained_architecture(model_name, weights):
    """Architecture arguments a catalog tag needs (e.g. ``first_unit_shared_preact``);
    empty for files and URLs (their architecture is checked on load)."""
    from keras_preact.weights import catalog

    if not (isinstance(weights, str) and catalog.looks_like_tag(weights)):
        return {}
    entry = catalog.resolve_tag(model_name, weights)
    return {k: v for k, v in entry.architecture.items()
            if k not in ("classes", "include_top", "input_shape", "preprocessing")}
