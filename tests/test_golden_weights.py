"""Weights files written by keras-preact keep loading and computing what they did.

`tests/golden/*.weights.h5.gz` are small `PreActResNet.save_weights` files (gzipped)
of the configs in `CASES`, with random values in every variable (moving statistics
too), and `*.npz` their outputs on a fixed input: inference and, except for the
dropout unit, a training-mode call (batch statistics). They were made once with
``python -m tests.test_golden_weights`` (TensorFlow backend, float32); regenerate
only on purpose, as a change here means files written before no longer load or
compute something else. Outputs are compared to float32 rounding: oneDNN picks other
kernels on other CPUs (AVX-512, AMX), which round in another order; a misplaced or
missing variable changes them by orders of magnitude more.
"""

import gzip
import os
import shutil
import tempfile

import keras
import numpy as np
import pytest

from keras_preact import PreActResNet
from keras_preact.layers import UNIT_TYPES

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
SMALL = dict(stage_blocks=(1, 2), stage_filters=(4, 8), stage_strides=(1, 2), stem_filters=4,
             input_shape=(8, 8, 3), classes=3, classifier_activation=None)
BOTTLENECK = dict(SMALL, block="bottleneck", stage_filters=(8, 16))
IMAGENET = dict(BOTTLENECK, stage_blocks=(2, 2), stem_kernel_size=7, stem_strides=2,
                input_shape=(32, 32, 3), stem="imagenet")
#: file stem -> (PreActResNet arguments, extra arguments the file is also loaded into).
CASES = {
    "basic": (dict(SMALL, stage_blocks=(2, 2, 2), stage_filters=(4, 8, 16),
                   stage_strides=(1, 2, 2), preprocessing="cifar10"), dict(remat="unit")),
    "bottleneck": (BOTTLENECK, dict(remat=1)),
    "bottleneck_imagenet": (dict(IMAGENET, bottleneck_stride="first",
                                 first_shared_preact=False), {}),
    "bottleneck_keras_layout": (dict(IMAGENET, stem="imagenet_preact", stride_position="last",
                                     strided_shortcut="subsample", conv_bias=True), {}),
    **{f"unit_{u}": (dict(SMALL, unit=u), {}) for u in UNIT_TYPES if u != "full_preact"},
}

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="golden outputs were computed on TensorFlow")


def _inputs(config):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 255, (2,) + config["input_shape"]).astype("float32")
    return x if config.get("preprocessing") else x / 255.0 - 0.5


def _load(name, config, tmp):
    """`PreActResNet(**config)` with the golden file `name` loaded."""
    path = os.path.join(tmp, f"{name}.weights.h5")
    with gzip.open(os.path.join(GOLDEN, f"{name}.weights.h5.gz"), "rb") as src, \
            open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    model = PreActResNet(**config)
    model.load_weights(path)
    return model


def _outputs(model, config):
    x = _inputs(config)
    out = {"inference": keras.ops.convert_to_numpy(model(x, training=False))}
    if config.get("unit") != "dropout_shortcut":
        out["training"] = keras.ops.convert_to_numpy(model(x, training=True))
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_weights_load_and_compute_as_recorded(name, tmp_path):
    config, extra = CASES[name]
    expected = np.load(os.path.join(GOLDEN, f"{name}.npz"))
    for kwargs in ({}, extra) if extra else ({},):
        got = _outputs(_load(name, dict(config, **kwargs), str(tmp_path)), config)
        assert sorted(got) == sorted(expected.files)
        for key, value in got.items():
            scale = float(np.abs(expected[key]).max())
            np.testing.assert_allclose(value, expected[key], rtol=1e-5, atol=1e-6 * scale,
                                       err_msg=f"{name} {key} {kwargs}")


def _make():
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    for name, (config, _) in CASES.items():
        model = PreActResNet(**config)
        for var in model.weights:
            low = 0.5 if any(k in var.path for k in ("gamma", "variance")) else -0.5
            var.assign(rng.uniform(low, low + 1.0, var.shape).astype(var.dtype))
        path = os.path.join(GOLDEN, f"{name}.weights.h5")
        model.save_weights(path)
        with open(path, "rb") as src, gzip.GzipFile(path + ".gz", "wb", 9, mtime=0) as dst:
            shutil.copyfileobj(src, dst)
        os.remove(path)
        with tempfile.TemporaryDirectory() as tmp:
            outputs = _outputs(_load(name, config, tmp), config)
        np.savez(os.path.join(GOLDEN, f"{name}.npz"), **outputs)


if __name__ == "__main__":
    _make()
