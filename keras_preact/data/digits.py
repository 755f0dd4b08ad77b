"""scikit-learn's 8 x 8 handwritten digits, shaped like CIFAR (32 x 32 x 3 uint8).

The data (1,797 real images, UCI "Optical Recognition of Handwritten Digits") ships with
scikit-learn, so this dataset works offline and lets the whole training path run on
real images in seconds.

Conversion: the values 0..16 are scaled to 0..255 (``round(v * 255 / 16)``), each pixel
is repeated into a 4 x 4 block (nearest-neighbour upsampling: no new intensities, every
32 x 32 image is exactly its 8 x 8 source at 4x) and the grey plane is copied to three
channels. Split: stratified per class with seed 0, 20% of every class held out
(`keras_preact.data.registry.stratified_split`): 1,438 train and 359 test images.
"""

import numpy as np

from keras_preact.data.registry import check_split
from keras_preact.data.registry import stratified_split

NUM_CLASSES = 10
NUM_IMAGES = 1797
TEST_FRACTION = 0.2
SPLIT_SEED = 0
UPSAMPLE = 4


def load_digits_images():
    """All 1,797 digits as uint8 (1797, 32, 32, 3) and int64 labels, in sklearn's order."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    small = np.rint(bunch.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    big = np.repeat(np.repeat(small, UPSAMPLE, axis=1), UPSAMPLE, axis=2)
    images = np.ascontiguousarray(np.repeat(big[..., None], 3, axis=-1))
    return images, bunch.target.astype(np.int64)


def read_digits(split):
    """One split ("train" or "test") of the digits: ``(images, labels, meta)``, uint8
    (N, 32, 32, 3), int64 (N,) and a dict with "indices" (positions in scikit-learn's
    array) and "source".
    """
    check_split(split)
    images, labels = load_digits_images()
    train, test = stratified_split(labels, test_fraction=TEST_FRACTION, seed=SPLIT_SEED)
    idx = train if split == "train" else test
    return images[idx], labels[idx], {"indices": idx, "source": "sklearn"}
