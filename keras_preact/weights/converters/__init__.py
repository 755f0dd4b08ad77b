"""Converters ``convert(source_path, model, entry) -> dict``: load a verified published
file into `model`, built from the catalog entry's architecture, and return facts (at least
``{"converted_tensors": int}``); another architecture raises ValueError, changing nothing.
"""

import importlib

import numpy as np

#: name -> "module:function", imported on first use (torch only for "pytorchcv").
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
    """Raises ValueError unless `model` is a `PreActResNet` (told apart by its stages:
    weights/ never imports models/)."""
    if not hasattr(model, "stage_blocks"):
        raise ValueError(f"The {converter} converter loads into a keras_preact PreActResNet. "
                         f"Received: {type(model).__name__}")


def match_arrays(assignments, arrays):
    """Pairs each variable with its source arrays, checking the shapes; assigns nothing.

    `assignments` yields ``(variable, [(key, transform or None), ...], stacked)`` (a
    stacked variable takes one key per row); `arrays` maps key -> numpy array. Returns
    (plan: [(variable, value)], missing keys, mismatches: [(keys, shape, variable)],
    unused keys)."""
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


def describe_mismatches(mismatched, *, source, rows, key_name=str):
    """``["N shape mismatches, e.g. [...]"]`` for `match_arrays`' mismatches (``[]`` for
    none): `source` names the file's side, `rows` a stacked variable's rows."""
    if not mismatched:
        return []
    examples = []
    for keys, shape, var in mismatched[:3]:
        more = f" (+{len(keys) - 1} {rows})" if len(keys) > 1 else ""
        examples.append(f"{key_name(keys[0])}{more}: {source} {shape}, "
                        f"model {tuple(var.shape)} ({var.path})")
    return [f"{len(mismatched)} shape mismatches, e.g. {examples}"]


def assign_all(plan):
    """Assigns a `match_arrays` plan."""
    for var, value in plan:
        var.assign(value.astype(var.dtype))
