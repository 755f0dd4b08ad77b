"""The dataset registry (names, shapes, sizes, classes, statistics in [0, 1] units,
augmentation) and the NumPy helpers the sources share; reads no dataset file."""

import numpy as np

from keras_preact.layers.preprocessing import PRESETS
from keras_preact.zoo_catalog import load_json

#: The catalog's class lists (``zoo/classes/``): CIFAR-100's 100 fine classes in label order.
CIFAR10_CLASSES = tuple(load_json("classes/cifar10.json"))
CIFAR100_CLASSES = tuple(load_json("classes/cifar100.json"))

#: "pad_crop_flip" is the paper's CIFAR augmentation (He et al. 2016a, Sec. 4.2: 4-pixel
#: padding, random crop, random horizontal flip); "pad_crop" spares digits the flip.
AUGMENTATIONS = ("pad_crop_flip", "pad_crop", "none")
SPLITS = ("train", "test")
MAX_SEED = 2**63 - 1


def _entry(description, classes, class_names, mean, std, stats_source, augmentation,
           sources, num_train=None, num_test=None):
    return dict(description=description, classes=classes, input_shape=(32, 32, 3),
                num_train=num_train, num_test=num_test, class_names=class_names, mean=mean,
                std=std, stats_source=stats_source, augmentation=augmentation, sources=sources)


def _cifar(n, description, class_names):
    # The model presets' statistics (pytorchcv's std): as `preprocessing="cifar10"` sees them.
    name = f"cifar{n}"
    return _entry(description, n, class_names, *PRESETS[name][1:3],
                  f"published (pytorchcv, the {name!r} preprocessing preset)", "pad_crop_flip",
                  ("tfds", "archive"), 50000, 10000)


_COMPUTED = "computed on the train split"
#: The registered datasets' published facts (`sources.dataset_info` adds computed ones).
DATASETS = {
    "cifar10": _cifar(10, "CIFAR-10 (Krizhevsky 2009): 32x32 colour images, 10 classes.",
                      CIFAR10_CLASSES),
    "cifar100": _cifar(100, "CIFAR-100 (Krizhevsky 2009): 32x32 colour images, 100 fine "
                       "classes.", CIFAR100_CLASSES),
    "digits": _entry(
        "scikit-learn's 8x8 handwritten digits (1,797 real images), scaled to 0..255, "
        "upsampled 4x (nearest) to 32x32, grey copied to 3 channels; stratified 80/20 "
        "split with seed 0.", 10, tuple(str(i) for i in range(10)), None, None, _COMPUTED,
        "pad_crop", ("sklearn",), 1438, 359),
    "folder": _entry(
        "A folder (or an archive) of images with one sub-folder per class (or train/ and "
        "test/ or val/ holding those); needs `path`.", None, None, None, None, _COMPUTED,
        "pad_crop_flip", ("folder",))}


def list_datasets():
    """The sorted names of the registered datasets."""
    return sorted(DATASETS)


def check_dataset_name(name, argument="name"):
    """Raises ValueError listing the valid names when `name` (an `argument`) is not registered."""
    if not isinstance(name, str) or name not in DATASETS:
        raise ValueError(f"Unknown dataset name. Received: {argument}={name!r}. "
                         f"Valid: {list_datasets()}")


def channel_stats(images):
    """Per-channel ``(mean, std)`` of uint8 NHWC images in [0, 1] units, tuples of C floats
    (a channel with zero spread gets std 1 so normalisation stays finite)."""
    x = np.asarray(images, dtype=np.float64).reshape(-1, images.shape[-1]) / 255.0
    std = x.std(axis=0)
    return tuple(map(float, x.mean(axis=0))), tuple(map(float, np.where(std > 0, std, 1.0)))


def stratified_split(labels, *, test_fraction=0.2, seed=0):
    """Sorted int64 ``(train, test)`` example indices, ``round(test_fraction * count)`` of
    each class in test, chosen by NumPy's legacy `RandomState` (frozen across releases)."""
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError("`test_fraction` must be in (0, 1). "
                         f"Received: test_fraction={test_fraction!r}")
    labels, rng = np.asarray(labels), np.random.RandomState(seed)
    shuffled = [rng.permutation(np.flatnonzero(labels == cls)) for cls in np.unique(labels)]
    cuts = [(members, int(round(test_fraction * len(members)))) for members in shuffled]
    train, test = [m[n:] for m, n in cuts], [m[:n] for m, n in cuts]
    return tuple(np.sort(np.concatenate(part)).astype(np.int64) for part in (train, test))
