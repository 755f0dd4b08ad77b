"""Converter for the keras.applications ResNet50V2 / ResNet101V2 / ResNet152V2 ImageNet
weights (``resnet{50,101,152}v2_weights_tf_dim_ordering_tf_kernels[_notop].h5``).

The published files are legacy Keras HDF5 weight files, as Keras 2's
``model.save_weights("....h5")`` wrote them: a root attribute ``layer_names`` and one
group per layer whose ``weight_names`` attribute lists its arrays
(``conv1_conv/kernel:0``, ...). They are read with h5py by layer name (no pickled
code, no Keras model of the publisher needed) and mapped one to one onto a
keras-preact model built in the keras.applications layout (`KERAS_LAYOUT`; block u
of stage s is ``conv{s+1}_block{u}``, see `assignments`). Keras strides the *last*
block of each stage: it is ``unit_last``. Every array must be used exactly once and
every variable assigned exactly once, with equal shapes; anything else raises
``ValueError`` naming the file, the layers and the shapes, before any variable changes.
"""

import numpy as np

from keras_preact.weights.converters import assign_all
from keras_preact.weights.converters import match_arrays
from keras_preact.weights.converters import require_preact_resnet

#: The `PreActResNet` arguments of the keras.applications ResNetV2 layout (with the
#: depth's stages and widths of `preact_resnet50/101/152`): the 7x7 stride-2 stem
#: conv with a bias and no BN-ReLU before the zero-padded max pool, the stride on
#: the last unit of stages 1-3 (strides 2, 2, 2, 1) with a max-pool-subsampled
#: identity shortcut there, a 1x1 projection (with bias) in the first unit of each
#: stage, the 3x3 conv carrying the stride, a bias on each unit's last conv, and
#: BatchNorm epsilon 1.001e-5.
KERAS_LAYOUT = {
    "stem": "imagenet_preact",
    "stage_strides": [2, 2, 2, 1],
    "stride_position": "last",
    "strided_shortcut": "subsample",
    "conv_bias": True,
    "bottleneck_stride": "middle",
    "bn_epsilon": 1.001e-5,
}
#: Arguments the layout fixes that the factories set by depth (checked too).
_FIXED = {"block": "bottleneck", "stem_kernel_size": 7, "stem_strides": 2,
          "unit": "full_preact", "bottleneck_expansion": 4}
#: keras.applications names of the depths keras-preact builds in this layout.
UPSTREAM_NAMES = {50: "ResNet50V2", 101: "ResNet101V2", 152: "ResNet152V2"}
#: BatchNorm weights in Keras' legacy order (trainable, then non-trainable).
_BN_FIELDS = ("gamma", "beta", "moving_mean", "moving_variance")


def read_legacy_h5(path):
    """Reads a legacy Keras HDF5 weights file (Keras 2's ``save_weights("....h5")``,
    or the ``model_weights`` group of a whole-model ``.h5``) by layer name.

    Returns:
        dict layer name -> dict weight name (``"kernel"``, ``"gamma"``, ...: Keras'
        names without the layer and ``:0``) -> numpy array, for layers with weights.

    Raises:
        ValueError: when the file is not HDF5 or not a legacy Keras weights file.
    """
    import h5py

    if not h5py.is_hdf5(path):
        raise ValueError(f"The keras.applications weights file is not an HDF5 file. Received: {path!r}")
    out = {}
    with h5py.File(path, "r") as f:
        group = f["model_weights"] if "model_weights" in f and "layer_names" not in f.attrs else f
        layer_names = _string_list_attr(group, "layer_names")
        if layer_names is None:
            raise ValueError("The file is not a legacy Keras HDF5 weights file (no 'layer_names' "
                             f"attribute; a Keras 3 '.weights.h5' has another format). Received: {path!r}")
        for name in layer_names:
            if name not in group:
                raise ValueError(f"The weights file lists the layer {name!r} but holds no group for it. "
                                 f"Received: {path!r}")
            layer = group[name]
            weights = {}
            for weight_name in _string_list_attr(layer, "weight_names") or []:
                short = weight_name.split("/")[-1].split(":")[0]
                weights[short] = np.asarray(layer[weight_name][()])
            if weights:
                out[name] = weights
    return out


