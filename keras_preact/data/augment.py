"""Batch-vectorised, stateless augmentation and random keys (TensorFlow; imported lazily).

The randomness of a batch or example is a pure function of a key (`stateless_key`),
never of a generator's state, so an epoch's augmentation can be reproduced from
``(seed, epoch)`` alone after a restart.
"""

import tensorflow as tf

from keras_preact.data.registry import AUGMENTATIONS

#: Padding of the paper's CIFAR augmentation (He et al. 2016a, Sec. 4.2: "4 pixels are
#: padded on each side, and a 32x32 crop is randomly sampled from the padded image or
#: its horizontal flip").
PAD = 4
# Every stateless op names its algorithm: "auto_select" may pick a different one per
# device, which would change the random numbers.
ALG = "philox"


def stateless_key(seed, epoch, stream, index=None):
    """The int64 (2,) key of ``(seed, epoch, stream)``, folded with `index` when given."""
    base = tf.stack([tf.cast(seed, tf.int64), tf.constant(stream, tf.int64)])
    key = tf.random.experimental.stateless_fold_in(base, tf.cast(epoch, tf.int64), alg=ALG)
    if index is None:
        return key
    return tf.random.experimental.stateless_fold_in(key, tf.cast(index, tf.int64), alg=ALG)


def pad_crop_flip(images, key, *, pad=PAD, flip=True):
    """Zero-pads (B, H, W, C) `images` by `pad`, randomly crops back to (H, W) and with
    `flip` flips left-right with probability 1/2, per image, keyed by `key` (int64 (2,)).

    Padding is black (0) in raw pixel space, as the paper's Torch code pads. One gather
    does crop and flip (the flip reverses the crop window's column indices).
    """
    if pad < 0:
        raise ValueError(f"`pad` must be >= 0. Received: pad={pad}")
    crop_key, flip_key = tf.unstack(tf.random.experimental.stateless_split(key, 2, alg=ALG))
    batch = tf.shape(images)[0]
    height, width = images.shape[1], images.shape[2]
    if height is None or width is None:
        height, width = tf.shape(images)[1], tf.shape(images)[2]
    offsets = tf.random.stateless_uniform(
        [batch, 2], seed=crop_key, minval=0, maxval=2 * pad + 1, dtype=tf.int32, alg=ALG
    )
    padded = tf.pad(images, [[0, 0], [pad, pad], [pad, pad], [0, 0]])
    rows = offsets[:, :1] + tf.range(height)[tf.newaxis, :]  # (B, H)
    cols = offsets[:, 1:] + tf.range(width)[tf.newaxis, :]  # (B, W)
    if flip:
        do_flip = tf.random.stateless_uniform([batch], seed=flip_key, alg=ALG) < 0.5
        cols = tf.where(do_flip[:, tf.newaxis], tf.reverse(cols, axis=[1]), cols)
    out = tf.gather(padded, rows, axis=1, batch_dims=1)  # (B, H, W + 2 pad, C)
    out = tf.gather(out, cols, axis=2, batch_dims=1)  # (B, H, W, C)
    return tf.ensure_shape(out, images.shape)


def apply_augmentation(images, key, policy):
    if policy not in AUGMENTATIONS:
        raise ValueError(f"Unknown augmentation policy. Received: {policy!r}. Valid: {list(AUGMENTATIONS)}")
    return images if policy == "none" else pad_crop_flip(images, key, flip=policy == "pad_crop_flip")
