"""CIFAR-10/100 through TensorFlow Datasets, read into uint8 arrays.

`tensorflow_datasets` (and TensorFlow) is imported only when this source is used. By
default nothing is downloaded: the data must be prepared in `data_dir` (TFDS' default
is ``~/tensorflow_datasets``).
"""

import os

import numpy as np

from keras_preact.layers.utils import check_choice
from keras_preact.data.registry import check_split

#: TFDS builder names of the datasets this source serves.
TFDS_NAMES = {"cifar10": "cifar10", "cifar100": "cifar100"}
_CHUNK = 4096


def read_tfds(name, split, *, data_dir=None, download=False):
    """Loads one split of CIFAR-10/100 from TFDS' `data_dir` (None: TFDS' default) into
    memory; `download` lets TFDS download and prepare it (needs network).

    Returns:
        ``(images, labels, meta)``: uint8 (N, 32, 32, 3), int64 (N,) (CIFAR-100: the
        100 fine classes) and a dict with "source", "data_dir" and "version".

    Raises:
        ValueError: when the data is not prepared in `data_dir` and `download` is False,
            or for an unknown name or split.
    """
    check_choice("name", name, sorted(TFDS_NAMES))
    check_split(split)
    import tensorflow_datasets as tfds

    tfds_name = TFDS_NAMES[name]
    if data_dir is not None:
        data_dir = os.path.expanduser(os.fspath(data_dir))
    try:
        ds, info = tfds.load(tfds_name, split=split, data_dir=data_dir, download=bool(download),
                             as_supervised=True, shuffle_files=False, with_info=True)
    except (AssertionError, FileNotFoundError, tfds.core.registered.DatasetNotFoundError) as err:
        where = data_dir if data_dir is not None else "TFDS' default (~/tensorflow_datasets)"
        raise ValueError(f"The TFDS dataset {tfds_name!r} is not prepared in data_dir={where!r} "
                         f"({str(err).splitlines()[0]}). Prepare it there (e.g. `tfds build "
                         f"{tfds_name} --data_dir ...` on a machine with network, or download=True), "
                         "or use source='archive' with the original CIFAR files.") from None
    # Batched reads, not batch_size=-1: the whole-split read relies on split metadata
    # that mocked or partially prepared builders lack.
    batches = list(tfds.as_numpy(ds.batch(_CHUNK)))
    if not batches:
        raise ValueError(f"The TFDS dataset {tfds_name!r} split {split!r} in data_dir={data_dir!r} is empty.")
    images = np.concatenate([np.asarray(x, dtype=np.uint8) for x, _ in batches])
    if images.shape[1:] != (32, 32, 3):
        raise ValueError(f"The TFDS dataset {tfds_name!r} has images of shape {images.shape[1:]}; "
                         "expected (32, 32, 3).")
    labels = np.concatenate([np.asarray(y, dtype=np.int64) for _, y in batches])
    return images, labels, {"source": "tfds", "data_dir": data_dir, "version": str(info.version)}
