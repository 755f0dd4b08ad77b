"""Datasets and input pipelines: CIFAR-10/100 (TFDS or the original files), digits, folders.
TensorFlow loads on first use of the tf.data functions (`keras_preact.data.pipeline`)."""

from keras_preact.data.registry import (AUGMENTATIONS, CIFAR10_CLASSES, CIFAR100_CLASSES,
                                        channel_stats, list_datasets)
from keras_preact.data.safe_pickle import safe_load_pickle
from keras_preact.data.sources import SOURCES, clear_cache, dataset_info, load_arrays

__all__ = ["AUGMENTATIONS", "CIFAR10_CLASSES", "CIFAR100_CLASSES", "SOURCES", "channel_stats",
           "clear_cache", "dataset_from_arrays", "dataset_info", "epoch_order", "list_datasets",
           "load_arrays", "make_dataset", "safe_load_pickle"]


def __getattr__(name):
    if name in ("dataset_from_arrays", "epoch_order", "make_dataset"):
        from keras_preact.data import pipeline
        return getattr(pipeline, name)
    raise AttributeError(f"module 'keras_preact.data' has no attribute {name!r}")
