"""Pretrained weights: the catalog, the verified download cache and `.weights.h5` files
that record the model's variable layout, so that another architecture fails loudly."""

from keras_preact.weights.catalog import get_entry, list_entries, render_zoo_readme
from keras_preact.weights.download import (WeightsDownloadError, WeightsIntegrityError,
                                           cached_entries, clear_cache, convert_checkpoint,
                                           fetch_weights, resolve_cache_dir)
from keras_preact.weights.local import (check_weights_file_layout, inspect_weights_file,
                                        load_weights_file, resolve_weights_argument,
                                        save_weights_file)
from keras_preact.weights.torch_checkpoint import read_state_dict

__all__ = ["WeightsDownloadError", "WeightsIntegrityError", "cached_entries",
           "check_weights_file_layout", "clear_cache", "convert_checkpoint", "fetch_weights",
           "get_entry", "inspect_weights_file", "list_entries", "load_weights_file",
           "read_state_dict", "render_zoo_readme", "resolve_cache_dir",
           "resolve_weights_argument", "save_weights_file"]
