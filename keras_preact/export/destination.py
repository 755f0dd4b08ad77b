"""Writing an export whole or not at all (`keras_preact.file_io.staged_folder`); only an export
of ours (with a model card) is replaced."""

import logging
import os

import keras
import numpy as np

from keras_preact.checks import check_bool, is_number, shorten
from keras_preact.export.card import (CLASS_NAMES_FILE, LITERT_FILE, MODEL_CARD_JSON,
                                      MODEL_CARD_MD, ONNX_FILE, make_model_card, write_model_card)
from keras_preact.export.serving import (
    AUTO, PARITY_TOLERANCES, ServingParts, check_class_names, check_json, compare)
from keras_preact.file_io import atomic_write_text, staged_folder

logger = logging.getLogger("keras_preact.export")
#: What an export of any format holds at its top: `overwrite` replaces a folder with nothing else.
EXPORT_NAMES = {MODEL_CARD_JSON, MODEL_CARD_MD, CLASS_NAMES_FILE, LITERT_FILE, ONNX_FILE,
                "saved_model.pb", "fingerprint.pb", "variables", "assets", "assets.extra"}


def check_target(target, *, overwrite):
    """Raises unless `target` is free, or an export of ours (holding only `EXPORT_NAMES`)
    and `overwrite` is set."""
    if not os.path.lexists(target):
        return
    if not os.path.isfile(os.path.join(target, MODEL_CARD_JSON)):
        # Checked first, so that no message suggests an `overwrite` that would be refused.
        raise ValueError(f"Refusing to write over {target!r}: it exists and is not a keras-preact "
                         f"export (no {MODEL_CARD_JSON}); choose another path. "
                         f"Received: path={target!r}")
    if foreign := sorted(set(os.listdir(target)) - EXPORT_NAMES):
        raise ValueError(f"Refusing to write over {target!r}: it holds files an export does not "
                         f"write ({shorten(', '.join(foreign), 80)}). Nothing was changed; move "
                         f"them out or choose another path. Received: path={target!r}")
    if not overwrite:
        raise FileExistsError(f"An export already exists at {target!r}; "
                              "pass overwrite=True (--overwrite) to replace it.")


def export_folder(model, target, *, export_format, write, run, quantization=None,
                  extra_versions=(), class_names_dir="", preprocessing=AUTO, top_k=None,
                  include_features=False, class_names=None, weights_info=None, metrics=None,
                  overwrite=False, check_parity=True, parity_images=None, parity_labels=None,
                  parity_tolerance=None, verbose=False):
    """Writes one export through `staged_folder` at `target`: ``write(staging, parts, card)``
    writes the model and the card's "serving" entry, ``run(staging, images)`` runs it for the
    parity check; `extra_versions`: packages whose versions go into the card;
    `class_names_dir`: where ``class_names.txt`` goes; the rest as in `export_saved_model`."""
    key = export_format if quantization is None else f"{export_format}_{quantization}"
    check_bool("overwrite", overwrite)
    check_bool("check_parity", check_parity)
    if parity_tolerance is None:
        parity_tolerance = PARITY_TOLERANCES[key]
    elif not is_number(parity_tolerance) or parity_tolerance < 0:
        raise ValueError("`parity_tolerance` must be a non-negative number or None. "
                         f"Received: parity_tolerance={parity_tolerance!r}")
    parts = ServingParts(model, preprocessing=preprocessing, top_k=top_k,
                         include_features=include_features)
    card = make_model_card(model, parts, export_format=export_format,
                           class_names=check_class_names(class_names, parts.classes),
                           weights_info=check_json("weights_info", weights_info),
                           metrics=check_json("metrics", metrics), extra_versions=extra_versions)
    images = parts.parity_images(parity_images) if check_parity else None
    if parity_labels is not None:
        parity_labels = np.asarray(parity_labels).reshape(-1)
        if images is None or parity_images is None or len(parity_labels) != len(images):
            raise ValueError("`parity_labels` must hold one class id per image of "
                             f"`parity_images`. Received: {len(parity_labels)} labels, "
                             f"parity_images={None if images is None else images.shape}")
    progress = keras.utils.Progbar(3, unit_name="stage", verbose=1 if verbose else 0)
    with staged_folder(target, check=lambda: check_target(target, overwrite=overwrite),
                       what="an export") as staging:
        write(staging, parts, card)
        progress.update(1)
        if check_parity:
            card["parity"] = compare(key, parts.reference_probabilities(model, images),
                                     run(staging, images), float(parity_tolerance), parity_labels)
        progress.update(2)
        if card["class_names"] is not None:
            names_file = os.path.join(staging, class_names_dir, CLASS_NAMES_FILE)
            atomic_write_text(names_file, "\n".join(card["class_names"]) + "\n")
        write_model_card(staging, card)
        progress.update(3)
    logger.info("Exported %s to %s", key, target)
    return target
