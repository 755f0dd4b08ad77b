"""keras-hub classes for every network of the registry, and presets keras-hub loads whole.

`PreActResNetBackbone` is a keras-hub `FeaturePyramidBackbone`: it takes `PreActResNet`'s
architecture arguments, outputs the last stage's features (after the final BN-ReLU) and
hands every stage out as `pyramid_outputs`. On it sit the task pieces, as in keras-hub's own
model folders: `PreActResNetImageClassifier` with its preprocessor and image converter, and
`PreActResNetDeepLabV3ImageSegmenter`. `save_preset` writes a `PreActResNet` as a keras-hub
preset. Needs the ``hub`` extra (``pip install "keras-preact[hub]"``); ``import keras_preact``
loads this module as soon as keras-hub is imported, so its presets load by name.

    >>> import tempfile
    >>> import keras_hub, keras_preact
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = keras_preact.save_preset(keras_preact.preact_resnet20(), f"{tmp}/r20")
    ...     classifier = keras_hub.models.ImageClassifier.from_preset(path)
    >>> type(classifier).__name__
    'PreActResNetImageClassifier'
    >>> backbone = PreActResNetBackbone.from_preset("preact_resnet110.cifar10",
    ...                                             load_weights=False)  # a catalog key
    >>> sorted(backbone.pyramid_outputs)
    ['P0', 'P1', 'P2']
"""

import os

import keras

import keras_preact

try:
    import keras_hub
except ModuleNotFoundError:
    raise ModuleNotFoundError('keras_preact.hub needs keras-hub: pip install "keras-preact[hub]"',
                              name="keras_hub") from None

from keras_preact.architecture import HEAD_ARGUMENTS, HEAD_LAYER
from keras_preact.file_io import staged_folder, user_path
from keras_preact.models import PreActResNet
from keras_preact.models.preact_resnet import MODEL_ARGUMENTS
from keras_preact.weights import local, presets

PACKAGE = "keras_preact"  # part of every preset's "registered_name": never change it
#: `PreActResNet` arguments of a head or an input, which a backbone does not take.
NOT_BACKBONE = (*HEAD_ARGUMENTS, "input_shape", "input_tensor", "name", "trainable", "dtype")
BACKBONE_ARGUMENTS = tuple(sorted(MODEL_ARGUMENTS - set(NOT_BACKBONE)))
#: keras-hub's preset files (`save_preset` writes these only).
PRESET_FILES = ("config.json", "metadata.json", "model.weights.h5", "image_converter.json",
                "preprocessor.json", "task.json", "task.weights.h5")


def _presets_by_name(cls):
    """`cls.from_preset` also takes what `kp.from_preset` takes: a registered model name or
    a catalog key. (A decorator: keras-hub names a preset's tasks by the first base class.)"""

    def from_preset(klass, preset, load_weights=True, **kwargs):
        if presets.is_bare_name(preset):
            return to_keras_hub(keras_preact.from_preset(
                preset, load_weights=load_weights, **kwargs,
                include_top=issubclass(klass, keras_hub.models.Task)))
        presets.check_preset(preset, load_weights)  # one line for a damaged or missing file
        return super(cls, klass).from_preset(preset, load_weights=load_weights, **kwargs)

    cls.from_preset = classmethod(from_preset)
    return cls


