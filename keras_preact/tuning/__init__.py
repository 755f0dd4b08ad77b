"""Depth sweeps with KerasTuner (`keras-preact tune`): which depth fits my data and budget?
`PreActResNetHyperModel` is the search space, `Budget` caps a candidate's cost and `tune`
runs a resumable study (``results.csv``, ``results.png``, the best model). KerasTuner loads
on first use of these names (see examples/tune_depth.py)."""

import importlib

_LAZY = {name: f"keras_preact.tuning.{module}" for module, names in (
    ("hypermodel", "BUDGET_KINDS Budget DEFAULT_DEPTHS OBJECTIVE PreActResNetHyperModel "
     "search_space_spec"), ("study", "TUNERS make_tuner plot_results retrain tune"),
) for name in names.split()}
__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'keras_preact.tuning' has no attribute {name!r}")
