"""Training (`train_and_evaluate`: Keras ``fit`` on every backend, or the multi-worker loop)
and `evaluate`."""

import functools
import os

import keras

from keras_preact import data, private_api
from keras_preact.data.registry import check_dataset_name
from keras_preact.file_io import user_path
from keras_preact.layers.preprocessing import ImageNormalization
from keras_preact.training.config import TrainConfig, training_path
from keras_preact.training.run import Run, Stepper, as_config, build_model, score
from keras_preact.training.workdir import CHECKPOINT_DIR, Workdir
from keras_preact.weights.local import load_keras_file, load_weights_file


def train_and_evaluate(config, workdir):
    """Trains `config`'s model on its dataset, writing the files of
    `keras_preact.training.workdir` and TensorBoard logs.

    Args:
        config: a `TrainConfig` (or its dict).
        workdir: str or `os.PathLike`, a new or empty folder, or one holding this same run
            (resumed from its last completed epoch, or its stored results returned if it is
            complete).

    Returns:
        dict: `Run.train`'s (``test_accuracy``, ``test_loss``, ``history``, ``epochs``,
        ``steps``, ``resumed_from_epoch``, ``train_time_s``, ``num_replicas``,
        ``model_path``, ``workdir``, plus `Stepper.labels`).

    Raises:
        ValueError: before anything is written, for an invalid config, missing or corrupt
            data, a workdir holding another run or a batch the replicas cannot split.
        WorkdirInUseError: if another process is training in `workdir`.
        TypeError: if `workdir` is not a path."""
    user_path(workdir, "workdir")  # TypeError for a non-path; `Run` refuses an empty one
    config = as_config(config)
    training_path(config, keras.backend.backend())  # what the path cannot honour is refused
    if config.strategy == "multiworker":
        from keras_preact.training.multiworker import train_multiworker
        return train_multiworker(config, workdir)
    return Run(config, workdir, Stepper()).train()


def load_workdir_model(workdir, checkpoint=None):
    """Loads a workdir's trained model: ``model.keras``, else its newest checkpoint, or
    `checkpoint`.

    Args:
        workdir: str or `os.PathLike`, a training workdir.
        checkpoint: str or None, a weights file of its ``checkpoints/`` to load instead.
            Defaults to `None`.

    Returns:
        tuple ``(model, config, source_path)``: the model, its `TrainConfig` and the file
        its weights came from.

    Raises:
        ValueError: if the workdir holds no run or no weights."""
    wd = Workdir(workdir)
    if (stored := wd.read_train_config()) is None:
        raise ValueError(
            f"No training run in {wd.path} (config.json missing). Received: workdir={workdir!r}")
    config = TrainConfig.from_dict(stored)
    if checkpoint is None and os.path.exists(path := wd.final_model_path):
        return keras.saving.load_model(path, compile=False), config, path
    if checkpoint is None and (state := wd.read_state()) is None:
        raise ValueError(f"The run in {wd.path} has no completed epoch yet.")
    model = build_model(config, data.dataset_info(config.dataset, **config.data_arguments()))
    ckpt = checkpoint or wd.file(CHECKPOINT_DIR, state["checkpoint"])
    load_weights_file(model, ckpt)
    return model, config, ckpt


