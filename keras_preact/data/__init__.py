"""Datasets and input pipelines: CIFAR-10/100 (TFDS or the original files), digits, folders.

Importing this package does not import TensorFlow: the registry and the array loaders
use NumPy; `make_dataset` (tf.data) imports its TensorFlow module when called, and the
TFDS and image-folder sources import TensorFlow when they read.

Example:
    >>> from keras_preact import data
    >>> data.list_datasets()
    ['cifar10', 'cifar100', 'digits', 'folder']
    >>> train = data.make_dataset("digits", "train", batch_size=64, seed=0, epoch=0,
    ...                           repeat_epochs=10)
"""

from keras_preact.data.registry import AUGMENTATIONS
from keras_preact.data.registry import CIFAR10_CLASSES
from keras_preact.data.registry import CIFAR100_CLASSES
from keras_preact.data.registry import channel_stats
from keras_preact.data.registry import list_datasets
from keras_preact.data.safe_pickle import safe_load_pickle
from keras_preact.data.sources import SOURCES
from keras_preact.data.sources import clear_cache
from keras_preact.data.sources import dataset_info
from keras_preact.data.sources import load_arrays


def make_dataset(name, split, *, batch_size=128, data_dir=None, source="auto", path=None,
                 download=False, shuffle=None, augment=None, normalize=True, seed=0,
                 epoch=0, drop_remainder=None, cache=True, repeat_epochs=None,
                 image_size=None):
    """The tf.data input pipeline of a registered dataset, deterministic per epoch.

    Order: decode -> cache -> shuffle -> batch -> augment -> normalise -> prefetch. The
    shuffle order and the augmentation of epoch ``e`` depend only on ``(seed, e)``
    (stateless random ops keyed by seed, epoch and batch index), never on how many
    epochs ran before: to resume at epoch 3, pass ``epoch=3`` and get exactly the
    batches an uninterrupted run sees in its epoch 3.

    Args:
        name: "cifar10", "cifar100", "digits" or "folder" (see `list_datasets`).
        split: "train" or "test".
        batch_size: int, default 128 (the paper's CIFAR batch size).
        data_dir: CIFAR: a folder with the original files or TFDS' data folder.
        source: CIFAR: "auto", "tfds" or "archive" (see `load_arrays`).
        path: CIFAR: an archive or extracted folder; "folder": the image folder.
        download: bool, let TFDS download (default False: offline).
        shuffle: None (True for train, False for test) or a bool.
        augment: None (the dataset's default policy for train, none for test), True
            (the default policy), False (none) or a policy name from `AUGMENTATIONS`.
            CIFAR and folders: "pad_crop_flip" (4-pixel zero pad, random crop, random
            horizontal flip); digits: "pad_crop" (no flip: a flip changes a digit).
        normalize: bool; True: ``(x / 255 - mean) / std`` with the dataset's
            per-channel statistics; False: raw float32 pixels in [0, 255], for a model
            that carries its own `preprocessing`.
        seed: int >= 0, keys the order and the augmentation.
        epoch: int >= 0, the first epoch yielded (the resume point).
        drop_remainder: None (True for train, False for test) or a bool.
        cache: bool, keep the decoded split in memory across calls (so building one
            dataset per epoch costs no re-decoding).
        repeat_epochs: None (one epoch), k > 0 (epochs ``epoch .. epoch + k - 1``
            concatenated, each in its own order) or -1 (without end; give Keras
            `steps_per_epoch`).
        image_size: "folder" only: (height, width), default (32, 32).

    Returns:
        `tf.data.Dataset` of ``(float32 images (B, H, W, C), int32 labels (B,))``; its
        cardinality is ``repeat_epochs * steps_per_epoch`` (unless -1).

    Raises:
        ValueError: for an unknown dataset (the message lists the valid names), invalid
            arguments, data that is not there, or corrupt files (naming the file).

    Example:
        >>> ds = make_dataset("cifar10", "train", data_dir="~/data", source="archive",
        ...                   seed=0, epoch=start_epoch, repeat_epochs=epochs - start_epoch)
        >>> model.fit(ds, epochs=epochs, initial_epoch=start_epoch,
        ...           steps_per_epoch=int(ds.cardinality()) // (epochs - start_epoch))
    """
    from keras_preact.data import pipeline

    return pipeline.make_dataset(
        name, split, batch_size=batch_size, data_dir=data_dir, source=source, path=path,
        download=download, shuffle=shuffle, augment=augment, normalize=normalize,
        seed=seed, epoch=epoch, drop_remainder=drop_remainder, cache=cache,
        repeat_epochs=repeat_epochs, image_size=image_size,
    )


def dataset_from_arrays(images, labels, **kwargs):
    """The pipeline of `make_dataset` over your own uint8 arrays.

    See `keras_preact.data.pipeline.dataset_from_arrays` for the arguments
    (batch_size, shuffle, augment, normalize, mean, std, seed, epoch, drop_remainder,
    repeat_epochs).

    Example:
        >>> ds = dataset_from_arrays(x, y, batch_size=32, normalize=False)
    """
    from keras_preact.data import pipeline

    return pipeline.dataset_from_arrays(images, labels, **kwargs)


def epoch_order(num_examples, *, seed=0, epoch=0):
    """The order in which a shuffled epoch visits the examples (a permutation).

    Example:
        >>> order = epoch_order(50000, seed=0, epoch=3)
    """
    from keras_preact.data import pipeline

    return pipeline.epoch_order(num_examples, seed=seed, epoch=epoch)


__all__ = [
    "AUGMENTATIONS",
    "CIFAR10_CLASSES",
    "CIFAR100_CLASSES",
    "SOURCES",
    "channel_stats",
    "clear_cache",
    "dataset_from_arrays",
    "dataset_info",
    "epoch_order",
    "list_datasets",
    "load_arrays",
    "make_dataset",
    "safe_load_pickle",
]
