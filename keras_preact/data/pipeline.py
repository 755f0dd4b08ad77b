"""The tf.data input pipeline (TensorFlow; imported lazily by `keras_preact.data`).

Order: decode -> cache -> shuffle -> batch -> augment -> normalise -> prefetch.

* decode + cache: a split is decoded once into uint8 arrays held in memory
  (`keras_preact.data.load_arrays`); those arrays are the cache, so every epoch after
  the first decode costs only gathers. (This suits CIFAR-sized data, well under 2 GB.)
* shuffle + batch: step ``s`` of the dataset is batch ``b = s % steps`` of epoch
  ``e = epoch + s // steps``; its examples are positions ``b*B .. b*B+B-1`` of a
  pseudo-random permutation of the split given by
  `tf.random.experimental.index_shuffle` under the key ``(seed, e)``. The order of
  epoch ``e`` is therefore a pure function of ``(seed, e)``: a run resumed at epoch 3
  sees exactly the batches an uninterrupted run sees in its epoch 3.
* augment: per batch, vectorised (`keras_preact.data.augment`), with stateless random
  ops keyed by ``(seed, e, b)``; done after the cache, on uint8 pixels.
* normalise: ``(x / 255 - mean) / std`` per channel, float32.

A dataset object always yields the same batches when iterated again (nothing in it has
state). Train several epochs with one dataset by asking for them (`repeat_epochs`), not
by iterating a one-epoch dataset repeatedly, which would repeat the same epoch.
"""

import math

import numpy as np
import tensorflow as tf

from keras_preact.data.augment import ALG
from keras_preact.data.augment import apply_augmentation
from keras_preact.data.registry import AUGMENTATIONS
from keras_preact.data.registry import check_dataset_name
from keras_preact.data.sources import dataset_info
from keras_preact.data.sources import load_arrays

# Distinct streams for the order and for the augmentation of the same (seed, epoch).
_SHUFFLE_STREAM = 0
_AUGMENT_STREAM = 1
_MAX_SEED = 2**63 - 1


def epoch_key(seed, epoch, stream=_SHUFFLE_STREAM):
    """The stateless key of one epoch: a function of ``(seed, epoch, stream)`` only."""
    base = tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])
    return tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64), alg=ALG)


def batch_key(seed, epoch, batch):
    """The stateless augmentation key of batch `batch` of epoch `epoch`."""
    key = epoch_key(seed, epoch, _AUGMENT_STREAM)
    return tf.random.experimental.stateless_fold_in(key, tf.cast(batch, tf.int64), alg=ALG)


def epoch_order(num_examples, *, seed=0, epoch=0):
    """The example order of one shuffled epoch, as the pipeline visits it.

    Args:
        num_examples: int > 0, size of the split.
        seed: int >= 0.
        epoch: int >= 0.

    Returns:
        int64 numpy array, a permutation of ``range(num_examples)``.

    Example:
        >>> order = epoch_order(10, seed=0, epoch=3)
        >>> sorted(order.tolist()) == list(range(10))
        True
    """
    _check_int("num_examples", num_examples, minimum=1)
    _check_int("seed", seed, minimum=0, maximum=_MAX_SEED)
    _check_int("epoch", epoch, minimum=0)
    positions = tf.range(num_examples, dtype=tf.int64)
    return tf.random.experimental.index_shuffle(
        positions, seed=epoch_key(seed, epoch), max_index=num_examples - 1
    ).numpy()


