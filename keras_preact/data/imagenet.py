"""ImageNet-style input pipelines, streamed from image folders or TFDS `imagenet2012`. The
order and the crops of example ``i`` of epoch ``e`` are functions of ``(seed, e, i)``
only, so a resumed run sees the same crops. Transforms as in fb.resnet.torch."""

import functools
import math
import os

import numpy as np
import tensorflow as tf

from keras_preact.checks import check_bool, check_choice, check_int
from keras_preact.data.folder import IMAGE_SUFFIXES, class_folders
from keras_preact.data.pipeline import ALG, stateless_key
from keras_preact.data.registry import MAX_SEED
from keras_preact.file_io import user_path

IMAGE_SIZE, RESIZE_SIZE = 224, 256
#: Random-resized-crop area and aspect ratio ranges (Szegedy et al. 2015).
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3.0 / 4.0, 4.0 / 3.0)
SOURCES = ("folder", "tfds")
TFDS_SPLITS = {"train": "train", "val": "validation", "test": "validation"}
_STREAM_ORDER, _STREAM_AUGMENT = 2, 3


def random_resized_crop(image, key, *, image_size=IMAGE_SIZE, scale=CROP_SCALE,
                        ratio=CROP_RATIO, flip=True):
    """The training transform of a uint8 (H, W, 3) `image`, keyed by `key`: a random crop
    of `scale` of the area and `ratio` width / height, resized to `image_size` squared, with
    `flip` flipped left-right half of the time; float32 in [0, 255]."""
    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    keys = tf.random.experimental.stateless_split(key, num=4, alg=ALG)
    # Ten tries, as fb.resnet.torch and torchvision do; the first crop that fits wins,
    # else the whole image (centre crop to the nearest allowed ratio).
    target_area = h * w * tf.random.stateless_uniform(
        (10,), keys[0], minval=scale[0], maxval=scale[1], alg=ALG)
    aspect = tf.exp(tf.random.stateless_uniform(
        (10,), keys[1], minval=math.log(ratio[0]), maxval=math.log(ratio[1]), alg=ALG))
    cw, ch = tf.round(tf.sqrt(target_area * aspect)), tf.round(tf.sqrt(target_area / aspect))
    fits = (cw > 0) & (ch > 0) & (cw <= w) & (ch <= h)
    first, any_fit = tf.argmax(tf.cast(fits, tf.int32)), tf.reduce_any(fits)
    in_ratio = w / h
    fallback_w = tf.where(in_ratio > ratio[1], tf.round(h * ratio[1]), w)
    fallback_h = tf.where(in_ratio < ratio[0], tf.round(w / ratio[0]), h)
    crop_w = tf.cast(tf.where(any_fit, cw[first], fallback_w), tf.int32)
    crop_h = tf.cast(tf.where(any_fit, ch[first], fallback_h), tf.int32)
    u = tf.random.stateless_uniform((2,), keys[2], alg=ALG)

    def offset(u, room):  # Uniform in [0, room] for a crop that fits, else centred.
        uniform = tf.cast(u * tf.cast(room + 1, tf.float32), tf.int32)
        return tf.minimum(tf.where(any_fit, uniform, room // 2), room)

    top, left = offset(u[0], shape[0] - crop_h), offset(u[1], shape[1] - crop_w)
    crop = image[top:top + crop_h, left:left + crop_w]
    out = tf.image.resize(tf.cast(crop, tf.float32), (image_size, image_size), method="bilinear")
    if flip:
        coin = tf.random.stateless_uniform((), keys[3], alg=ALG) < 0.5
        out = tf.cond(coin, lambda: tf.reverse(out, axis=[1]), lambda: out)
    return tf.clip_by_value(out, 0.0, 255.0)


def resize_center_crop(image, *, image_size=IMAGE_SIZE, resize_size=RESIZE_SIZE):
    """The evaluation transform: shorter side to `resize_size` (not resampled if equal), the
    centre `image_size` crop; float32 in [0, 255]."""
    hw = tf.shape(image)[:2]
    short = tf.reduce_min(hw)
    scale = tf.cast(resize_size, tf.float32) / tf.cast(short, tf.float32)
    new_size = tf.cast(tf.round(tf.cast(hw, tf.float32) * scale), tf.int32)
    new_size = tf.where(hw == short, resize_size, new_size)  # the shorter side exactly
    x = tf.cast(image, tf.float32)
    x = tf.cond(tf.equal(short, resize_size), lambda: x,
                lambda: tf.image.resize(x, new_size, method="bilinear", antialias=True))
    top, left = tf.unstack((tf.shape(x)[:2] - image_size) // 2)
    return tf.clip_by_value(tf.ensure_shape(x[top:top + image_size, left:left + image_size],
                                            (image_size, image_size, 3)), 0.0, 255.0)


def list_image_folder(root, split):
    """``(paths, labels, class_names)`` of one split of a folder holding train/ and val/ (or
    test/), each with one sub-folder per class; ValueError for missing folders or images."""
    if root is None:
        raise ValueError("source='folder' needs `path`: a folder with train/<class>/ and "
                         "val/<class>/ sub-folders. Received: path=None")
    root = user_path(root)
    split_dir = train_dir = os.path.join(root, "train")
    if not os.path.isdir(train_dir):
        raise ValueError("The ImageNet-style folder needs a train/ sub-folder with one folder "
                         f"per class. Received: path={root!r}")
    class_names = class_folders(train_dir)
    if split != "train":
        split_dir = next((d for d in (os.path.join(root, "val"), os.path.join(root, "test"))
                          if os.path.isdir(d)), None)
        if split_dir is None:
            raise ValueError("The ImageNet-style folder has no val/ (or test/) sub-folder. "
                             f"Received: path={root!r}, split={split!r}")
        class_folders(split_dir, within=class_names)
    # Each class's images in name order; a class the held-out folder lacks has none.
    examples = [(os.path.join(class_dir, f), label) for label, name in enumerate(class_names)
                if os.path.isdir(class_dir := os.path.join(split_dir, name))
                for f in sorted(os.listdir(class_dir)) if f.lower().endswith(IMAGE_SUFFIXES)]
    if not examples:
        raise ValueError(f"No images ({', '.join(IMAGE_SUFFIXES)}) under {split_dir!r}.")
    paths, labels = zip(*examples)
    return list(paths), np.asarray(labels, np.int32), class_names


def _folder_examples(path, split, *, shuffle, seed, epoch):
    """``(file bytes, label)`` examples of an image folder and its class names."""
    paths, labels, class_names = list_image_folder(path, split)
    if shuffle:
        key = stateless_key(seed, epoch, _STREAM_ORDER, 0)
        order = tf.random.experimental.index_shuffle(
            tf.range(len(paths), dtype=tf.int64), seed=key, max_index=len(paths) - 1).numpy()
        paths, labels = [paths[i] for i in order], labels[order]
    return tf.data.Dataset.from_tensor_slices((paths, labels)).map(
        lambda p, y: (tf.io.read_file(p), y), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True), class_names


def _tfds_examples(split, *, data_dir, manual_dir):
    """``(JPEG bytes, label)`` examples of TFDS' imagenet2012 and its class names."""
    import tensorflow_datasets as tfds
    data_dir = None if data_dir is None else user_path(data_dir)
    builder = tfds.builder("imagenet2012", data_dir=data_dir)
    read = functools.partial(builder.as_dataset, split=TFDS_SPLITS[split], shuffle_files=False,
                             decoders={"image": tfds.decode.SkipDecoding()})
    try:
        ds = read()
    except (AssertionError, FileNotFoundError, tf.errors.NotFoundError):
        if manual_dir is None:
            raise ValueError(
                f"TFDS' imagenet2012 is not prepared in data_dir={builder.data_dir!r} and cannot "
                "be downloaded: pass the folder holding ILSVRC2012_img_train.tar and "
                "ILSVRC2012_img_val.tar as manual_dir.") from None
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
            manual_dir=user_path(manual_dir)))
        ds = read()
    names = builder.info.features["label"].names
    return ds.map(lambda ex: (ex["image"], tf.cast(ex["label"], tf.int32))), names


def make_imagenet_dataset(split, *, source="folder", path=None, data_dir=None, manual_dir=None,
                          batch_size=256, image_size=IMAGE_SIZE, resize_size=RESIZE_SIZE,
                          shuffle=None, augment=None, normalize=False,
                          mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), seed=0,
                          epoch=0, drop_remainder=None, shuffle_buffer=10000):
    """A streamed ImageNet-style pipeline for one epoch.

    Args:
        split: "train" or "val" ("test" is an alias of "val").
        source: "folder" (`path` holds train/ and val/) or "tfds" (`data_dir`: TFDS'
            folder; `manual_dir`: the official tar files, used once to prepare it).
        batch_size, image_size, resize_size: the batches, crops and evaluation resize.
        shuffle, augment, drop_remainder: None (True for train) or bool; augment is the
            random-resized crop + flip, else resize + centre crop.
        normalize: False: float32 pixels in [0, 255]; True: ``(x / 255 - mean) / std``.
        mean, std: per channel, in [0, 1] units.
        seed, epoch: the order and the crops are functions of them.
        shuffle_buffer: "tfds" only (folders are shuffled exactly).

    Returns (`tf.data.Dataset` of (float32 (B, S, S, 3), int32 (B,)), class names).
    Raises ValueError for invalid arguments or missing data, before reading images."""
    check_choice("split", split, ("train", "val", "test"))
    check_choice("source", source, SOURCES)
    for name, value, minimum in (("batch_size", batch_size, 1), ("image_size", image_size, 8),
                                 ("resize_size", resize_size, 8), ("epoch", epoch, 0),
                                 ("shuffle_buffer", shuffle_buffer, 1)):
        check_int(name, value, minimum=minimum)
    check_int("seed", seed, minimum=0, maximum=MAX_SEED)
    if resize_size < image_size:
        raise ValueError("`resize_size` must be at least `image_size` (the centre crop is taken "
                         f"from the resized image). Received: resize_size={resize_size}, "
                         f"image_size={image_size}")
    train = split == "train"  # the default of shuffle, augment and drop_remainder
    flags = {"shuffle": shuffle, "augment": augment, "drop_remainder": drop_remainder}
    for name, value in flags.items():
        check_bool(name, value, allow_none=True)
    check_bool("normalize", normalize)
    shuffle, augment, drop_remainder = (train if v is None else v for v in flags.values())
    if source == "folder":
        ds, class_names = _folder_examples(path, split, shuffle=shuffle, seed=seed, epoch=epoch)
    else:
        ds, class_names = _tfds_examples(split, data_dir=data_dir, manual_dir=manual_dir)
        if shuffle:
            ds = ds.shuffle(shuffle_buffer, seed=int((seed * 1000003 + epoch) % (2**31 - 1)),
                            reshuffle_each_iteration=False)

    def transform(index, example):
        data, label = example
        image = tf.io.decode_image(data, channels=3, expand_animations=False)  # first frame
        image.set_shape((None, None, 3))
        if augment:
            key = stateless_key(seed, epoch, _STREAM_AUGMENT, index)
            x = random_resized_crop(image, key, image_size=image_size)
        else:
            x = resize_center_crop(image, image_size=image_size, resize_size=resize_size)
        if normalize:
            x = (x / 255.0 - tf.constant(mean, tf.float32)) / tf.constant(std, tf.float32)
        return x, label

    ds = ds.enumerate().map(transform, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE), list(class_names)
