"""Writers of real-format CIFAR files and image folders for the data tests.

The layouts follow https://www.cs.toronto.edu/~kriz/cifar.html: pickled dicts with byte
keys, ``b"data"`` an (N, 3072) uint8 array of R, G, B planes; binary records of label
byte(s) + 3072 pixels. Pixel rows are built here by explicit indexing, independently of
the library's decoder.
"""

import io
import os
import pickle
import struct
import tarfile

import numpy as np


def random_images(n, seed=0, size=32):
    """Random uint8 NHWC images (asymmetric noise: any crop / flip is identifiable)."""
    return np.random.RandomState(seed).randint(0, 256, size=(n, size, size, 3)).astype(np.uint8)


def to_cifar_rows(images):
    """(N, 32, 32, 3) -> (N, 3072): row[c * 1024 + r * 32 + col] = image[r, col, c]."""
    n = images.shape[0]
    rows = np.zeros((n, 3072), dtype=np.uint8)
    r, col = np.meshgrid(np.arange(32), np.arange(32), indexing="ij")
    for c in range(3):
        rows[:, c * 1024 + r.ravel() * 32 + col.ravel()] = images[:, r.ravel(), col.ravel(), c]
    return rows


class Py2StylePickler(pickle._Pickler):
    """Writes byte and text strings as Python 2 ``str`` opcodes and numpy's globals
    under their numpy 1.x module names, as the original cPickle'd CIFAR files have."""

    dispatch = pickle._Pickler.dispatch.copy()

    def _save_py2_str(self, obj):
        if isinstance(obj, str):
            obj = obj.encode("latin1")
        if len(obj) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(obj)]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", len(obj)) + obj)
        self.memoize(obj)

    dispatch[bytes] = _save_py2_str
    dispatch[str] = _save_py2_str

    def save_global(self, obj, name=None):
        module = getattr(obj, "__module__", None)
        name = name or obj.__qualname__
        if module in ("numpy._core.multiarray", "numpy.core.multiarray"):
            module = "numpy.core.multiarray"
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode("ascii"))
        self.memoize(obj)


def pickle_bytes(obj, protocol):
    """Pickles with a protocol number, or "py2" for the original files' style."""
    if protocol == "py2":
        buf = io.BytesIO()
        Py2StylePickler(buf, protocol=2).dump(obj)
        return buf.getvalue()
    return pickle.dumps(obj, protocol=protocol)


def cifar10_batch_dict(images, labels, index=1):
    return {
        b"batch_label": f"training batch {index} of 5".encode(),
        b"labels": [int(v) for v in labels],
        b"data": to_cifar_rows(images),
        b"filenames": [f"img_{index}_{i}.png".encode() for i in range(len(labels))],
    }


def cifar100_batch_dict(images, fine, coarse):
    return {
        b"filenames": [f"img_{i}.png".encode() for i in range(len(fine))],
        b"batch_label": b"training batch 1 of 1",
        b"fine_labels": [int(v) for v in fine],
        b"coarse_labels": [int(v) for v in coarse],
        b"data": to_cifar_rows(images),
    }


def write_cifar10_python(root, train, test, protocol=pickle.DEFAULT_PROTOCOL):
    """Writes ``root/cifar-10-batches-py``; train: list of 5 (images, labels)."""
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    for i, (x, y) in enumerate(train, start=1):
        with open(os.path.join(folder, f"data_batch_{i}"), "wb") as f:
            f.write(pickle_bytes(cifar10_batch_dict(x, y, i), protocol))
    with open(os.path.join(folder, "test_batch"), "wb") as f:
        f.write(pickle_bytes(cifar10_batch_dict(*test), protocol))
    meta = {b"label_names": [b"airplane"] * 10, b"num_cases_per_batch": 10000, b"num_vis": 3072}
    with open(os.path.join(folder, "batches.meta"), "wb") as f:
        f.write(pickle_bytes(meta, protocol))
    return folder


def write_cifar100_python(root, train, test, protocol=pickle.DEFAULT_PROTOCOL):
    """Writes ``root/cifar-100-python``; train/test: (images, fine, coarse)."""
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder, exist_ok=True)
    for fname, split in (("train", train), ("test", test)):
        with open(os.path.join(folder, fname), "wb") as f:
            f.write(pickle_bytes(cifar100_batch_dict(*split), protocol))
    return folder


def write_cifar10_binary(root, train, test):
    folder = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(folder, exist_ok=True)
    files = [(f"data_batch_{i}.bin", b) for i, b in enumerate(train, start=1)]
    files.append(("test_batch.bin", test))
    for fname, (x, y) in files:
        rows = to_cifar_rows(x)
        with open(os.path.join(folder, fname), "wb") as f:
            for label, row in zip(y, rows):
                f.write(bytes([int(label)]) + row.tobytes())
    return folder


def write_cifar100_binary(root, train, test):
    folder = os.path.join(root, "cifar-100-binary")
    os.makedirs(folder, exist_ok=True)
    for fname, (x, fine, coarse) in (("train.bin", train), ("test.bin", test)):
        rows = to_cifar_rows(x)
        with open(os.path.join(folder, fname), "wb") as f:
            for c, label, row in zip(coarse, fine, rows):
                f.write(bytes([int(c), int(label)]) + row.tobytes())
    return folder


def make_tar_gz(folder, archive):
    """Packs `folder` as the top-level directory of a .tar.gz (as the real archives)."""
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=os.path.basename(folder))
    return archive


def cifar10_splits(per_batch=3, num_test=4, seed=0):
    """Five train batches and a test batch of random images with labels 0..9."""
    rng = np.random.RandomState(seed)
    train = [
        (random_images(per_batch, seed=seed * 100 + i), rng.randint(0, 10, per_batch))
        for i in range(5)
    ]
    test = (random_images(num_test, seed=seed * 100 + 50), rng.randint(0, 10, num_test))
    return train, test


def write_png_folder(root, classes, per_class, seed=0, size=32):
    """Writes ``root/<class>/<i>.png`` and returns {class: [images in file order]}."""
    from PIL import Image

    out = {}
    for k, name in enumerate(classes):
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        images = random_images(per_class, seed=seed * 1000 + k, size=size)
        for i, img in enumerate(images):
            Image.fromarray(img).save(os.path.join(folder, f"{i:03d}.png"))
        out[name] = images
    return out


def shifted(image, dy, dx, flip=False, pad=4):
    """The crop at offset (dy, dx) of the zero-padded image (optionally flipped)."""
    h, w = image.shape[:2]
    padded = np.pad(image, ((pad, pad), (pad, pad), (0, 0)))
    crop = padded[dy : dy + h, dx : dx + w]
    return crop[:, ::-1] if flip else crop


def matching_transforms(source, output, pad=4, flips=(False, True)):
    """All (dy, dx, flip) under which `output` is a pad-crop(-flip) of `source`."""
    found = []
    for flip in flips:
        for dy in range(2 * pad + 1):
            for dx in range(2 * pad + 1):
                if np.array_equal(shifted(source, dy, dx, flip, pad), output):
                    found.append((dy, dx, flip))
    return found


def write_image(path, height=32, width=32, seed=0, **save_args):
    """Writes one random RGB image at `path` (its format from the suffix); returns it."""
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)
    Image.fromarray(image).save(path, **save_args)
    return image
