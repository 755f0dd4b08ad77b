"""Gradient-flow diagnostics (TensorFlow): the paper's argument as a test, the report,
the files and the `keras-preact diagnose` command."""

import csv

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import diagnostics
from tests.helpers import to_numpy


@pytest.mark.slow
def test_preactivation_keeps_gradients_flatter_than_the_original_unit_resnet164():
    """He et al. 2016, Section 3: ResNet-164 at initialisation, three seeds.

    Both ratios exceed 1 (gradients grow toward the input at initialisation for both
    units), but full pre-activation's first-to-last ratio is at least 5x smaller. A
    plain PyTorch implementation at 32x32 measured 1.2e3-1.6e3 vs 2.0e4-2.3e4; this
    check uses 8x8 images and batch 8 to stay cheap (measured here: 1.6e3-1.9e3 vs
    1.6e4-2.1e4, about 10x).
    """
    for seed in (0, 1, 2):
        pre, orig = diagnostics.compare_units(
            "preact_resnet164", ("full_preact", "original"), batch_size=8, seed=seed,
            input_shape=(8, 8, 3),
        )
        assert len(pre.rows) == len(orig.rows) == 54
        assert pre.first_to_last > 1 and orig.first_to_last > 1
        assert orig.first_to_last >= 5 * pre.first_to_last, (
            seed, pre.first_to_last, orig.first_to_last)


def test_report_is_measured_on_the_models_own_forward_and_leaves_it_unchanged(tiny_model_kwargs):
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = kp.PreActResNet(**{**tiny_model_kwargs, "stage_blocks": (1, 2, 2)},
                            classifier_activation=None)
    images, labels = diagnostics.random_batch(model, batch_size=4, seed=3)
    before = [to_numpy(v).copy() for v in model.non_trainable_variables]
    report = diagnostics.gradient_flow(model, images, labels)
    for v, b in zip(model.non_trainable_variables, before):
        np.testing.assert_array_equal(to_numpy(v), b)
    assert [(r["stage"], r["index_in_stage"]) for r in report.rows] == [
        (1, 1), (2, 1), (2, 2), (3, 1), (3, 2)]
    # The loss equals the model's own training-mode loss on that batch, and the
    # gradient at the last unit's input equals one taken through the last stage alone.
    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                           from_logits=True))
    assert report.loss == pytest.approx(float(loss), rel=1e-5)
    # (Training-mode BN uses batch statistics: the moving ones do not matter here.)
    stage3 = model.get_layer("stage3")
    head = [model.get_layer(n) for n in ("post_bn", "post_relu", "pool", "logits")]
    upstream = keras.Model(model.inputs, stage3.input)
    x3 = upstream([images], training=True)
    with tf.GradientTape() as tape:
        h, unit_inputs = stage3(x3, training=True, return_unit_inputs=True)
        for layer in head:
            h = layer(h, training=True)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, h,
                                                                           from_logits=True))
    g = tape.gradient(loss, unit_inputs[-1])
    assert report.rows[-1]["grad_rms"] == pytest.approx(float(tf.sqrt(tf.reduce_mean(g * g))),
                                                        rel=1e-4)
    a = to_numpy(unit_inputs[-1])
    assert report.rows[-1]["act_std"] == pytest.approx(float(a.std()), rel=1e-4)


def test_bad_input_is_a_clear_error(tiny_model_kwargs):
    model = kp.PreActResNet(**tiny_model_kwargs)
    with pytest.raises(ValueError, match="batch_size.*>= 2.*batch_size=1"):
        diagnostics.gradient_flow(model, batch_size=1)
    with pytest.raises(ValueError, match="labels"):
        diagnostics.gradient_flow(model, np.zeros((2, 16, 16, 3), "float32"))
    with pytest.raises(ValueError, match="include_top"):
        diagnostics.gradient_flow(kp.PreActResNet(**tiny_model_kwargs, include_top=False))
    with pytest.raises(ValueError, match=r"Unknown `unit`.*Valid"):
        diagnostics.compare_units("preact_resnet20", ["preact"])
    with pytest.raises(ValueError, match=r"`input_shape` is too small.*at least 8"):
        diagnostics.compare_units("preact_resnet20", input_shape=(4, 4, 3))


def test_diagnose_command_prints_table_and_writes_csv_and_png(tmp_path, capsys):
    from keras_preact.cli import main

    rc = main(["diagnose", "preact_resnet20", "--unit", "original", "--unit", "full_preact",
               "--batch", "4", "--seed", "1", "--input-size", "8", "--out-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "first/last" in out and "grad_rms[original]" in out
    with open(tmp_path / "preact_resnet20_gradient_flow.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["model"] for r in rows] == ["original"] * 9 + ["full_preact"] * 9
    assert all(float(r["grad_rms"]) > 0 for r in rows)
    # The CSV reads back into the ratios the table printed.
    reports = diagnostics.read_csv(tmp_path / "preact_resnet20_gradient_flow.csv")
    assert f"{reports[0].first_to_last:.3g}" in out.splitlines()[-3]
    png = (tmp_path / "preact_resnet20_gradient_flow.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000

    rc = main(["diagnose", "preact_resnet20", "--unit", "orig", "--out-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: Unknown `unit`") and "'full_preact'" in err
    assert not (tmp_path / "x").exists()
    rc = main(["diagnose", "resnet9000", "--out-dir", str(tmp_path / "x")])
    assert rc == 2 and "Unknown model name" in capsys.readouterr().err
