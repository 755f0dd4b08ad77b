"""Converters ``convert(source_path, model, entry) -> dict``: load a verified published
file into `model`, built from the catalog entry's architecture, and return facts (at least
``{"converted_tensors": int}``); another architecture raises ValueError, changing nothing."""

import pkgutil

import numpy as np

#: name -> "module:function", imported on first use.
CONVERTERS = {
    "keras_weights": "keras_preact.weights.converters:convert_keras_weights",
    "pytorchcv": "keras_preact.weights.converters.pytorchcv:convert",
    "keras_applications": "keras_preact.weights.converters.keras_applications:convert"}


def get_converter(name):
    """The converter function registered as `name` (ValueError for an unknown one)."""
    if name not in CONVERTERS:
        raise ValueError(f"Unknown weights converter. Received: converter={name!r}. "
                         f"Valid: {sorted(CONVERTERS)}")
    return pkgutil.resolve_name(CONVERTERS[name])


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


def assign_arrays(model, assignments, arrays, *, what, noun, source, layout="",
                  key_name=str):
    """Assigns `arrays` (key -> numpy array) to `model`'s variables, all or nothing.

    `assignments` yields ``(variable, [(key, transform or None), ...], stacked)`` (a stacked
    variable takes one key per unit). ValueError, with nothing assigned, for missing,
    unused or mismatched arrays: it names `what` (the file's kind), `noun` (an array's),
    `layout` (the model's, optional) and `source`. Returns ``{"converted_tensors": n}``."""
    used, missing, mismatched, plan = set(), [], [], []
    for var, sources, stacked in assignments:
        keys = [k for k, _ in sources]
        used.update(k for k in keys if k in arrays)
        if absent := [k for k in keys if k not in arrays]:
            missing += absent
            continue
        values = [arrays[k] if t is None else t(arrays[k]) for k, t in sources]
        value = np.stack(values) if stacked else values[0]
        if tuple(value.shape) != tuple(var.shape):
            mismatched.append(f"{key_name(keys[0])}: file {tuple(value.shape)}, "
                              f"model {tuple(var.shape)} ({var.path})")
        else:
            plan.append((var, value))
    unused = [k for k in arrays if k not in used]
    problems = [f"{len(keys)} {text}, e.g. {[key_name(k) for k in keys[:5]]}"
                for keys, text in ((missing, f"{noun}s missing from the file"),
                                   (unused, f"unexpected {noun}s (no place in the model)"))
                if keys]
    if mismatched:
        problems.append(f"{len(mismatched)} shape mismatches, e.g. {mismatched[:3]}")
    if problems:
        head = f"classes {model.classes}" if model.include_top else "no head"
        raise ValueError(
            f"The {what} does not match the architecture of {model.name!r} ({layout}depth "
            f"{model.depth}, {model.block} units, stages {list(model.stage_blocks)}, {head}): "
            + "; ".join(problems) + f". Nothing was loaded. Received: {source}")
    for var, value in plan:
        var.assign(value.astype(var.dtype))
    return {"converted_tensors": len(arrays)}
