"""LiteRT and ONNX exports: parity with Keras, quantised accuracy on digits.

Runtimes: `ai-edge-litert`'s interpreter (tf.lite.Interpreter is deprecated) and
`onnxruntime`, both independent of the TensorFlow that wrote the files.

Stated tolerances (largest |difference| of probabilities against the Keras model):
float32 LiteRT and ONNX 1e-5; float16 LiteRT 1e-2. Quantised accuracy on the digits
test split (359 images) may drop by at most 0.6 points (float16, about 2 images),
2.0 points (dynamic range, about 7 images) and 1 point (int8 LiteRT and ONNX, calibrated
on 128 training images) against the Keras model.
"""

import json
import os

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact import export
from tests.helpers import tiny_model

# isort: split
import ai_edge_litert.interpreter as ai_edge_litert  # noqa: E402 (test requirement)
import onnxruntime  # noqa: E402 (test requirement)

FLOAT_TOLERANCE = 1e-5
FLOAT16_TOLERANCE = 1e-2
MAX_ACCURACY_DROP = {"float16": 0.006, "dynamic_range": 0.02}
DIGITS_CLASSES = [str(i) for i in range(10)]


def _litert(path, x):
    interpreter = ai_edge_litert.Interpreter(model_path=path)
    return interpreter.get_signature_runner("serving_default")(images=x)


def _onnx(path, x):
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, {"images": x})))


@pytest.fixture(scope="module")
def digits():
    from keras_preact.data import load_arrays

    train = load_arrays("digits", "train")
    test = load_arrays("digits", "test")
    return train, test


@pytest.fixture(scope="module")
def digits_model(digits):
    """A tiny pre-activation ResNet trained for a few seconds on digits (32x32x3)."""
    (x_train, y_train), (x_test, y_test) = digits
    keras.utils.set_random_seed(0)
    model = kp.PreActResNet(
        stage_blocks=(1, 1, 1), stage_filters=(8, 16, 32), stem_filters=8, stem_strides=2,
        input_shape=(32, 32, 3), classes=10, preprocessing="unit", name="digits_net",
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_train.astype("float32"), y_train, batch_size=64, epochs=4, verbose=0)
    probs = model.predict(x_test.astype("float32"), verbose=0, batch_size=128)
    accuracy = float(np.mean(np.argmax(probs, -1) == y_test))
    assert accuracy > 0.9, f"the tiny digits model only reached {accuracy:.3f}"
    return model, probs, accuracy


@pytest.mark.parametrize("fmt", ["litert", "onnx"])
def test_float_exports_match_keras_on_a_named_network(tmp_path, fmt):
    model = kp.preact_resnet20(preprocessing="cifar10")
    fn = export.export_litert if fmt == "litert" else export.export_onnx
    folder = fn(model, tmp_path / fmt, class_names=[f"c{i}" for i in range(10)])
    path = os.path.join(folder, export.LITERT_FILE if fmt == "litert" else export.ONNX_FILE)
    run = _litert if fmt == "litert" else _onnx
    rng = np.random.default_rng(1)
    for batch in (1, 7):
        x = rng.integers(0, 256, (batch, 32, 32, 3), dtype=np.uint8)
        expected = model.predict(x.astype("float32"), verbose=0)
        out = run(path, x)
        assert set(out) == {"probabilities", "top_k_classes", "top_k_scores"}
        # Other inputs than the export's own parity check: the same float32 rounding,
        # with twice its margin (measured 1.08e-5 once, on a loaded 2-core machine).
        assert np.max(np.abs(out["probabilities"] - expected)) <= 2 * FLOAT_TOLERANCE
        np.testing.assert_array_equal(out["top_k_classes"][:, 0], np.argmax(expected, -1))
    with open(os.path.join(folder, "model_card.json")) as f:
        card = json.load(f)
    assert card["format"] == fmt
    assert card["parity"]["max_abs_diff"] <= card["parity"]["tolerance"] == FLOAT_TOLERANCE
    assert card["class_names"][3] == "c3"
    with open(os.path.join(folder, "class_names.txt")) as f:
        assert f.read().split()[3] == "c3"
    served = export.load_export(folder)
    assert served.kind == fmt and served.class_names[0] == "c0"
    x = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    np.testing.assert_allclose(
        served.predict(x)["probabilities"], model.predict(x.astype("float32"), verbose=0),
        atol=FLOAT_TOLERANCE,
    )


@pytest.fixture(scope="module")
def digits_float_exports(tmp_path_factory, digits, digits_model):
    """The digits model as float32 LiteRT and ONNX (with features), exported once."""
    model, _, _ = digits_model
    (_, _), (x_test, _) = digits
    root = tmp_path_factory.mktemp("digits_exports")
    lite = export.export_litert(model, root / "lite", parity_images=x_test[:16])
    onnx = export.export_onnx(model, root / "onnx", include_features=True)
    return os.path.join(lite, export.LITERT_FILE), os.path.join(onnx, export.ONNX_FILE)


def test_float_exports_match_keras_on_digits(digits, digits_model, digits_float_exports):
    model, probs, _ = digits_model
    (_, _), (x_test, _) = digits
    lite, onnx = digits_float_exports
    got_lite = _litert(lite, x_test)["probabilities"]
    got_onnx = _onnx(onnx, x_test)
    assert np.max(np.abs(got_lite - probs)) <= FLOAT_TOLERANCE
    assert np.max(np.abs(got_onnx["probabilities"] - probs)) <= FLOAT_TOLERANCE
    pool = keras.Model(model.inputs, model.get_layer("pool").output)
    np.testing.assert_allclose(
        got_onnx["features"], pool.predict(x_test.astype("float32"), verbose=0), atol=1e-4
    )


