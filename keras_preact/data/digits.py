"""scikit-learn's 8 x 8 handwritten digits shaped like CIFAR (see ``DATASETS["digits"]``): each
pixel a 4 x 4 block (no new intensities); 1,438 train and 359 test images."""

import numpy as np

from keras_preact.checks import check_choice
from keras_preact.data.registry import SPLITS, stratified_split

UPSAMPLE = 4


def read_digits(split):
    """One split ("train" or "test"): ``(images, labels, meta)``, uint8 (N, 32, 32, 3), int64
    (N,) and a dict with "indices" (positions in scikit-learn's array) and "source"."""
    from sklearn.datasets import load_digits
    check_choice("split", split, SPLITS)
    bunch = load_digits()
    small = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    images = small.repeat(UPSAMPLE, axis=1).repeat(UPSAMPLE, axis=2)[..., None].repeat(3, axis=-1)
    idx = stratified_split(bunch.target)[0 if split == "train" else 1]
    return images[idx], bunch.target[idx].astype(np.int64), {"indices": idx, "source": "sklearn"}
