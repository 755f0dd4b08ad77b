"""LiteRT (``.tflite``) and ONNX exports, their runtimes, and `export_model` over all formats.

Both are converted from the serving model by Keras' own exporters: the same uint8 ``images``
and named outputs, less ``top_k_labels`` (class names are in ``class_names.txt``)."""

import importlib
import os
import warnings

import numpy as np
import tensorflow as tf

from keras_preact.export.card import LITERT_FILE
from keras_preact.export.card import ONNX_FILE
from keras_preact.export.saved_model import export_saved_model
from keras_preact.export.saved_model import open_saved_model
from keras_preact.export.serving import EXPORT_EXTRA
from keras_preact.export.serving import FORMATS
from keras_preact.export.serving import QUANTIZATIONS
from keras_preact.export.serving import check_path
from keras_preact.export.staging import export_folder
from keras_preact.files import file_hash
from keras_preact.layers.utils import check_choice
from keras_preact.layers.utils import check_known_arguments
from keras_preact.layers.utils import check_positive_int


def open_litert(path):
    """``(input_shape, run)`` of a ``.tflite`` file, run by `ai-edge-litert`'s interpreter."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise ModuleNotFoundError(
            f"Running a LiteRT export needs the `ai-edge-litert` package ({EXPORT_EXTRA}); "
            "tf.lite.Interpreter is deprecated.") from None
    runner = Interpreter(model_path=path).get_signature_runner("serving_default")
    dims = runner.get_input_details()["images"]["shape_signature"][1:]
    return tuple(int(d) if d > 0 else None for d in dims), lambda images: runner(images=images)


def open_onnx(path):
    """``(input_shape, run)`` of a ``.onnx`` file, run by `onnxruntime` on the CPU."""
    try:
        import onnxruntime
    except ImportError:
        raise ModuleNotFoundError("Running an ONNX export needs the `onnxruntime` package "
                                  f"({EXPORT_EXTRA}).") from None
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    shape = tuple(d if isinstance(d, int) else None for d in session.get_inputs()[0].shape[1:])
    return shape, lambda images: dict(zip(names, session.run(names, {"images": images})))


#: Export kind -> ``open(path) -> (input_shape, run)``; ``run(images)`` -> outputs by name.
RUNTIMES = {"saved_model": open_saved_model, "litert": open_litert, "onnx": open_onnx}
#: Format -> (file name, packages whose versions go into the model card).
_FILES = {"litert": (LITERT_FILE, ("ai_edge_litert",)),
          "onnx": (ONNX_FILE, ("onnx", "tf2onnx", "onnxruntime"))}
#: The keyword arguments every exporter takes, and those of one format only.
SHARED_ARGUMENTS = ("top_k", "include_features", "preprocessing", "class_names", "weights_info",
                    "metrics", "overwrite", "check_parity", "parity_images", "parity_tolerance",
                    "verbose")
EXTRA_ARGUMENTS = {"saved_model": ("version", "accept_encoded"), "litert": ("quantization",),
                   "onnx": ("opset_version",)}


def _export_single_file(model, path, export_format, converter_kwargs, quantization=None,
                        **options):
    """The LiteRT and ONNX exporter, through Keras' ``model.export(format=...)``."""
    filename, versions = _FILES[export_format]

    def serving(parts):
        return {"file": filename, "quantization": quantization,
                "inputs": {"images": {"dtype": "uint8", "shape": [None, *parts.input_shape]}},
                "outputs": sorted(parts.describe_outputs())}

    def write(folder, parts, card):
        file_path = os.path.join(folder, filename)
        if not getattr(parts.raw, "_called", True):
            # Keras' ONNX exporter refuses a model that was never called.
            height, width, channels = parts.input_shape
            parts.raw(np.zeros((1, height or 32, width or 32, channels), np.uint8), training=False)
        with warnings.catch_warnings():
            # tf2onnx's numpy-2 shim and the LiteRT converter warn about deprecations not ours.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            parts.raw.export(file_path, format=export_format, verbose=False, **converter_kwargs)
        card["serving"].update(bytes=os.path.getsize(file_path), sha256=file_hash(file_path))

    def run(folder, images):
        return RUNTIMES[export_format](os.path.join(folder, filename))[1](images)

    return export_folder(model, check_path("path", path), export_format=export_format,
                         quantization=quantization, serving=serving, write=write, run=run,
                         extra_versions=versions, **options)


def export_litert(model, path, *, quantization=None, **kwargs):
    """Exports a classifier as LiteRT (``model.tflite`` in the folder `path`), with a model card.

    Its ``serving_default`` signature takes uint8 ``images``; `load_export` runs it.

    Args:
        quantization: None (float32, default), "float16" (float16 weights) or
            "dynamic_range" (int8 weights, float activations).
        **kwargs: as in `export_saved_model`; `parity_tolerance` defaults to
            `PARITY_TOLERANCES` "litert", "litert_float16" or "litert_dynamic_range".

    Returns:
        str, the export folder.

    Raises:
        ValueError, FileExistsError, ExportParityError: as `export_saved_model`.
        ImportError: for the parity check without `ai-edge-litert`.
    """
    check_choice("quantization", quantization, QUANTIZATIONS)
    converter_kwargs = {}
    if quantization is not None:
        # Dynamic range: int8 weights, no representative data set needed.
        converter_kwargs["optimizations"] = [tf.lite.Optimize.DEFAULT]
        if quantization == "float16":
            converter_kwargs["target_spec"] = {"supported_types": [tf.float16]}
    return _export_single_file(model, path, "litert", converter_kwargs,
                               quantization=quantization, **kwargs)


def export_onnx(model, path, *, opset_version=None, **kwargs):
    """Exports a classifier as ONNX (``model.onnx`` in the folder `path`), with a model card.

    Converted with tf2onnx; it takes uint8 ``images``; `load_export` runs it.

    Args:
        opset_version: the ONNX opset; None (default): tf2onnx's.
        **kwargs: as in `export_saved_model`.

    Returns:
        str, the export folder.

    Raises:
        ValueError, FileExistsError, ExportParityError: as `export_saved_model`.
        ImportError: without `tf2onnx` (conversion) or `onnxruntime` (parity check).
    """
    if opset_version is not None:
        check_positive_int("opset_version", opset_version)
    try:
        importlib.import_module("tf2onnx")  # the converter Keras' ONNX export calls
    except ImportError:
        raise ModuleNotFoundError("ONNX export on the TensorFlow backend needs `tf2onnx` and "
                                  f"`onnx` ({EXPORT_EXTRA}).") from None
    converter_kwargs = {} if opset_version is None else {"opset_version": opset_version}
    return _export_single_file(model, path, "onnx", converter_kwargs, **kwargs)


def export_model(model, path, *, format="saved_model", **kwargs):
    """Exports in one of `FORMATS` with that format's exporter (`export_saved_model`,
    `export_litert`, `export_onnx`), which takes the keyword arguments.

    Returns:
        str, the folder written.

    Raises:
        ValueError: for an unknown format or an argument that format does not take.
    """
    check_choice("format", format, FORMATS)
    where = f"the {format!r} exporter"
    check_known_arguments(kwargs, SHARED_ARGUMENTS + EXTRA_ARGUMENTS[format], where=where)
    exporters = {"saved_model": export_saved_model, "litert": export_litert, "onnx": export_onnx}
    return exporters[format](model, path, **kwargs)