def dataset_from_arrays(images, labels, *, batch_size=128, shuffle=False, augment="none",
                        normalize=True, mean=None, std=None, seed=0, epoch=0,
                        drop_remainder=False, repeat_epochs=None):
    """Builds the batched, deterministic pipeline over in-memory uint8 images.

    Args:
        images: uint8 array (N, H, W, C).
        labels: int array (N,).
        batch_size: int > 0.
        shuffle: bool, visit each epoch in the ``(seed, epoch)`` order.
        augment: a policy from `AUGMENTATIONS` ("pad_crop_flip", "pad_crop", "none").
        normalize: bool; True gives ``(x / 255 - mean) / std``, False raw float32
            pixels in [0, 255] (for models that carry their own `preprocessing`).
        mean, std: per-channel statistics in [0, 1] units (needed when `normalize`).
        seed: int >= 0, keys the order and the augmentation.
        epoch: int >= 0, the first epoch this dataset yields.
        drop_remainder: bool, drop each epoch's last partial batch.
        repeat_epochs: None (one epoch), an int k > 0 (epochs epoch .. epoch+k-1, each
            in its own order) or -1 (epochs epoch, epoch+1, ... without end).

    Returns:
        `tf.data.Dataset` of ``(images float32 (B, H, W, C), labels int32 (B,))``, of
        known cardinality unless `repeat_epochs` is -1.

    Raises:
        ValueError: for arrays of the wrong dtype or shape and invalid arguments.

    Example:
        >>> ds = dataset_from_arrays(x, y, batch_size=32, shuffle=True,
        ...                          augment="pad_crop_flip", mean=(0.5,) * 3, std=(0.25,) * 3)
    """
    images = np.asarray(images)
    labels = np.asarray(labels)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(
            "`images` must be a uint8 array (N, H, W, C). Received: images of dtype "
            f"{images.dtype} and shape {images.shape}"
        )
    if labels.shape != (images.shape[0],) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(
            f"`labels` must be N={images.shape[0]} ints. Received: labels of dtype "
            f"{labels.dtype} and shape {labels.shape}"
        )
    num = int(images.shape[0])
    _check_common(batch_size=batch_size, seed=seed, epoch=epoch, normalize=normalize,
                  repeat_epochs=repeat_epochs)
    _check_bool("shuffle", shuffle)
    _check_bool("drop_remainder", drop_remainder)
    if augment not in AUGMENTATIONS:
        raise ValueError(
            f"`augment` must be one of {list(AUGMENTATIONS)}. Received: augment={augment!r}"
        )
    if num == 0:
        raise ValueError("`images` is empty: nothing to batch.")
    steps = num // batch_size if drop_remainder else math.ceil(num / batch_size)
    if steps == 0:
        raise ValueError(
            f"batch_size={batch_size} with drop_remainder=True leaves no batch of the "
            f"{num} examples. Use a smaller batch_size or drop_remainder=False."
        )
    channels = images.shape[-1]
    if normalize:
        mean = _per_channel("mean", mean, channels)
        std = _per_channel("std", std, channels)
        if any(s <= 0 for s in std):
            raise ValueError(f"`std` must be positive. Received: std={std}")
        mean_t = tf.constant(np.reshape(mean, (1, 1, 1, channels)), tf.float32)
        inv_std_t = tf.constant(1.0 / np.reshape(std, (1, 1, 1, channels)), tf.float32)

    images_t = tf.constant(images)
    labels_t = tf.constant(labels.astype(np.int32))
    steps_t = tf.constant(steps, tf.int64)
    batch_t = tf.constant(batch_size, tf.int64)
    num_t = tf.constant(num, tf.int64)
    first_epoch = tf.constant(epoch, tf.int64)
    batch_shape = (batch_size if drop_remainder else None,) + tuple(images.shape[1:])

    def make_batch(step):
        ep = first_epoch + step // steps_t
        b = step % steps_t
        start = b * batch_t
        positions = tf.range(start, tf.minimum(start + batch_t, num_t), dtype=tf.int64)
        if shuffle:
            positions = tf.random.experimental.index_shuffle(
                positions, seed=epoch_key(seed, ep), max_index=num - 1
            )
        x = tf.gather(images_t, positions)
        y = tf.gather(labels_t, positions)
        if augment != "none":
            x = apply_augmentation(x, batch_key(seed, ep, b), augment)
        x = tf.cast(x, tf.float32)
        if normalize:
            x = (x * (1.0 / 255.0) - mean_t) * inv_std_t
        x = tf.ensure_shape(x, batch_shape)
        y = tf.ensure_shape(y, batch_shape[:1])
        return x, y

    if repeat_epochs == -1:
        steps_ds = tf.data.Dataset.counter(dtype=tf.int64)
    else:
        steps_ds = tf.data.Dataset.range((repeat_epochs or 1) * steps)
    ds = steps_ds.map(make_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def make_dataset(name, split, *, batch_size=128, data_dir=None, source="auto", path=None,
                 download=False, shuffle=None, augment=None, normalize=True, seed=0,
                 epoch=0, drop_remainder=None, cache=True, repeat_epochs=None,
                 image_size=None):
    """The input pipeline of a registered dataset; see `keras_preact.data.make_dataset`."""
    check_dataset_name(name)
    if split not in ("train", "test"):
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")
    # Arguments are checked before anything is read: a typo should not cost a decode.
    _check_bool("cache", cache)
    _check_common(batch_size=batch_size, seed=seed, epoch=epoch, normalize=normalize,
                  repeat_epochs=repeat_epochs)
    for arg, value in (("shuffle", shuffle), ("drop_remainder", drop_remainder)):
        if value is not None:
            _check_bool(arg, value)
    if not (augment is None or isinstance(augment, bool) or augment in AUGMENTATIONS):
        raise ValueError(
            f"`augment` must be None, a bool or one of {list(AUGMENTATIONS)}. Received: "
            f"augment={augment!r}"
        )
    images, labels = load_arrays(
        name, split, data_dir=data_dir, source=source, path=path, download=download,
        cache=cache, image_size=image_size,
    )
    if name == "folder":
        info = dataset_info(name, path=path, image_size=image_size)
    else:
        info = dataset_info(name)
    train = split == "train"
    if shuffle is None:
        shuffle = train
    if augment is None:
        augment = info["augmentation"] if train else "none"
    elif augment is True:
        augment = info["augmentation"]
    elif augment is False:
        augment = "none"
    if drop_remainder is None:
        # Train: a constant batch shape (steady BatchNorm statistics, one compiled
        # step); test: every example is evaluated.
        drop_remainder = train
    return dataset_from_arrays(
        images, labels, batch_size=batch_size, shuffle=shuffle, augment=augment,
        normalize=normalize, mean=info["mean"], std=info["std"], seed=seed, epoch=epoch,
        drop_remainder=drop_remainder, repeat_epochs=repeat_epochs,
    )


def _check_common(*, batch_size, seed, epoch, normalize, repeat_epochs):
    _check_int("batch_size", batch_size, minimum=1)
    _check_int("seed", seed, minimum=0, maximum=_MAX_SEED)
    _check_int("epoch", epoch, minimum=0)
    _check_bool("normalize", normalize)
    if repeat_epochs is not None and repeat_epochs != -1:
        _check_int("repeat_epochs", repeat_epochs, minimum=1, extra="None, -1 or ")


def _check_int(name, value, *, minimum=None, maximum=None, extra=""):
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    if ok and minimum is not None and value < minimum:
        ok = False
    if ok and maximum is not None and value > maximum:
        ok = False
    if not ok:
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"`{name}` must be {extra}an int {bounds}. Received: {name}={value!r}")


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")


def _per_channel(name, values, channels):
    if values is None:
        raise ValueError(f"normalize=True needs `{name}` (per channel, [0, 1] units).")
    values = tuple(float(v) for v in np.ravel(values))
    if len(values) == 1:
        values = values * channels
    if len(values) != channels:
        raise ValueError(
            f"`{name}` has {len(values)} values for {channels}-channel images. "
            f"Received: {name}={values}"
        )
    return values
