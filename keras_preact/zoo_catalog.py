"""Access to the catalog shipped as the package data of `keras_preact.zoo`."""

import json
from importlib import resources


def load_json(name):
    """Loads `name` (e.g. "models.json") from the installed catalog; ValueError if absent."""
    ref = resources.files("keras_preact.zoo").joinpath(name)
    if not ref.is_file():
        raise ValueError(f"The catalog has no file {name!r}.")
    return json.loads(ref.read_text(encoding="utf-8"))
