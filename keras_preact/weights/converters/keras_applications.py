"""Converter for the keras.applications ResNet50V2 / 101V2 / 152V2 ImageNet weights: legacy
Keras 2 HDF5 files, read with h5py by layer name and mapped one to one onto a model built in
`KERAS_LAYOUT` (block u of stage s is ``conv{s+1}_block{u}``)."""

import h5py
import numpy as np

from keras_preact.architecture import HEAD_LAYER, STEM_CONV_LAYER
from keras_preact.weights.converters import assign_arrays, require_preact_resnet

#: `PreActResNet` arguments of keras.applications' ResNetV2 layout (`preact_resnet50/101/152`).
KERAS_LAYOUT = {"stem": "imagenet_preact", "stage_strides": [2, 2, 2, 1],
                "stride_position": "last", "strided_shortcut": "subsample", "conv_bias": True,
                "bottleneck_stride": "middle", "bn_epsilon": 1.001e-5}
#: Arguments the layout fixes that the factories set by depth (checked too).
_FIXED = {"block": "bottleneck", "stem_kernel_size": 7, "stem_strides": 2,
          "unit": "full_preact", "bottleneck_expansion": 4}
UPSTREAM_NAMES = {50: "ResNet50V2", 101: "ResNet101V2", 152: "ResNet152V2"}
#: (our layer, keras.applications layer, weight names) outside the stages, the head last.
_OUTER_LAYERS = ((STEM_CONV_LAYER, "conv1_conv", ("kernel", "bias")),
                 ("post_bn", "post_bn", ("gamma", "beta", "moving_mean", "moving_variance")),
                 (HEAD_LAYER, "predictions", ("kernel", "bias")))


def read_legacy_h5(path):
    """Reads a legacy Keras HDF5 weights file (also a whole-model ``.h5``) as dict layer
    name -> dict weight name ("kernel", ...) -> numpy array, for layers with weights;
    ValueError when the file is not HDF5 or not a legacy Keras weights file."""
    if not h5py.is_hdf5(path):
        raise ValueError("The keras.applications weights file is not an HDF5 file. "
                         f"Received: {path!r}")
    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f and "layer_names" not in f.attrs else f
        if (layer_names := _string_list_attr(group, "layer_names")) is None:
            raise ValueError("The file is not a legacy Keras HDF5 weights file (no "
                             "'layer_names' attribute; a Keras 3 '.weights.h5' has another "
                             f"format). Received: {path!r}")
        if missing := [name for name in layer_names if name not in group]:
            raise ValueError(f"The weights file lists the layer {missing[0]!r} but holds no "
                             f"group for it. Received: {path!r}")
        layers = {name: _layer_weights(group[name]) for name in layer_names}
    return {name: weights for name, weights in layers.items() if weights}


def _layer_weights(layer):
    """Weight name ("kernel", ...) -> numpy array, of one layer's group."""
    return {w.split("/")[-1].split(":")[0]: np.asarray(layer[w][()])
            for w in _string_list_attr(layer, "weight_names") or []}


def _string_list_attr(group, name):
    """A list-of-strings attribute, also split in chunks (``name0``, ...); None if absent."""
    values, i = list(group.attrs.get(name, [])), 0
    while f"{name}{i}" in group.attrs:
        values.extend(group.attrs[f"{name}{i}"])
        i += 1
    if name not in group.attrs and i == 0:
        return None
    return [v.decode("utf8") if hasattr(v, "decode") else str(v) for v in values]


def check_layout(model):
    """Raises ValueError unless `model` is a `PreActResNet` in `KERAS_LAYOUT`."""
    require_preact_resnet(model, "keras_applications")
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in model.get_config().items()}
    epsilon = config.get("bn_epsilon")
    if epsilon is not None and abs(epsilon - KERAS_LAYOUT["bn_epsilon"]) <= 1e-12:
        config["bn_epsilon"] = KERAS_LAYOUT["bn_epsilon"]  # equal but for rounding
    wrong = [f"{key}={config.get(key)!r} (needs {want!r})"
             for key, want in {**KERAS_LAYOUT, **_FIXED}.items() if config.get(key) != want]
    if wrong:
        raise ValueError(
            f"{model.name!r} is not built in the keras.applications ResNetV2 layout the "
            "keras_applications converter loads into: " + ", ".join(wrong) + ". Build it "
            "with keras_preact.weights.converters.keras_applications.KERAS_LAYOUT (or from "
            "its catalog entry).")


def _unit_source(layer_prefix, name):
    """((keras layer, weight name), transform None) of the variable `name` of one unit."""
    head, _, field = name.partition("_")
    if name.startswith("preact_bn_"):
        return (f"{layer_prefix}_preact_bn", name[len("preact_bn_"):]), None
    if head == "shortcut":
        return (f"{layer_prefix}_0_conv", field), None
    if head.startswith("bn"):
        return (f"{layer_prefix}_{int(head[2:]) - 1}_bn", field), None
    # The full pre-activation unit has only conv{i} variables left.
    return (f"{layer_prefix}_{int(head[4:])}_conv", field), None


def assignments(model):
    """Yields `assign_arrays` assignments, keyed by (keras layer, weight name)."""
    for ours, theirs, fields in _OUTER_LAYERS[:None if model.include_top else -1]:
        for field in fields:
            yield getattr(model.get_layer(ours), field), [((theirs, field), None)], False
    for s in range(1, len(model.stage_blocks) + 1):
        stage = model.get_layer(f"stage{s}")
        # (layer, its spec, unit numbers): "unit1", the stacked units, "unit_last".
        parts = [(stage.unit1, stage.unit1.spec, [1]),
                 (stage, stage.repeat_spec, range(2, 2 + stage.num_stacked)),
                 (stage.unit_last, getattr(stage.unit_last, "spec", None), [stage.num_blocks])]
        for layer, spec, units in parts:
            for name, *_ in spec.variable_specs() if layer is not None and units else ():
                yield layer.get_variable(name), [_unit_source(f"conv{s + 1}_block{u}", name)
                                                 for u in units], layer is stage


def load_weights(model, weights, *, source="weights"):
    """Loads keras.applications ResNetV2 weights (see `read_legacy_h5`) into a
    `PreActResNet` built with `KERAS_LAYOUT` (include_top=False for a ``_notop`` file);
    returns ``{"converted_tensors": n}``. ValueError, with nothing changed, when the
    model is not in the layout or does not match the file one to one."""
    check_layout(model)
    arrays = {(layer, field): v for layer, fields in weights.items() for field, v in fields.items()}
    layout = f"{UPSTREAM_NAMES.get(model.depth, 'ResNetV2')} layout, "
    return assign_arrays(model, assignments(model), arrays, what="keras.applications weights "
                         "file", noun="weight", source=source, layout=layout, key_name="/".join)


def convert(source_path, model, entry):
    """Catalog converter (see `keras_preact.weights.converters`)."""
    return load_weights(model, read_legacy_h5(source_path), source=repr(source_path))
