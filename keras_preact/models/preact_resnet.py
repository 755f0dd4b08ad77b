"""`PreActResNet`: one config-driven pre-activation ResNet.

Every named network in the zoo is this class with different arguments (see
`keras_preact.models.cifar`). The graph is: optional preprocessing -> stem conv ->
stages of pre-activation units -> final BN-ReLU (the paper's last-unit rule) ->
pooling -> dense head.
"""

import inspect
import math
import os

import keras

from keras_preact.layers.blocks import BN_EPSILON
from keras_preact.layers.blocks import BN_MOMENTUM
from keras_preact.layers.blocks import BOTTLENECK_STRIDES
from keras_preact.layers.blocks import BLOCK_TYPES
from keras_preact.layers.blocks import check_layout
from keras_preact.layers.blocks import STRIDE_POSITIONS
from keras_preact.layers.blocks import PreActStage
from keras_preact.layers.preprocessing import ImageNormalization
from keras_preact.layers.preprocessing import resolve_preprocessing
from keras_preact.layers import variants
from keras_preact.layers.remat import check_remat
from keras_preact.layers.utils import check_known_arguments
from keras_preact.layers.utils import normalize_data_format

BLOCKS = BLOCK_TYPES
#: Stems: "cifar" is a single conv (the paper's CIFAR nets); "imagenet" is conv, BN,
#: ReLU and a 3x3 stride-2 max pool (the paper's ImageNet nets, Section 5), with
#: symmetric padding as in Torch; "imagenet_preact" is the conv and the max pool
#: with no BN or ReLU between them (keras.applications ResNetV2: the first unit's
#: pre-activation normalises the stem's output).
STEMS = ("cifar", "imagenet", "imagenet_preact")
#: The stems that end in the 3x3 stride-2 max pool.
POOLED_STEMS = ("imagenet", "imagenet_preact")
POOLINGS = (None, "avg", "max")


def _positive_int_tuple(name, value):
    try:
        out = tuple(value)
    except TypeError:
        raise ValueError(
            f"`{name}` must be a sequence of positive integers. Received: {name}={value!r}"
        ) from None
    if not out or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(
            f"`{name}` must be a non-empty sequence of positive integers. "
            f"Received: {name}={value!r}"
        )
    return out


