"""Exports for serving (SavedModel, LiteRT, ONNX), each made from `build_serving_model` (uint8
images -> "probabilities", "top_k_classes", "top_k_scores"), checked against the Keras model
and written whole with a model card. TensorFlow only, so not imported by ``import keras_preact``:
``export.export_saved_model(model, "/tmp/r20")``, then ``export.load_export("/tmp/r20")``."""

from keras_preact.export.card import (
    CLASS_NAMES_FILE, LITERT_FILE, MODEL_CARD_JSON, MODEL_CARD_MD, ONNX_FILE, read_class_names,
    read_model_card, render_model_card)
from keras_preact.export.load import (
    ExportedModel, expected_input_shape, fit_image, load_export, load_model_to_export,
    read_image_file, top_k_predictions)
from keras_preact.export.saved_model import (
    SIGNATURE_ENCODED, SIGNATURE_METADATA, SIGNATURE_PREPROCESSED, SIGNATURE_RAW,
    export_saved_model)
from keras_preact.export.serving import (
    AUTO, EXPORT_EXTRA, FORMATS, ONNX_QUANTIZATIONS, PARITY_TOLERANCES, QUANTIZATIONS,
    ExportParityError, build_serving_model, validate_images)
from keras_preact.export.formats import export_litert, export_model, export_onnx

__all__ = ["AUTO", "CLASS_NAMES_FILE", "EXPORT_EXTRA", "FORMATS", "LITERT_FILE", "MODEL_CARD_JSON",
           "MODEL_CARD_MD", "ONNX_FILE", "ONNX_QUANTIZATIONS", "PARITY_TOLERANCES", "QUANTIZATIONS",
           "SIGNATURE_ENCODED", "SIGNATURE_METADATA", "SIGNATURE_PREPROCESSED", "SIGNATURE_RAW",
           "ExportParityError", "ExportedModel", "build_serving_model", "expected_input_shape",
           "export_litert", "export_model", "export_onnx", "export_saved_model", "fit_image",
           "load_export", "load_model_to_export", "read_class_names", "read_image_file",
           "read_model_card", "render_model_card", "top_k_predictions", "validate_images"]
