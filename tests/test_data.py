"""Tests of keras_preact.data: sources, safe pickle reading, registry, tf.data pipeline."""

import hashlib
import os
import pickle
import re
import tarfile

import numpy as np
import pytest

from keras_preact import data
from keras_preact.data import sources
from keras_preact.layers.preprocessing import PRESETS
from tests import data_fixtures as F
from tests.helpers import REPO, run_python


@pytest.fixture(autouse=True)
def _fresh_array_cache():
    data.clear_cache()
    yield
    data.clear_cache()


@pytest.fixture
def cifar10_dir(tmp_path):
    """A cifar-10-batches-py folder: 5 train batches of 4 images, 6 test images."""
    train, test = F.cifar10_splits(per_batch=4, num_test=6, seed=1)
    F.write_cifar10_python(str(tmp_path), train, test)
    images = np.concatenate([x for x, _ in train])
    labels = np.concatenate([y for _, y in train])
    return tmp_path, images, labels, test


def _collect(ds):
    xs, ys = [], []
    for x, y in ds:
        xs.append(x.numpy())
        ys.append(y.numpy())
    return xs, ys


def _digest(batches):
    h = hashlib.sha256()
    for x, y in zip(*batches):
        h.update(np.ascontiguousarray(x).tobytes())
        h.update(np.ascontiguousarray(y).tobytes())
    return h.hexdigest()


# --- registry -----------------------------------------------------------------------


def test_registry_lists_datasets_and_describes_them():
    assert data.list_datasets() == ["cifar10", "cifar100", "digits", "folder"]
    c10 = data.dataset_info("cifar10")
    assert (c10["classes"], c10["input_shape"], c10["num_train"], c10["num_test"]) == (
        10, (32, 32, 3), 50000, 10000,
    )
    assert c10["class_names"][0] == "airplane" and len(c10["class_names"]) == 10
    assert c10["mean"] == PRESETS["cifar10"][1] and c10["std"] == PRESETS["cifar10"][2]
    assert c10["augmentation"] == "pad_crop_flip"
    c100 = data.dataset_info("cifar100")
    assert c100["classes"] == 100
    assert len(set(c100["class_names"])) == 100
    assert list(c100["class_names"]) == sorted(c100["class_names"])
    digits = data.dataset_info("digits")
    assert digits["augmentation"] == "pad_crop"
    assert (digits["num_train"], digits["num_test"]) == (1438, 359)
    assert len(digits["mean"]) == 3 and all(0 < s < 1 for s in digits["std"])


UNKNOWN = "Unknown dataset.*cifar10.*cifar100.*digits.*folder"


@pytest.mark.parametrize("call, match", [
    (lambda tmp: data.dataset_info("imagenet"), UNKNOWN),
    (lambda tmp: data.load_arrays("cifar1O", "train"), UNKNOWN),
    (lambda tmp: data.make_dataset("mnist", "train"), UNKNOWN),
    (lambda tmp: data.dataset_info("folder"), "needs `path`"),
    (lambda tmp: data.load_arrays("folder", "train", path=str(tmp / "nope")), "does not exist"),
    (lambda tmp: data.load_arrays("folder", "train", path=str(tmp)),
     r"needs 2 or more class sub-folders.*Received: classes=\[\]"),
    (lambda tmp: data.load_arrays("cifar10", "train", source="archive", data_dir=str(tmp)),
     r"No cifar10 files.*cifar-10-batches-py/.*cifar-10-python.tar.gz"),
    (lambda tmp: data.load_arrays("cifar10", "train", source="archive"),
     "source='archive' needs `path`"),
    (lambda tmp: data.load_arrays("cifar10", "train", source="s3"),
     r"(?=.*`source`)(?=.*source='s3')(?=.*'archive')"),
    (lambda tmp: data.load_arrays("cifar10", "val"), r"(?=.*`split`)(?=.*split='val')(?=.*'test')"),
    (lambda tmp: data.load_arrays("digits", "train", source="tfds"), "takes no `source`"),
])
def test_unknown_names_and_missing_files_are_clear_errors(call, match, tmp_path):
    with pytest.raises(ValueError, match=match):
        call(tmp_path)


# --- original CIFAR files -------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["py2", 0, 2, pickle.DEFAULT_PROTOCOL, 5])
def test_cifar10_pickle_layout_decodes_pixel_exact(tmp_path, protocol):
    train, test = F.cifar10_splits(per_batch=3, num_test=2, seed=2)
    folder = F.write_cifar10_python(str(tmp_path), train, test, protocol=protocol)
    x, y = data.load_arrays("cifar10", "train", source="archive", path=folder)
    assert x.dtype == np.uint8 and x.shape == (15, 32, 32, 3)
    assert y.dtype == np.int64
    np.testing.assert_array_equal(x, np.concatenate([b[0] for b in train]))
    np.testing.assert_array_equal(y, np.concatenate([b[1] for b in train]))
    # Channel order and row-major planes, spelled out on the stored row of image 0.
    row = F.cifar10_batch_dict(*train[0])[b"data"][0]
    for r, c in [(0, 0), (0, 31), (5, 17), (31, 0), (31, 31)]:
        assert x[0, r, c, 0] == row[r * 32 + c]
        assert x[0, r, c, 1] == row[1024 + r * 32 + c]
        assert x[0, r, c, 2] == row[2048 + r * 32 + c]
    xt, yt = data.load_arrays("cifar10", "test", source="archive", data_dir=str(tmp_path))
    np.testing.assert_array_equal(xt, test[0])
    np.testing.assert_array_equal(yt, test[1])


def test_channel_planes_are_red_green_blue(tmp_path):
    # One image whose R, G, B planes are constant 10, 20, 30 and one with a gradient
    # along the rows only: a swapped axis or channel order cannot pass.
    img = np.zeros((2, 32, 32, 3), np.uint8)
    img[0, ..., 0], img[0, ..., 1], img[0, ..., 2] = 10, 20, 30
    img[1, ..., 0] = np.arange(32, dtype=np.uint8)[:, None]
    rows = np.concatenate([np.full(1024, 10), np.full(1024, 20), np.full(1024, 30)])
    assert np.array_equal(F.to_cifar_rows(img)[0], rows)
    train = [(img, np.array([3, 4]))] * 5
    F.write_cifar10_python(str(tmp_path), train, (img, np.array([1, 2])))
    x, _ = data.load_arrays("cifar10", "test", source="archive", data_dir=str(tmp_path))
    assert tuple(x[0, 7, 9]) == (10, 20, 30)
    assert x[1, 12, 0, 0] == 12 and x[1, 0, 12, 0] == 0


