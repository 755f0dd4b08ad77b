"""Exports for serving: SavedModel (TF Serving), LiteRT and ONNX, each with a model card.

TensorFlow only, and not imported by ``import keras_preact``: ``from keras_preact import export``.
Every export is made from one Keras serving model (`build_serving_model`): raw uint8 images
``[batch, height, width, channels]`` go through the model's own preprocessing to the outputs
``probabilities``, ``top_k_classes`` / ``top_k_scores`` (and ``features``). Each is checked
against the Keras model (`PARITY_TOLERANCES`) before it is moved into place whole, and gets
``model_card.json`` / ``.md``; `load_export` runs any of them.

Example:
    >>> export.export_saved_model(model, "/tmp/r20", class_names=[str(i) for i in range(10)])
    '/tmp/r20/1'
    >>> export.load_export("/tmp/r20").predict(images_uint8)["top_k_classes"]
"""

from keras_preact.export.card import CLASS_NAMES_FILE
from keras_preact.export.card import LITERT_FILE
from keras_preact.export.card import MODEL_CARD_JSON
from keras_preact.export.card import MODEL_CARD_MD
from keras_preact.export.card import ONNX_FILE
from keras_preact.export.card import read_class_names
from keras_preact.export.card import read_model_card
from keras_preact.export.card import render_model_card
from keras_preact.export.load import ExportedModel
from keras_preact.export.load import expected_input_shape
from keras_preact.export.load import fit_image
from keras_preact.export.load import load_export
from keras_preact.export.load import load_model_to_export
from keras_preact.export.load import read_image_file
from keras_preact.export.load import top_k_predictions
from keras_preact.export.saved_model import SIGNATURE_ENCODED
from keras_preact.export.saved_model import SIGNATURE_METADATA
from keras_preact.export.saved_model import SIGNATURE_PREPROCESSED
from keras_preact.export.saved_model import SIGNATURE_RAW
from keras_preact.export.saved_model import export_saved_model
from keras_preact.export.serving import AUTO
from keras_preact.export.serving import EXPORT_EXTRA
from keras_preact.export.serving import FORMATS
from keras_preact.export.serving import PARITY_TOLERANCES
from keras_preact.export.serving import QUANTIZATIONS
from keras_preact.export.serving import ExportParityError
from keras_preact.export.serving import build_serving_model
from keras_preact.export.serving import validate_images
from keras_preact.export.single_file import export_litert
from keras_preact.export.single_file import export_model
from keras_preact.export.single_file import export_onnx

__all__ = [
    "AUTO", "CLASS_NAMES_FILE", "EXPORT_EXTRA", "FORMATS", "LITERT_FILE", "MODEL_CARD_JSON",
    "MODEL_CARD_MD", "ONNX_FILE", "PARITY_TOLERANCES", "QUANTIZATIONS", "SIGNATURE_ENCODED",
    "SIGNATURE_METADATA", "SIGNATURE_PREPROCESSED", "SIGNATURE_RAW", "ExportParityError",
    "ExportedModel", "build_serving_model", "expected_input_shape", "export_litert", "export_model",
    "export_onnx", "export_saved_model", "fit_image", "load_export", "load_model_to_export",
    "read_class_names", "read_image_file", "read_model_card", "render_model_card",
    "top_k_predictions", "validate_images",
]
