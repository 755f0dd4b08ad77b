"""Validation and loading of local Keras `.weights.h5` files.

Keras matches `.weights.h5` variables by layer class and creation order, not by layer
name, so a file from another architecture can load silently wrong when shapes agree.
These helpers inspect the file before any layer is built and fail loudly instead.
"""

import os

WEIGHTS_SUFFIX = ".weights.h5"


def resolve_weights_argument(weights):
    """Validates a factory's `weights` argument.

    Args:
        weights: None or a path to an existing Keras `.weights.h5` file.

    Returns:
        None or the absolute path.

    Raises:
        ValueError: if the path does not exist, is not a `.weights.h5` or not HDF5.
    """
    if weights is None:
        return None
    if not isinstance(weights, (str, os.PathLike)):
        raise ValueError(
            "`weights` must be None or a path to a .weights.h5 file. "
            f"Received: weights={weights!r}"
        )
    path = os.path.abspath(os.fspath(weights))
    if not str(path).endswith(WEIGHTS_SUFFIX):
        raise ValueError(
            "`weights` must be None or a path to a Keras weights file ending in "
            f"'{WEIGHTS_SUFFIX}'. Received: weights={weights!r}"
        )
    if not os.path.isfile(path):
        raise ValueError(
            f"The weights file does not exist. Received: weights={weights!r}"
        )
    import h5py

    if not h5py.is_hdf5(path):
        raise ValueError(
            "The weights file is not an HDF5 file (corrupt or of another format). "
            f"Received: weights={weights!r}"
        )
    return path


def inspect_weights_file(path):
    """Reads the stem and head shapes of a keras-preact `.weights.h5` file.

    Returns:
        dict with "in_channels", "stem_filters" and "kernel_size" (from the stem conv)
        and "classes" (None when the file has no dense head).

    Raises:
        ValueError: if the file does not hold a keras-preact model's weights.
    """
    import h5py

    with h5py.File(path, "r") as f:
        stem = f.get("layers/conv2d/vars/0")
        if stem is None or len(stem.shape) != 4:
            raise ValueError(
                "The weights file does not hold a keras-preact model's weights (no "
                f"stem convolution found). Received: weights={path!r}"
            )
        dense = f.get("layers/dense/vars/0")
        return {
            "kernel_size": int(stem.shape[0]),
            "in_channels": int(stem.shape[2]),
            "stem_filters": int(stem.shape[3]),
            "classes": None if dense is None else int(dense.shape[1]),
        }


def check_weights_compatible(path, *, channels, stem_filters, include_top, classes):
    """Raises ValueError when a weights file cannot fit the requested model."""
    info = inspect_weights_file(path)
    if info["in_channels"] != channels:
        raise ValueError(
            f"The weights expect {info['in_channels']}-channel input, but the model "
            f"was asked for {channels} channels. Received: input_shape with "
            f"{channels} channels, weights={path!r}"
        )
    if info["stem_filters"] != stem_filters:
        raise ValueError(
            f"The weights have a stem of {info['stem_filters']} filters; this model "
            f"has {stem_filters}. Received: weights={path!r}"
        )
    if include_top:
        if info["classes"] is None:
            raise ValueError(
                "The weights have no classifier head; use include_top=False. "
                f"Received: include_top=True, weights={path!r}"
            )
        if info["classes"] != classes:
            raise ValueError(
                f"The weights' classifier has {info['classes']} classes. Received: "
                f"classes={classes}. Pass classes={info['classes']}, or "
                "include_top=False to reuse the features."
            )
    return info


def load_weights_file(model, path):
    """Loads `path` into `model`, turning Keras' shape errors into a clear message."""
    try:
        model.load_weights(path)
    except ValueError as err:
        raise ValueError(
            f"The weights file does not match the architecture of {model.name!r}: "
            f"{err}. Received: weights={path!r}"
        ) from None
