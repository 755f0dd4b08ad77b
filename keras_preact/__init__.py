"""keras-preact: pre-activation ResNets (He et al. 2016) for Keras 3.

Works on the TensorFlow, JAX and PyTorch backends. `import keras_preact` is cheap: the
public names load on first use, and the classes that saved files reference
(`PreActResNet`, its layers, the training recipe's optimizer and schedule) are
registered with Keras as soon as Keras is imported, before or after keras_preact, so
`keras.saving.load_model` reads every file keras-preact writes.

Imported before TensorFlow, it sets `TF_ENABLE_ONEDNN_OPTS=1` unless that variable is
already set: TensorFlow's oneDNN CPU kernels, which it enables by itself only on CPUs
with AVX-512/AMX features, trained ResNet-110 1.5-1.9x faster on an AVX2 CPU. Set
`TF_ENABLE_ONEDNN_OPTS=0` to keep TensorFlow's Eigen kernels.

Example:
    >>> import keras_preact
    >>> model = keras_preact.preact_resnet110(classes=10)
    >>> keras_preact.list_models()[:3]
    ['preact_resnet20', 'preact_resnet32', 'preact_resnet44']
"""

__version__ = "0.1.0"

import importlib as _importlib
import importlib.abc as _importlib_abc
import importlib.util as _importlib_util
import os as _os
import sys as _sys

# TensorFlow runs its oneDNN CPU kernels by default only on CPUs with AVX-512/AMX
# features. On an AVX2 CPU they trained ResNet-110 1.5-1.9x faster than its Eigen
# kernels (README, "Performance"), so unless the environment says otherwise they are
# turned on here. TensorFlow reads the switch once, when it is imported: this works
# only when keras_preact is imported before TensorFlow (or Keras on that backend).
# `TF_ENABLE_ONEDNN_OPTS=0` keeps the Eigen kernels.
if "tensorflow" not in _sys.modules:
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_MODELS = "keras_preact.models"
#: Public name -> the module that defines it (PEP 562: loaded on first use, so that
#: `import keras_preact` and `keras-preact --help` start without Keras or TensorFlow).
_LAZY = {
    **{name: _MODELS for name in (
        "PreActResNet", "count_macs", "count_params", "get_model", "list_models",
        "model_info", "register_model", "preact_resnet_cifar", "preact_resnet_imagenet",
        "preact_resnet20", "preact_resnet32", "preact_resnet44", "preact_resnet56",
        "preact_resnet110", "preact_resnet164", "preact_resnet272", "preact_resnet542",
        "preact_resnet1001", "preact_resnet1202", "preact_resnet18", "preact_resnet34",
        "preact_resnet50", "preact_resnet101", "preact_resnet152", "preact_resnet200",
    )},
    "CoupledSGD": "keras_preact.training.optimizers",
    "WarmupPiecewiseConstant": "keras_preact.training.schedules",
}
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
    """Loads a `.keras` model file, such as a training run's `model.keras`.

    `keras.saving.load_model` with safe mode on: a file holding a Lambda layer, which
    would run arbitrary code, is refused. (Keras' own `load_model` reads keras-preact's
    files too, once keras_preact is imported.)

    Args:
        path: str or `os.PathLike`, a `.keras` file.
        compile: bool, default True: restore the optimizer and loss the file was
            compiled with.
        safe_mode: bool, default True.

    Returns:
        The Keras model.

    Example:
        >>> model = keras_preact.load_model("runs/demo/model.keras")
    """
    import keras

    return keras.saving.load_model(path, compile=compile, safe_mode=safe_mode)


def _register_serializable():
    for module in _SERIALIZABLE:
        _importlib.import_module(module)


class _RegisterWithKeras(_importlib_abc.MetaPathFinder):
    """Registers keras-preact's classes with Keras once Keras is imported.

    Keras finds a saved file's custom classes only among those registered (its
    import-by-module fallback covers Keras' own packages), and registering them needs
    Keras, which `import keras_preact` does not load. So this finder wraps the loading
    of `keras` and of keras_preact's own modules: when Keras has loaded and no
    keras_preact module is still loading (Keras is often first imported by one of
    them), the serializable modules are imported and the finder leaves.
    """

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
