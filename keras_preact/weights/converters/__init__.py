"""Converters ``convert(source_path, model, entry) -> dict``: load a verified published
file into `model`, built from the catalog entry's architecture, and return facts (at least
``{"converted_tensors": int}``); another architecture raises ValueError, changing nothing."""

import importlib

import numpy as np

#: name -> "module:function", imported on first use (torch only for "pytorchcv").
CONVERTERS = {
    "keras_weights": "keras_preact.weights.converters:convert_keras_weights",
    "pytorchcv": "keras_preact.weights.converters.pytorchcv:convert",
    "keras_applications": "keras_preact.weights.converters.keras_applications:convert"}


def get_converter(name):
    """The converter function registered as `name` (ValueError for an unknown one)."""
    if name not in CONVERTERS:
        raise ValueError(f"Unknown weights converter. Received: converter={name!r}. "
                         f"Valid: {sorted(CONVERTERS)}")
    module_name, func_name = CONVERTERS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)


def convert_keras_weights(source_path, model, entry):
    """Converter for published files that already are keras-preact `.weights.h5` files."""
    from keras_preact.weights.local import load_weights_file
    load_weights_file(model, source_path)
    return {"converted_tensors": len(model.weights)}


def require_preact_resnet(model, converter):
    """Raises ValueError unless `model` is a `PreActResNet` (told apart by its stages)."""
    if not hasattr(model, "stage_blocks"):
        raise ValueError(f"The {converter} converter loads into a keras_preact PreActResNet. "
                         f"Received: {type(model).__name__}")


def match_arrays(assignments, arrays, *, source, rows, key_name=str):
    """Pairs each variable with its source arrays, checking the shapes; assigns nothing.

    `assignments` yields ``(variable, [(key, transform or None), ...], stacked)`` (a stacked
    variable takes one key per row); `arrays` maps key -> numpy array; `source`, `rows` and
    `key_name` word the shape mismatches. Returns (plan for `assign_all`, missing keys,
    unused keys, problems: [] or the message on shape mismatches)."""
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
    examples = []
    for keys, shape, var in mismatched[:3]:
        more = f" (+{len(keys) - 1} {rows})" if len(keys) > 1 else ""
        examples.append(f"{key_name(keys[0])}{more}: {source} {shape}, "
                        f"model {tuple(var.shape)} ({var.path})")
    problems = [f"{len(mismatched)} shape mismatches, e.g. {examples}"] if mismatched else []
    return plan, missing, [k for k in arrays if k not in used], problems


def assign_all(plan):
    """Assigns a `match_arrays` plan."""
    for var, value in plan:
        var.assign(value.astype(var.dtype))
