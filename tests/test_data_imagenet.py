"""The ImageNet-style pipeline: folders generated here, TFDS plumbing with mock data."""

import os

import numpy as np
import pytest
from PIL import Image

tf = pytest.importorskip("tensorflow")

from keras_preact.data import imagenet  # noqa: E402


def _write(path, array, fmt):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(array).save(path, format=fmt)


@pytest.fixture(scope="module")
def image_root(tmp_path_factory):
    """train/ and val/ with two classes and images of several sizes and formats."""
    root = tmp_path_factory.mktemp("imagenet")
    rng = np.random.RandomState(0)
    sizes = [(256, 384), (300, 200), (180, 420), (256, 256)]
    for split, per_class in (("train", 4), ("val", 2)):
        for c, name in enumerate(("n01440764", "n01443537")):
            for i in range(per_class):
                h, w = sizes[(i + c) % len(sizes)]
                img = rng.randint(0, 256, (h, w, 3)).astype(np.uint8)
                fmt, ext = ("JPEG", "jpg") if i % 2 == 0 else ("PNG", "png")
                _write(str(root / split / name / f"img{i}.{ext}"), img, fmt)
    # A stray non-image file is ignored.
    (root / "train" / "n01440764" / "README.txt").write_text("not an image")
    return root


def test_folder_train_and_eval_batches(image_root):
    ds, classes = imagenet.make_imagenet_dataset(
        "train", path=str(image_root), batch_size=4, image_size=64, resize_size=73, seed=0)
    assert classes == ["n01440764", "n01443537"]
    batches = list(ds)
    assert len(batches) == 2  # 8 images, drop_remainder for train
    x, y = batches[0]
    assert x.shape == (4, 64, 64, 3) and x.dtype == tf.float32
    assert float(tf.reduce_min(x)) >= 0.0 and float(tf.reduce_max(x)) <= 255.0
    assert sorted(np.concatenate([b[1].numpy() for b in batches]).tolist()) == [0] * 4 + [1] * 4

    val, _ = imagenet.make_imagenet_dataset(
        "val", path=str(image_root), batch_size=3, image_size=64, resize_size=73)
    sizes = [int(b[0].shape[0]) for b in val]
    assert sizes == [3, 1]  # evaluation keeps every image


def test_eval_is_resize_then_exact_centre_crop(tmp_path):
    # A 256x384 image needs no resize for resize_size=256: the crop is an exact slice.
    rng = np.random.RandomState(1)
    img = rng.randint(0, 256, (256, 384, 3)).astype(np.uint8)
    _write(str(tmp_path / "train" / "a" / "x.png"), img, "PNG")
    _write(str(tmp_path / "val" / "a" / "x.png"), img, "PNG")
    ds, _ = imagenet.make_imagenet_dataset("val", path=str(tmp_path), batch_size=1)
    x = next(iter(ds))[0].numpy()[0]
    np.testing.assert_array_equal(x, img[16:240, 80:304].astype(np.float32))
    # A smooth 512x768 image is halved first (shorter side 512 -> 256), keeping the
    # aspect: the crop then matches the same ramp sampled at half resolution.
    yy, xx = np.mgrid[0:512, 0:768].astype(np.float32)
    ramp = np.stack([xx / 768 * 255, yy / 512 * 255, (xx + yy) / 1280 * 255], -1)
    out = imagenet.resize_center_crop(tf.constant(ramp.astype(np.uint8))).numpy()
    half = ramp[::2, ::2] + np.array([255 / 768, 255 / 512, 510 / 1280]) / 2
    assert out.shape == (224, 224, 3)
    assert np.abs(out - half[16:240, 80:304]).mean() < 1.0


def test_train_crops_are_keyed_by_seed_and_epoch(image_root):
    def first(seed, epoch):
        ds, _ = imagenet.make_imagenet_dataset(
            "train", path=str(image_root), batch_size=8, image_size=32, resize_size=40,
            seed=seed, epoch=epoch)
        x, y = next(iter(ds))
        return x.numpy(), y.numpy()

    a, ya = first(0, 0)
    b, yb = first(0, 0)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ya, yb)
    c, _ = first(0, 1)
    assert not np.array_equal(a, c)


def test_random_resized_crop_full_area_is_whole_image():
    img = np.random.RandomState(2).randint(0, 256, (60, 90, 3)).astype(np.uint8)
    key = tf.constant([3, 4], tf.int64)
    out = imagenet.random_resized_crop(
        tf.constant(img), key, image_size=30, scale=(1.0, 1.0), ratio=(1.5, 1.5), flip=False
    ).numpy()
    ref = tf.image.resize(tf.constant(img, tf.float32), (30, 30), method="bilinear").numpy()
    np.testing.assert_allclose(out, ref, atol=1e-4)


def test_bad_arguments_name_the_argument(tmp_path, image_root):
    with pytest.raises(ValueError, match="split="):
        imagenet.make_imagenet_dataset("validation", path=str(image_root))
    with pytest.raises(ValueError, match="source="):
        imagenet.make_imagenet_dataset("train", source="web", path=str(image_root))
    with pytest.raises(ValueError, match="resize_size"):
        imagenet.make_imagenet_dataset("val", path=str(image_root), image_size=64, resize_size=32)
    with pytest.raises(ValueError, match="train/"):
        imagenet.make_imagenet_dataset("train", path=str(tmp_path))
    with pytest.raises(ValueError, match="path=None"):
        imagenet.make_imagenet_dataset("train")


def test_tfds_source_plumbing_with_mock_data(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    # Mock data only proves the plumbing (splits, SkipDecoding, labels), not learning.
    with tfds.testing.mock_data(num_examples=6, data_dir=str(tmp_path)):
        ds, classes = imagenet.make_imagenet_dataset(
            "val", source="tfds", batch_size=3, image_size=32, resize_size=36,
            data_dir=str(tmp_path))
        x, y = next(iter(ds))
    assert len(classes) == 1000
    assert x.shape == (3, 32, 32, 3) and y.dtype == tf.int32


def test_tfds_without_prepared_data_or_manual_dir_says_how(tmp_path):
    with pytest.raises(ValueError, match="manual_dir"):
        imagenet.make_imagenet_dataset("val", source="tfds", data_dir=str(tmp_path))
