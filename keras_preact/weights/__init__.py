"""Pretrained weights: the catalog (`list_entries`, `get_entry`), the verified download
cache (`fetch_weights`) and `.weights.h5` files that record the model's variable layout
(`save_weights_file`, `load_weights_file`), so another architecture fails loudly.
"""

from keras_preact.weights.catalog import get_entry
from keras_preact.weights.catalog import list_entries
from keras_preact.weights.catalog import render_zoo_readme
from keras_preact.weights.download import WeightsDownloadError
from keras_preact.weights.download import WeightsIntegrityError
from keras_preact.weights.download import cached_entries
from keras_preact.weights.download import clear_cache
from keras_preact.weights.download import fetch_weights
from keras_preact.weights.download import resolve_cache_dir
from keras_preact.weights.local import check_weights_file_layout
from keras_preact.weights.local import inspect_weights_file
from keras_preact.weights.local import load_weights_file
from keras_preact.weights.local import resolve_weights_argument
from keras_preact.weights.local import save_weights_file

__all__ = [
    "WeightsDownloadError",
    "WeightsIntegrityError",
    "cached_entries",
    "check_weights_file_layout",
    "clear_cache",
    "fetch_weights",
    "get_entry",
    "inspect_weights_file",
    "list_entries",
    "load_weights_file",
    "render_zoo_readme",
    "resolve_cache_dir",
    "resolve_weights_argument",
    "save_weights_file",
]
