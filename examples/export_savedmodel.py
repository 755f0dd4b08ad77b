"""Export a pre-activation ResNet as a SavedModel for TF Serving, and query it.

Trains a small network on scikit-learn's digits for a few seconds (offline; pass
``--model PATH.keras`` to export your own model instead), exports it with a
``serving_default`` signature that takes raw uint8 images, reloads it and checks it
against Keras, and writes the TF Serving REST requests (plain pixels and base64 PNG
bytes) next to the export.

Run:
    python examples/export_savedmodel.py --out /tmp/digits_export

Then, with TF Serving (not needed for this script):
    docker run -p 8501:8501 -v /tmp/digits_export/saved_model:/models/digits \
        -e MODEL_NAME=digits tensorflow/serving
    curl -d @/tmp/digits_export/request.json \
        http://localhost:8501/v1/models/digits:predict
    curl -d @/tmp/digits_export/request_encoded.json \
        http://localhost:8501/v1/models/digits:predict

The response is ``{"predictions": [{"probabilities": [...], "top_k_classes": [...],
"top_k_scores": [...], "top_k_labels": [...]}, ...]}``, one entry per instance.
"""

import argparse
import base64
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

# keras_preact before Keras: it picks TensorFlow's CPU kernels before TensorFlow loads.
import keras_preact as kp  # noqa: E402  isort: skip
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_preact import export, file_io  # noqa: E402

DIGITS = [str(i) for i in range(10)]


def train_digits_model(epochs):
    from keras_preact.data import load_arrays

    (x_train, y_train), (x_test, y_test) = (load_arrays("digits", "train"),
                                            load_arrays("digits", "test"))
    keras.utils.set_random_seed(0)
    # The preprocessing layer goes inside the model, so the export takes raw pixels.
    model = kp.PreActResNet(
        stage_blocks=(1, 1, 1), stage_filters=(16, 32, 64), input_shape=(32, 32, 3),
        classes=10, preprocessing="unit", name="digits_preact",
    )
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(x_train.astype("float32"), y_train, batch_size=64, epochs=epochs, verbose=2)
    _, accuracy = model.evaluate(x_test.astype("float32"), y_test, verbose=0)
    return model, x_test, y_test, {"digits_test_accuracy": float(accuracy)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/export_example")
    parser.add_argument("--model", default=None, help="a .keras file to export instead")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()

    if args.model:
        model = keras.saving.load_model(args.model)
        height, width, channels = model.inputs[0].shape[1:]
        x_test = np.random.default_rng(0).integers(0, 256, (4, height, width, channels),
                                                   dtype=np.uint8)
        class_names, metrics = None, None
        weights_info = {"file": os.path.basename(args.model),
                        "sha256": file_io.file_hash(args.model)}
    else:
        model, x_test, y_test, metrics = train_digits_model(args.epochs)
        class_names, weights_info = DIGITS, None
        print(f"trained: {metrics}")

    base = os.path.join(args.out, "saved_model")
    folder = export.export_saved_model(
        model, base, version=1, top_k=3, accept_encoded=True, class_names=class_names,
        weights_info=weights_info, metrics=metrics, overwrite=args.overwrite,
    )
    print(f"exported to {folder}; model card: {os.path.join(folder, 'model_card.md')}")

    # Reload as TF Serving would and compare with Keras on the same raw images.
    signatures = tf.saved_model.load(folder).signatures
    images = x_test[:4]
    served = signatures["serving_default"](images=tf.constant(images))
    expected = model.predict(images.astype("float32"), verbose=0)
    diff = float(np.abs(served["probabilities"].numpy() - expected).max())
    print(f"serving_default vs model.predict: max |difference| {diff:.2g}")
    print("top-3 classes:", served["top_k_classes"].numpy().tolist())
    if "top_k_labels" in served:
        print("top-3 labels:", served["top_k_labels"].numpy().astype(str).tolist())

    # TF Serving REST requests (row format: one dict per instance, keyed by input name).
    request = {"signature_name": "serving_default",
               "instances": [{"images": image.tolist()} for image in images]}
    encoded = [base64.b64encode(tf.io.encode_png(image).numpy()).decode("ascii")
               for image in images]
    request_encoded = {"signature_name": "serve_encoded",
                       "instances": [{"image_bytes": {"b64": b}} for b in encoded]}
    for name, body in (("request.json", request), ("request_encoded.json", request_encoded)):
        path = os.path.join(args.out, name)
        with open(path, "w") as f:
            json.dump(body, f)
        print(f"wrote {path}")

    # What TF Serving does with request_encoded.json, run here on the loaded model.
    pngs = tf.constant([base64.b64decode(b) for b in encoded])
    from_bytes = signatures["serve_encoded"](image_bytes=pngs)["probabilities"].numpy()
    print("serve_encoded gives the same probabilities:",
          bool(np.allclose(from_bytes, served["probabilities"].numpy(), atol=1e-6)))


if __name__ == "__main__":
    main()
