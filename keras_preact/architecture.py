"""The arguments of a `PreActResNet` in one typed, frozen record, `Architecture` (each
field: its name, its default and whether it changes what the weights mean), and the names
of the layers other modules look up. The model builds from the record; its config, the
weights files, presets, keras-hub's backbone and the factories read it: a new argument is
a field here and its use where the model is built. Imports nothing of the package."""

import dataclasses

#: `head` of a field: it shapes the classifier (a backbone, such as keras-hub's, leaves it
#: to its task). `weights` of a field: RECORDED in every `.weights.h5` keras-preact saves (it
#: changes what the weights mean, even at equal shapes); RECORDED_IF_SET only when not at its
#: default (files saved before it existed lack it); None, the weights mean the same.
RECORDED, RECORDED_IF_SET = "recorded", "recorded_if_set"


def _argument(default, weights=None, *, head=False):
    return dataclasses.field(default=default, metadata={"weights": weights, "head": head})


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Every `PreActResNet` argument but `input_tensor` and `name` (see `PreActResNet`).
    The model keeps the checked and completed record as `model.spec`."""

    block: str = _argument("basic", RECORDED)
    stage_blocks: tuple = _argument((3, 3, 3), RECORDED)
    stage_filters: tuple = _argument((16, 32, 64), RECORDED)
    stage_strides: tuple = _argument((1, 2, 2), RECORDED)
    stem_filters: int = _argument(16, RECORDED)
    stem_kernel_size: int = _argument(3, RECORDED)
    stem_strides: int = _argument(1, RECORDED)
    bottleneck_stride: str = _argument("middle", RECORDED)
    bottleneck_expansion: int = _argument(4, RECORDED)
    first_shared_preact: bool = _argument(True, RECORDED)
    stride_position: str = _argument("first", RECORDED_IF_SET)
    strided_shortcut: str = _argument("projection", RECORDED_IF_SET)
    conv_bias: bool = _argument(False, RECORDED_IF_SET)
    stem: str = _argument("cifar", RECORDED_IF_SET)
    include_top: bool = _argument(True, head=True)
    pooling: str | None = _argument(None, head=True)
    features: bool = _argument(False, head=True)
    classes: int = _argument(10, head=True)
    classifier_activation: object = _argument("softmax", head=True)
    head_dropout: float | None = _argument(None, head=True)
    preprocessing: object = _argument(None)
    input_shape: tuple | None = _argument(None)
    data_format: str | None = _argument(None)
    kernel_initializer: object = _argument("he_normal")
    zero_init_last: bool = _argument(False)
    bn_momentum: float = _argument(0.9)
    bn_epsilon: float = _argument(1e-5)
    synchronized_bn: bool = _argument(False)
    unit: str = _argument("full_preact")
    shortcut_scale: float | None = _argument(None)
    residual_scale: float | None = _argument(None)
    gate_bias: float | None = _argument(None)
    dropout_rate: float | None = _argument(None)
    stochastic_depth: float = _argument(0.0)
    remat: object = _argument(None)
    dtype: object = _argument(None)


_FIELDS = dataclasses.fields(Architecture)
#: Every field name, in the record's order.
ARGUMENTS = tuple(f.name for f in _FIELDS)
#: Field name -> default.
DEFAULTS = {f.name: f.default for f in _FIELDS}
#: The fields every `.weights.h5` records, and those recorded when not at their default.
WEIGHTS_ARGUMENTS = tuple(f.name for f in _FIELDS if f.metadata["weights"] == RECORDED)
WEIGHTS_ARGUMENTS_IF_SET = tuple(f.name for f in _FIELDS
                                 if f.metadata["weights"] == RECORDED_IF_SET)
#: The fields of the head (`include_top`, `classes`, ...).
HEAD_ARGUMENTS = tuple(f.name for f in _FIELDS if f.metadata["head"])

#: The model's layers that other modules look up by name.
INPUT_NAME = "images"
PREPROCESSING_LAYER = "preprocessing"
STEM_CONV_LAYER = "stem_conv"
POOL_LAYER = "pool"
HEAD_LAYER = "logits"
PREDICTIONS_LAYER = "predictions"
#: Where a `.weights.h5` holds the stem convolution's kernel and the classifier's variables
#: (Keras names a file's layers by class and creation order: the first `Conv2D`, the
#: `Dense`, whose ``vars/0`` is the kernel and ``vars/1`` the bias).
STEM_KERNEL_PATH = "layers/conv2d/vars/0"
HEAD_PATH = "layers/dense/"
