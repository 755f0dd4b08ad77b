"""Depth sweeps with KerasTuner: which depth fits my data and my budget?

`PreActResNetHyperModel` searches depth, block, unit variant, width, learning rate,
weight decay and warm-up; `Budget` caps parameters, multiply-adds or step time; `tune`
runs a resumable study that writes ``results.csv``, ``results.png`` and the best model
(`keras-preact tune`). KerasTuner loads on first use of these names.

Example:
    >>> from keras_preact.tuning import Budget, tune
    >>> result = tune("runs/tune", dataset="digits", depths=(8, 14, 20), epochs=2,
    ...               max_trials=3, budget=Budget("params", 200_000))
"""

import importlib

_LAZY = {
    "keras_preact.tuning.hypermodel": ("BUDGET_KINDS", "Budget", "DEFAULT_DEPTHS", "OBJECTIVE",
                                       "PreActResNetHyperModel", "search_space_spec"),
    "keras_preact.tuning.study": ("TUNERS", "make_tuner", "plot_results", "retrain", "tune"),
}
__all__ = sorted(name for names in _LAZY.values() for name in names)


def __getattr__(name):
    # KerasTuner (and TensorFlow) load on first use: other subcommands start without them.
    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'keras_preact.tuning' has no attribute {name!r}")
