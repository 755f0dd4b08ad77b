"""Weights: local `.weights.h5` files for now (the catalog and downloads come later)."""

from keras_preact.weights.local import inspect_weights_file
from keras_preact.weights.local import load_weights_file
from keras_preact.weights.local import resolve_weights_argument

__all__ = ["inspect_weights_file", "load_weights_file", "resolve_weights_argument"]
