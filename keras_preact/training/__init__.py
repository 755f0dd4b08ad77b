"""Training: the paper's CIFAR recipe, tf.distribute strategies, crash-safe runs.
`train_and_evaluate` trains on TensorFlow (Keras ``fit``, or the multi-worker loop),
`train_data_parallel` on JAX; e.g. ``train_and_evaluate(TrainConfig(), "runs/resnet110")``."""

import importlib

from keras_preact.training.config import (PRECISIONS, RECIPES, STRATEGIES, TrainConfig,
                                          paper_cifar_recipe, paper_imagenet_recipe, recipe)

# Loaded on first use, so that `keras-preact --help` starts without Keras.
_LAZY = {name: f"keras_preact.training.{module}" for module, names in (
    ("optimizers", "CoupledSGD"), ("schedules", "WarmupPiecewiseConstant"),
    ("trainer", "train_and_evaluate evaluate load_workdir_model"),
    ("run", "build_model SmoothedCrossentropy"),
    ("demo", "run_demo DEMO_EPOCHS"), ("multiworker", "train_multiworker parse_tf_config"),
    ("distribute", "make_strategy set_synchronized_batch_norm"),
    ("jax_parallel", "train_data_parallel"),
) for name in names.split()}

__all__ = ["PRECISIONS", "RECIPES", "STRATEGIES", "TrainConfig", "paper_cifar_recipe",
           "paper_imagenet_recipe", "recipe", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_preact.training' has no attribute {name!r}")
