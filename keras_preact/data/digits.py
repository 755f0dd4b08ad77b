"""scikit-learn's 8 x 8 handwritten digits (1,797 real images, UCI "Optical Recognition of
Handwritten Digits"), shaped like CIFAR (32 x 32 x 3 uint8): offline, real images, seconds.

The values 0..16 are scaled to 0..255 (``round(v * 255 / 16)``), each pixel repeated into
a 4 x 4 block (nearest-neighbour: no new intensities) and the grey plane copied to three
channels. Split: 20% of every class held out with seed 0 (`registry.stratified_split`):
1,438 train and 359 test images.
"""

import numpy as np

from keras_preact.data.registry import SPLITS
from keras_preact.data.registry import stratified_split
from keras_preact.layers.utils import check_choice

UPSAMPLE = 4


def read_digits(split):
    """One split ("train" or "test") of the digits: ``(images, labels, meta)``, uint8
    (N, 32, 32, 3), int64 (N,) and a dict with "indices" (positions in scikit-learn's
    array) and "source".
    """
    from sklearn.datasets import load_digits

    check_choice("split", split, SPLITS)
    bunch = load_digits()
    small = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    big = np.repeat(np.repeat(small, UPSAMPLE, axis=1), UPSAMPLE, axis=2)
    images = np.repeat(big[..., None], 3, axis=-1)
    train, test = stratified_split(bunch.target)
    idx = train if split == "train" else test
    return images[idx], bunch.target[idx].astype(np.int64), {"indices": idx, "source": "sklearn"}
