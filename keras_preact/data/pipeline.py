"""The tf.data pipeline over in-memory uint8 arrays. Step ``s`` is batch ``b = s % steps`` of
epoch ``e = epoch + s // steps``: the order is keyed by ``(seed, e)``, the augmentation by
``(seed, e, b)`` (`stateless_key`), so a resumed run sees an uninterrupted run's batches."""

import math

import numpy as np
import tensorflow as tf

from keras_preact.checks import check_bool, check_choice, check_int
from keras_preact.data.registry import AUGMENTATIONS, MAX_SEED
from keras_preact.data.sources import dataset_info, load_arrays

# Distinct streams for the order and for the augmentation of the same (seed, epoch).
_SHUFFLE_STREAM, _AUGMENT_STREAM, _CUTOUT_STREAM = 0, 1, 2
#: Padding of the paper's CIFAR augmentation (He et al. 2016a, Sec. 4.2).
PAD = 4
# Every stateless op names its algorithm ("auto_select" may differ, and so the numbers, by device).
ALG = "philox"


def stateless_key(seed, epoch, stream, index=None):
    """The int64 (2,) key of ``(seed, epoch, stream)``, folded with `index` when given."""
    base = tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64), alg=ALG)
    return key if index is None else tf.random.experimental.stateless_fold_in(
        key, tf.cast(index, tf.int64), alg=ALG)


def pad_crop_flip(images, key, *, pad=PAD, flip=True):
    """Zero-pads (B, H, W, C) `images` by `pad` (black, as the paper's Torch code pads),
    crops back to (H, W) at random and with `flip` flips half of them, keyed by `key`."""
    crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2, alg=ALG))
    shape = tf.shape(images)
    offsets = tf.random.stateless_uniform([shape[0], 2], seed=crop_key, minval=0,
                                          maxval=2 * pad + 1, dtype=tf.int32, alg=ALG)
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    rows = offsets[:, :1] + tf.range(shape[1])[tf.newaxis, :]  # (B, H)
    cols = offsets[:, 1:] + tf.range(shape[2])[tf.newaxis, :]  # (B, W)
    if flip:  # Reversing the crop window's column indices flips it in the same gather.
        do_flip = tf.random.stateless_uniform([shape[0]], seed=flip_key, alg=ALG) < 0.5
        cols = tf.where(do_flip[:, tf.newaxis], tf.reverse(cols, axis=[1]), cols)
    out = tf.gather(padded, rows, axis=1, batch_dims=1)  # (B, H, W + 2 pad, C)
    out = tf.gather(out, cols, axis=2, batch_dims=1)  # (B, H, W, C)
    return tf.ensure_shape(out, images.shape)


def cut_out(images, key, size):
    """Zeroes a `size` x `size` square of each (B, H, W, C) image, centred on a random pixel
    and clipped at the borders (DeVries & Taylor 2017, arXiv:1708.04552), keyed by `key`."""
    shape = tf.shape(images)
    uniform = tf.random.stateless_uniform([shape[0], 2], seed=key, alg=ALG)
    low = tf.cast(uniform * tf.cast(shape[1:3], tf.float32), tf.int32) - size // 2  # (B, 2)
    # Whether each row (B, H), then each column (B, W), crosses the square.
    rows, cols = ((d >= 0) & (d < size) for d in (
        tf.range(shape[i + 1])[tf.newaxis, :] - low[:, i:i + 1] for i in (0, 1)))
    keep = ~(rows[:, :, tf.newaxis] & cols[:, tf.newaxis, :])
    return images * tf.cast(keep, images.dtype)[..., tf.newaxis]