@_presets_by_name
@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetBackbone(keras_hub.models.FeaturePyramidBackbone):
    """A pre-activation ResNet without its head, as a keras-hub backbone.

    Args:
        image_shape: tuple of 3 ints, the input's shape in its data format (None: a free
            size). Defaults to `(None, None, 3)`.
        dtype: dtype policy of the backbone and every layer. Defaults to `None`.
        **kwargs: `PreActResNet` architecture arguments (`BACKBONE_ARGUMENTS`: `block`,
            `stage_blocks`, `unit`, `preprocessing`, `data_format`, ...), and `name`,
            `trainable`.

    Raises:
        ValueError: for an invalid architecture argument, as `PreActResNet`.

    Example:
        >>> backbone = PreActResNetBackbone(stage_blocks=(3, 3, 3), image_shape=(32, 32, 3))
        >>> sorted(backbone.pyramid_outputs)
        ['P0', 'P1', 'P2']
    """

    def __init__(self, *, image_shape=(None, None, 3), dtype=None, **kwargs):
        arch = {k: kwargs.pop(k) for k in BACKBONE_ARGUMENTS if k in kwargs}
        trunk = PreActResNet(**arch, features=True, input_shape=image_shape, dtype=dtype)
        levels = trunk.pyramid_outputs
        super().__init__(inputs=trunk.input, outputs=[*levels.values()][-1], dtype=dtype, **kwargs)
        self.pyramid_outputs = levels
        trunk_config = trunk.get_config()
        self.architecture = {k: trunk_config[k] for k in BACKBONE_ARGUMENTS}
        self.image_shape, self.data_format = list(trunk_config["input_shape"]), trunk.data_format

    def get_config(self):
        return {**super().get_config(), **self.architecture, "image_shape": self.image_shape}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetImageConverter(keras_hub.layers.ImageConverter):
    """Resizes images to the backbone's input size (a backbone with `preprocessing` scales
    them itself)."""

    backbone_cls = PreActResNetBackbone

    def get_config(self):  # keras-hub 0.32's leaves data_format out
        return {**super().get_config(), "data_format": self.data_format}


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetImageClassifierPreprocessor(keras_hub.models.ImageClassifierPreprocessor):
    """keras-hub's image classifier preprocessor with `PreActResNetImageConverter`."""

    backbone_cls = PreActResNetBackbone
    image_converter_cls = PreActResNetImageConverter


@_presets_by_name
@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetImageClassifier(keras_hub.models.ImageClassifier):
    """keras-hub's image classifier (pooling, dense head) on a `PreActResNetBackbone`; the
    paper's head is ``pooling="avg"`` with ``activation="softmax"``."""

    backbone_cls = PreActResNetBackbone
    preprocessor_cls = PreActResNetImageClassifierPreprocessor


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetImageSegmenterPreprocessor(keras_hub.models.ImageSegmenterPreprocessor):
    """keras-hub's image segmenter preprocessor with `PreActResNetImageConverter`."""

    backbone_cls = PreActResNetBackbone
    image_converter_cls = PreActResNetImageConverter


@keras.saving.register_keras_serializable(package=PACKAGE)
class PreActResNetDeepLabV3ImageSegmenter(keras_hub.models.DeepLabV3ImageSegmenter):
    """keras-hub's DeepLabV3+ on a `PreActResNetBackbone`: atrous spatial pyramid pooling
    on its last level, the decoder fed by its first. ``DeepLabV3ImageSegmenter.from_preset``
    of a keras-preact preset builds it.

    Args:
        backbone: a `PreActResNetBackbone` (or keras-hub's `DeepLabV3Backbone` around one).
        num_classes: int, the number of segmentation classes.
        dilation_rates: sequence of ints, the pyramid pooling's rates (keras-hub's example:
            6, 12, 18), used when `backbone` is a `PreActResNetBackbone`.
            Defaults to `(6, 12, 18)`.
        **kwargs: `DeepLabV3ImageSegmenter`'s (`activation`, `preprocessor`, ...)."""

    backbone_cls = PreActResNetBackbone
    preprocessor_cls = PreActResNetImageSegmenterPreprocessor

    def __init__(self, backbone, num_classes, dilation_rates=(6, 12, 18), **kwargs):
        if isinstance(backbone, PreActResNetBackbone):
            low, top = list(backbone.pyramid_outputs)[0], list(backbone.pyramid_outputs)[-1]
            backbone = keras_hub.models.DeepLabV3Backbone(
                image_encoder=backbone, spatial_pyramid_pooling_key=top, low_level_feature_key=low,
                upsampling_size=2 ** (int(top[1:]) - int(low[1:])), dtype=backbone.dtype_policy,
                dilation_rates=list(dilation_rates), image_shape=backbone.image_shape)
        super().__init__(backbone=backbone, num_classes=num_classes, **kwargs)


