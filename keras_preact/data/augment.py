"""Batch-vectorised, stateless augmentation (TensorFlow; imported lazily).

The randomness of a batch is a pure function of a key (a length-2 int64 seed, see
`keras_preact.data.pipeline.batch_key`), never of a random generator's state, so an
epoch's augmentation can be reproduced from ``(seed, epoch)`` alone after a restart.
"""

import tensorflow as tf

from keras_preact.data.registry import AUGMENTATIONS

#: Padding of the CIFAR augmentation the paper takes from the original ResNet paper
#: (He et al. 2016a, Sec. 4.2: "4 pixels are padded on each side, and a 32x32 crop is
#: randomly sampled from the padded image or its horizontal flip").
PAD = 4
# Every stateless op names its algorithm: "auto_select" may pick a different one per
# device, which would change the random numbers.
ALG = "philox"


def pad_crop_flip(images, key, *, pad=PAD, flip=True):
    """Zero-pads, randomly crops back to the input size and optionally flips, per image.

    Padding is black (0) in raw pixel space, before normalisation, as the paper's Torch
    code pads the image. One gather does crop and flip: the flip reverses the column
    indices of the crop window.

    Args:
        images: (B, H, W, C) tensor of any dtype (uint8 pixels in the pipeline).
        key: int64 tensor of shape (2,), the batch's stateless seed.
        pad: int >= 0, pixels of padding on each side.
        flip: bool, also flip each image left-right with probability 1/2.

    Returns:
        Tensor of the input's shape and dtype.

    Example:
        >>> out = pad_crop_flip(tf.zeros((8, 32, 32, 3), tf.uint8), tf.constant([0, 1], tf.int64))
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
    """Applies a named policy from `AUGMENTATIONS` to a batch."""
    if policy == "pad_crop_flip":
        return pad_crop_flip(images, key, flip=True)
    if policy == "pad_crop":
        return pad_crop_flip(images, key, flip=False)
    if policy == "none":
        return images
    raise ValueError(
        f"Unknown augmentation policy. Received: {policy!r}. Valid: {list(AUGMENTATIONS)}"
    )
