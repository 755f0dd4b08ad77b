"""Converters: turn a published weights file into the weights of a built keras-preact model.

A converter is a function ``convert(source_path, model, entry) -> dict``:

- ``source_path``: the verified published file (for a zip release, the extracted member
  named by the catalog entry's ``archive_member``);
- ``model``: a keras-preact model already built from the entry's architecture config;
- ``entry``: the catalog entry (a dict), for converter options (``converter_args``).

It loads the weights into ``model`` in place, raising ``ValueError`` with a clear message
when the file holds another architecture, and returns a dict of facts about the
conversion (at least ``{"converted_tensors": int}``). Converters are imported lazily by
name, so torch is only needed for the PyTorch ones.
"""

import importlib

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
    """Returns the converter function registered as `name`.

    Raises:
        ValueError: for an unknown name (the message lists the valid ones).
    """
    if name not in CONVERTERS:
        raise ValueError(
            f"Unknown weights converter. Received: converter={name!r}. "
            f"Valid: {sorted(CONVERTERS)}"
        )
    module_name, func_name = CONVERTERS[name].split(":")
    return getattr(importlib.import_module(module_name), func_name)
