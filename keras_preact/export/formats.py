"""LiteRT and ONNX exports (the serving model through Keras' exporters: uint8 ``images``, the
same outputs less ``top_k_labels``), their runtimes, and `export_model` over all formats."""

import importlib
import os
import warnings

import tensorflow as tf

from keras_preact.checks import check_choice, check_int, check_known_arguments
from keras_preact.export.card import LITERT_FILE, ONNX_FILE
from keras_preact.export.saved_model import export_saved_model, open_saved_model
from keras_preact.export.serving import (
    EXPORT_EXTRA, FORMATS, ONNX_QUANTIZATIONS, QUANTIZATIONS, check_path, validate_images)
from keras_preact.export.destination import export_folder
from keras_preact.file_io import file_hash


def _require(module, needed_for):
    """Imports a package of the export extra; ModuleNotFoundError saying how to get it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModuleNotFoundError(f"{needed_for} ({EXPORT_EXTRA}).") from None


def open_litert(path):
    """``(input_shape, run)`` of a ``.tflite`` file, run by `ai-edge-litert`."""
    litert = _require("ai_edge_litert.interpreter", "Running LiteRT exports needs `ai-edge-litert`")
    # Without `num_threads` the interpreter runs on one core.
    interpreter = litert.Interpreter(model_path=path, num_threads=os.cpu_count())
    runner = interpreter.get_signature_runner("serving_default")
    dims = runner.get_input_details()["images"]["shape_signature"][1:]
    return tuple(int(d) if d > 0 else None for d in dims), lambda images: runner(images=images)


def open_onnx(path):
    """``(input_shape, run)`` of a ``.onnx`` file, run by `onnxruntime` on the CPU."""
    onnxruntime = _require("onnxruntime", "Running an ONNX export needs `onnxruntime`")
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
                    "metrics", "overwrite", "check_parity", "parity_images", "parity_labels",
                    "parity_tolerance", "verbose")
EXTRA_ARGUMENTS = {"saved_model": ("version", "accept_encoded"),
                   "litert": ("quantization", "calibration_images"),
                   "onnx": ("opset_version", "quantization", "calibration_images")}


def _calibration(quantization, calibration_images, parts):
    """The checked uint8 calibration images of an int8 export, else None."""
    if quantization != "int8":
        if calibration_images is not None:
            raise ValueError("`calibration_images` is for quantization='int8' only. "
                             f"Received: quantization={quantization!r}")
        return None
    if calibration_images is None:
        raise ValueError("quantization='int8' needs `calibration_images`: uint8 images "
                         "[N, H, W, C] like those the model will serve (a few hundred training "
                         "images). Received: calibration_images=None")
    return validate_images(calibration_images, parts.input_shape, name="calibration_images")


def _quantize_onnx(path, images):
    """Static int8 quantisation (QDQ, per-channel weights) of the ONNX file `path` in place,
    calibrated on `images` by onnxruntime."""
    quantization = _require("onnxruntime.quantization", "int8 ONNX needs `onnxruntime`")

    class Reader(quantization.CalibrationDataReader):
        batches = iter([{"images": images[i:i + 32]} for i in range(0, len(images), 32)])

        def get_next(self):
            return next(self.batches, None)

    prepared = path + ".prepared.onnx"
    # The symbolic pass stops at top_k; ONNX shape inference and the optimizer still run.
    quantization.shape_inference.quant_pre_process(path, prepared, skip_symbolic_shape=True)
    quantization.quantize_static(
        prepared, path, Reader(), per_channel=True, quant_format=quantization.QuantFormat.QDQ,
        activation_type=quantization.QuantType.QInt8, weight_type=quantization.QuantType.QInt8)
    os.remove(prepared)


def _export_single_file(model, path, export_format, converter_kwargs, quantization=None,
                        calibration_images=None, **options):
    """The LiteRT and ONNX exporter, through Keras' ``model.export(format=...)``."""
    filename, versions = _FILES[export_format]

    def write(folder, parts, card):
        inputs = {"images": {"dtype": "uint8", "shape": [None, *parts.input_shape]}}
        card["serving"] = {"file": filename, "quantization": quantization, "inputs": inputs,
                           "outputs": sorted(parts.describe_outputs())}
        file_path = os.path.join(folder, filename)
        images = _calibration(quantization, calibration_images, parts)
        if images is not None and export_format == "litert":
            converter_kwargs["representative_dataset"] = lambda: ([x[None]] for x in images)
        # `parts.raw` was never called, and Keras' ONNX exporter refuses such a model.
        parts.raw(parts.parity_images(None)[:1], training=False)
        with warnings.catch_warnings():
            # tf2onnx's numpy-2 shim and the LiteRT converter warn about deprecations not ours.
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            parts.raw.export(file_path, format=export_format, verbose=False, **converter_kwargs)
        if images is not None:
            card["serving"]["calibration_images"] = len(images)
            if export_format == "onnx":
                _quantize_onnx(file_path, images)
        card["serving"].update(bytes=os.path.getsize(file_path), sha256=file_hash(file_path))

    def run(folder, images):
        return RUNTIMES[export_format](os.path.join(folder, filename))[1](images)

    return export_folder(model, check_path("path", path), export_format=export_format,
                         quantization=quantization, write=write, run=run,
                         extra_versions=versions, **options)


