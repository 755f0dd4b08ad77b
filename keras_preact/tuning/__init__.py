"""Depth sweeps with KerasTuner (`keras-preact tune`): which depth fits my data and budget?
`PreActResNetHyperModel` is the search space, `Budget` caps a candidate's cost and `tune`
runs a resumable study (``results.csv``, ``results.png``, the best model). KerasTuner loads
on first use of these names (see examples/tune_depth.py)."""

import importlib

#: `TrainConfig` fields every trial sets from the search space, whatever its study's `config`
#: holds: `keras-preact tune` refuses their `train` flags, naming what to use instead.
SPACE_FLAGS = {"model": "--depths/--widths/--units", "model_kwargs": "--depths/--widths/--units",
               "learning_rate": "--lrs", "weight_decay": "--weight-decays",
               "warmup": "--warmups", "steps": "--epochs", "eval_every": "nothing (each epoch)"}
_LAZY = {
    "keras_preact.tuning.hypermodel": ("BUDGET_KINDS", "Budget", "DEFAULT_DEPTHS", "OBJECTIVE",
                                       "PreActResNetHyperModel", "search_space_spec"),
    "keras_preact.tuning.study": ("TUNERS", "make_tuner", "plot_results", "retrain", "tune")}
__all__ = sorted(name for names in _LAZY.values() for name in names)


def __getattr__(name):
    for module, names in _LAZY.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module 'keras_preact.tuning' has no attribute {name!r}")