@pytest.mark.parametrize("quantization", ["float16", "dynamic_range"])
def test_quantised_litert_accuracy_on_digits(tmp_path, digits, digits_model, digits_float_exports,
                                            quantization):
    model, probs, keras_accuracy = digits_model
    (_, _), (x_test, y_test) = digits
    folder = export.export_litert(
        model, tmp_path / quantization, quantization=quantization,
        class_names=DIGITS_CLASSES, metrics={"keras_test_accuracy": keras_accuracy},
        parity_images=x_test[:32],
    )
    out = _litert(os.path.join(folder, export.LITERT_FILE), x_test)
    accuracy = float(np.mean(np.argmax(out["probabilities"], -1) == y_test))
    drop = keras_accuracy - accuracy
    assert drop <= MAX_ACCURACY_DROP[quantization], (quantization, keras_accuracy, accuracy)
    if quantization == "float16":
        assert np.max(np.abs(out["probabilities"] - probs)) <= FLOAT16_TOLERANCE
    with open(os.path.join(folder, "model_card.json")) as f:
        card = json.load(f)
    assert card["serving"]["quantization"] == quantization
    assert card["metrics"] == {"keras_test_accuracy": keras_accuracy}
    # The weights shrink: 4 -> 2 bytes a parameter (float16), 4 -> 1 (int8), less
    # what stays float32 (BN statistics, biases). Files also have a fixed overhead.
    saved = os.path.getsize(digits_float_exports[0]) - card["serving"]["bytes"]
    per_parameter = saved / kp.count_params(model, trainable_only=False)
    assert per_parameter >= (1.5 if quantization == "float16" else 2.0), per_parameter


@pytest.mark.parametrize("fmt", ["litert", "onnx"])
def test_int8_exports_keep_accuracy_on_digits(tmp_path, digits, digits_model,
                                              digits_float_exports, fmt):
    model, probs, keras_accuracy = digits_model
    (x_train, _), (x_test, y_test) = digits
    folder = export.export_model(model, tmp_path / fmt, format=fmt, quantization="int8",
                                 calibration_images=x_train[:128], parity_images=x_test,
                                 parity_labels=y_test)
    out = export.load_export(folder).predict(x_test)["probabilities"]
    accuracy = float(np.mean(np.argmax(out, -1) == y_test))
    assert accuracy >= keras_accuracy - 0.01, (fmt, keras_accuracy, accuracy)
    card = export.read_model_card(folder)
    assert card["serving"]["quantization"] == "int8"
    assert card["serving"]["calibration_images"] == 128
    # The card's record is this same measurement.
    assert card["parity"]["accuracy"] == {"keras": pytest.approx(keras_accuracy, abs=1e-9),
                                          "export": pytest.approx(accuracy, abs=1e-9)}
    assert card["parity"]["max_abs_diff"] == pytest.approx(np.max(np.abs(out - probs)), abs=1e-6)
    if fmt == "litert":  # this net's ONNX graph outweighs its 20k parameters: see the demo's
        assert card["serving"]["bytes"] < 0.6 * os.path.getsize(digits_float_exports[0])


def test_litert_and_onnx_bad_arguments(tmp_path):
    model = tiny_model(classes=5, preprocessing="unit")
    with pytest.raises(ValueError, match=r"quantization='int4'.*dynamic_range"):
        export.export_litert(model, tmp_path / "a", quantization="int4")
    with pytest.raises(ValueError, match=r"parity_tolerance=-1"):
        export.export_litert(model, tmp_path / "b", parity_tolerance=-1)
    with pytest.raises(ValueError, match=r"opset_version=0"):
        export.export_onnx(model, tmp_path / "c", opset_version=0)
    with pytest.raises(ValueError, match=r"parity_images.*16x16"):
        export.export_onnx(model, tmp_path / "d", parity_images=np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"needs `calibration_images`.*Received: calibration_"):
        export.export_litert(model, tmp_path / "f", quantization="int8")
    with pytest.raises(ValueError, match=r"calibration_images.*16x16"):
        export.export_onnx(model, tmp_path / "g", quantization="int8",
                           calibration_images=np.zeros((2, 8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match=r"for quantization='int8' only"):
        export.export_litert(model, tmp_path / "h", calibration_images=np.zeros((2, 16, 16, 3)))
    with pytest.raises(ValueError, match=r"quantization='float16'.*Valid: \[None, 'int8'\]"):
        export.export_onnx(model, tmp_path / "i", quantization="float16")
    with pytest.raises(ValueError, match=r"one class id per image.*3 labels"):
        export.export_onnx(model, tmp_path / "j", parity_labels=[0, 1, 2],
                           parity_images=np.zeros((2, 16, 16, 3), np.uint8))
    assert sorted(os.listdir(tmp_path)) == []
    folder = export.export_onnx(model, tmp_path / "e")
    with pytest.raises(FileExistsError, match="overwrite"):
        export.export_onnx(model, tmp_path / "e")
    served = export.load_export(os.path.join(folder, export.ONNX_FILE))
    with pytest.raises(ValueError, match="uint8"):
        served.predict(np.zeros((1, 16, 16, 3), np.float32))
    with pytest.raises(ValueError, match="16x16"):
        served.predict(np.zeros((1, 32, 32, 3), np.uint8))
