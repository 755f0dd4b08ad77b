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

# TensorFlow enables oneDNN by itself only on CPUs with AVX-512/AMX features; on AVX2 it
# trained ResNet-110 1.5-1.9x faster (CHANGELOG.md, 0.1.0). Read when TF is imported.
if "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_MODELS = "keras_preact.models"
#: Public name -> module, loaded on first use (PEP 562): no Keras or TF at import or --help.
_LAZY = {
    name: _MODELS
    for name in ("PreActResNet", "count_macs", "count_params", "get_model", "list_models",
                 "model_info", "register_model", "preact_resnet_cifar", "preact_resnet_imagenet")}
for _depth in (20, 32, 44, 56, 110, 164, 272, 542, 1001, 1202, 18, 34, 50, 101, 152, 200):
    _LAZY[f"preact_resnet{_depth}"] = _MODELS
_LAZY["CoupledSGD"] = "keras_preact.training.optimizers"
_LAZY["WarmupPiecewiseConstant"] = "keras_preact.training.schedules"
_LAZY["save_preset"] = _LAZY["from_preset"] = "keras_preact.weights.presets"
_SUBMODULES = ("finetune", "layers", "models", "weights")
#: The modules of every Keras object that a file written by keras-preact references.
_SERIALIZABLE = (_MODELS, "keras_preact.training.optimizers", "keras_preact.training.schedules")


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
        safe_mode: bool: refuse a file holding a Lambda layer (arbitrary code)."""
    import keras
    return keras.saving.load_model(path, compile=compile, safe_mode=safe_mode)


def _register_serializable():
    for module in _SERIALIZABLE:
        _importlib.import_module(module)


class _RegisterWithKeras(_importlib_abc.MetaPathFinder):
    """Registers keras-preact's classes once `keras` has loaded and no keras_preact
    module is still loading (one of them often imports Keras first), then leaves."""

    def __init__(self):
        self.loading = 0
        self.keras_loaded = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" and not fullname.startswith(__name__ + "."):
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
            self.keras_loaded |= fullname == "keras"
            if self.keras_loaded and not self.loading and self in _sys.meta_path:
                _sys.meta_path.remove(self)
                _register_serializable()

        spec.loader.exec_module = exec_then_register
        return spec


if "keras" in _sys.modules:
    _register_serializable()
elif not any(isinstance(f, _RegisterWithKeras) for f in _sys.meta_path):
    _sys.meta_path.insert(0, _RegisterWithKeras())