def export_litert(model, path, *, quantization=None, calibration_images=None, **kwargs):
    """Exports a classifier as LiteRT (``model.tflite`` in the folder `path`, signature
    ``serving_default`` on uint8 ``images``), with a model card; returns the folder.

    Args:
        quantization: one of `QUANTIZATIONS`; each has its `PARITY_TOLERANCES` entry.
            "int8" quantises weights and activations (float32 in and out).
        calibration_images: for "int8": uint8 ``[N, H, W, C]`` images, e.g. a few hundred
            training images, that set the activations' ranges.
        **kwargs: as in `export_saved_model`.

    Raises as `export_saved_model`; ImportError for the parity check without `ai-edge-litert`."""
    check_choice("quantization", quantization, QUANTIZATIONS)
    # Dynamic range: int8 weights, no representative data set needed.
    optimize = {} if quantization is None else {"optimizations": [tf.lite.Optimize.DEFAULT]}
    if quantization == "float16":
        optimize["target_spec"] = {"supported_types": [tf.float16]}
    elif quantization == "int8":
        optimize["target_spec"] = {"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]}
    return _export_single_file(model, path, "litert", optimize, quantization=quantization,
                               calibration_images=calibration_images, **kwargs)


def export_onnx(model, path, *, opset_version=None, quantization=None, calibration_images=None,
                **kwargs):
    """Exports a classifier as ONNX (``model.onnx`` in the folder `path`, converted by
    tf2onnx, on uint8 ``images``), with a model card; returns the folder.

    Args:
        opset_version: the ONNX opset; None (default): tf2onnx's.
        quantization: None or "int8": static quantisation by onnxruntime (QDQ, per-channel).
        calibration_images: for "int8", as in `export_litert`.
        **kwargs: as in `export_saved_model`.

    Raises as `export_saved_model`; ImportError without `tf2onnx` or (parity check)
    `onnxruntime`."""
    converter_kwargs = {} if opset_version is None else {
        "opset_version": check_int("opset_version", opset_version, minimum=1)}
    check_choice("quantization", quantization, ONNX_QUANTIZATIONS)
    # The converter Keras' ONNX export calls, checked before any work.
    _require("tf2onnx", "ONNX export on the TensorFlow backend needs `tf2onnx` and `onnx`")
    return _export_single_file(model, path, "onnx", converter_kwargs, quantization=quantization,
                               calibration_images=calibration_images, **kwargs)


def export_model(model, path, *, format="saved_model", **kwargs):
    """Exports in one of `FORMATS` with its exporter (`export_saved_model`, `export_litert`,
    `export_onnx`), which takes `kwargs`; returns the folder written.

    Raises ValueError for an unknown format or an argument that format does not take."""
    check_choice("format", format, FORMATS)
    check_known_arguments(kwargs, SHARED_ARGUMENTS + EXTRA_ARGUMENTS[format],
                          where=f"the {format!r} exporter")
    exporters = {"saved_model": export_saved_model, "litert": export_litert, "onnx": export_onnx}
    return exporters[format](model, path, **kwargs)
