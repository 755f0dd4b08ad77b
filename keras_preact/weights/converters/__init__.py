"""Converters: a published weights file into the weights of a built keras-preact model.

A converter is ``convert(source_path, model, entry) -> dict``: it loads the verified
published file (for a zip release, its extracted ``archive_member``) into `model`,
built from the catalog entry's architecture, and returns facts about the conversion
(at least ``{"converted_tensors": int}``); a file of another architecture raises
ValueError before any variable changes. Converters are imported on first use, so
torch is needed only for the PyTorch one.
"""

import importlib

import numpy as np

#: name -> "module:function". Only the named module is imported, on first use.
CONVERTERS = {
    # The published file already is a Keras `.weights.h5` of this architecture.
    "keras_weights": "keras_preact.weights.converters.keras_weights:convert",
    # imgclsmob / pytorchcv `.pth` state dicts (needs the `torch` extra).
    "pytorchcv": "keras_preact.weights.converters.pytorchcv:convert",
    # keras.applications ResNet50V2/101V2/152V2 `.h5` files.
    "keras_applications": "keras_preact.weights.converters.keras_applications:convert",
}


def get_converter(name):
    """The converter function registered as `name` (ValueError for an unknown one)."""
    if name not in CONVERTERS:
        raise ValueError(f"Unknown weights converter. Received: converter={name!r}. "
                         f"Valid: {sorted(CONVERTERS)}")
    module_name, func_name = CONVERTERS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def require_preact_resnet(model, converter):
    """Raises ValueError unless `model` is a `PreActResNet`, told apart by its stages,
    not its class: weights/ never imports models/."""
    if not hasattr(model, "stage_blocks"):
        raise ValueError(f"The {converter} converter loads into a keras_preact PreActResNet. "
                         f"Received: {type(model).__name__}")


def match_arrays(assignments, arrays):
    """Pairs each variable with its source arrays, checking the shapes; assigns nothing.

    `assignments` yields ``(variable, [(key, transform or None), ...], stacked)`` (a
    stacked variable takes one key per row); `arrays` maps key -> numpy array.
    Returns (plan: [(variable, value)], missing keys, shape mismatches:
    [(keys, value shape, variable)], keys of `arrays` no variable used).
    """
    used, missing, mismatched, plan = set(), [], [], []
    for var, sources, stacked in assignments:
        keys = [k for k, _ in sources]
        used.update(k for k in keys if k in arrays)
        absent = [k for k in keys if k not in arrays]
        if absent:
            missing += absent
            continue
        values = [arrays[k] if t is None else t(arrays[k]) for k, t in sources]
        value = np.stack(values) if stacked else values[0]
        if tuple(value.shape) != tuple(var.shape):
            mismatched.append((keys, tuple(value.shape), var))
        else:
            plan.append((var, value))
    return plan, missing, mismatched, [k for k in arrays if k not in used]


def assign_all(plan):
    """Assigns a `match_arrays` plan; returns the number of variables assigned."""
    for var, value in plan:
        var.assign(value.astype(var.dtype))
    return len(plan)
