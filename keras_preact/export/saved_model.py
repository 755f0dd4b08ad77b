"""SavedModel export for TF Serving, written with `keras.export.ExportArchive` (with
`tf.saved_model.save`, Keras 3 models lose their input names and dtypes)."""

import json
import os

import keras
import tensorflow as tf

from keras_preact.checks import check_bool, check_int
from keras_preact.export.serving import check_path
from keras_preact.export.destination import export_folder

SIGNATURE_RAW = "serving_default"
SIGNATURE_PREPROCESSED = "serve_preprocessed"
SIGNATURE_ENCODED = "serve_encoded"
SIGNATURE_METADATA = "metadata"


def _write_archive(folder, parts, card, version, accept_encoded):
    """Writes the SavedModel into `folder` and its card's "serving" entry."""
    shape = [None, *parts.input_shape]
    signatures = {SIGNATURE_RAW: {"inputs": {"images": {"dtype": "uint8", "shape": shape}}},
                  SIGNATURE_PREPROCESSED: {"inputs": {
                      "inputs": {"dtype": "float32", "shape": shape}}}}
    if accept_encoded:
        signatures[SIGNATURE_ENCODED] = {"inputs": {"image_bytes": {
            "dtype": "string", "shape": [None], "content": "JPEG, PNG, GIF or BMP bytes"}}}
    signatures[SIGNATURE_METADATA] = {"inputs": {}, "outputs": ["class_names", "model_card"]}
    card["serving"] = {"version": version,
                       "layout": "TF Serving: <model_base_path>/<version>/saved_model.pb",
                       "signatures": signatures}
    floats = tf.TensorSpec(shape, tf.float32, name="inputs")
    height, width, channels = parts.input_shape
    names = card["class_names"]
    labels = tf.constant(names if names is not None else [], dtype=tf.string)

    # Every signature calls this one function, traced and stored once (the bulk of the time).
    @tf.function(input_signature=[floats], autograph=False)
    def network(inputs):
        out = dict(parts.preprocessed(inputs, training=False))
        if names is not None:
            out["top_k_labels"] = tf.gather(labels, out["top_k_classes"])
        return out

    def serve_images(images):
        return network(parts.normalize(images))

    def decode(image_bytes):
        """One encoded image -> uint8 pixels, asserting the model's input size."""
        image = tf.io.decode_image(image_bytes, channels=channels, expand_animations=False)
        if height is not None and width is not None:
            check = tf.debugging.assert_equal(
                tf.shape(image)[:2], tf.constant([height, width], tf.int32),
                message=f"serve_encoded: every image must decode to {height}x{width} "
                "(height x width), the model's input size")
            with tf.control_dependencies([check]):
                image = tf.identity(image)
        image.set_shape([height, width, channels])
        return image

    def serve_encoded(image_bytes):
        return serve_images(tf.map_fn(decode, image_bytes, fn_output_signature=tf.uint8))

    # No parity figures in this copy (measured after writing); model_card.json has them.
    card_json = json.dumps(card, default=str)
    # No archive.track(model): the endpoints hold the variables; it re-traces (3x slower).
    archive = keras.export.ExportArchive()
    archive.add_endpoint(SIGNATURE_RAW, serve_images, [tf.TensorSpec(shape, tf.uint8, "images")])
    archive.add_endpoint(SIGNATURE_PREPROCESSED, network, [floats])
    if accept_encoded:
        bytes_spec = tf.TensorSpec([None], tf.string, name="image_bytes")
        archive.add_endpoint(SIGNATURE_ENCODED, serve_encoded, [bytes_spec])
    archive.add_endpoint(SIGNATURE_METADATA, lambda: {"class_names": labels,
                                                      "model_card": tf.constant(card_json)}, [])
    archive.write_out(folder, verbose=False)


def open_saved_model(path):
    """``(input_shape, run)`` of a SavedModel version folder; ``run(images)`` -> outputs."""
    loaded = tf.saved_model.load(path)  # kept alive by the function below
    shape = loaded.signatures[SIGNATURE_RAW].structured_input_signature[1]["images"].shape
    return tuple(shape[1:]), lambda images: loaded.signatures[SIGNATURE_RAW](
        images=tf.constant(images))


def export_saved_model(model, path, *, version=1, accept_encoded=False, **options):
    """Exports a classifier as a SavedModel for TF Serving (in ``path/<version>/``), with a
    model card. Signatures: ``serving_default`` (uint8 ``images`` -> "probabilities",
    "top_k_classes", "top_k_scores", + "features", + "top_k_labels" with class names),
    ``serve_preprocessed`` (float32 ``inputs``, preprocessed), ``serve_encoded`` (JPEG/PNG
    ``image_bytes`` of the input size) and ``metadata`` (``class_names``, ``model_card``).

    Args:
        model: a built classifier with one image input, e.g. a `PreActResNet`.
        path: the base folder (TF Serving's ``--model_base_path``).
        version: int >= 1, the version folder name.
        accept_encoded: add the ``serve_encoded`` signature.
        **options: every exporter's: `top_k`, `include_features`, `preprocessing` (see
            `build_serving_model`); `class_names` (a str per class); `weights_info`, `metrics`
            (JSON dicts for the model card); `overwrite` (default False); `check_parity`
            (default True: compare with the model on `parity_images`, default 8 seeded random
            ones, within `parity_tolerance`, default `PARITY_TOLERANCES`; with their
            `parity_labels`, both accuracies go into the card); `verbose`.

    Returns str, the version folder written (``path/<version>``).

    Raises:
        ValueError: for an invalid argument or an unwritable path.
        FileExistsError: if the version exists and `overwrite` is False.
        ExportParityError: if the reloaded export does not match the model."""
    base = check_path("path", path)
    check_int("version", version, minimum=1)
    check_bool("accept_encoded", accept_encoded)
    if os.path.exists(base) and not os.path.isdir(base):
        raise ValueError(f"`path` must be a folder. Received: path={path!r} (a file)")
    return export_folder(model, os.path.join(base, str(version)), export_format="saved_model",
                         write=lambda *args: _write_archive(*args, version, accept_encoded),
                         run=lambda folder, images: open_saved_model(folder)[1](images),
                         class_names_dir="assets.extra", **options)