def _string_list_attr(group, name):
    """A list-of-strings attribute, also when Keras split it into chunks
    (``name0``, ``name1``, ... for lists beyond HDF5's header limit)."""
    if name in group.attrs:
        values = list(group.attrs[name])
    elif f"{name}0" in group.attrs:
        values, i = [], 0
        while f"{name}{i}" in group.attrs:
            values.extend(group.attrs[f"{name}{i}"])
            i += 1
    else:
        return None
    return [v.decode("utf8") if hasattr(v, "decode") else str(v) for v in values]


def check_layout(model):
    """Raises ValueError unless `model` is a `PreActResNet` in `KERAS_LAYOUT`."""
    require_preact_resnet(model, "keras_applications")
    config = model.get_config()
    wrong = []
    for key, want in {**KERAS_LAYOUT, **_FIXED}.items():
        have = config.get(key)
        have = list(have) if isinstance(have, tuple) else have
        if key == "bn_epsilon" and have is not None and abs(have - want) <= 1e-12:
            continue
        if have != want:
            wrong.append(f"{key}={have!r} (needs {want!r})")
    if wrong:
        raise ValueError(
            f"{model.name!r} is not built in the keras.applications ResNetV2 layout the "
            "keras_applications converter loads into: " + ", ".join(wrong) + ". Build it "
            "with keras_preact.weights.converters.keras_applications.KERAS_LAYOUT (or from "
            "its catalog entry)."
        )


def _unit_targets(layer_prefix, variables):
    """Yields (variable, (keras layer, weight name)) for the variables of one unit."""
    for name, var in variables.items():
        if name.startswith("preact_bn_"):
            yield var, (f"{layer_prefix}_preact_bn", name[len("preact_bn_"):])
            continue
        head, _, field = name.partition("_")
        if head == "shortcut":
            yield var, (f"{layer_prefix}_0_conv", field)
        elif head.startswith("bn"):
            yield var, (f"{layer_prefix}_{int(head[2:]) - 1}_bn", field)
        else:  # the full pre-activation unit has only conv{i} variables left
            yield var, (f"{layer_prefix}_{int(head[4:])}_conv", field)


def assignments(model):
    """Yields (variable, [(keras layer, weight name), ...], stacked) for every
    variable of a model in `KERAS_LAYOUT`; stacked variables list one source per row."""
    stem = model.get_layer("stem_conv")
    yield stem.kernel, [("conv1_conv", "kernel")], False
    yield stem.bias, [("conv1_conv", "bias")], False
    for s in range(1, len(model.stage_blocks) + 1):
        stage = model.get_layer(f"stage{s}")
        prefix = f"conv{s + 1}_block"
        for var, source in _unit_targets(f"{prefix}1", stage.unit1._vars):
            yield var, [source], False
        rows = range(2, 2 + stage.num_stacked)
        for name, var in stage._stacked.items():
            sources = [next(_unit_targets(f"{prefix}{u}", {name: None}))[1] for u in rows]
            yield var, sources, True
        if stage.unit_last is not None:
            for var, source in _unit_targets(f"{prefix}{stage.units}", stage.unit_last._vars):
                yield var, [source], False
    post = model.get_layer("post_bn")
    for field in _BN_FIELDS:
        yield getattr(post, field), [("post_bn", field)], False
    if model.include_top:
        dense = model.get_layer("logits")
        yield dense.kernel, [("predictions", "kernel")], False
        yield dense.bias, [("predictions", "bias")], False


