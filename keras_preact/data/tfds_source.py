"""CIFAR-10/100 through TensorFlow Datasets, read into uint8 arrays.

`tensorflow_datasets` (and with it TensorFlow) is imported only when this source is
used. By default nothing is downloaded (`download=False`): the data must already be
prepared in `data_dir` (TFDS' default is ``~/tensorflow_datasets``).
"""

import numpy as np

#: TFDS builder names of the datasets this source serves.
TFDS_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100"}
_CHUNK = 4096


def read_tfds(name, split, *, data_dir=None, download=False):
    """Loads one split of a TFDS dataset into memory.

    Args:
        name: "cifar10" or "cifar100".
        split: "train" or "test".
        data_dir: TFDS data folder; None uses TFDS' default.
        download: bool, let TFDS download and prepare the data (needs network).

    Returns:
        ``(images, labels, meta)``: uint8 (N, 32, 32, 3), int64 (N,) and a dict with
        "source", "data_dir" and "version". For CIFAR-100 the labels are TFDS' "label"
        feature (the 100 fine classes).

    Raises:
        ValueError: when the data is not prepared in `data_dir` and `download` is False
            (the message names `data_dir`), or for an unknown name or split.

    Example:
        >>> images, labels, _ = read_tfds("cifar10", "test", data_dir="~/tensorflow_datasets")
    """
    if name not in TFDS_NAMES:
        raise ValueError(
            f"No TFDS source for dataset {name!r}. Valid: {sorted(TFDS_NAMES)}"
        )
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")
    import os

    import tensorflow_datasets as tfds

    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    try:
        ds, info = tfds.load(
            TFDS_NAMES[name],
            split=split,
            data_dir=data_dir,
            download=bool(download),
            as_supervised=True,
            shuffle_files=False,
            with_info=True,
        )
    except (AssertionError, FileNotFoundError, tfds.core.registered.DatasetNotFoundError) as err:
        where = data_dir if data_dir is not None else "TFDS' default (~/tensorflow_datasets)"
        raise ValueError(
            f"The TFDS dataset {TFDS_NAMES[name]!r} is not prepared in data_dir={where!r} "
            f"({str(err).splitlines()[0]}). Prepare it there (e.g. `tfds build "
            f"{TFDS_NAMES[name]} --data_dir ...` on a machine with network, or "
            "download=True), or use source='archive' with the original CIFAR files."
        ) from None
    images, labels = [], []
    # Batched reads, not batch_size=-1: the whole-split read relies on split metadata
    # that mocked or partially prepared builders lack.
    for x, y in tfds.as_numpy(ds.batch(_CHUNK)):
        images.append(np.asarray(x, dtype=np.uint8))
        labels.append(np.asarray(y, dtype=np.int64))
    if not images:
        raise ValueError(
            f"The TFDS dataset {TFDS_NAMES[name]!r} split {split!r} in data_dir="
            f"{data_dir!r} is empty."
        )
    images = np.concatenate(images)
    if images.shape[1:] != (32, 32, 3):
        raise ValueError(
            f"The TFDS dataset {TFDS_NAMES[name]!r} has images of shape "
            f"{images.shape[1:]}; expected (32, 32, 3)."
        )
    meta = {"source": "tfds", "data_dir": data_dir, "version": str(info.version)}
    return images, np.concatenate(labels), meta
