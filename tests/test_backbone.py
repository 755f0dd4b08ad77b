"""Backbones for dense prediction: `features=True` / `pyramid_outputs` (feature maps by level,
named as keras-hub names them), pretrained weights in a backbone, and a keras-hub task built
on a keras-preact encoder."""

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import weights as W
from tests.helpers import to_numpy

pytestmark = pytest.mark.filterwarnings("ignore:The structure of `inputs`:UserWarning")


@pytest.mark.multibackend
@pytest.mark.parametrize("name, size, levels", [
    ("preact_resnet20", 32, {"P0": 16, "P1": 32, "P2": 64}),
    ("preact_resnet50", 64, {"P2": 256, "P3": 512, "P4": 1024, "P5": 2048}),
])
def test_feature_maps_are_named_by_their_stride(name, size, levels):
    model = kp.get_model(name, features=True, input_shape=(size, size, 3))
    out = model(np.random.default_rng(0).random((2, size, size, 3), dtype="float32"))
    assert list(out) == list(levels)
    for level, channels in levels.items():
        side = size // 2 ** int(level[1:])
        assert tuple(out[level].shape) == (2, side, side, channels), level
    assert not any(layer.name in ("logits", "pool") for layer in model.layers)
    assert list(model.pyramid_outputs) == list(levels)


def test_keras_applications_layout_has_levels_p3_to_p5():
    # The stride on each stage's last unit: stages at strides 8, 16, 32, 32; the deeper wins.
    model = kp.preact_resnet50(features=True, input_shape=(64, 64, 3), stem="imagenet_preact",
                               stage_strides=(2, 2, 2, 1), stride_position="last")
    assert {k: tuple(v.shape[1:3]) for k, v in model.output.items()} == {
        "P3": (8, 8), "P4": (4, 4), "P5": (2, 2)}
    assert model.output["P5"] is model.get_layer("post_relu").output


def test_the_last_level_is_what_the_head_sees_and_the_others_the_stage_sums():
    model = kp.preact_resnet20(input_shape=(32, 32, 3))
    levels = model.pyramid_outputs
    assert levels["P2"] is model.get_layer("post_relu").output
    assert levels["P0"] is model.get_layer("stage1").output
    assert levels["P1"] is model.get_layer("stage2").output


def test_pretrained_weights_load_into_the_backbone_as_into_the_classifier(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    entry = W.get_entry("preact_resnet18.imagenet")
    # Random weights in the converted format, served through the catalog's real path.
    W.save_weights_file(kp.preact_resnet18(classes=1000),
                        str(served / "preact_resnet18.imagenet.weights.h5"))
    monkeypatch.setenv("KERAS_PREACT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KERAS_PREACT_WEIGHTS_DIR", str(served))
    monkeypatch.setenv("KERAS_PREACT_OFFLINE", "1")
    shape = (64, 64, 3)
    classifier = kp.preact_resnet18(weights=entry.tag, input_shape=shape)
    backbone = kp.preact_resnet18(weights=entry.tag, input_shape=shape, features=True)
    fresh = kp.preact_resnet18(input_shape=shape, features=True)
    x = np.random.default_rng(1).random((2, *shape), dtype="float32")
    expected = keras.Model(classifier.input, classifier.pyramid_outputs)(x)
    got, other = backbone(x), fresh(x)
    for level in ("P2", "P3", "P4", "P5"):
        np.testing.assert_array_equal(to_numpy(got[level]), to_numpy(expected[level]))
        assert not np.allclose(to_numpy(other[level]), to_numpy(expected[level])), level


@pytest.mark.parametrize("kwargs, message", [
    ({"features": True, "pooling": "avg"}, "Received: pooling='avg'. Leave pooling=None"),
    ({"features": "yes"}, "`features` must be True or False. Received: features='yes'"),
])
def test_bad_backbone_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kp.preact_resnet20(**kwargs)


def test_a_keras_hub_segmenter_trains_on_a_preact_backbone(tmp_path):
    import keras_hub  # the `hub` extra, part of the `test` extra
    encoder = kp.preact_resnet20(features=True, input_shape=(32, 32, 3))
    # DeepLabV3+: atrous pyramid on P2 (stride 4), upsampled x4 to meet P0's projection.
    backbone = keras_hub.models.DeepLabV3Backbone(
        image_encoder=encoder, spatial_pyramid_pooling_key="P2", upsampling_size=4,
        dilation_rates=[1, 2], low_level_feature_key="P0", projection_filters=8,
        image_shape=(32, 32, 3))
    segmenter = keras_hub.models.DeepLabV3ImageSegmenter(backbone=backbone, num_classes=3)
    segmenter.compile(optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(3)
    x = rng.random((2, 32, 32, 3), dtype="float32")
    y = rng.integers(0, 3, (2, 32, 32, 1))
    before = to_numpy(encoder.get_layer("stem_conv").kernel).copy()
    loss = segmenter.train_on_batch(x, y)
    assert np.isfinite(np.ravel(loss)).all()
    assert not np.array_equal(to_numpy(encoder.get_layer("stem_conv").kernel), before)
    assert tuple(segmenter.predict(x, verbose=0).shape) == (2, 32, 32, 3)
    segmenter.save(tmp_path / "segmenter.keras")
    loaded = keras.saving.load_model(tmp_path / "segmenter.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), segmenter.predict(x, verbose=0),
                               atol=1e-6)
