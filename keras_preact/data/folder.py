"""A folder of images, ``root/train/<class>/*`` beside a held-out ``root/test/<class>/*``
(split names in any case: train/training beside test/testing, val/valid or validation), or
``root/<class>/*`` (20% of every class held out as "test"), or a .zip / .tar.gz of either.
Images of any format Pillow reads are decoded and resized with Pillow, as `predict --resize`
does; hidden files and folders are skipped, linked folders followed."""

import collections
import concurrent.futures
import functools
import hashlib
import logging
import os
import shutil
import warnings

import numpy as np

from keras_preact.data.registry import stratified_split
from keras_preact.file_io import keras_preact_home, staged_folder, user_path

#: The image files TensorFlow decodes (`keras_preact.data.imagenet` streams folders with it).
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png")
logger = logging.getLogger(__name__)
#: The split folders' names (any case); of the held-out ones, the first found is used.
TRAIN_FOLDERS = ("train", "training")
HELD_OUT_FOLDERS = ("test", "testing", "val", "valid", "validation")
#: The archives `shutil.unpack_archive` extracts: .zip, .tar, .tar.gz, .tgz, ...
ARCHIVE_SUFFIXES = tuple(s for _, suffixes, _ in shutil.get_unpack_formats() for s in suffixes)
_warned = set()  # (folder, kind, ...): each warning once a process, not once a split


def folder_layout(path):
    """Returns ("split", train_dir, held_out_dir) or ("flat", path, None), where `path` is
    a folder or an archive (then its extracted copy); raises ValueError."""
    if path is None:
        raise ValueError("The 'folder' dataset needs `path` (--data-path): a folder with one "
                         "sub-folder per class (or train/ and test/ or val/ holding those), or "
                         "an archive of one. Received: path=None")
    if not os.path.isdir(path := _extracted(user_path(path))):
        what = (f"is a file, not a folder or an archive ({', '.join(ARCHIVE_SUFFIXES)})"
                if os.path.exists(path) else "does not exist")
        raise ValueError(f"The image folder {what}. Received: path={path!r}")
    names = {name.lower(): name for name in _folders(path)}
    train = [names[n] for n in TRAIN_FOLDERS if n in names]
    held_out = [names[n] for n in HELD_OUT_FOLDERS if n in names]
    if not train + held_out:
        return "flat", path, None
    if len(train) == 1 and held_out:
        return "split", os.path.join(path, train[0]), os.path.join(path, held_out[0])
    need = ("more than one train folder" if len(train) > 1 else "no held-out folder (" +
            "/, ".join(HELD_OUT_FOLDERS) + "/, any case)" if train else
            "no train folder (train/ or training/, any case)")
    raise ValueError(f"The image folder has {'/, '.join(train + held_out)}/ but {need}. "
                     f"Received: path={path!r}")


def _extracted(path):
    """`path`, or for an archive its copy extracted once (whole or not at all) under
    ``$KERAS_PREACT_HOME/extracted``, named by the archive's path, size and time: its one
    top folder if it holds only that. ValueError for an archive that cannot be extracted."""
    if not (path.lower().endswith(ARCHIVE_SUFFIXES) and os.path.isfile(path)):
        return path
    zip_file, stat = path.lower().endswith(".zip"), os.stat(path)
    key = hashlib.sha256(repr((path, stat.st_size, stat.st_mtime_ns)).encode()).hexdigest()
    target = keras_preact_home("extracted", f"{os.path.basename(path)}-{key[:16]}")
    if not os.path.isdir(target):
        with staged_folder(target, check=lambda: None, what="an extracted archive") as staging:
            try:  # "data": no link or path out of the folder (shutil skips those of a zip)
                shutil.unpack_archive(path, staging, filter=None if zip_file else "data")
            except Exception as err:  # noqa: BLE001 - tar, gzip, zip and OS errors alike
                raise ValueError(f"Cannot extract the archive {path!r} ({type(err).__name__}: "
                                 f"{err}): damaged or not an archive. Received: path={path!r}"
                                 ) from None
    top = _folders(target)
    return os.path.join(target, top[0]) if os.listdir(target) == top[:1] else target


def _visible(names):
    """`names` less hidden ones (.git, .ipynb_checkpoints, macOS' ._* and __MACOSX)."""
    return [n for n in names if not n.startswith((".", "__MACOSX"))]


def _folders(directory):
    """The sorted visible sub-folders of `directory` (links to folders too)."""
    return sorted(n for n in _visible(os.listdir(directory))
                  if os.path.isdir(os.path.join(directory, n)))


def class_folders(directory, *, within=None, least=1):
    """The sorted class sub-folder names of `directory`, each holding an image; ValueError
    when there are fewer than `least` or some are not in `within` (the train classes)."""
    if len(names := _folders(directory)) < least:
        raise ValueError(f"The image folder {directory!r} needs {least} or more class sub-folders "
                         "(<folder>/<class name>/<images>)" + ("; a classifier needs 2 classes"
                         if least > 1 else "") + f". Received: classes={names}")
    if extra := sorted(set(names) - set(within or names)):
        raise ValueError(f"The folder {directory!r} has classes missing from the train "
                         f"folder: {extra}.")
    for folder in (os.path.join(directory, name) for name in names):
        if not image_files(folder):
            raise ValueError(f"The class folder {folder!r} holds no images (a format Pillow "
                             f"reads: {', '.join(IMAGE_SUFFIXES)}, .tiff, .webp, ...).")
    return names


