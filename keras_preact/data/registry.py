"""The dataset registry: names, shapes, sizes, classes, statistics, augmentation.

No TensorFlow here and no file read (`sources.dataset_info` adds what the files say).
Statistics are per channel in [0, 1] units (pixels / 255).
"""

import numpy as np

from keras_preact.layers.preprocessing import PRESETS

CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip

# The 100 fine classes in label order (alphabetical, as in the dataset's meta file).
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle",
    "bicycle", "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can",
    "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud",
    "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin",
    "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo",
    "keyboard", "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man",
    "maple_tree", "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange",
    "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain",
    "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail",
    "snake", "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table",
    "tank", "telephone", "television", "tiger", "tractor", "train", "trout", "tulip",
    "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

#: Augmentation policies `make_dataset` knows. "pad_crop_flip" is the CIFAR augmentation
#: the paper uses (from He et al. 2016a, Sec. 4.2: 4-pixel padding, random 32 x 32 crop,
#: random horizontal flip); "pad_crop" drops the flip, which would change a digit.
AUGMENTATIONS = ("pad_crop_flip", "pad_crop", "none")

# Published statistics, shared with the model presets so that a model that carries
# `preprocessing="cifar10"` sees exactly what this pipeline's normalisation produces.
# The std values are the widely used pytorchcv ones (the true pixel std of the
# CIFAR-10 train split is about 0.247, 0.243, 0.261); they are kept for that agreement.
_CIFAR10_MEAN, _CIFAR10_STD = PRESETS["cifar10"][1], PRESETS["cifar10"][2]
_CIFAR100_MEAN, _CIFAR100_STD = PRESETS["cifar100"][1], PRESETS["cifar100"][2]

#: The registered datasets' published facts (`sources.dataset_info` adds what is
#: computed from the files: the digits' statistics, a folder's classes and sizes).
DATASETS = {
    "cifar10": {
        "description": "CIFAR-10 (Krizhevsky 2009): 32x32 colour images, 10 classes.",
        "num_classes": 10,
        "image_shape": (32, 32, 3),
        "num_train": 50000,
        "num_test": 10000,
        "class_names": CIFAR10_CLASSES,
        "mean": _CIFAR10_MEAN,
        "std": _CIFAR10_STD,
        "stats_source": "published (pytorchcv, the 'cifar10' preprocessing preset)",
        "augmentation": "pad_crop_flip",
        "sources": ("tfds", "archive"),
    },
    "cifar100": {
        "description": "CIFAR-100 (Krizhevsky 2009): 32x32 colour images, 100 fine classes.",
        "num_classes": 100,
        "image_shape": (32, 32, 3),
        "num_train": 50000,
        "num_test": 10000,
        "class_names": CIFAR100_CLASSES,
        "mean": _CIFAR100_MEAN,
        "std": _CIFAR100_STD,
        "stats_source": "published (pytorchcv, the 'cifar100' preprocessing preset)",
        "augmentation": "pad_crop_flip",
        "sources": ("tfds", "archive"),
    },
    "digits": {
        "description": (
            "scikit-learn's 8x8 handwritten digits (1,797 real images), scaled to "
            "0..255, upsampled 4x (nearest) to 32x32, grey copied to 3 channels; "
            "stratified 80/20 split with seed 0."
        ),
        "num_classes": 10,
        "image_shape": (32, 32, 3),
        "num_train": 1438,
        "num_test": 359,
        "class_names": tuple(str(i) for i in range(10)),
        "mean": None,  # Computed on the train split (see `sources.dataset_info`).
        "std": None,
        "stats_source": "computed on the train split",
        "augmentation": "pad_crop",
        "sources": ("sklearn",),
    },
    "folder": {
        "description": (
            "A folder of images with one sub-folder per class (or train/ and test/ "
            "sub-folders holding those); needs `path`."
        ),
        "num_classes": None,
        "image_shape": (32, 32, 3),
        "num_train": None,
        "num_test": None,
        "class_names": None,
        "mean": None,
        "std": None,
        "stats_source": "computed on the train split",
        "augmentation": "pad_crop_flip",
        "sources": ("folder",),
    },
}


def list_datasets():
    """Names of the registered datasets.

    Returns:
        list of str, sorted.

    Example:
        >>> list_datasets()
        ['cifar10', 'cifar100', 'digits', 'folder']
    """
    return sorted(DATASETS)


def check_dataset_name(name):
    """Raises ValueError listing the valid names when `name` is not registered."""
    if not isinstance(name, str) or name not in DATASETS:
        raise ValueError(
            f"Unknown dataset name. Received: name={name!r}. Valid: {list_datasets()}"
        )


def channel_stats(images):
    """Per-channel mean and std of uint8 NHWC images, in [0, 1] units.

    Args:
        images: uint8 array (N, H, W, C).

    Returns:
        ``(mean, std)``, tuples of C floats (std over all pixels of the channel; a
        channel with zero spread gets std 1 so normalisation stays finite).
    """
    x = np.asarray(images, dtype=np.float64).reshape(-1, images.shape[-1]) / 255.0
    mean = x.mean(axis=0)
    std = x.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)