def test_cifar100_pickle_uses_fine_labels(tmp_path):
    images = F.random_images(5, seed=3)
    fine, coarse = np.array([99, 0, 57, 3, 42]), np.array([19, 4, 1, 2, 0])
    test = (images[:2], fine[:2], coarse[:2])
    F.write_cifar100_python(str(tmp_path), (images, fine, coarse), test)
    x, y = data.load_arrays("cifar100", "train", source="archive", data_dir=str(tmp_path))
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, fine)


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_tar_gz_archives_are_read_without_extracting(tmp_path, name):
    src = tmp_path / "src"
    if name == "cifar10":
        train, test = F.cifar10_splits(per_batch=2, num_test=3, seed=4)
        folder = F.write_cifar10_python(str(src), train, test)
        expected = (test[0], test[1])
        archive = tmp_path / "cifar-10-python.tar.gz"
    else:
        images = F.random_images(4, seed=5)
        fine, coarse = np.array([1, 2, 3, 4]), np.array([0, 0, 0, 0])
        folder = F.write_cifar100_python(str(src), (images, fine, coarse), (images, fine, coarse))
        expected = (images, fine)
        archive = tmp_path / "cifar-100-python.tar.gz"
    F.make_tar_gz(folder, str(archive))
    x, y = data.load_arrays(name, "test", source="archive", path=str(archive))
    np.testing.assert_array_equal(x, expected[0])
    np.testing.assert_array_equal(y, expected[1])
    # A folder holding the archive is found too, and "auto" prefers the files to TFDS.
    empty_parent = tmp_path / "data"
    empty_parent.mkdir()
    os.replace(archive, empty_parent / archive.name)
    x2, _ = data.load_arrays(name, "test", data_dir=str(empty_parent), cache=False)
    np.testing.assert_array_equal(x2, expected[0])
    assert sorted(os.listdir(empty_parent)) == [archive.name]  # Nothing extracted.


def test_binary_layouts_decode_pixel_exact(tmp_path):
    train, test = F.cifar10_splits(per_batch=2, num_test=3, seed=6)
    F.write_cifar10_binary(str(tmp_path / "a"), train, test)
    x, y = data.load_arrays("cifar10", "train", source="archive", data_dir=str(tmp_path / "a"))
    np.testing.assert_array_equal(x, np.concatenate([b[0] for b in train]))
    np.testing.assert_array_equal(y, np.concatenate([b[1] for b in train]))

    images = F.random_images(3, seed=7)
    fine, coarse = np.array([5, 77, 99]), np.array([11, 12, 13])
    split = (images, fine, coarse)
    folder = F.write_cifar100_binary(str(tmp_path / "b"), split, split)
    x, y = data.load_arrays("cifar100", "train", source="archive", path=folder)
    np.testing.assert_array_equal(x, images)
    np.testing.assert_array_equal(y, fine)
    archive = F.make_tar_gz(folder, str(tmp_path / "cifar-100-binary.tar.gz"))
    x, y = data.load_arrays("cifar100", "test", source="archive", path=archive)
    np.testing.assert_array_equal(x, images)


