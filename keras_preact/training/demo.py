"""The offline demo: pre-activation ResNet-20 on scikit-learn's digits, on a laptop CPU: the
paper's recipe stretched to `DEMO_EPOCHS` epochs at batch 32, the rates scaled by sqrt(32 / 128)
(the linear rule's lower rate learns too slowly in 8 epochs)."""

import os

from keras_preact.training.config import TrainConfig
from keras_preact.training.workdir import CURVE_PNG, run_metrics

DEMO_DATASET = "digits"
DEMO_EPOCHS = 8
DEMO_WORKDIR = "runs/demo"


def run_demo(workdir=DEMO_WORKDIR, *, epochs=DEMO_EPOCHS, seed=0, export=True,
             verbose="auto", **overrides):
    """Trains the demo model (resumable like any run); returns `train_and_evaluate`'s dict plus
    ``curve_path`` and, with `export`, ``export``.

    Args:
        workdir: the run's folder.
        epochs, seed, verbose, **overrides: `TrainConfig` fields.
        export: also export the trained model (`export_demo`)."""
    from keras_preact.training.api import train_and_evaluate
    values = dict(model="preact_resnet20", dataset=DEMO_DATASET, batch_size=32, lr_scaling="sqrt",
                  epochs=epochs, seed=seed, deterministic=True, verbose=verbose)
    result = train_and_evaluate(TrainConfig(**{**values, **overrides}), workdir)
    result["curve_path"] = os.path.join(result["workdir"], CURVE_PNG)
    if export:
        result["export"] = export_demo(workdir=result["workdir"], model_path=result["model_path"])
    return result


def export_demo(*, workdir, model_path, dataset=DEMO_DATASET):
    """Exports the trained model with its model card (class names, held-out metrics) to
    ``workdir/export/saved_model/1/``, replacing an earlier export: ``{"saved_model": folder}``."""
    import keras

    from keras_preact.data import dataset_info
    from keras_preact.export.formats import export_model
    from keras_preact.file_io import file_hash
    return {"saved_model": export_model(
        keras.saving.load_model(model_path), os.path.join(workdir, "export", "saved_model"),
        format="saved_model", class_names=[str(c) for c in dataset_info(dataset)["class_names"]],
        weights_info={"path": os.path.abspath(model_path), "sha256": file_hash(model_path)},
        metrics=run_metrics(model_path), overwrite=True)}