def load_weights(model, weights, *, source="weights"):
    """Loads keras.applications ResNetV2 weights (layer -> weight name -> array, see
    `read_legacy_h5`) into a `PreActResNet` built with `KERAS_LAYOUT` (e.g.
    ``preact_resnet50(**KERAS_LAYOUT)``; include_top=False for a ``_notop`` file).

    Returns:
        dict with "converted_tensors" (int).

    Raises:
        ValueError: when the model is not in the layout, or the file and the model do
            not match one to one (another depth, a missing or extra layer, a head
            that is or is not there, another shape); nothing is changed then.
    """
    check_layout(model)
    arrays = {(layer, field): v for layer, fields in weights.items() for field, v in fields.items()}
    plan, missing, mismatched, unexpected = match_arrays(
        ((var, [(k, None) for k in keys], stacked) for var, keys, stacked in assignments(model)),
        arrays)
    if missing or mismatched or unexpected:
        problems = [f"{len(mismatched)} shape mismatches, e.g. " + str([
            f"{'/'.join(keys[0])}{f' (+{len(keys) - 1} blocks)' if len(keys) > 1 else ''}: "
            f"file {shape}, model {tuple(var.shape)} ({var.path})" for keys, shape, var in mismatched[:3]
        ])] if mismatched else []
        for keys, what in ((missing, "weights missing from the file"),
                           (unexpected, "weights of the file have no place in the model")):
            layers = list(dict.fromkeys(layer for layer, _ in keys))
            if keys:
                problems.append(f"{len(keys)} {what}, in the layers {layers[:5]}"
                                + (f" and {len(layers) - 5} more" if len(layers) > 5 else ""))
        expected_layers = len({layer for _, keys, _ in assignments(model) for layer, _ in keys})
        upstream = UPSTREAM_NAMES.get(model.depth, f"depth {model.depth}")
        head = f"{model.classes} classes" if model.include_top else "no head (include_top=False)"
        raise ValueError(
            f"The keras.applications weights file does not match the architecture of "
            f"{model.name!r} ({upstream} layout, stages {list(model.stage_blocks)}, {head}): "
            f"the file has {len(weights)} layers with weights, the model expects "
            f"{expected_layers}; " + "; ".join(problems)
            + f". Nothing was loaded. Received: {source}"
        )
    assign_all(plan)
    return {"converted_tensors": len(arrays)}


def convert(source_path, model, entry):
    """Catalog converter (see `keras_preact.weights.converters`)."""
    return load_weights(model, read_legacy_h5(source_path), source=repr(source_path))


# --- the reference, for the tests and the benchmark ------------------------------------


def keras_reference(depth, *, include_top=True, input_shape=None, seed=0):
    """keras.applications' ResNet{depth}V2 (depth 50, 101 or 152; logits, default
    224x224 input) with random weights, BatchNorm statistics included."""
    import keras

    if depth not in UPSTREAM_NAMES:
        raise ValueError(f"No keras.applications ResNetV2 of depth {depth}. Valid: {sorted(UPSTREAM_NAMES)}")
    keras.utils.set_random_seed(seed)
    kwargs = dict(weights=None, include_top=include_top, classifier_activation=None)
    if input_shape is not None:
        kwargs["input_shape"] = tuple(input_shape)
    net = getattr(keras.applications, UPSTREAM_NAMES[depth])(**kwargs)
    rng = np.random.RandomState(seed + 1)
    bns = [layer for layer in net.layers if isinstance(layer, keras.layers.BatchNormalization)]
    # Scales below 1 (shrinking with depth) keep a deep random net's logits of the
    # order of a trained net's, where float32 rounding is far below the 1e-4 bound.
    shrink = min(1.0, (60.0 / max(len(bns), 1)) ** 0.5)
    for layer in bns:
        n = layer.gamma.shape[0]
        layer.gamma.assign(rng.uniform(0.2 * shrink, 0.6 * shrink, n).astype("float32"))
        layer.beta.assign(rng.uniform(-0.1, 0.1, n).astype("float32"))
        layer.moving_mean.assign(rng.uniform(-0.1, 0.1, n).astype("float32"))
        layer.moving_variance.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
    for layer in net.layers:
        if isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense)) and layer.bias is not None:
            layer.bias.assign(rng.uniform(-0.1, 0.1, layer.bias.shape).astype("float32"))
    return net


def save_legacy_h5(net, path, *, keras_version="2.2.4", backend="tensorflow"):
    """Writes a Keras model's weights as Keras 2's ``save_weights("....h5")`` did,
    the format of the published keras.applications files (for tests and benchmarks):
    ``layer_names`` lists every layer, weights or not, and each layer's arrays are in
    Keras' legacy order (trainable, then non-trainable).
    """
    import h5py

    # Fixed-length byte strings, as h5py 2 stored Keras 2's lists of bytes.
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.asarray([layer.name.encode("utf8") for layer in net.layers])
        f.attrs["backend"] = np.bytes_(backend.encode("utf8"))
        f.attrs["keras_version"] = np.bytes_(keras_version.encode("utf8"))
        for layer in net.layers:
            group = f.create_group(layer.name)
            weights = layer.trainable_weights + layer.non_trainable_weights
            names = [f"{layer.name}/{w.name}:0".encode("utf8") for w in weights]
            group.attrs["weight_names"] = np.asarray(names)
            for name, w in zip(names, weights):
                group.create_dataset(name.decode("utf8"), data=np.asarray(w))
    return path