def evaluate(workdir=None, *, model=None, weights=None, dataset=None, data_dir=None,
             data_source="auto", data_path=None, batch_size=256, split="test",
             model_kwargs=None, verbose="auto", flip=False):
    """Loss and accuracy of a trained model on a dataset split.

    Give `workdir`, or `dataset` with `weights` (a ``.keras`` file, or a model name and its
    ``.weights.h5``), or `dataset` with a built `model`.

    Args:
        workdir: str, `os.PathLike` or None, a training workdir (its final model or newest
            checkpoint, its data). Defaults to `None`.
        model: str, a model name (with `weights`), or a built Keras model, or None.
            Defaults to `None`.
        weights: str or None, a ``.keras`` file, or a ``.weights.h5`` for `model`.
            Defaults to `None`.
        dataset: str, the dataset name; see `keras_preact.data.make_dataset`
            (default: the workdir's).
        data_dir: see `keras_preact.data.make_dataset` (default: the workdir's).
        data_source: see `keras_preact.data.make_dataset`; with a workdir, "auto" takes
            the workdir's. Defaults to `"auto"`.
        data_path: see `keras_preact.data.make_dataset` (default: the workdir's).
        batch_size: int, the evaluation's batch size. Defaults to `256`.
        split: str, the split to score. Defaults to `"test"`.
        model_kwargs: dict or None, extra `get_model` arguments for a model name.
            Defaults to `None`.
        verbose: the verbosity of the evaluation (as Keras' `Model.predict`).
            Defaults to `"auto"`.
        flip: bool, score the mean of the probabilities of each image and its mirror image
            (test-time augmentation by a horizontal flip). Defaults to `False`.

    Returns:
        dict with ``loss``, ``accuracy``, ``num_examples``, ``dataset``, ``split``,
        ``source`` (the file the model came from; None for a built model without
        `weights`) and ``flip``.

    Raises:
        ValueError: for a missing workdir or weights file, an unknown model or dataset,
            weights that do not fit the model, both `workdir` and `model` / `weights`
            given, or a model whose outputs or classes do not match the dataset's."""
    if workdir is not None and (model, weights) != (None, None):
        raise ValueError("Give `workdir` (its model is evaluated) or `model` / `weights`, not "
                         f"both. Received: workdir={workdir!r}, model={model!r}, "
                         f"weights={weights!r}")
    if workdir is not None:
        net, config, source = load_workdir_model(workdir)
        dataset = dataset or config.dataset
        data_dir = data_dir if data_dir is not None else config.data_dir
        data_path = data_path if data_path is not None else config.data_path
        data_source = config.data_source if data_source == "auto" else data_source
    else:
        if dataset is None or (model is None and weights is None):
            raise ValueError("Give `workdir`, or `dataset` with `weights` (a .keras file, or a "
                             "model name and its .weights.h5). Received: workdir=None, "
                             f"model={model!r}, weights={weights!r}, dataset={dataset!r}")
        check_dataset_name(dataset, "dataset")
        if isinstance(model, str) and weights is None:
            raise ValueError("A model name needs `weights` (--weights), or the untrained network "
                             f"would be scored. Received: model={model!r}, weights=None")
        if weights is not None and not os.path.isfile(weights):
            raise ValueError(f"Weights file not found. Received: weights={weights!r}")
        if model is None and not str(weights).endswith(".keras"):
            raise ValueError("A weights file needs `model`, the architecture it belongs to "
                             f"(only a .keras file holds its own). Received: weights={weights!r}")
        net, source = _model_for(model, weights, dataset, data_path, model_kwargs), weights
    # A folder's images are read at the model's size.
    size = getattr(net, "input_shape", (None,) * 4)[1:3] if dataset == "folder" else ()
    size = tuple(size) if all(isinstance(d, int) for d in size) and size else None
    info = data.dataset_info(dataset, path=data_path, image_size=size)
    classes = info["classes"]
    shape = getattr(net, "output_shape", None)
    if (outputs := shape[-1] if isinstance(shape, tuple) else None) != classes:
        raise ValueError(f"The {dataset!r} dataset has {classes} classes and the model "
                         f"({source}) {outputs} outputs: it cannot be scored on it.")
    trained_on = Workdir(workdir).read_config().get("class_names") if workdir else None
    if trained_on and [str(c) for c in info["class_names"]] != [str(c) for c in trained_on]:
        raise ValueError(f"The run in {workdir} was trained on the classes {trained_on}; the "
                         f"{dataset!r} data has {list(info['class_names'])}, which would be "
                         f"scored by position. Received: data_path={data_path!r}")
    make = functools.partial(data.make_dataset, dataset, split, data_dir=data_dir,
                             source=data_source, path=data_path, image_size=size, shuffle=False,
                             augment=False, drop_remainder=False)
    # A model with its own normalisation layer takes raw pixels.
    normalize = not any(isinstance(layer, ImageNormalization)
                        for layer in private_api.flatten_layers(net))
    results = score(functools.partial(net.predict, verbose=verbose),
                    make(batch_size=batch_size, normalize=normalize), flip=flip)
    return {**results, "num_examples": int(make(batch_size=1).cardinality()), "dataset": dataset,
            "split": split, "source": source, "flip": bool(flip)}


def _model_for(model, weights, dataset, data_path, model_kwargs):
    """The model `evaluate` was given: a built one, a ``.keras`` file, or a name."""
    if model is None or isinstance(model, str):
        if weights is not None and str(weights).endswith(".keras"):
            return load_keras_file(weights)
        # As training builds it, with the dataset's normalisation (a layer without weights).
        config = TrainConfig(model=model, model_kwargs=model_kwargs or {}, dataset=dataset,
                             data_path=data_path).validate()
        model = build_model(config, data.dataset_info(dataset, **config.data_arguments()))
    if weights is not None:
        load_weights_file(model, weights)
    return model
