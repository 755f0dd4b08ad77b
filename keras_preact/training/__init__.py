"""Training: the paper's CIFAR recipe, tf.distribute strategies, crash-safe runs.

`train_and_evaluate` trains on TensorFlow (Keras ``fit``, or the multi-worker loop),
`train_data_parallel` on JAX. Only the recipe pieces load with the package; the rest
(and TensorFlow) load on first use.

Example:
    >>> from keras_preact.training import TrainConfig, train_and_evaluate
    >>> config = TrainConfig(model="preact_resnet110", dataset="cifar10")  # the paper
    >>> result = train_and_evaluate(config, "runs/resnet110")
"""

from keras_preact.training.config import PRECISIONS
from keras_preact.training.config import STRATEGIES
from keras_preact.training.config import TrainConfig
from keras_preact.training.config import paper_cifar_recipe
from keras_preact.training.config import paper_imagenet_recipe

# Loaded on first use, so that `keras-preact --help` starts without Keras.
_LAZY = {
    "CoupledSGD": "keras_preact.training.optimizers",
    "WarmupPiecewiseConstant": "keras_preact.training.schedules",
    "train_and_evaluate": "keras_preact.training.trainer",
    "evaluate": "keras_preact.training.trainer",
    "build_model": "keras_preact.training.run",
    "load_workdir_model": "keras_preact.training.trainer",
    "run_demo": "keras_preact.training.demo",
    "DEMO_EPOCHS": "keras_preact.training.demo",
    "make_strategy": "keras_preact.training.distribute",
    "set_synchronized_batch_norm": "keras_preact.training.distribute",
    "train_multiworker": "keras_preact.training.multiworker",
    "parse_tf_config": "keras_preact.training.distribute",
    "train_data_parallel": "keras_preact.training.jax_parallel",
}

__all__ = ["PRECISIONS", "STRATEGIES", "TrainConfig", "paper_cifar_recipe",
           "paper_imagenet_recipe", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_preact.training' has no attribute {name!r}")
