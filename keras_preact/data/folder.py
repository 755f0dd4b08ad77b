"""A folder of images, ``root/train/<class>/*`` beside a held-out ``root/test/<class>/*``
(or ``val/``, ``validation/``), or ``root/<class>/*`` (20% of every class held out as
"test"), read with `keras.utils.image_dataset_from_directory`."""

import contextlib
import logging
import os
import warnings

import numpy as np

from keras_preact.data.registry import stratified_split
from keras_preact.files import user_path

#: The image files `keras.utils.image_dataset_from_directory` reads.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
logger = logging.getLogger(__name__)
#: The held-out folders beside train/, the first one found is used.
HELD_OUT_FOLDERS = ("test", "val", "validation")


def folder_layout(path):
    """Returns ("split", train_dir, held_out_dir) or ("flat", path, None); raises ValueError."""
    if path is None:
        raise ValueError("The 'folder' dataset needs `path` (--data-path): a folder with one sub-folder per "
                         "class (or train/ and test/, val/ or validation/ holding those). "
                         "Received: path=None")
    path = user_path(path)
    if not os.path.isdir(path):
        raise ValueError("The image folder does not exist or is not a folder. "
                         f"Received: path={path!r}")
    if not os.path.isdir(train_dir := os.path.join(path, "train")):
        return "flat", path, None
    for held_out in (os.path.join(path, name) for name in HELD_OUT_FOLDERS):
        if os.path.isdir(held_out):
            return "split", train_dir, held_out
    raise ValueError("The image folder has train/ but no held-out folder beside it; add one of "
                     f"{'/, '.join(HELD_OUT_FOLDERS)}/. Received: path={path!r}")


def class_folders(directory, *, within=None, least=1):
    """The sorted class sub-folder names of `directory`, each holding an image; ValueError
    when there are fewer than `least` or some are not in `within` (the train classes)."""
    names = sorted(d for d in os.listdir(directory) if os.path.isdir(os.path.join(directory, d)))
    if len(names) < least:
        raise ValueError(f"The image folder {directory!r} needs {least} or more class sub-folders "
                         "(<folder>/<class name>/<images>)" + ("; a classifier needs 2 classes"
                         if least > 1 else "") + f". Received: classes={names}")
    if extra := sorted(set(names) - set(within or names)):
        raise ValueError(f"The folder {directory!r} has classes missing from the train "
                         f"folder: {extra}.")
    for folder in (os.path.join(directory, name) for name in names):
        if not next(_images(folder), None):
            raise ValueError(f"The class folder {folder!r} holds no images "
                             f"({', '.join(IMAGE_SUFFIXES)}).")
    return names


def _images(directory):
    """The image files under `directory`, in a sorted walk."""
    for root, _, names in sorted(os.walk(directory)):
        yield from (os.path.join(root, n) for n in sorted(names)
                    if n.lower().endswith(IMAGE_SUFFIXES))


def _read_directory(directory, class_names, image_size):
    import keras
    try:
        ds = keras.utils.image_dataset_from_directory(
            directory, labels="inferred", label_mode="int", class_names=class_names,
            color_mode="rgb", batch_size=256, image_size=image_size, shuffle=False,
            interpolation="bilinear", data_format="channels_last", verbose=False)
    except ValueError as err:
        raise ValueError(f"Cannot read the image folder {directory!r}: {err}") from None
    try:
        batches = [(np.clip(np.rint(x), 0, 255).astype(np.uint8), np.asarray(y, np.int64))
                   for x, y in ds]
    except Exception as err:  # noqa: BLE001 - a bad image file surfaces as a TF error.
        where = _undecodable(directory) or f"an image under {directory!r}"
        raise ValueError(f"Cannot decode {where} ({type(err).__name__}: "
                         f"{(str(err).splitlines() or [''])[0]}). Remove or replace it.") from None
    return tuple(np.concatenate(arrays) for arrays in zip(*batches))


def _undecodable(directory):
    """The first image file under `directory` that Pillow cannot decode (quoted), or None."""
    from PIL import Image
    for path in _images(directory):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                with Image.open(path) as image:
                    image.load()
        except Exception:  # noqa: BLE001 - any failure names the file
            return repr(path)


def read_image_folder(path, split, *, image_size=(32, 32)):
    """Reads one split of the image folder `path`, resized to `image_size` (H, W; bilinear,
    aspect ratio not kept): ``(images, labels, meta)``, uint8 (N, H, W, 3), int64 (N,) and a
    dict with "class_names", "layout" and "path". ValueError for missing or bad files."""
    try:
        size = tuple(int(v) for v in image_size)
    except (TypeError, ValueError):
        size = ()
    if len(size) != 2 or min(size) <= 0:
        raise ValueError("`image_size` must be two positive ints (height, width). Received: "
                         f"image_size={image_size!r}")
    layout, train_dir, test_dir = folder_layout(path)
    class_names = class_folders(train_dir, least=2)
    from PIL import Image
    with contextlib.suppress(OSError), Image.open(first := next(_images(train_dir))) as image:
        if (shape := image.size[::-1]) != size:  # The first image stands for the folder.
            logger.warning("The folder's images (%s is %dx%d) are resized to %dx%d (bilinear, "
                           "aspect ratio not kept).", first, *shape, *size)
    if layout == "split":
        directory = train_dir if split == "train" else test_dir
        own = class_folders(directory, within=class_names)
        images, labels = _read_directory(directory, own, size)
        # Class ids follow the train folder's classes, even where the test folder lacks some.
        labels = np.array([class_names.index(n) for n in own], np.int64)[labels]
    else:
        images, labels = _read_directory(train_dir, class_names, size)
        if (counts := np.bincount(labels)).min() < 3:  # round(20%) of 2 images is none
            raise ValueError(f"The image folder {train_dir!r} holds {len(labels)} images; for its "
                             "held-out split (20%) every class needs at least 3, and "
                             f"{class_names[counts.argmin()]!r} has {counts.min()}. Add images, or "
                             "give train/ and test/ sub-folders.")
        idx = stratified_split(labels)[0 if split == "train" else 1]
        images, labels = images[idx], labels[idx]
    root = train_dir if layout == "flat" else os.path.dirname(train_dir)
    return images, labels, {"class_names": class_names, "layout": layout, "path": root}