class _MkdirOnLoad:
    """Unpickling this runs os.mkdir(path): the proof that code would have run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


class _ExecOnLoad:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (exec, (f"import os; os.mkdir({self.path!r})",))


@pytest.mark.parametrize("payload_cls", [_MkdirOnLoad, _ExecOnLoad])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, payload_cls):
    marker = str(tmp_path / "pwned")
    train, test = F.cifar10_splits(per_batch=2, num_test=2)
    folder = F.write_cifar10_python(str(tmp_path), train, test)
    batch = F.cifar10_batch_dict(*train[0])
    batch[b"labels"] = payload_cls(marker)
    blob = pickle.dumps(batch, protocol=2)
    # Control: a plain pickle.loads of these bytes does run the payload.
    pickle.loads(blob)
    assert os.path.isdir(marker)
    os.rmdir(marker)
    with open(os.path.join(folder, "data_batch_1"), "wb") as f:
        f.write(blob)
    with pytest.raises(ValueError, match=r"Refusing to load.*data_batch_1.*global"):
        data.load_arrays("cifar10", "train", source="archive", path=folder)
    assert not os.path.exists(marker)


def test_pickle_with_object_array_is_refused():
    blob = pickle.dumps({b"data": np.array([1, "x"], dtype=object)}, protocol=2)
    with pytest.raises(ValueError, match="Refusing to load.*'evil.bin'.*object"):
        data.safe_load_pickle(blob, source="evil.bin")
    blob = pickle.dumps({b"data": np.zeros(3, dtype=[("a", "u1"), ("b", "u1")])})
    with pytest.raises(ValueError, match="Refusing to load"):
        data.safe_load_pickle(blob, source="evil.bin")


def test_corrupt_and_missing_files_name_the_file(tmp_path):
    train, test = F.cifar10_splits(per_batch=2, num_test=2)
    folder = F.write_cifar10_python(str(tmp_path), train, test)
    path = os.path.join(folder, "data_batch_2")

    blob = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(blob[: len(blob) // 2])
    with pytest.raises(ValueError, match=r"data_batch_2.*truncated or corrupt"):
        data.load_arrays("cifar10", "train", source="archive", path=folder)

    bad = F.cifar10_batch_dict(*train[1])
    bad[b"data"] = bad[b"data"][:, :3000].copy()
    with open(path, "wb") as f:
        pickle.dump(bad, f)
    with pytest.raises(ValueError, match=r"data_batch_2.*shape \(2, 3000\).*3072"):
        data.load_arrays("cifar10", "train", source="archive", path=folder)

    bad = F.cifar10_batch_dict(*train[1])
    bad[b"labels"] = [3, 10]
    with open(path, "wb") as f:
        pickle.dump(bad, f)
    with pytest.raises(ValueError, match=r"data_batch_2.*classes 0..9"):
        data.load_arrays("cifar10", "train", source="archive", path=folder)

    os.remove(path)
    with pytest.raises(ValueError, match=r"data_batch_2.*is missing"):
        data.load_arrays("cifar10", "train", source="archive", path=folder)
    # The test split does not need the missing train file.
    x, _ = data.load_arrays("cifar10", "test", source="archive", path=folder)
    assert x.shape == (2, 32, 32, 3)


def test_truncated_archive_and_binary_files_name_the_file(tmp_path):
    train, test = F.cifar10_splits(per_batch=20, num_test=20)
    folder = F.write_cifar10_python(str(tmp_path / "src"), train, test)
    archive = F.make_tar_gz(folder, str(tmp_path / "cifar-10-python.tar.gz"))
    blob = open(archive, "rb").read()
    with open(archive, "wb") as f:
        f.write(blob[: len(blob) * 2 // 3])
    with pytest.raises(ValueError, match=r"cifar-10-python.tar.gz.*truncated or corrupt"):
        data.load_arrays("cifar10", "test", source="archive", path=archive)

    with tarfile.open(tmp_path / "other.tar.gz", "w:gz") as tar:
        tar.add(str(tmp_path / "src"), arcname="unrelated")
    with pytest.raises(ValueError, match=r"other.tar.gz.*no cifar10 folder"):
        data.load_arrays("cifar10", "test", source="archive", path=str(tmp_path / "other.tar.gz"))

    binary = F.write_cifar10_binary(str(tmp_path / "bin"), train, test)
    path = os.path.join(binary, "test_batch.bin")
    with open(path, "r+b") as f:
        f.truncate(3073 * 2 + 100)
    with pytest.raises(ValueError, match=r"test_batch.bin.*3073-byte record"):
        data.load_arrays("cifar10", "test", source="archive", path=binary)


def test_cache_returns_read_only_arrays_and_sees_file_changes(cifar10_dir):
    root, images, _, _ = cifar10_dir
    a, _ = data.load_arrays("cifar10", "train", source="archive", data_dir=str(root))
    b, _ = data.load_arrays("cifar10", "train", source="archive", data_dir=str(root))
    assert a is b and not a.flags.writeable
    c, _ = data.load_arrays("cifar10", "train", source="archive", data_dir=str(root), cache=False)
    assert c is not a and c.flags.writeable
    # Rewriting a batch file (new content) invalidates the cached split.
    new = F.random_images(4, seed=99)
    folder = os.path.join(str(root), "cifar-10-batches-py")
    with open(os.path.join(folder, "data_batch_5"), "wb") as f:
        pickle.dump(F.cifar10_batch_dict(new, np.zeros(4, int), 5), f)
    os.utime(os.path.join(folder, "data_batch_5"), ns=(1, 1))
    d, _ = data.load_arrays("cifar10", "train", source="archive", data_dir=str(root))
    np.testing.assert_array_equal(d[-4:], new)


# --- TFDS -----------------------------------------------------------------------------


def test_tfds_source_through_mock_data(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=10):
        x, y = data.load_arrays(
            "cifar10", "train", source="tfds", data_dir=str(tmp_path), cache=False
        )
        assert x.shape == (10, 32, 32, 3) and x.dtype == np.uint8
        assert y.dtype == np.int64 and y.min() >= 0 and y.max() < 10
        ds = data.make_dataset(
            "cifar100", "test", source="tfds", data_dir=str(tmp_path), batch_size=4, cache=False
        )
        xs, ys = _collect(ds)
    assert [len(b) for b in ys] == [4, 4, 2]
    assert xs[0].dtype == np.float32 and np.concatenate(ys).max() < 100


def test_tfds_without_prepared_data_names_data_dir(tmp_path):
    empty = str(tmp_path / "tfds_empty")
    expected = rf"not prepared in data_dir='{re.escape(empty)}'.*source='archive'"
    with pytest.raises(ValueError, match=expected):
        data.load_arrays("cifar10", "test", source="tfds", data_dir=empty)
    with pytest.raises(ValueError, match=r"not prepared.*searched for the original files"):
        data.load_arrays("cifar100", "test", data_dir=empty)


# --- digits ---------------------------------------------------------------------------


def test_digits_are_real_split_and_balanced():
    from sklearn.datasets import load_digits

    sk = load_digits()
    xtr, ytr, mtr = sources.load_arrays_with_meta("digits", "train", cache=False)
    xte, yte, mte = sources.load_arrays_with_meta("digits", "test", cache=False)
    assert xtr.shape == (1438, 32, 32, 3) and xte.shape == (359, 32, 32, 3)
    assert xtr.dtype == np.uint8 and xtr.min() == 0 and xtr.max() == 255
    all_idx = np.concatenate([mtr["indices"], mte["indices"]])
    assert sorted(all_idx.tolist()) == list(range(1797))
    counts = np.bincount(sk.target)
    np.testing.assert_array_equal(np.bincount(yte), np.rint(0.2 * counts).astype(int))
    np.testing.assert_array_equal(np.bincount(ytr) + np.bincount(yte), counts)
    # Nearest 4x upsampling of the real images, grey in all three channels.
    small = np.rint(sk.images[mte["indices"]] * 255 / 16).astype(np.uint8)
    np.testing.assert_array_equal(xte[:, ::4, ::4, 0], small)
    np.testing.assert_array_equal(xte[:, 3::4, 3::4, 0], small)
    assert np.array_equal(xte[..., 0], xte[..., 1]) and np.array_equal(xte[..., 0], xte[..., 2])
    np.testing.assert_array_equal(yte, sk.target[mte["indices"]])
    # Deterministic: a second decode gives the same split.
    again, _ = data.load_arrays("digits", "test", cache=False)
    np.testing.assert_array_equal(again, xte)


# --- image folders --------------------------------------------------------------------


def test_image_folder_flat_and_split_layouts(tmp_path):
    flat = tmp_path / "flat"
    written = F.write_png_folder(str(flat), ["cat", "dog"], per_class=5, seed=1)
    x, y = data.load_arrays("folder", "train", path=str(flat))
    xt, yt = data.load_arrays("folder", "test", path=str(flat))
    assert (len(y), len(yt)) == (8, 2)
    assert sorted(yt.tolist()) == [0, 1]
    every = np.concatenate([written["cat"], written["dog"]])
    for img in np.concatenate([x, xt]):  # PNG is lossless; no resize at 32x32.
        assert any(np.array_equal(img, w) for w in every)
    for img, label in zip(x, y):
        source = written[["cat", "dog"][label]]
        assert any(np.array_equal(img, w) for w in source)
    info = data.dataset_info("folder", path=str(flat))
    assert info["class_names"] == ("cat", "dog") and info["classes"] == 2
    assert (info["num_train"], info["num_test"]) == (8, 2)
    np.testing.assert_allclose(info["mean"], x.reshape(-1, 3).mean(0) / 255, rtol=1e-6)

    split = tmp_path / "split"
    tr = F.write_png_folder(str(split / "train"), ["a", "b", "c"], per_class=2, seed=2)
    te = F.write_png_folder(str(split / "test"), ["a", "c"], per_class=1, seed=3)
    xt, yt = data.load_arrays("folder", "test", path=str(split))
    assert yt.tolist() == [0, 2]  # Class ids from train's classes: "c" stays 2.
    np.testing.assert_array_equal(xt[1], te["c"][0])
    ds = data.make_dataset("folder", "train", path=str(split), batch_size=3)
    xs, ys = _collect(ds)
    assert xs[0].shape == (3, 32, 32, 3)
    assert sorted(np.concatenate(ys).tolist()) == [0, 0, 1, 1, 2, 2]
    x, y = data.load_arrays("folder", "train", path=str(split))
    np.testing.assert_array_equal(x, np.concatenate([tr["a"], tr["b"], tr["c"]]))
    assert y.tolist() == [0, 0, 1, 1, 2, 2]
    small = data.load_arrays("folder", "train", path=str(split), image_size=(16, 16))[0]
    assert small.shape == (6, 16, 16, 3)


@pytest.mark.parametrize("held_out", ["val", "validation"])
def test_image_folder_takes_val_or_validation_beside_train(tmp_path, held_out):
    # train/ and val/ are the layout, not two classes named "train" and "val".
    F.write_png_folder(str(tmp_path / "train"), ["cat", "dog"], per_class=3, seed=4)
    val = F.write_png_folder(str(tmp_path / held_out), ["cat", "dog"], per_class=2, seed=5)
    info = data.dataset_info("folder", path=str(tmp_path))
    assert info["class_names"] == ("cat", "dog")
    assert (info["num_train"], info["num_test"]) == (6, 4)
    xt, yt = data.load_arrays("folder", "test", path=str(tmp_path))
    np.testing.assert_array_equal(xt, np.concatenate([val["cat"], val["dog"]]))
    assert yt.tolist() == [0, 0, 1, 1]


def test_image_folder_with_train_but_no_held_out_folder_is_refused(tmp_path):
    F.write_png_folder(str(tmp_path / "train"), ["cat", "dog"], per_class=3)
    F.write_png_folder(str(tmp_path / "extra"), ["cat", "dog"], per_class=3)
    with pytest.raises(ValueError, match=r"train/ but no held-out folder \(test/, testing/, val/, "
                       r"valid/, validation/, any case\)\. Received: path="):
        data.dataset_info("folder", path=str(tmp_path))


def test_image_folder_of_one_class_is_refused(tmp_path):
    F.write_png_folder(str(tmp_path), ["cat"], per_class=5)
    with pytest.raises(ValueError, match=r"a classifier needs 2 classes.*classes=\['cat'\]"):
        data.dataset_info("folder", path=str(tmp_path))
    F.write_png_folder(str(tmp_path / "split" / "train"), ["cat"], per_class=3)
    F.write_png_folder(str(tmp_path / "split" / "test"), ["cat"], per_class=3)
    with pytest.raises(ValueError, match="a classifier needs 2 classes"):
        data.load_arrays("folder", "test", path=str(tmp_path / "split"))


@pytest.mark.parametrize("content", [None, "notes.txt"])
@pytest.mark.parametrize("where", ["", "train", "test"])
def test_image_folder_class_without_images_is_named(tmp_path, content, where):
    root = tmp_path / "data"
    for split in (["train", "test"] if where else [""]):
        F.write_png_folder(str(root / split), ["cat", "dog", "eel"][:2 + (split != where)], 3)
    empty = root / where / "eel"
    empty.mkdir()
    if content:
        (empty / content).write_text("not an image")
    with pytest.raises(ValueError) as info:
        data.load_arrays("folder", "test", path=str(root))
    assert str(info.value) == (f"The class folder {str(empty)!r} holds no images (a format "
                               "Pillow reads: .bmp, .gif, .jpeg, .jpg, .png, .tiff, .webp, ...).")


def test_image_folder_too_small_for_its_held_out_split_says_so(tmp_path):
    F.write_png_folder(str(tmp_path), ["cat", "dog"], per_class=2)
    F.write_png_folder(str(tmp_path / "eel"), [""], per_class=5)  # eel/ holds 5 images
    for split in ("train", "test"):
        with pytest.raises(ValueError, match=r"holds 9 images; .*every class needs at least 3, "
                           r"and 'cat' has 2\. .*train/ and test/ sub-folders"):
            data.load_arrays("folder", split, path=str(tmp_path))
    # 3 images a class are enough: one of each is held out.
    F.write_png_folder(str(tmp_path / "cat"), [""], per_class=3, seed=7)
    F.write_png_folder(str(tmp_path / "dog"), [""], per_class=3, seed=8)
    assert sorted(data.load_arrays("folder", "test", path=str(tmp_path))[1].tolist()) == [0, 1, 2]


# --- image folders as users make them (issue 45) ------------------------------------------


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("train, held_out", [("training", "testing"), ("Train", "Test"),
                                             ("TRAIN", "Valid")])
def test_image_folder_split_names_are_recognised_in_any_case(tmp_path, train, held_out):
    F.write_png_folder(str(tmp_path / train), ["cat", "dog"], per_class=3, seed=4)
    F.write_png_folder(str(tmp_path / held_out), ["cat", "dog"], per_class=2, seed=5)
    info = data.dataset_info("folder", path=str(tmp_path))
    assert info["class_names"] == ("cat", "dog")
    assert (info["num_train"], info["num_test"]) == (6, 4)


@pytest.mark.parametrize("folders, message", [
    (["Test", "val"], r"has Test/, val/ but no train folder \(train/ or training/, any case\)"),
    (["train", "Training", "test"], r"has train/, Training/, test/ but more than one train "
                                    r"folder"),
    (["train", "extra"], r"has train/ but no held-out folder \(test/, testing/, val/, valid/, "
                         r"validation/, any case\)")])
def test_image_folder_split_names_without_their_pair_are_refused(tmp_path, folders, message):
    for name in folders:
        F.write_png_folder(str(tmp_path / name), ["cat", "dog"], per_class=3)
    received = rf"\. Received: path='{re.escape(str(tmp_path))}'$"
    with pytest.raises(ValueError, match=message + received):
        data.dataset_info("folder", path=str(tmp_path))


def test_image_folder_reads_what_pillow_reads_and_counts_what_it_skips(tmp_path, caplog):
    for k, name in enumerate(["cat", "dog"]):
        F.write_image(str(tmp_path / name / "a.png"), seed=k)
        for i, suffix in enumerate([".webp", ".tiff", ".tif", ".jpg"]):
            F.write_image(str(tmp_path / name / f"b{i}{suffix}"), seed=10 * k + i, lossless=True)
        (tmp_path / name / "notes.txt").write_text("not an image")
    (tmp_path / "dog" / "clip.heic").write_bytes(b"not an image Pillow reads")
    with caplog.at_level("WARNING", logger="keras_preact"):
        info = data.dataset_info("folder", path=str(tmp_path))
    assert (info["num_train"], info["num_test"]) == (8, 2)  # 5 images a class
    assert _warnings(caplog) == [f"Skipped 3 file(s) under {str(tmp_path)!r} that are not "
                                 "images Pillow reads: 1 .heic, 2 .txt."]


def test_image_folder_resize_warning_counts_every_image_once(tmp_path, caplog):
    for k, name in enumerate(["cat", "dog"]):
        F.write_image(str(tmp_path / name / "000.png"), seed=k)  # the first is 32x32
        for i in range(1, 4):
            F.write_image(str(tmp_path / name / f"{i:03d}.png"), 120, 200, seed=10 * k + i)
    with caplog.at_level("WARNING", logger="keras_preact"):
        info = data.dataset_info("folder", path=str(tmp_path))
    assert info["input_shape"] == (32, 32, 3)
    assert _warnings(caplog) == [
        f"6 of the 8 images under {str(tmp_path)!r} ({str(tmp_path / 'cat' / '001.png')!r} is "
        "120x200) are resized to 32x32 (bilinear, aspect ratio not kept)."]
    caplog.clear()
    with caplog.at_level("WARNING", logger="keras_preact"):  # every image large: still one
        data.dataset_info("folder", path=str(tmp_path), image_size=(16, 16))
    assert len(_warnings(caplog)) == 1 and "8 of the 8 images" in _warnings(caplog)[0]


def test_image_folder_reads_16_bit_images_by_their_top_8_bits(tmp_path):
    from PIL import Image

    deep = np.random.default_rng(0).integers(0, 65536, (32, 32), dtype=np.uint16)
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        for i in range(3):
            Image.fromarray(deep).save(tmp_path / name / f"{i}.png")  # 16-bit greyscale
    x, _ = data.load_arrays("folder", "train", path=str(tmp_path))
    top = (deep >> 8).astype(np.uint8)  # not clipped to 255
    np.testing.assert_array_equal(x[0], np.repeat(top[..., None], 3, axis=-1))


def test_image_folder_says_which_classes_its_test_split_lacks(tmp_path, caplog):
    F.write_png_folder(str(tmp_path / "train"), ["a", "b"], per_class=2)
    F.write_png_folder(str(tmp_path / "test"), ["a"], per_class=1)
    with caplog.at_level("WARNING", logger="keras_preact"):
        data.dataset_info("folder", path=str(tmp_path))
    assert _warnings(caplog) == [f"The test folder {str(tmp_path / 'test')!r} has no images of "
                                 "the classes ['b']: its accuracy says nothing about them."]


def test_image_folder_follows_linked_class_folders(tmp_path):
    F.write_png_folder(str(tmp_path), ["cats", "dogs"], per_class=3)
    (tmp_path / "imgs").mkdir()
    for name in ("cat", "dog"):
        os.symlink(os.path.join("..", name + "s"), tmp_path / "imgs" / name)
    (tmp_path / "cats" / "more").mkdir()
    os.symlink("..", tmp_path / "cats" / "more" / "up")  # a link to a folder above: walked once
    info = data.dataset_info("folder", path=str(tmp_path / "imgs"))
    assert info["class_names"] == ("cat", "dog")
    assert (info["num_train"], info["num_test"]) == (4, 2)
    # The arrays kept on disk follow the files behind the links.
    new = F.write_image(str(tmp_path / "dogs" / "003.png"), seed=99)
    data.clear_cache()
    x, y = data.load_arrays("folder", "train", path=str(tmp_path / "imgs"))
    assert len(y) == 5 and any(np.array_equal(image, new) for image in x)


def test_image_folder_skips_hidden_folders_and_files(tmp_path):
    written = F.write_png_folder(str(tmp_path), ["cat", "dog"], per_class=3)
    F.write_png_folder(str(tmp_path / ".ipynb_checkpoints"), ["cat"], per_class=3)
    (tmp_path / ".git" / "objects").mkdir(parents=True)
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (tmp_path / "cat" / "._000.png").write_bytes(b"macOS resource fork")
    (tmp_path / "cat" / ".DS_Store").write_bytes(b"\0")
    F.write_png_folder(str(tmp_path / "dog" / ".thumbs"), ["x"], per_class=2)
    info = data.dataset_info("folder", path=str(tmp_path))
    assert info["class_names"] == ("cat", "dog")
    x, _ = data.load_arrays("folder", "train", path=str(tmp_path))
    xt, _ = data.load_arrays("folder", "test", path=str(tmp_path))
    assert sorted(map(bytes, np.concatenate([x, xt]))) == sorted(
        map(bytes, np.concatenate([written["cat"], written["dog"]])))


@pytest.mark.parametrize("kind", ["zip", "gztar"])
def test_image_folder_from_an_archive_is_extracted_once(folder_home, kind):
    import shutil

    root, folders, decoded = folder_home
    archive = shutil.make_archive(str(root.parent / "imgs"), kind, root.parent, root.name)
    before = open(archive, "rb").read()
    expected = _load_both(root)
    data.clear_cache()
    loaded = _load_both(archive)
    for (x0, y0, _m0), (x1, y1, m1) in zip(expected, loaded):
        np.testing.assert_array_equal(x1, x0)
        np.testing.assert_array_equal(y1, y0)
        assert (m1["class_names"], m1["layout"]) == (["cat", "dog"], "split")
    extracted = folders.parent / "extracted"
    [copy] = os.listdir(extracted)  # one folder, and no temporary one beside it
    assert copy.startswith(os.path.basename(archive) + "-")
    assert m1["path"] == str(extracted / copy / "images")
    stamp = os.stat(extracted / copy).st_mtime_ns
    data.clear_cache()
    info = data.dataset_info("folder", path=archive)
    assert info["class_names"] == ("cat", "dog") and (info["num_train"], info["num_test"]) == (6, 4)
    assert os.stat(extracted / copy).st_mtime_ns == stamp  # not extracted again
    assert open(archive, "rb").read() == before


def test_a_damaged_archive_is_named_and_leaves_nothing(folder_home):
    root, folders, _ = folder_home
    archive = root.parent / "imgs.tar.gz"
    archive.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(ValueError, match=rf"^Cannot extract the archive "
                       rf"'{re.escape(str(archive))}' \(.*\): damaged or not an archive\. "
                       rf"Received: path='{re.escape(str(archive))}'$"):
        data.load_arrays("folder", "train", path=str(archive))
    assert not os.listdir(folders.parent / "extracted")
    text = root.parent / "imgs.txt"
    text.write_text("a file")
    with pytest.raises(ValueError, match=r"^The image folder is a file, not a folder or an "
                       r"archive \(.*\.tar\.gz, .*\.zip\)\. Received: path="):
        data.load_arrays("folder", "train", path=str(text))


def test_a_truncated_jpeg_is_named_and_stderr_stays_clean(tmp_path, capfd):
    F.write_png_folder(str(tmp_path), ["cat", "dog"], per_class=3)
    broken = tmp_path / "dog" / "cut.jpg"
    F.write_image(str(broken), 64, 64, quality=95)
    broken.write_bytes(broken.read_bytes()[:600])
    capfd.readouterr()
    with pytest.raises(ValueError) as info:
        data.load_arrays("folder", "train", path=str(tmp_path), cache=False)
    assert re.fullmatch(rf"Cannot decode {re.escape(repr(str(broken)))} \(.+\)\. Remove or "
                        r"replace it\.", str(info.value)), str(info.value)
    assert capfd.readouterr().err == ""


def _closed_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once it is closed


def test_download_without_network_fails_at_once(tmp_path, monkeypatch):
    import time

    import tensorflow_datasets as tfds

    url = f"http://127.0.0.1:{_closed_port()}/cifar-10-binary.tar.gz"
    monkeypatch.setitem(sources.DOWNLOAD_URLS, "cifar10", url)
    monkeypatch.setattr(tfds, "load", lambda *a, **k: pytest.fail("TFDS was asked to download"))
    start = time.monotonic()
    with pytest.raises(ValueError) as info:
        data.load_arrays("cifar10", "test", source="tfds", data_dir=str(tmp_path), download=True)
    assert time.monotonic() - start < 30
    assert re.fullmatch(rf"Cannot download cifar10 from {re.escape(url)} \(127\.0\.0\.1 cannot "
                        r"be reached: .*\)\. Received: download=True\. .*", str(info.value))
    assert "\n" not in str(info.value)
    monkeypatch.setenv("KERAS_PREACT_OFFLINE", "1")
    with pytest.raises(ValueError, match=r"cannot be reached: KERAS_PREACT_OFFLINE is set\)\. "
                                         r"Received: download=True"):
        data.load_arrays("cifar10", "test", source="tfds", data_dir=str(tmp_path), download=True)


def test_predict_takes_a_folder_of_images(tmp_path, capsys):
    import json

    from tests.helpers import run_cli, tiny_model

    model = tiny_model(classes=3, preprocessing="unit")
    model.save(path := str(tmp_path / "m.keras"))
    images = tmp_path / "images"
    files = [images / "b.png", images / "a" / "c.webp", images / "a.jpg"]
    for i, file in enumerate(files):
        F.write_image(str(file), 16, 16, seed=i)
    (images / "notes.txt").write_text("not an image")
    (images / ".hidden.png").write_bytes(b"not read")
    code, out, err = run_cli(["predict", path, str(images), "--json"], capsys)
    assert code == 0, err
    # As `train` walks a folder: its own files, then each sub-folder's, all sorted.
    assert [r["image"] for r in json.loads(out)] == [str(files[i]) for i in (2, 0, 1)]
    (tmp_path / "empty").mkdir()
    code, out, err = run_cli(["predict", path, str(tmp_path / "empty")], capsys)
    assert (code, out) == (2, "")
    assert err.startswith(f"error: image folder {str(tmp_path / 'empty')!r} holds no images")
    assert len(err.splitlines()) == 1


# --- image folders kept on disk ------------------------------------------------------


@pytest.fixture
def folder_home(tmp_path, monkeypatch):
    """A split image folder, a private KERAS_PREACT_HOME, and the list of decoded splits."""
    root = tmp_path / "images"
    F.write_png_folder(str(root / "train"), ["cat", "dog"], per_class=3, seed=11)
    F.write_png_folder(str(root / "test"), ["cat", "dog"], per_class=2, seed=12)
    home = tmp_path / "home"
    monkeypatch.setenv("KERAS_PREACT_HOME", str(home))
    decoded, read = [], sources.folder.read_image_folder

    def counting_read(path, split, **kwargs):
        decoded.append(split)
        return read(path, split, **kwargs)

    monkeypatch.setattr(sources.folder, "read_image_folder", counting_read)
    return root, home / "folders", decoded


def _load_both(root, **kwargs):
    return [sources.load_arrays_with_meta("folder", split, path=str(root), **kwargs)
            for split in ("train", "test")]


def _kept(folders):
    """The arrays kept on disk (and no temporary file left beside them)."""
    names = sorted(os.listdir(folders)) if folders.exists() else []
    assert all(n.endswith(".npz") for n in names), names
    return names


def _assert_same(loaded, expected):
    for (x0, y0, meta0), (x1, y1, meta1) in zip(expected, loaded):
        np.testing.assert_array_equal(x1, x0)
        np.testing.assert_array_equal(y1, y0)
        assert (x1.dtype, y1.dtype, meta1) == (np.uint8, np.int64, meta0)


def test_image_folder_is_read_from_disk_in_a_fresh_state(folder_home, monkeypatch):
    root, folders, decoded = folder_home
    first = _load_both(root)
    assert decoded == ["train", "test"] and len(_kept(folders)) == 2
    data.clear_cache()  # as a new process: nothing in memory
    monkeypatch.setattr(sources.folder, "_read_directory", lambda *a: pytest.fail("decoded"))
    again = _load_both(root)
    assert decoded == ["train", "test"]  # not decoded again
    _assert_same(again, first)
    assert not again[0][0].flags.writeable  # as from memory: read-only
    # Another size is other arrays (and the decoder is needed for them).
    with pytest.raises(pytest.fail.Exception, match="decoded"):
        sources.load_arrays("folder", "train", path=str(root), image_size=(16, 16))


def test_image_folder_without_cache_neither_reads_nor_writes_the_disk(folder_home):
    root, folders, decoded = folder_home
    first = _load_both(root, cache=False)
    assert decoded == ["train", "test"] and _kept(folders) == []
    _load_both(root)
    data.clear_cache()
    _assert_same(_load_both(root, cache=False), first)
    assert decoded == ["train", "test"] * 3  # cache=False decodes, disk or not


@pytest.mark.parametrize("change", ["edit", "add", "remove"])
def test_image_folder_kept_on_disk_follows_its_files(folder_home, change):
    from PIL import Image

    root, folders, decoded = folder_home
    _load_both(root)
    kept = _kept(folders)
    image = root / "train" / "dog" / "000.png"
    new = F.random_images(1, seed=99)[0]
    if change == "edit":
        Image.fromarray(new).save(image)
        os.utime(image, ns=(1_000_000_000, 1_000_000_000))  # whatever the clock's resolution
    elif change == "add":
        Image.fromarray(new).save(root / "test" / "cat" / "new.png")
    else:
        os.remove(image)
    data.clear_cache()
    (x, y, _), (xt, yt, _) = _load_both(root)
    assert decoded == ["train", "test"] * 2  # both decoded again: one file changed
    assert _kept(folders) == kept  # rewritten in place, not one more file per change
    if change == "edit":
        np.testing.assert_array_equal(x[3], new)  # dog/000.png follows cat's 3 images
    assert (len(y), len(yt)) == {"edit": (6, 4), "add": (6, 5), "remove": (5, 4)}[change]
    data.clear_cache()
    _load_both(root)
    assert len(decoded) == 4  # and the new arrays are then read from disk


@pytest.mark.parametrize("damage", ["truncated", "not a zip", "empty"])
def test_a_damaged_kept_file_is_decoded_again_and_rewritten(folder_home, damage):
    root, folders, decoded = folder_home
    first = _load_both(root)
    for name in _kept(folders):
        path = folders / name
        content = path.read_bytes()
        path.write_bytes({"truncated": content[:len(content) // 2], "not a zip": b"x" * 100,
                          "empty": b""}[damage])
    data.clear_cache()
    _assert_same(_load_both(root), first)
    assert decoded == ["train", "test"] * 2
    data.clear_cache()
    _assert_same(_load_both(root), first)
    assert len(decoded) == 4  # rewritten whole: read from disk this time


def test_a_write_cut_short_leaves_no_kept_file(folder_home, monkeypatch):
    root, folders, decoded = folder_home

    def killed(file, **arrays):
        with open(file, "wb") as f:
            f.write(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(np, "savez", killed)
        with pytest.raises(KeyboardInterrupt):
            sources.load_arrays("folder", "train", path=str(root))
    assert _kept(folders) == []
    data.clear_cache()
    _load_both(root)
    assert decoded == ["train", "train", "test"] and len(_kept(folders)) == 2


def test_an_unwritable_cache_folder_still_loads_with_one_warning(folder_home, monkeypatch, caplog):
    root, folders, decoded = folder_home
    blocker = folders.parent.parent / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KERAS_PREACT_HOME", str(blocker))
    with caplog.at_level("WARNING", logger="keras_preact"):
        first = _load_both(root)
        data.clear_cache()
        _assert_same(_load_both(root), first)
    assert decoded == ["train", "test"] * 2
    assert blocker.read_text() == "not a folder"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"Decoded image folders are not kept in {blocker / 'folders'} (Not a "
                     "directory)."]


# --- pipeline -------------------------------------------------------------------------


def test_pipeline_shapes_dtypes_and_order(cifar10_dir):
    root, images, labels, test = cifar10_dir
    ds = data.make_dataset("cifar10", "train", data_dir=str(root), batch_size=8)
    spec = ds.element_spec
    assert spec[0].shape.as_list() == [8, 32, 32, 3] and spec[0].dtype.name == "float32"
    assert spec[1].shape.as_list() == [8] and spec[1].dtype.name == "int32"
    assert int(ds.cardinality()) == 20 // 8  # drop_remainder for train
    xs, ys = _collect(data.make_dataset("cifar10", "test", data_dir=str(root), batch_size=4))
    assert [len(b) for b in ys] == [4, 2]  # test keeps the last partial batch, in order
    np.testing.assert_array_equal(np.concatenate(ys), test[1])
    # No augmentation on test; normalisation is (x / 255 - mean) / std.
    mean, std = np.array(PRESETS["cifar10"][1]), np.array(PRESETS["cifar10"][2])
    np.testing.assert_allclose(np.concatenate(xs), (test[0] / 255.0 - mean) / std, atol=1e-5)
    raw, _ = _collect(data.make_dataset("cifar10", "test", data_dir=str(root), normalize=False))
    np.testing.assert_array_equal(raw[0], test[0].astype(np.float32))
    # Several epochs in one dataset: cardinality counts them all.
    ds = data.make_dataset("cifar10", "train", data_dir=str(root), batch_size=8, repeat_epochs=3)
    assert int(ds.cardinality()) == 6


def test_normalised_digits_train_split_is_zero_mean_unit_std():
    ds = data.make_dataset("digits", "train", batch_size=500, augment=False, shuffle=False,
                           drop_remainder=False)
    x = np.concatenate(_collect(ds)[0]).reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(x.std(0), 1.0, atol=1e-4)
    # The test split uses the train statistics: close to, not exactly, zero mean.
    xt = np.concatenate(_collect(data.make_dataset("digits", "test", batch_size=500))[0])
    assert abs(float(xt.mean())) < 0.1


def test_digits_augmentation_crops_but_never_flips():
    source, _ = data.load_arrays("digits", "train")
    ds = data.make_dataset("digits", "train", batch_size=128, shuffle=False, normalize=False)
    out = next(ds.as_numpy_iterator())[0].astype(np.uint8)
    offsets = set()
    for i, img in enumerate(out):
        found = F.matching_transforms(source[i], img, flips=(False,))
        assert found, f"image {i} is not an unflipped pad-and-crop of its source"
        offsets.update((dy, dx) for dy, dx, _ in found)
    assert len(offsets) > 20  # Cropping does happen.
    # The check above would catch flips: with the flip policy many images fail it.
    ds = data.make_dataset("digits", "train", batch_size=128, shuffle=False, normalize=False,
                           augment="pad_crop_flip")
    flipped = next(ds.as_numpy_iterator())[0][:64].astype(np.uint8)
    misses = sum(
        not F.matching_transforms(source[i], img, flips=(False,)) for i, img in enumerate(flipped)
    )
    assert misses > 10


def test_cifar_augmentation_pads_crops_and_flips():
    images = F.random_images(64, seed=11)
    labels = np.zeros(64, np.int64)
    ds = data.dataset_from_arrays(images, labels, batch_size=32, augment="pad_crop_flip",
                                  normalize=False, seed=3)
    out = np.concatenate(_collect(ds)[0]).astype(np.uint8)
    flips, offsets = [], []
    for src, img in zip(images, out):
        found = F.matching_transforms(src, img)
        assert len(found) == 1, "random noise matches exactly one crop/flip"
        dy, dx, flip = found[0]
        flips.append(flip)
        offsets.append((dy, dx))
        if dy == 0:  # The padding is zero: a crop at the top shows a black border.
            assert not img[:4].any()
    assert 0.25 < np.mean(flips) < 0.75
    assert len(set(offsets)) > 25
    assert any(dy == 0 for dy, _ in offsets)


def test_epoch_order_depends_only_on_seed_and_epoch(cifar10_dir):
    root = str(cifar10_dir[0])
    kwargs = dict(data_dir=root, batch_size=4, seed=5)
    full = _collect(data.make_dataset("cifar10", "train", repeat_epochs=4, **kwargs))
    steps = 5
    epochs = [
        (full[0][e * steps : (e + 1) * steps], full[1][e * steps : (e + 1) * steps])
        for e in range(4)
    ]
    # Resumed at epoch 2 for two epochs: the same batches as epochs 2 and 3.
    resumed = _collect(data.make_dataset("cifar10", "train", epoch=2, repeat_epochs=2, **kwargs))
    for got, want in zip(resumed[0], epochs[2][0] + epochs[3][0]):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(resumed[1], epochs[2][1] + epochs[3][1]):
        np.testing.assert_array_equal(got, want)
    # A single epoch 3 built after all of that, and re-iterated, is epoch 3 again.
    single = data.make_dataset("cifar10", "train", epoch=3, **kwargs)
    assert _digest(_collect(single)) == _digest(epochs[3]) == _digest(_collect(single))
    # Different epochs and different seeds differ, in order and in augmentation.
    assert _digest(epochs[0]) != _digest(epochs[1])
    assert not np.array_equal(np.concatenate(epochs[0][1]), np.concatenate(epochs[1][1]))
    assert not np.array_equal(np.concatenate(epochs[0][0]), np.concatenate(epochs[1][0]))
    other_seed = _collect(
        data.make_dataset("cifar10", "train", data_dir=root, batch_size=4, seed=6)
    )
    assert _digest(other_seed) != _digest(epochs[0])


def test_each_epoch_visits_every_example_once_in_a_new_order():
    images = F.random_images(50, seed=0)
    ids = np.arange(50)
    ds = data.dataset_from_arrays(images, ids, batch_size=8, shuffle=True, repeat_epochs=3,
                                  normalize=False, seed=1)
    ys = np.concatenate(_collect(ds)[1])
    orders = ys.reshape(3, 50)  # ceil(50 / 8) = 7 batches per epoch, last one short
    for e, order in enumerate(orders):
        assert sorted(order.tolist()) == list(range(50))
        np.testing.assert_array_equal(order, data.epoch_order(50, seed=1, epoch=e))
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[0], np.arange(50))
    # Without end (repeat_epochs=-1): the same epochs, in the same order.
    endless = data.dataset_from_arrays(images, ids, batch_size=8, shuffle=True, repeat_epochs=-1,
                                       normalize=False, seed=1)
    np.testing.assert_array_equal(np.concatenate(_collect(endless.take(21))[1]), ys)


def test_resumed_epoch_matches_in_a_fresh_process(cifar10_dir):
    root = str(cifar10_dir[0])
    ds = data.make_dataset("cifar10", "train", data_dir=root, batch_size=4, seed=9, repeat_epochs=4)
    batches = _collect(ds)
    want = _digest((batches[0][15:20], batches[1][15:20]))  # epoch 3 of 5 steps each
    script = (
        "import sys, hashlib, numpy as np\n"
        f"sys.path.insert(0, {REPO!r})\n"
        "from tests.test_data import _collect, _digest\n"
        "from keras_preact import data\n"
        f"ds = data.make_dataset('cifar10', 'train', data_dir={root!r}, batch_size=4,\n"
        "                       seed=9, epoch=3)\n"
        "print('DIGEST', _digest(_collect(ds)))\n"
    )
    out = run_python(script, env={"KERAS_BACKEND": "tensorflow"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("DIGEST")]
    assert got == [want]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size"),
        (dict(batch_size=2.5), "batch_size"),
        (dict(seed=-1), "seed"),
        (dict(epoch=-2), "epoch"),
        (dict(repeat_epochs=0), "repeat_epochs"),
        (dict(augment="mixup"), "augment"),
        (dict(shuffle="yes"), "shuffle"),
        (dict(batch_size=10**6, drop_remainder=True), "leaves no batch"),
    ],
)
def test_bad_pipeline_arguments_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        data.make_dataset("digits", "train", **kwargs)
    if "drop_remainder" not in kwargs:
        # Checked before any file is looked at: the bad argument is named, not the path.
        with pytest.raises(ValueError, match=message):
            data.make_dataset("cifar10", "train", source="archive", path="/no/such/cifar",
                              **kwargs)


def test_importing_the_package_does_not_import_tensorflow():
    script = (
        "import sys\n"
        "import keras_preact.data as d\n"
        "d.dataset_info('cifar10'); d.load_arrays('digits', 'test')\n"
        "print('TF' if 'tensorflow' in sys.modules else 'NO_TF')\n"
    )
    out = run_python(script, env={"KERAS_BACKEND": "jax"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "NO_TF"