@functools.lru_cache(maxsize=1)
def image_suffixes():
    """The suffixes of the image files Pillow opens (all its plugins)."""
    from PIL import Image
    return tuple(s for s, kind in Image.registered_extensions().items() if kind in Image.OPEN)


def visible_files(directory):
    """The files under `directory`, in a sorted walk that follows links (each real folder
    once) and skips hidden files and folders."""
    seen, walk = set(), []
    for root, folders, names in os.walk(directory, followlinks=True):
        if (real := os.path.realpath(root)) in seen:  # a link to a folder above it
            folders.clear()
            continue
        seen.add(real)
        folders[:] = _visible(folders)
        walk.append((root, sorted(_visible(names))))
    return [os.path.join(root, name) for root, names in sorted(walk) for name in names]


def image_files(directory, skipped=None):
    """The image files (`image_suffixes`) of `visible_files(directory)`; the other files are
    appended to the list `skipped`."""
    files = visible_files(directory)
    images = [f for f in files if f.lower().endswith(image_suffixes())]
    if skipped is not None:
        skipped += sorted(set(files) - set(images))
    return images


def _decode(path, size):
    """The image file `path` as uint8 RGB (height, width) `size`, and its own (height,
    width); ValueError naming it when Pillow cannot read it."""
    from PIL import Image
    try:
        with warnings.catch_warnings(), Image.open(path) as image:
            warnings.simplefilter("ignore")  # a big photo, a palette's transparency
            shape = (image.height, image.width)
            if image.mode in ("I", "I;16", "I;16B", "I;16L"):  # 16 bits: their top 8, as
                # `convert` would clip every value over 255 to white
                image = Image.fromarray((np.asarray(image, np.uint32) >> 8).astype(np.uint8))
            image = image.convert("RGB")
        # As `predict --resize` resizes (Pillow copies an image of the size asked).
        return np.asarray(image.resize(size[::-1], Image.Resampling.BILINEAR), np.uint8), shape
    except Exception as err:  # noqa: BLE001 - any failure names the file
        raise ValueError(f"Cannot decode {path!r} ({type(err).__name__}: "
                         f"{(str(err).splitlines() or [''])[0]}). Remove or replace it.") from None


def _read_directory(directory, class_names, size, root):
    """The images of `class_names` under `directory` and their labels; warns (once a
    process for the folder `root`) of files skipped and of images resized."""
    skipped = []
    files = [(file, label) for label, name in enumerate(class_names)
             for file in image_files(os.path.join(directory, name), skipped)]
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        images, shapes = zip(*pool.map(lambda f: _decode(f[0], size), files))
    if skipped and _once(root, "skipped"):
        kinds = collections.Counter(os.path.splitext(f)[1].lower() or "no suffix" for f in skipped)
        logger.warning("Skipped %d file(s) under %r that are not images Pillow reads: %s.",
                       len(skipped), root, ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
    if (other := [i for i, s in enumerate(shapes) if s != size]) and _once(root, "resized", size):
        logger.warning("%d of the %d images under %r (%r is %dx%d) are resized to %dx%d (bilinear, "
                       "aspect ratio not kept).", len(other), len(files), root,
                       files[other[0]][0], *shapes[other[0]], *size)
    return np.stack(images), np.array([label for _, label in files], np.int64)


def _once(*key):
    """Whether `key` is new (then remembered): a warning said once, not once a split."""
    return key not in _warned and not _warned.add(key)


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
    root = train_dir if layout == "flat" else os.path.dirname(train_dir)
    if layout == "split" and split != "train":
        own = class_folders(test_dir, within=class_names)
        if (missing := sorted(set(class_names) - set(own))) and _once(root, "missing"):
            logger.warning("The test folder %r has no images of the classes %s: its accuracy "
                           "says nothing about them.", test_dir, missing)
        images, labels = _read_directory(test_dir, own, size, root)
        # Class ids follow the train folder's classes, even where the test folder lacks some.
        labels = np.array([class_names.index(n) for n in own], np.int64)[labels]
    else:
        images, labels = _read_directory(train_dir, class_names, size, root)
    if layout == "flat":
        if (counts := np.bincount(labels)).min() < 3:  # round(20%) of 2 images is none
            raise ValueError(f"The image folder {train_dir!r} holds {len(labels)} images; for its "
                             "held-out split (20%) every class needs at least 3, and "
                             f"{class_names[counts.argmin()]!r} has {counts.min()}. Add images, or "
                             "give train/ and test/ sub-folders.")
        idx = stratified_split(labels)[0 if split == "train" else 1]
        images, labels = images[idx], labels[idx]
    return images, labels, {"class_names": class_names, "layout": layout, "path": root}
