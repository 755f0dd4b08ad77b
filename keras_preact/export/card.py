"""Model cards (``model_card.json`` / ``.md``), class names, and finding an export's files."""

import contextlib
import datetime
import json
import os
import platform

import numpy as np

import keras
import tensorflow as tf

import keras_preact
from keras_preact.file_io import atomic_write_text, read_json, user_path
from keras_preact.models.costs import count_macs, count_params

MODEL_CARD_JSON = "model_card.json"
MODEL_CARD_MD = "model_card.md"
CLASS_NAMES_FILE = "class_names.txt"
LITERT_FILE = "model.tflite"
ONNX_FILE = "model.onnx"
PAPER = ("He, Zhang, Ren, Sun. Identity Mappings in Deep Residual Networks. ECCV 2016 "
         "(arXiv:1603.05027)")


def _versions(extra=()):
    out = {"keras_preact": keras_preact.__version__, "keras": keras.__version__,
           "tensorflow": tf.__version__, "numpy": np.__version__,
           "python": platform.python_version()}
    for module in extra:
        with contextlib.suppress(ImportError):
            out[module] = getattr(__import__(module), "__version__", "unknown")
    return out


def _architecture(model):
    macs = None  # for a free input size
    with contextlib.suppress(ValueError):
        macs = count_macs(model)
    arch = {"name": model.name, "class": type(model).__name__, "parameters": count_params(model),
            "parameters_total": count_params(model, trainable_only=False), "multiply_adds": macs,
            "input_shape": list(model.inputs[0].shape[1:]),
            "classes": int(model.outputs[0].shape[-1])}
    arch.update({key: getattr(model, key) for key in ("depth", "block") if hasattr(model, key)})
    # Not for a subclassed model without a serialisable config.
    with contextlib.suppress(NotImplementedError, TypeError, ValueError):
        arch["config"] = json.loads(json.dumps(model.get_config(), default=str))
    return arch


def make_model_card(model, parts, *, export_format, class_names, weights_info, metrics,
                    extra_versions=()):
    """The model card of an export; the exporter fills in "serving", the check "parity"."""
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return {
        "model_card_version": 1, "format": export_format, "created": created,
        "architecture": _architecture(model), "paper": PAPER, "weights": weights_info,
        "preprocessing": parts.preprocessing,
        "input": {"name": "images", "dtype": "uint8", "shape": [None, *parts.input_shape],
                  "layout": "NHWC (batch, height, width, channels)", "range": "0..255"},
        "outputs": parts.describe_outputs(class_names if export_format == "saved_model" else None),
        "top_k": parts.top_k, "class_names": class_names, "metrics": metrics, "serving": None,
        "parity": None, "versions": _versions(extra_versions)}


def _fmt(value):
    if isinstance(value, (int, float)):
        return f"{value:.6g}" if isinstance(value, float) else f"{value:,}"
    return "not given" if value is None else str(value)


def _section(title, items, *, empty="not given", fmt=_fmt):
    """A Markdown section of ``- key: value`` lines (``- <empty>`` when there are none)."""
    body = [f"- {k}: {fmt(v)}" for k, v in (items or {}).items()]
    return ["", f"## {title}", "", *(body or ([f"- {empty}"] if empty else []))]


