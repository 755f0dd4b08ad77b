"""Fine-tuning: new heads, stage freezing with BatchNorm kept in inference mode, the CLI."""

import glob
import json
import os

import h5py
import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import finetune
from keras_preact import weights as W
from tests.helpers import run_command, to_numpy

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")


def _tiny(tiny_model_kwargs, **kwargs):
    return kp.PreActResNet(**{**tiny_model_kwargs, **kwargs})


def _values(model, prefix):
    return {v.path: to_numpy(v).copy() for v in model.weights if v.path.startswith(prefix)}


def test_frozen_stages_keep_weights_and_batchnorm_statistics(tiny_model_kwargs):
    model = finetune.replace_head(_tiny(tiny_model_kwargs, classes=10), classes=3)
    assert model.output_shape == (None, 3)
    assert finetune.freeze(model, ["stem", "stage1", "stage2"]) == ["stem", "stage1", "stage2"]
    assert finetune.frozen_parts(model) == ["stem", "stage1", "stage2"]
    before = {p: _values(model, p)
              for p in ("stem_conv", "stage1", "stage2", "stage3", "post_bn", "logits")}
    assert any("moving_mean" in k for k in before["stage1"])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    assert len(model.trainable_weights) == len(
        [v for v in model.weights
         if v.path.startswith(("stage3", "post_bn", "logits")) and v.trainable]
    )
    rng = np.random.RandomState(0)
    x = rng.rand(16, 16, 16, 3).astype("float32") * 3 + 1  # far from the initial statistics
    y = rng.randint(0, 3, 16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    for part in ("stem_conv", "stage1", "stage2"):
        for path, value in _values(model, part).items():
            np.testing.assert_array_equal(value, before[part][path], err_msg=path)
    for part in ("stage3", "post_bn", "logits"):
        changed = [p for p, v in _values(model, part).items()
                   if not np.array_equal(v, before[part][p])]
        assert changed, part
    # Trainable BatchNorm moved its statistics; frozen ones (checked above) did not.
    assert not np.array_equal(_values(model, "post_bn")["post_bn/moving_mean"],
                              before["post_bn"]["post_bn/moving_mean"])
    # A frozen part computes the same in training and inference mode (no batch statistics).
    stage1 = model.get_layer("stage1")
    h = rng.rand(4, 16, 16, 8).astype("float32")
    np.testing.assert_allclose(to_numpy(stage1(h, training=True)),
                               to_numpy(stage1(h, training=False)), atol=1e-6)
    finetune.unfreeze(model, "all")
    assert finetune.frozen_parts(model) == []
    with pytest.raises(ValueError, match=r"part='stage9'.*'stage3'"):
        finetune.freeze(model, ["stage9"])


def test_freezing_the_stem_freezes_its_batchnorm_too(tiny_model_kwargs):
    # The ImageNet stem (and the 2015 units' stem) is conv-BN-ReLU: both are the stem.
    for kwargs in ({"stem": "imagenet"}, {"unit": "original"}, {}):
        model = _tiny(tiny_model_kwargs, classes=3, **kwargs)
        finetune.freeze(model, "stem")
        stem = [layer.name for layer in model.layers if layer.name.startswith("stem_")
                and layer.weights]
        assert stem and not any(model.get_layer(n).trainable for n in stem), (kwargs, stem)
        assert finetune.frozen_parts(model) == ["stem"]


@pytest.mark.parametrize("suffix", [".weights.h5", ".keras"])
def test_fine_tuning_a_file_builds_the_architecture_it_records(tmp_path, suffix):
    # A run fine-tuned from pytorchcv weights has first_shared_preact=False; fine-tuning its
    # files again must build that layout (`train --weights FILE`), not the factory default.
    source = kp.preact_resnet20(classes=10, first_shared_preact=False, bottleneck_stride="first")
    path = str(tmp_path / f"run{suffix}")
    source.save(path) if suffix == ".keras" else source.save_weights(path)
    arch = finetune.pretrained_architecture("preact_resnet20", path)
    assert arch["first_shared_preact"] is False and arch["bottleneck_stride"] == "first"
    assert not {"classes", "stage_blocks", "block"} & set(arch)
    model = kp.preact_resnet20(classes=3, **arch)
    assert finetune.load_pretrained(model, path)["copied_head"] is False
    for a, b in zip(model.get_layer("stage3").weights, source.get_layer("stage3").weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    assert finetune.pretrained_architecture("preact_resnet20", "https://h/f.weights.h5") == {}


def test_load_pretrained_copies_the_backbone_and_a_fitting_head(tiny_model_kwargs, tmp_path):
    source = _tiny(tiny_model_kwargs, classes=10, preprocessing="unit")
    path = W.save_weights_file(source, str(tmp_path / "src.weights.h5"))
    x = np.random.RandomState(2).rand(2, 16, 16, 3).astype("float32")
    features = keras.Model(source.input, source.get_layer("post_relu").output)

    target = _tiny(tiny_model_kwargs, classes=4, preprocessing="unit")
    info = finetune.load_pretrained(target, path)
    assert info == {"source": path, "copied_head": False, "classes": 10}
    target_features = keras.Model(target.input, target.get_layer("post_relu").output)
    np.testing.assert_allclose(to_numpy(target_features(x)), to_numpy(features(x)), atol=1e-6)

    same = _tiny(tiny_model_kwargs, classes=10, preprocessing="unit")
    assert finetune.load_pretrained(same, path)["copied_head"] is True
    np.testing.assert_allclose(to_numpy(same(x)), to_numpy(source(x)), atol=1e-6)

    deeper = _tiny({**tiny_model_kwargs, "stage_blocks": (1, 2, 1)}, classes=4)
    with pytest.raises(ValueError, match="does not match the architecture"):
        finetune.load_pretrained(deeper, path)
    other = _tiny(tiny_model_kwargs, classes=4, first_shared_preact=False)
    with pytest.raises(ValueError, match="first_shared_preact"):
        finetune.load_pretrained(other, path)


def _write_folder(root, classes=3, per_class=10, seed=0):
    """Class-coloured noisy 32x32 PNGs, one sub-folder per class."""
    from PIL import Image

    rng = np.random.RandomState(seed)
    colours = [(220, 40, 40), (40, 220, 40), (40, 40, 220), (220, 220, 40)][:classes]
    for c, colour in enumerate(colours):
        folder = os.path.join(root, f"class{c}")
        os.makedirs(folder)
        for i in range(per_class):
            noise = rng.randint(-40, 40, size=(32, 32, 3))
            image = np.clip(np.array(colour)[None, None] + noise, 0, 255).astype("uint8")
            Image.fromarray(image).save(os.path.join(folder, f"{i}.png"))


@pytest.mark.e2e
def test_cli_fine_tunes_a_digits_checkpoint_on_an_image_folder(tmp_path):
    arch = json.dumps({"architecture": {"block": "basic", "stage_blocks": [1, 1, 1],
                                        "stage_filters": [8, 16, 32], "stem_filters": 8}})
    common = ["--model-kwargs", arch, "--batch-size", "16", "--eval-every", "0", "--verbose", "0",
              "--lr-scale", "none", "--lr", "0.05", "--warmup", "0"]
    pre = str(tmp_path / "digits")
    proc = run_command(["train", "--dataset", "digits", "--steps", "20", "--workdir", pre, *common],
                       env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checkpoint = sorted(glob.glob(os.path.join(pre, "checkpoints", "*.weights.h5")))[-1]

    folder = str(tmp_path / "images")
    _write_folder(folder)
    tuned = str(tmp_path / "tuned")
    proc = run_command(["train", "--dataset", "folder", "--data-path", folder, "--epochs", "3",
                        "--weights", checkpoint, "--freeze", "stem,stage1", "--seed", "1",
                        "--workdir", tuned, *common], env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Fine-tuning from" in proc.stderr and "new classifier" in proc.stderr
    assert "test accuracy" in proc.stdout

    model = keras.saving.load_model(os.path.join(tuned, "model.keras"), compile=False)
    assert model.output_shape == (None, 3)
    with h5py.File(checkpoint, "r") as f:
        pretrained_stem = f["layers/conv2d/vars/0"][()]
    # The frozen stem and stage 1 are the digits checkpoint's, moving statistics included.
    np.testing.assert_array_equal(to_numpy(model.get_layer("stem_conv").kernel), pretrained_stem)
    donor = kp.PreActResNet.from_config({**model.get_config(), "classes": 10, "name": "donor"})
    donor.load_weights(checkpoint)
    for a, b in zip(model.get_layer("stage1").weights, donor.get_layer("stage1").weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    # The unfrozen stages trained on from the loaded values.
    assert not np.array_equal(to_numpy(model.get_layer("stage3").weights[0]),
                              to_numpy(donor.get_layer("stage3").weights[0]))



def test_cli_train_refuses_bad_weights_before_writing(tmp_path, capsys):
    from keras_preact.cli import main

    never = str(tmp_path / "never")
    for weights, match in (
        (str(tmp_path / "missing.weights.h5"), "The weights file does not exist"),
        ("imagenet", "Unknown weights tag for preact_resnet20"),
    ):
        code = main(["train", "--model", "preact_resnet20", "--dataset", "digits", "--epochs", "1",
                     "--weights", weights, "--workdir", never])
        assert code == 2 and f"error: {match}" in capsys.readouterr().err
    code = main(["train", "--model", "preact_resnet20", "--dataset", "digits", "--epochs", "1",
                 "--freeze", "stage1,neck", "--workdir", never])
    assert code == 2 and "Unknown part to freeze" in capsys.readouterr().err
    assert not os.path.exists(never)