def validate_config(
    *,
    block,
    stage_blocks,
    stage_filters,
    stage_strides,
    stem_filters,
    stem_kernel_size,
    stem_strides,
    bottleneck_stride,
    bottleneck_expansion,
    include_top,
    pooling,
    classes,
    classifier_activation,
    input_shape,
    data_format,
    unit=variants.DEFAULT_UNIT,
    shortcut_scale=None,
    residual_scale=None,
    gate_bias=None,
    dropout_rate=None,
    stem="cifar",
    stride_position="first",
    strided_shortcut="projection",
    conv_bias=False,
):
    """Checks every `PreActResNet` argument before any layer is built.

    Returns:
        dict of the normalised values: stage tuples, data_format and the full input
        shape (with the channel count, which may be None for an unknown size).

    Raises:
        ValueError: naming the argument, the value received and what is valid.
    """
    if block not in BLOCKS:
        raise ValueError(
            f"Unknown `block`. Received: block={block!r}. Valid: {sorted(BLOCKS)}"
        )
    variants.resolve_unit_options(
        unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
        gate_bias=gate_bias, dropout_rate=dropout_rate,
    )
    stage_blocks = _positive_int_tuple("stage_blocks", stage_blocks)
    stage_filters = _positive_int_tuple("stage_filters", stage_filters)
    stage_strides = _positive_int_tuple("stage_strides", stage_strides)
    if not len(stage_blocks) == len(stage_filters) == len(stage_strides):
        raise ValueError(
            "`stage_blocks`, `stage_filters` and `stage_strides` must have one entry "
            f"per stage. Received: stage_blocks={stage_blocks}, stage_filters="
            f"{stage_filters}, stage_strides={stage_strides}"
        )
    for name, value in (
        ("stem_filters", stem_filters),
        ("stem_kernel_size", stem_kernel_size),
        ("stem_strides", stem_strides),
        ("bottleneck_expansion", bottleneck_expansion),
    ):
        _positive_int_tuple(name, (value,))
    if block == "bottleneck":
        bad = [f for f in stage_filters if f % bottleneck_expansion]
        if bad:
            raise ValueError(
                "Bottleneck stage widths must be divisible by `bottleneck_expansion`. "
                f"Received: stage_filters={stage_filters}, "
                f"bottleneck_expansion={bottleneck_expansion}"
            )
    if bottleneck_stride not in BOTTLENECK_STRIDES:
        raise ValueError(
            f"`bottleneck_stride` must be one of {BOTTLENECK_STRIDES}. "
            f"Received: bottleneck_stride={bottleneck_stride!r}"
        )
    if not isinstance(include_top, bool):
        raise ValueError(
            f"`include_top` must be True or False. Received: include_top={include_top!r}"
        )
    if pooling not in POOLINGS:
        raise ValueError(
            f"`pooling` must be one of {POOLINGS}. Received: pooling={pooling!r}"
        )
    if include_top:
        if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
            raise ValueError(
                "`classes` must be an integer >= 1 when include_top=True. "
                f"Received: classes={classes!r}"
            )
        if classifier_activation is not None:
            try:
                keras.activations.get(classifier_activation)
            except (ValueError, TypeError):
                raise ValueError(
                    "Unknown `classifier_activation`. Received: classifier_activation="
                    f"{classifier_activation!r}. Valid: None, 'softmax', 'sigmoid', "
                    "'linear' or any keras.activations name"
                ) from None
    data_format = normalize_data_format(data_format)
    if stem not in STEMS:
        raise ValueError(f"Unknown `stem`. Received: stem={stem!r}. Valid: {list(STEMS)}")
    if stride_position not in STRIDE_POSITIONS:
        raise ValueError(
            f"`stride_position` must be one of {STRIDE_POSITIONS}. "
            f"Received: stride_position={stride_position!r}"
        )
    if stride_position == "last":
        short = [i + 1 for i, (n, s) in enumerate(zip(stage_blocks, stage_strides)) if s > 1 and n < 2]
        if short:
            raise ValueError(
                "stride_position='last' strides in a unit after the first, so every "
                f"strided stage needs at least 2 units. Received: stage_blocks={stage_blocks}, "
                f"stage_strides={stage_strides} (stages {short})"
            )
    check_layout(strided_shortcut=strided_shortcut, conv_bias=conv_bias, unit=unit)

    # The ImageNet stems' max pool halves the size once more.
    total_stride = stem_strides * (2 if stem in POOLED_STEMS else 1) * math.prod(stage_strides)
    min_size = 2 * total_stride
    if input_shape is None:
        input_shape = (None, None, 3) if data_format == "channels_last" else (3, None, None)
    try:
        input_shape = tuple(None if d is None else int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError(
            f"`input_shape` must be a tuple of 3 ints (or None for a free size). "
            f"Received: input_shape={input_shape!r}"
        ) from None
    if len(input_shape) != 3:
        raise ValueError(
            "`input_shape` must have 3 dimensions (height, width, channels) for "
            "channels_last or (channels, height, width) for channels_first. "
            f"Received: input_shape={input_shape}"
        )
    if data_format == "channels_last":
        height, width, channels = input_shape
    else:
        channels, height, width = input_shape
    if channels is None or channels < 1:
        raise ValueError(
            f"The channel dimension of `input_shape` must be a positive int. "
            f"Received: input_shape={input_shape} (data_format={data_format!r})"
        )
    for size in (height, width):
        if size is not None and size < min_size:
            raise ValueError(
                f"`input_shape` is too small: this network downsamples by "
                f"{total_stride}, so height and width must be at least {min_size}. "
                f"Received: input_shape={input_shape} (data_format={data_format!r})"
            )
    return {
        "stage_blocks": stage_blocks,
        "stage_filters": stage_filters,
        "stage_strides": stage_strides,
        "data_format": data_format,
        "input_shape": input_shape,
        "channels": channels,
        "min_size": min_size,
    }


def _head_dtype(dtype):
    """The final activation's dtype: float32, or float64 under a float64 policy."""
    if dtype is not None and keras.dtype_policies.get(dtype).compute_dtype == "float64":
        return "float64"
    return "float32"


def _zero_last_convs(model):
    """Sets the last conv kernel of every residual branch to zero (`zero_init_last`)."""
    for stage in model.layers:
        if not isinstance(stage, PreActStage):
            continue
        for unit in (stage.unit1, stage.unit_last):
            if unit is not None:
                kernel = unit.get_variable(f"{unit.spec.convs[-1][0]}_kernel")
                kernel.assign(keras.ops.zeros(kernel.shape, kernel.dtype))
        if stage.num_stacked:
            kernel = stage.get_variable(f"{stage.repeat_spec.convs[-1][0]}_kernel")
            kernel.assign(keras.ops.zeros(kernel.shape, kernel.dtype))


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNet(keras.Model):
    """A pre-activation ResNet (He et al. 2016), driven entirely by its arguments.

    The first unit after the stem applies its BN-ReLU before the split (its shortcut
    sees the activated stem output; `first_unit_shared_preact`), every unit keeps
    nothing after its addition, and the last unit is followed by one extra BN-ReLU,
    global pooling and the dense head (paper Section 4 and its official code).

    Args:
        block: "basic" (two 3x3 convs) or "bottleneck" (1x1, 3x3, 1x1).
        stage_blocks: units per stage, e.g. (18, 18, 18) for ResNet-110.
        stage_filters: output width of each stage, e.g. (16, 32, 64) basic,
            (64, 128, 256) bottleneck.
        stage_strides: stride of each stage, default (1, 2, 2); on its first unit
            unless `stride_position="last"`.
        stem_filters: width of the stem conv, default 16.
        stem_kernel_size: default 3.
        stem_strides: default 1.
        stem: "cifar" (default: the conv alone), "imagenet" (the conv with
            symmetric padding, then BN, ReLU and a 3x3 stride-2 max pool; use with
            ``stem_kernel_size=7, stem_strides=2, stem_filters=64``) or
            "imagenet_preact" (the same conv and zero-padded max pool with no BN or
            ReLU between them, as keras.applications ResNetV2).
        bottleneck_stride: "middle" (default, the 3x3 conv; pytorchcv/timm and the
            published CIFAR weights) or "first" (the first 1x1; the official code).
        bottleneck_expansion: output width / inner width of a bottleneck, default 4.
        first_unit_shared_preact: bool, default True. Whether the very first unit
            shares its BN-ReLU with the shortcut even when the shortcut is an
            identity (the paper's code does; pytorchcv's basic CIFAR nets do not, so
            their converter sets False). Units with a projection always share it.
        include_top: bool, default True: add pooling and the dense classifier.
        pooling: None, "avg" or "max". With include_top=False: None returns the 4D
            feature map, "avg"/"max" a pooled vector. With include_top=True the head
            uses global average pooling unless "max" is given.
        classes: int >= 1, default 10 (with include_top=True).
        classifier_activation: default "softmax"; None returns logits.
        preprocessing: None, a preset name ("symmetric", "unit", "cifar10",
            "cifar100", "imagenet") or a dict with "mean", "std" and optional
            "scale"; see `keras_preact.layers.preprocessing`. Built into the model so
            it takes raw [0, 255] pixels.
        input_shape: (height, width, channels) (channels first for channels_first);
            None means (None, None, 3). Height and width must be at least twice
            the total stride (8 for the CIFAR networks).
        input_tensor: optional Keras tensor to use as the input. Not serialised:
            a reloaded model gets a fresh `keras.Input`.
        data_format: "channels_last" or "channels_first"; None uses
            `keras.config.image_data_format()`.
        kernel_initializer: default "he_normal".
        zero_init_last: bool, default False (the paper's He initialisation of every
            conv). True starts the last conv of every residual branch at zero, as
            timm's `zero_init_last`, so each unit starts as the identity. An
            untrained ResNet-1001 in inference mode overflows to NaN: over 333
            identity units the activations grow past float32 (a PyTorch model of
            the same initialisation does too); with True its outputs are finite.
        bn_momentum: default 0.9; bn_epsilon: default 1e-5 (Torch's defaults).
        synchronized_bn: bool, default False. Cross-replica BatchNorm statistics
            under `tf.distribute` (TensorFlow only). By default each replica
            normalises with the statistics of its own per-replica batch; with True
            every replica uses the statistics of the global batch.
        unit: the residual unit, one of `keras_preact.layers.UNIT_TYPES`; default
            "full_preact" (Fig. 4e). The others are the units the paper compares
            (Fig. 2 / Table 1, Fig. 4 / Table 2; see `keras_preact.layers.variants`).
            Units with a ReLU after the addition (the 2015 "original" design and its
            shortcut variants) get a conv-BN-ReLU stem and nothing after the last
            unit, as in He et al. 2015; "relu_only_preact" gets a plain conv stem and
            a final ReLU (its pre-activation has no BN).
        shortcut_scale, residual_scale: the lambdas of unit="constant_scaling"
            (None: 0.5 and 0.5, the paper's only converging setting).
        gate_bias: initial gate bias b_g of the gating units (None: -6).
        dropout_rate: shortcut drop rate of unit="dropout_shortcut" (None: 0.5).
        stride_position: "first" (default) or "last": which unit of a stage
            carries its stride. "first" is the paper's; "last" is
            keras.applications ResNet50V2/101V2/152V2, whose stages stride
            (2, 2, 2, 1) on their last unit; the strided last unit is a sub-layer
            "unit_last" of its `PreActStage`. Strided stages then need >= 2 units.
        strided_shortcut: "projection" (default: a strided unit gets a 1x1
            projection shortcut, the paper's rule) or "subsample": a strided unit
            that keeps its width gets an identity shortcut that keeps every s-th
            pixel of its raw input (keras.applications' ``MaxPooling2D(1, s)``).
        conv_bias: bool, default False. True adds a bias to the convs that no
            BatchNorm follows: each unit's last conv and projection shortcut, and
            the stem conv unless the stem has a BN (keras.applications ResNetV2).
            unit="full_preact" only.
        remat: rematerialisation (gradient checkpointing) of each stage's stacked
            units in training, to train deep networks in little memory: None/False
            (off, default), True or "segment" (about sqrt(n) checkpoints a stage),
            "unit" (one a unit) or an int N (segments of N units). Outputs,
            gradients and moving statistics equal the plain path's; a training
            step costs about one extra forward pass. TensorFlow (also under
            `fit`), JAX and PyTorch; see `keras_preact.layers.remat`.
        dtype: optional dtype policy for every layer (e.g. "mixed_bfloat16" or
            "float64"). The final activation computes in float32 at least.
        name: model name, default "preact_resnet".
        **kwargs: the base `keras.Model` argument `trainable`; any other name
            raises ValueError.

    Example:
        >>> model = PreActResNet(block="basic", stage_blocks=(3, 3, 3),
        ...                      stage_filters=(16, 32, 64), input_shape=(32, 32, 3))
        >>> model.count_params()
        272282
        >>> # keras.applications ResNet50V2's layout (its weights load into it):
        >>> from keras_preact.weights.converters.keras_applications import KERAS_LAYOUT
        >>> keras_preact.preact_resnet50(**KERAS_LAYOUT).count_params()
        25613800
    """

    def __init__(
        self,
        *,
        block="basic",
        stage_blocks=(3, 3, 3),
        stage_filters=(16, 32, 64),
        stage_strides=(1, 2, 2),
        stem_filters=16,
        stem_kernel_size=3,
        stem_strides=1,
        stem="cifar",
        bottleneck_stride="middle",
        bottleneck_expansion=4,
        first_unit_shared_preact=True,
        include_top=True,
        pooling=None,
        classes=10,
        classifier_activation="softmax",
        preprocessing=None,
        input_shape=None,
        input_tensor=None,
        data_format=None,
        kernel_initializer="he_normal",
        zero_init_last=False,
        bn_momentum=BN_MOMENTUM,
        bn_epsilon=BN_EPSILON,
        synchronized_bn=False,
        unit=variants.DEFAULT_UNIT,
        shortcut_scale=None,
        residual_scale=None,
        gate_bias=None,
        dropout_rate=None,
        stride_position="first",
        strided_shortcut="projection",
        conv_bias=False,
        remat=None,
        dtype=None,
        name="preact_resnet",
        **kwargs,
    ):
        check_known_arguments(kwargs, MODEL_ARGUMENTS, where="PreActResNet")
        if not isinstance(zero_init_last, bool):
            raise ValueError(
                f"`zero_init_last` must be True or False. Received: zero_init_last={zero_init_last!r}"
            )
        checked = validate_config(
            block=block,
            stage_blocks=stage_blocks,
            stage_filters=stage_filters,
            stage_strides=stage_strides,
            stem_filters=stem_filters,
            stem_kernel_size=stem_kernel_size,
            stem_strides=stem_strides,
            stem=stem,
            bottleneck_stride=bottleneck_stride,
            bottleneck_expansion=bottleneck_expansion,
            include_top=include_top,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            input_shape=input_shape,
            data_format=data_format,
            unit=unit,
            shortcut_scale=shortcut_scale,
            residual_scale=residual_scale,
            gate_bias=gate_bias,
            dropout_rate=dropout_rate,
            stride_position=stride_position,
            strided_shortcut=strided_shortcut,
            conv_bias=conv_bias,
        )
        resolved_preprocessing = resolve_preprocessing(preprocessing)
        remat = check_remat(remat, unit)
        data_format = checked["data_format"]
        channel_axis = -1 if data_format == "channels_last" else 1

        # --- graph (layer creation order is frozen: weights files depend on it) ---
        if input_tensor is None:
            inputs = keras.Input(shape=checked["input_shape"], name="images")
        else:
            inputs = input_tensor
        x = inputs
        if resolved_preprocessing is not None:
            scale, mean, std = resolved_preprocessing
            x = ImageNormalization(
                scale=scale,
                mean=mean,
                std=std,
                data_format=data_format,
                dtype=dtype,
                name="preprocessing",
            )(x)
        stem_padding = "same"
        if stem in POOLED_STEMS and stem_strides > 1:
            # Torch pads (k - 1) // 2 on every side; Keras' "same" would pad only
            # bottom/right of an even input and shift the grid of converted weights.
            x = keras.layers.ZeroPadding2D(
                (stem_kernel_size - 1) // 2, data_format=data_format, dtype=dtype,
                name="stem_pad",
            )(x)
            stem_padding = "valid"
        # conv_bias: a bias where no BN follows the stem conv (only "imagenet" has one).
        x = keras.layers.Conv2D(
            stem_filters,
            stem_kernel_size,
            strides=stem_strides,
            padding=stem_padding,
            use_bias=conv_bias and stem != "imagenet",
            kernel_initializer=kernel_initializer,
            data_format=data_format,
            dtype=dtype,
            name="stem_conv",
        )(x)
        if stem == "imagenet" or unit not in variants.PREACTIVATION_UNITS:
            # He et al. 2015: a conv-BN-ReLU stem, since these units start with a
            # conv (Fig. 4a-c and the Fig. 2 shortcut variants).
            x = keras.layers.BatchNormalization(
                axis=channel_axis,
                momentum=bn_momentum,
                epsilon=bn_epsilon,
                synchronized=synchronized_bn,
                dtype=dtype,
                name="stem_bn",
            )(x)
            x = keras.layers.Activation("relu", dtype=dtype, name="stem_relu")(x)
        if stem in POOLED_STEMS:
            # After the ReLU every value is >= 0, so zero padding acts as Torch's
            # -inf padding for the max. "imagenet_preact" has no ReLU there: its
            # zeros can win the max at the border, exactly as in keras.applications
            # ResNetV2 (pool1_pad + pool1_pool), whose weights expect it.
            x = keras.layers.ZeroPadding2D(1, data_format=data_format, dtype=dtype,
                                           name="stem_pool_pad")(x)
            x = keras.layers.MaxPooling2D(3, strides=2, data_format=data_format,
                                          dtype=dtype, name="stem_pool")(x)
        stage_kwargs = dict(
            kernel_initializer=kernel_initializer,
            bn_momentum=bn_momentum,
            bn_epsilon=bn_epsilon,
            synchronized=synchronized_bn,
            data_format=data_format,
            dtype=dtype,
        )
        if block == "bottleneck":
            stage_kwargs.update(expansion=bottleneck_expansion, bottleneck_stride=bottleneck_stride)
        if unit != variants.DEFAULT_UNIT:
            # Only non-default units get the keys, so the default graph is unchanged.
            stage_kwargs.update(
                unit=unit, shortcut_scale=shortcut_scale, residual_scale=residual_scale,
                gate_bias=gate_bias, dropout_rate=dropout_rate,
            )
        for key, value, default in (("stride_position", stride_position, "first"),
                                    ("strided_shortcut", strided_shortcut, "projection"),
                                    ("conv_bias", conv_bias, False),
                                    ("remat", remat, None)):
            if value != default:
                stage_kwargs[key] = value
        for stage, (num_units, filters, stride) in enumerate(
            zip(checked["stage_blocks"], checked["stage_filters"], checked["stage_strides"]),
            start=1,
        ):
            # First-unit rule: the activation goes before the split (shared with the
            # shortcut) in the very first unit after the stem.
            first_shared = True if (stage == 1 and first_unit_shared_preact) else None
            if unit not in variants.PREACTIVATION_UNITS:
                first_shared = None  # no pre-activation to share
            x = PreActStage(
                block,
                filters,
                num_units,
                strides=stride,
                first_shared_preact=first_shared,
                name=f"stage{stage}",
                **stage_kwargs,
            )(x)
        # Last-unit rule: one BN-ReLU after the final addition (the unit's own
        # activation: ReLU only for Fig. 4d; nothing for units that end in a ReLU).
        # Deviation: for "relu_before_addition" (Fig. 4c) the paper does not say
        # what follows the last unit; like the original design, nothing does.
        if unit == variants.DEFAULT_UNIT:
            x = keras.layers.BatchNormalization(
                axis=channel_axis,
                momentum=bn_momentum,
                epsilon=bn_epsilon,
                synchronized=synchronized_bn,
                dtype=dtype,
                name="post_bn",
            )(x)
        if unit in variants.PREACTIVATION_UNITS:
            x = keras.layers.Activation("relu", dtype=dtype, name="post_relu")(x)
        if include_top:
            pool = keras.layers.GlobalMaxPooling2D if pooling == "max" else keras.layers.GlobalAveragePooling2D
            x = pool(data_format=data_format, dtype=dtype, name="pool")(x)
            x = keras.layers.Dense(classes, dtype=dtype, name="logits")(x)
            # Float32 (at least) so softmax stays accurate under mixed precision.
            x = keras.layers.Activation(
                classifier_activation, dtype=_head_dtype(dtype),
                name="predictions",
            )(x)
        elif pooling == "avg":
            x = keras.layers.GlobalAveragePooling2D(
                data_format=data_format, dtype=dtype, name="pool"
            )(x)
        elif pooling == "max":
            x = keras.layers.GlobalMaxPooling2D(
                data_format=data_format, dtype=dtype, name="pool"
            )(x)
        super().__init__(inputs=inputs, outputs=x, name=name, **kwargs)
        if zero_init_last:
            _zero_last_convs(self)

        # --- config (exactly the constructor's arguments) ---
        self.block = block
        self.stage_blocks = checked["stage_blocks"]
        self.stage_filters = checked["stage_filters"]
        self.stage_strides = checked["stage_strides"]
        self.stem_filters = stem_filters
        self.stem_kernel_size = stem_kernel_size
        self.stem_strides = stem_strides
        self.stem = stem
        self.bottleneck_stride = bottleneck_stride
        self.bottleneck_expansion = bottleneck_expansion
        self.first_unit_shared_preact = first_unit_shared_preact
        self.include_top = include_top
        self.pooling = pooling
        self.classes = classes
        self.classifier_activation = classifier_activation
        self.preprocessing = preprocessing
        self.data_format = data_format
        self.kernel_initializer = kernel_initializer
        self.zero_init_last = zero_init_last
        self.bn_momentum = bn_momentum
        self.bn_epsilon = bn_epsilon
        self.synchronized_bn = synchronized_bn
        self.unit = unit
        self.shortcut_scale = shortcut_scale
        self.residual_scale = residual_scale
        self.gate_bias = gate_bias
        self.dropout_rate = dropout_rate
        self.stride_position = stride_position
        self.strided_shortcut = strided_shortcut
        self.conv_bias = conv_bias
        self.remat = remat
        self._input_shape_arg = checked["input_shape"]
        self._dtype_arg = dtype

    @property
    def depth(self):
        """Weighted layers counted as in the paper: convs on the main path + the head."""
        convs_per_unit = 2 if self.block == "basic" else 3
        return 1 + convs_per_unit * sum(self.stage_blocks) + 1

    def get_config(self):
        dtype = self._dtype_arg
        if dtype is not None and not isinstance(dtype, str):
            dtype = keras.dtype_policies.serialize(dtype)
        return {
            "block": self.block,
            "stage_blocks": list(self.stage_blocks),
            "stage_filters": list(self.stage_filters),
            "stage_strides": list(self.stage_strides),
            "stem_filters": self.stem_filters,
            "stem_kernel_size": self.stem_kernel_size,
            "stem_strides": self.stem_strides,
            "stem": self.stem,
            "bottleneck_stride": self.bottleneck_stride,
            "bottleneck_expansion": self.bottleneck_expansion,
            "first_unit_shared_preact": self.first_unit_shared_preact,
            "include_top": self.include_top,
            "pooling": self.pooling,
            "classes": self.classes,
            "classifier_activation": self.classifier_activation,
            "preprocessing": self.preprocessing,
            "input_shape": list(self._input_shape_arg),
            "input_tensor": None,
            "data_format": self.data_format,
            "kernel_initializer": self.kernel_initializer
            if isinstance(self.kernel_initializer, str)
            else keras.initializers.serialize(
                keras.initializers.get(self.kernel_initializer)
            ),
            "zero_init_last": self.zero_init_last,
            "bn_momentum": self.bn_momentum,
            "bn_epsilon": self.bn_epsilon,
            "synchronized_bn": self.synchronized_bn,
            "unit": self.unit,
            "shortcut_scale": self.shortcut_scale,
            "residual_scale": self.residual_scale,
            "gate_bias": self.gate_bias,
            "dropout_rate": self.dropout_rate,
            "stride_position": self.stride_position,
            "strided_shortcut": self.strided_shortcut,
            "conv_bias": self.conv_bias,
            "remat": self.remat,
            "dtype": dtype,
            "name": self.name,
            "trainable": self.trainable,
        }

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        """`keras.Model.save_weights`; a `.weights.h5` file also records the
        architecture arguments, the preprocessing and the input shape, so that
        ``get_model(name, weights=filepath)`` rebuilds this model from the file
        alone (any Keras still loads it as a plain weights file)."""
        super().save_weights(filepath, overwrite=overwrite, max_shard_size=max_shard_size)
        if str(filepath).endswith(".weights.h5") and os.path.isfile(filepath):
            from keras_preact.weights.local import record_model

            record_model(self, filepath)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if isinstance(config.get("dtype"), dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


#: Every keyword argument `PreActResNet` accepts (the base `keras.Model` takes
#: `trainable`), for the unknown-argument checks of the model and its factories.
MODEL_ARGUMENTS = frozenset(
    set(inspect.signature(PreActResNet.__init__).parameters) - {"self", "kwargs"}
) | {"trainable"}