def render_model_card(card):
    """Renders a model card dict (as in ``model_card.json``) as Markdown (``model_card.md``)."""
    arch = card["architecture"]
    lines = [f"# Model card: {arch['name']} ({card['format']})", "",
             f"Pre-activation ResNet; {card['paper']}.", "", "## Architecture", "", "| | |",
             "|---|---|", f"| class | {arch['class']} |"]
    lines += [f"| {key} | {_fmt(arch[key])} |" for key in ("depth", "block") if key in arch]
    lines += [f"| parameters (trainable) | {_fmt(arch['parameters'])} |",
              f"| parameters (all) | {_fmt(arch['parameters_total'])} |",
              f"| multiply-adds per image | {_fmt(arch['multiply_adds'])} |",
              f"| input shape | {arch['input_shape']} |", f"| classes | {arch['classes']} |"]
    lines += _section("Weights", card.get("weights"))
    lines += _section("Preprocessing (inside the export)", card["preprocessing"])
    lines += ["", "## Input and outputs", "",
              "- input `{name}`: {dtype} {shape}, {layout}, {range}".format(**card["input"])]
    lines += [f"- output `{name}`: {spec['dtype']} {spec['shape']}"
              for name, spec in card["outputs"].items()]
    if names := card.get("class_names"):
        more = " ..." if len(names) > 20 else ""
        lines.append(f"- class names ({len(names)}): {', '.join(names[:20])}{more}")
    lines += _section("Metrics", card.get("metrics"))
    lines += _section("Serving", card.get("serving"), empty=None, fmt=json.dumps)
    lines += _section("Parity with the Keras model", card.get("parity"), empty="not checked")
    lines += _section("Versions", card["versions"], fmt=str)
    return "\n".join(lines + ["", f"Created {card['created']}.", ""])


def write_model_card(folder, card):
    atomic_write_text(os.path.join(folder, MODEL_CARD_JSON), json.dumps(card, indent=2) + "\n")
    atomic_write_text(os.path.join(folder, MODEL_CARD_MD), render_model_card(card))


def read_model_card(path):
    """The ``model_card.json`` of an export (any path `load_export` takes) as a dict, or None."""
    folder = locate_export(path, must_exist=False)[1]
    card_path = os.path.join(folder or "", MODEL_CARD_JSON)
    return read_json(card_path) if folder and os.path.isfile(card_path) else None


def read_class_names(path, *, argument="path"):
    """Class names from the file `path` (named `argument` in errors): UTF-8 text, one a line,
    or a JSON list of strings (``.json``); ValueError for a file holding anything else."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"The class names file must be UTF-8 text, one class name a line or a "
                         f"JSON list (.json); byte {err.start} is not UTF-8. "
                         f"Received: {argument}={path!r}") from None
    if not str(path).endswith(".json"):
        names = [line.strip() for line in text.splitlines() if line.strip()]
    else:
        try:
            names = json.loads(text)
        except ValueError as err:
            raise ValueError(f"The class names file {path!r} is not valid JSON ({err})") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"The class names file {path!r} must hold a JSON list of strings")
    if not names:
        raise ValueError(f"The class names file holds no class name. Received: {argument}={path!r}")
    return names


def locate_export(path, *, must_exist=True):
    """(kind, folder holding the card, file or folder to load) of a `load_export` path; kind
    "saved_model" (latest version of a base folder), "litert", "onnx" or "keras". Anything
    else: ``(None, None, None)``, or ValueError with `must_exist`."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"`path` must be a path. Received: path={path!r}")
    if os.path.isdir(path := user_path(path)):
        if os.path.isfile(os.path.join(path, "saved_model.pb")):
            return "saved_model", path, path
        if versions := [int(name) for name in os.listdir(path) if name.isdigit()
                        and os.path.isfile(os.path.join(path, name, "saved_model.pb"))]:
            latest = os.path.join(path, str(max(versions)))
            return "saved_model", latest, latest
        # A LiteRT or ONNX export folder stands for its model file, read as below.
        files = [os.path.join(path, name) for name in (LITERT_FILE, ONNX_FILE)]
        path = next((file for file in files if os.path.isfile(file)), path)
    for suffix, kind in ((".tflite", "litert"), (".onnx", "onnx"), (".keras", "keras")):
        if os.path.isfile(path) and path.endswith(suffix):
            return kind, os.path.dirname(path), path
    if not must_exist:
        return None, None, None
    what = "does not exist" if not os.path.exists(path) else "is not an export"
    raise ValueError(f"The path {what}. Received: path={path!r}. Valid: a SavedModel export (its "
                     "base folder or a version folder), a LiteRT or ONNX export folder, a .tflite "
                     "or .onnx file, or a .keras model file")