def _converter(backbone):
    """The image converter of `backbone`: resizing to its input size, if it has one."""
    shape = backbone.image_shape
    size = shape[:2] if backbone.data_format == "channels_last" else shape[1:]
    return PreActResNetImageConverter(image_size=None if None in size else tuple(size),
                                      data_format=backbone.data_format)


def to_keras_hub(model):
    """The keras-hub twin of a `PreActResNet`, with equal weights and outputs.

    Args:
        model: a `PreActResNet`.

    Returns:
        A `PreActResNetImageClassifier` for a model with its head, else a
        `PreActResNetBackbone`.

    Raises:
        ValueError: if `model` is not a `PreActResNet`."""
    if not isinstance(model, PreActResNet):
        raise ValueError("to_keras_hub needs a PreActResNet (e.g. kp.preact_resnet20()). "
                         f"Received: model={type(model).__name__}")
    config = model.get_config()
    backbone = PreActResNetBackbone(**{k: config[k] for k in BACKBONE_ARGUMENTS},
                                    image_shape=config["input_shape"], dtype=config["dtype"])
    local.copy_weights_from_model(model, backbone, source_label=model.name)
    if not config["include_top"]:
        return backbone
    classifier = PreActResNetImageClassifier(
        backbone=backbone, num_classes=config["classes"], pooling=config["pooling"] or "avg",
        activation=config["classifier_activation"], dropout=config["head_dropout"] or 0.0,
        preprocessor=PreActResNetImageClassifierPreprocessor(image_converter=_converter(backbone)))
    classifier.output_dense.set_weights(model.get_layer(HEAD_LAYER).get_weights())
    return classifier


def save_preset(model, preset_dir, *, overwrite=False):
    """Saves a `PreActResNet` as a keras-hub preset folder; returns its absolute path.

    The folder holds `PreActResNetBackbone`'s ``config.json`` and ``model.weights.h5``,
    ``metadata.json`` and the image converter; a model with its head adds the classifier
    (``task.json``, ``task.weights.h5``, ``preprocessor.json``). keras-hub's
    `Backbone.from_preset`, `ImageClassifier.from_preset` (no `num_classes` needed) and
    `DeepLabV3ImageSegmenter.from_preset` load it, and so does `keras_preact.from_preset`.

    Args:
        model: a `PreActResNet`.
        preset_dir: str or `os.PathLike`, the folder; written whole (a temporary folder
            renamed into place).
        overwrite: bool, replace the preset the folder holds. Defaults to `False`.

    Returns:
        str: the preset folder's absolute path.

    Raises:
        FileExistsError: for an existing preset without `overwrite` (nothing is written).
        ValueError: for a folder that holds other files or a model that is not a
            `PreActResNet` (nothing is written).
        TypeError: if `preset_dir` is not a path."""
    path, twin = user_path(preset_dir, "preset_dir"), to_keras_hub(model)

    def check():
        if not os.path.exists(path):
            return
        if not (os.path.isdir(path) and set(os.listdir(path)) <= set(PRESET_FILES)):
            raise ValueError(f"Refusing to write a preset into {path!r}: it is a file or a folder "
                             "of other files; choose an empty or new folder. "
                             f"Received: preset_dir={path!r}")
        if os.listdir(path) and not overwrite:
            raise FileExistsError(f"A preset already exists at {path!r}; pass overwrite=True "
                                  "to replace it.")

    with staged_folder(path, check=check, what="a preset", name="preset_dir") as staging:
        twin.save_to_preset(staging)
        if isinstance(twin, PreActResNetBackbone):  # the task pieces read the converter
            _converter(twin).save_to_preset(staging)
    return path
