"""keras-preact: pre-activation ResNets (He et al. 2016) for Keras 3 on TensorFlow, JAX, torch.

`import keras_preact` is cheap: the public names load on first use, and the classes
that saved files reference are registered with Keras whenever Keras is imported. Imported
before TensorFlow, it sets `TF_ENABLE_ONEDNN_OPTS=1` unless that variable is set."""

__version__ = "0.1.0"

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import os as _os
import sys as _sys

# TensorFlow enables oneDNN by itself only on CPUs with AVX-512/AMX features; the training
# kernels want it on every CPU (docs/performance.md). Read when TF is imported.
if "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_MODELS = "keras_preact.models"
#: Public name -> module, loaded on first use (PEP 562): no Keras or TF at import or --help.
_LAZY = dict.fromkeys(
    ("PreActResNet", "count_macs", "count_params", "get_model", "list_models", "model_info",
     "register_model", "preact_resnet_cifar", "preact_resnet_imagenet",
     *(f"preact_resnet{d}" for d in (20, 32, 44, 56, 110, 164, 272, 542, 1001, 1202, 18, 34, 50,
                                     101, 152, 200))), _MODELS)
_LAZY.update(CoupledSGD="keras_preact.training.optimizers", save_preset="keras_preact.hub",
             WarmupPiecewiseConstant="keras_preact.training.schedules")
_SUBMODULES = ("finetune", "layers", "models", "weights")
#: The modules that register keras-preact's classes with Keras (files written by keras-preact
#: name them), by the module whose import makes them importable: keras-hub's classes only
#: once the user imports keras-hub.
_REGISTRATION = {
    "keras": (_MODELS, "keras_preact.training.optimizers", "keras_preact.training.schedules",
              "keras_preact.training.losses"),
    "keras_hub": ("keras_preact.hub",)}


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBMODULES))


def load_model(path, *, compile=True, safe_mode=True):
    """Loads a `.keras` model file, such as a training run's `model.keras`; returns the model.

    Args:
        path: str or `os.PathLike`, a `.keras` file.
        compile: bool: restore the optimizer and loss the file was compiled with.
        safe_mode: bool: refuse a file holding a Lambda layer (arbitrary code).

    Raises ValueError naming the file if it is missing, damaged or (`safe_mode`) unsafe."""
    from keras_preact.weights.local import load_keras_file
    return load_keras_file(path, compile=compile, safe_mode=safe_mode)


def from_preset(preset, *, load_weights=True, **kwargs):
    """Builds the `PreActResNet` a preset holds, with its weights. keras-hub's own loaders
    find keras-preact's classes once ``import keras_preact`` has run: import it first.

    Args:
        preset: a folder of `save_preset` (or keras-preact 0.1.0), an ``hf://`` or
            ``kaggle://`` handle of one (the ``hub`` extra), or, as `keras_preact.hub`'s classes
            take, a catalog key ("preact_resnet20.cifar10") or a model name (random weights).
        load_weights: load the weights (checked against the model first).
        **kwargs: config values to change (``features=True``: the backbone, same weights).

    Raises ValueError naming a missing or damaged preset file, or weights that do not fit."""
    from keras_preact.models import get_model, list_models
    from keras_preact.weights import catalog, presets

    bare, entries = presets.is_bare_name(preset), {e.key: e for e in catalog.list_entries()}
    if bare and (entry := entries.get(preset)):
        pretrained = {"weights": entry.tag} if load_weights else entry.architecture
        return get_model(entry.model, **{**pretrained, **kwargs})
    if bare and preset in list_models():
        return get_model(preset, **kwargs)
    if bare and (model := str(preset).partition(".")[0]) in list_models():
        raise ValueError(f"Unknown catalog key. Received: preset={preset!r}. Valid: "
                         f"{sorted(k for k in entries if k.startswith(model + '.'))}")
    return presets.from_preset(preset, load_weights=load_weights, **kwargs)


def _register():
    """Imports the registering modules of every trigger already imported (once each)."""
    for trigger, modules in _REGISTRATION.items():
        if trigger in _sys.modules and trigger not in _registered:
            _registered.add(trigger)
            for module in modules:
                _importlib.import_module(module)


class _RegisterWithKeras(_importlib_abc.MetaPathFinder):
    """Calls `_register` after each import of a trigger (`keras`, `keras_hub`) or of a
    keras_preact module, once no keras_preact module is still loading (a module that
    imported Keras half-way must finish before the registering modules import it); leaves
    `sys.meta_path` when every trigger has fired."""

    loading = 0

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _REGISTRATION and not fullname.startswith(__name__ + "."):
            return None
        _sys.meta_path.remove(self)
        try:
            spec = _importlib_util.find_spec(fullname)
        finally:
            _sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            self.loading += 1
            try:
                exec_module(module)
            finally:
                self.loading -= 1
            if not self.loading:
                _register()
                if _registered == set(_REGISTRATION) and self in _sys.meta_path:
                    _sys.meta_path.remove(self)

        spec.loader.exec_module = exec_then_register
        return spec


_registered = set()
_register()
if not any(isinstance(f, _RegisterWithKeras) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _RegisterWithKeras())