def epoch_order(num_examples, *, seed=0, epoch=0):
    """The order of a shuffled epoch: an int64 numpy permutation of ``range(num_examples)``."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed, minimum=0, maximum=MAX_SEED)
    check_int("epoch", epoch, minimum=0)
    return _shuffle(tf.range(num_examples, dtype=tf.int64), num_examples, seed, epoch).numpy()


def _shuffle(positions, num, seed, epoch):
    key = stateless_key(seed, epoch, _SHUFFLE_STREAM)
    return tf.random.experimental.index_shuffle(positions, seed=key, max_index=num - 1)


def dataset_from_arrays(images, labels, *, batch_size=128, shuffle=False, augment="none",
                        normalize=True, mean=None, std=None, seed=0, epoch=0,
                        drop_remainder=False, repeat_epochs=None, cutout=0):
    """The batched, deterministic pipeline of `make_dataset` over in-memory uint8 images.

    Args:
        images, labels: uint8 (N, H, W, C) and ints (N,).
        batch_size, drop_remainder: the batches (the last partial one dropped or not).
        shuffle: visit each epoch in the ``(seed, epoch)`` order.
        augment: a policy from `AUGMENTATIONS`.
        cutout: after `augment`, a black square of this side in each image (`cut_out`); 0: off.
        normalize: True: ``(x / 255 - mean) / std``; False: raw float32 pixels in [0, 255].
        mean, std: per channel, in [0, 1] units.
        seed: keys the order and the augmentation; epoch: the first epoch yielded.
        repeat_epochs: None (one epoch), k > 0 (epochs epoch .. epoch+k-1) or -1 (no end).

    Returns `tf.data.Dataset` of ``(images float32 (B, H, W, C), labels int32 (B,))``."""
    images, labels = _check_arrays(images, labels)
    num = int(images.shape[0])
    _check_common(batch_size, seed, epoch, normalize, repeat_epochs, shuffle, drop_remainder)
    check_choice("augment", augment, AUGMENTATIONS)
    check_int("cutout", cutout, minimum=0)
    if (steps := num // batch_size if drop_remainder else math.ceil(num / batch_size)) == 0:
        raise ValueError(f"batch_size={batch_size} with drop_remainder=True leaves no batch of "
                         f"the {num} examples. Use a smaller batch_size or drop_remainder=False.")
    scale = _normalizer(mean, std, images.shape[-1]) if normalize else None
    images_t, labels_t = tf.constant(images), tf.constant(labels.astype(np.int32))
    batch_shape = (batch_size if drop_remainder else None,) + tuple(images.shape[1:])

    def make_batch(step):
        ep, b = epoch + step // steps, step % steps
        positions = tf.range(b * batch_size, tf.minimum((b + 1) * batch_size, num), dtype=tf.int64)
        if shuffle:
            positions = _shuffle(positions, num, seed, ep)
        x = tf.gather(images_t, positions)
        if augment != "none":
            key = stateless_key(seed, ep, _AUGMENT_STREAM, b)
            x = pad_crop_flip(x, key, flip=augment == "pad_crop_flip")
        if cutout:
            x = cut_out(x, stateless_key(seed, ep, _CUTOUT_STREAM, b), cutout)
        x = tf.cast(x, tf.float32)
        if scale is not None:
            x = (x * (1.0 / 255.0) - scale[0]) * scale[1]
        y = tf.gather(labels_t, positions)
        return tf.ensure_shape(x, batch_shape), tf.ensure_shape(y, batch_shape[:1])

    steps_ds = (tf.data.Dataset.counter(dtype=tf.int64) if repeat_epochs == -1
                else tf.data.Dataset.range((repeat_epochs or 1) * steps))
    ds = steps_ds.map(make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def make_dataset(name, split, *, batch_size=128, data_dir=None, source="auto", path=None,
                 download=False, shuffle=None, augment=None, normalize=True, seed=0, epoch=0,
                 drop_remainder=None, cache=True, repeat_epochs=None, image_size=None, cutout=0):
    """The tf.data input pipeline of a registered dataset, deterministic per epoch (to
    resume at epoch 3, pass ``epoch=3``).

    Args:
        name, split: a name from `list_datasets()`; "train" or "test".
        data_dir, source, path, download, cache, image_size: see `load_arrays`.
        shuffle, drop_remainder: None (True for train, False for test) or a bool.
        augment: None (True for train), True (the dataset's policy), False or a policy name.
        normalize: True: with the dataset's statistics; False: raw pixels.
        batch_size, seed, epoch, repeat_epochs, cutout: see `dataset_from_arrays`.

    Returns `tf.data.Dataset` of ``(float32 images (B, H, W, C), int32 labels (B,))``.
    Raises ValueError for invalid arguments (before anything is read) or missing data."""
    check_bool("cache", cache)
    _check_common(batch_size, seed, epoch, normalize, repeat_epochs, shuffle, drop_remainder,
                  allow_none=True)
    if not (augment is None or isinstance(augment, bool) or augment in AUGMENTATIONS):
        raise ValueError(f"`augment` must be None, a bool or one of {list(AUGMENTATIONS)}. "
                         f"Received: augment={augment!r}")
    images, labels = load_arrays(name, split, data_dir=data_dir, source=source, path=path,
                                 download=download, cache=cache, image_size=image_size)
    info = dataset_info(name, path=path, image_size=image_size)  # a folder's only
    train = split == "train"
    augment = train if augment is None else augment
    if isinstance(augment, bool):
        augment = info["augmentation"] if augment else "none"
    # Train drops the last partial batch (steady BN statistics, one compiled step).
    return dataset_from_arrays(
        images, labels, batch_size=batch_size, shuffle=train if shuffle is None else shuffle,
        augment=augment, normalize=normalize, mean=info["mean"], std=info["std"], seed=seed,
        epoch=epoch, drop_remainder=train if drop_remainder is None else drop_remainder,
        repeat_epochs=repeat_epochs, cutout=cutout)


def _check_common(batch_size, seed, epoch, normalize, repeat_epochs, shuffle, drop_remainder,
                  allow_none=False):
    check_int("batch_size", batch_size, minimum=1)
    check_int("seed", seed, minimum=0, maximum=MAX_SEED)
    check_int("epoch", epoch, minimum=0)
    check_bool("normalize", normalize)
    check_bool("shuffle", shuffle, allow_none=allow_none)
    check_bool("drop_remainder", drop_remainder, allow_none=allow_none)
    if repeat_epochs is not None and repeat_epochs != -1:
        check_int("repeat_epochs", repeat_epochs, minimum=1, extra="None, -1 or ")


def _check_arrays(images, labels):
    images, labels = np.asarray(images), np.asarray(labels)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError("`images` must be a uint8 array (N, H, W, C). Received: images of "
                         f"dtype {images.dtype} and shape {images.shape}")
    if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"`labels` must be N={images.shape[0]} ints. Received: labels of "
                         f"dtype {labels.dtype} and shape {labels.shape}")
    if images.shape[0] == 0:
        raise ValueError("`images` is empty: nothing to batch.")
    return images, labels


def _normalizer(mean, std, channels):
    """``(mean, 1 / std)`` as float32 (1, 1, 1, C) constants; checks both."""
    values = []
    for name, given in (("mean", mean), ("std", std)):
        if given is None:
            raise ValueError(f"normalize=True needs `{name}` (per channel, [0, 1] units).")
        v = tuple(float(x) for x in np.ravel(given))
        v = v * channels if len(v) == 1 else v
        if len(v) != channels:
            raise ValueError(f"`{name}` has {len(v)} values for {channels}-channel images. "
                             f"Received: {name}={v}")
        values.append(np.reshape(v, (1, 1, 1, channels)))
    if np.any(values[1] <= 0):
        raise ValueError(f"`std` must be positive. Received: std={v}")
    return tf.constant(values[0], tf.float32), tf.constant(1.0 / values[1], tf.float32)
