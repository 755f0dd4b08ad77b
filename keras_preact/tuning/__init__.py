"""Depth sweeps with KerasTuner: which depth fits my data and my budget?

`PreActResNetHyperModel` searches depth, block, unit variant, width, learning rate,
weight decay and warm-up with the library's factories, data pipeline and recipe;
`Budget` caps parameters, multiply-adds or step time; `tune` runs a resumable study
that writes ``results.csv``, ``results.png`` and the best model (`keras-preact tune`).
KerasTuner loads on first use of these names; `import keras_preact` never imports this.

Example:
    >>> from keras_preact.tuning import Budget, tune
    >>> result = tune("runs/tune", dataset="digits", depths=(8, 14, 20), epochs=2,
    ...               max_trials=3, budget=Budget("params", 200_000))
"""

_LAZY = {
    "BUDGET_KINDS": "keras_preact.tuning.hypermodel",
    "Budget": "keras_preact.tuning.hypermodel",
    "DEFAULT_DEPTHS": "keras_preact.tuning.hypermodel",
    "OBJECTIVE": "keras_preact.tuning.hypermodel",
    "PreActResNetHyperModel": "keras_preact.tuning.hypermodel",
    "search_space_spec": "keras_preact.tuning.hypermodel",
    "TUNERS": "keras_preact.tuning.study",
    "make_tuner": "keras_preact.tuning.study",
    "plot_results": "keras_preact.tuning.study",
    "retrain": "keras_preact.tuning.study",
    "tune": "keras_preact.tuning.study",
}

__all__ = sorted(_LAZY)


def __getattr__(name):
    # KerasTuner (and TensorFlow) load on first use: other subcommands start without them.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_preact.tuning' has no attribute {name!r}")
