"""Training: the paper's CIFAR recipe, tf.distribute strategies, crash-safe runs.
`train_and_evaluate` trains with Keras ``fit`` on every backend (``strategy="data_parallel"``
on JAX), or with the multi-worker loop on TensorFlow; e.g.
``train_and_evaluate(TrainConfig(), "runs/resnet110")``."""

import importlib

from keras_preact.training.config import (LIMITS, PATHS, PRECISIONS, RECIPES, STRATEGIES,
                                          TrainConfig, paper_cifar_recipe, paper_imagenet_recipe,
                                          recipe, training_path)

# Loaded on first use, so that `keras-preact --help` starts without Keras.
_LAZY = {name: f"keras_preact.training.{module}" for module, names in (
    ("optimizers", "CoupledSGD"), ("schedules", "WarmupPiecewiseConstant"),
    ("api", "train_and_evaluate evaluate load_workdir_model"),
    ("run", "build_model"), ("losses", "SmoothedCrossentropy compile_model"),
    ("demo", "run_demo DEMO_EPOCHS"), ("multiworker", "train_multiworker parse_tf_config"),
    ("distribute", "make_strategy set_synchronized_batch_norm")) for name in names.split()}

__all__ = ["LIMITS", "PATHS", "PRECISIONS", "RECIPES", "STRATEGIES", "TrainConfig",
           "training_path", "paper_cifar_recipe", "paper_imagenet_recipe", "recipe", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_preact.training' has no attribute {name!r}")
