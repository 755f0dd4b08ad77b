"""`PreActResNet`: one config-driven pre-activation ResNet; every named network of
the zoo is this class with different arguments (`keras_preact.models.cifar`)."""

import contextlib
import dataclasses
import inspect
import math
import os

import keras

from keras_preact.architecture import (
    ARGUMENTS, DEFAULTS, HEAD_LAYER, INPUT_NAME, POOL_LAYER, PREDICTIONS_LAYER, PREPROCESSING_LAYER,
    STEM_CONV_LAYER, Architecture)
from keras_preact.checks import (check_bool, check_choice, check_int, check_known_arguments, is_int,
                                 pop_deprecated)
from keras_preact.layers import variants
from keras_preact.layers.blocks import (
    BLOCK_TYPES, check_stride_position, check_unit_arguments, PreActStage)
from keras_preact.layers.initializers import call_on_host
from keras_preact.layers.preprocessing import ImageNormalization, resolve_preprocessing
from keras_preact.layers.remat import check_remat, model_pruning_off
from keras_preact.layers.shapes import normalize_data_format

#: Stems: "cifar", a single conv (the paper's CIFAR nets); "imagenet", conv, BN, ReLU
#: and a 3x3 stride-2 max pool with Torch's symmetric padding (Section 5);
#: "imagenet_preact", the conv and the max pool alone (keras.applications ResNetV2).
STEMS = ("cifar", "imagenet", "imagenet_preact")
POOLED_STEMS = ("imagenet", "imagenet_preact")
POOLINGS = (None, "avg", "max")
#: The `Architecture` fields that every residual unit takes as they are.
_UNIT_FIELDS = ("bn_momentum", "bn_epsilon", "unit", "shortcut_scale", "residual_scale",
                "gate_bias", "dropout_rate", "strided_shortcut", "conv_bias")
#: Deprecated argument names -> their names now (accepted with a warning for one release).
RENAMED_ARGUMENTS = {"first_unit_shared_preact": "first_shared_preact"}


def rename_deprecated(kwargs, where):
    """`kwargs` with the names of `RENAMED_ARGUMENTS` replaced (a FutureWarning each)."""
    kwargs = dict(kwargs)
    for old, new in RENAMED_ARGUMENTS.items():
        if old in kwargs:
            kwargs.setdefault(new, pop_deprecated(kwargs, old, new, where))
    return kwargs


def _positive_ints(name, value):
    out = ()
    with contextlib.suppress(TypeError):
        out = tuple(value)
    if not out or not all(is_int(v, 1) for v in out):
        raise ValueError(f"`{name}` must be a non-empty sequence of positive integers. "
                         f"Received: {name}={value!r}")
    return out


def check_input_tensor(input_tensor):
    """ValueError unless `input_tensor` is None or a symbolic Keras tensor."""
    if input_tensor is not None and not keras.backend.is_keras_tensor(input_tensor):
        raise ValueError("`input_tensor` must be None or a Keras tensor (from `keras.Input` or "
                         f"a layer). Received: input_tensor={input_tensor!r}")


def _check_head(include_top, pooling, classes, classifier_activation, features, width):
    """ValueError for a head that cannot work: also a softmax over one class (always 1.0) and
    one over `width` features too large to allocate."""
    check_choice("pooling", pooling, POOLINGS)
    if features and pooling is not None:
        raise ValueError("`features=True` returns the stages' 4D feature maps, which are not "
                         f"pooled. Received: pooling={pooling!r}. Leave pooling=None.")
    if not include_top:
        return
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 1:
        raise ValueError("`classes` must be an integer >= 1 when include_top=True. "
                         f"Received: classes={classes!r}")
    try:
        activation = keras.activations.get(classifier_activation)
    except (ValueError, TypeError):
        raise ValueError(f"Unknown `classifier_activation`. Received: classifier_activation="
                         f"{classifier_activation!r}. Valid: None, 'softmax', 'sigmoid', "
                         "'linear' or any keras.activations name") from None
    if classes == 1 and activation is keras.activations.softmax:
        raise ValueError("A softmax over one class always outputs 1.0. Received: classes=1, "
                         f"classifier_activation={classifier_activation!r}. Valid: classes >= 2, "
                         "or classifier_activation='sigmoid' (one class: a yes/no output) or None")
    if classes * width > 2**31:  # refused before numpy tries to allocate it
        raise ValueError(f"`classes` is too large: the head would hold {classes * width:,} "
                         f"weights ({width} per class), over 2**31. Received: classes={classes}")


def _check_input_shape(input_shape, data_format, total_stride):
    if input_shape is None:
        input_shape = (None, None, 3) if data_format == "channels_last" else (3, None, None)
    try:
        input_shape = tuple(None if d is None else int(d) for d in input_shape)
    except (TypeError, ValueError):
        raise ValueError("`input_shape` must be a tuple of 3 ints (or None for a free size). "
                         f"Received: input_shape={input_shape!r}") from None
    if len(input_shape) != 3:
        raise ValueError(
            "`input_shape` must have 3 dimensions (height, width, channels) for channels_last "
            f"or (channels, height, width) for channels_first. Received: input_shape={input_shape}")
    last = data_format == "channels_last"
    channels, sizes = ((input_shape[2], input_shape[:2]) if last
                       else (input_shape[0], input_shape[1:]))
    where = f"Received: input_shape={input_shape} (data_format={data_format!r})"
    if channels is None or channels < 1:
        raise ValueError(f"The channel dimension of `input_shape` must be a positive int. {where}")
    if any(size is not None and size < 2 * total_stride for size in sizes):
        raise ValueError(f"`input_shape` is too small: this network downsamples by {total_stride}, "
                         f"so height and width must be at least {2 * total_stride}. {where}")
    return input_shape


def check_dtype(dtype):
    """ValueError unless `dtype` is None or a floating-point dtype or policy."""
    with contextlib.suppress(ValueError, TypeError):  # not a dtype: refused below
        if dtype is None or "float" in keras.dtype_policies.get(dtype).compute_dtype:
            return
    raise ValueError("`dtype` must be a floating-point dtype or policy (float32, float16, "
                     f"bfloat16, mixed_float16, mixed_bfloat16, ...). Received: dtype={dtype!r}")


def validate_config(arch):
    """Checks every argument of an `Architecture` before any layer is built (ValueError);
    returns it completed: the stages as tuples, the data format, the full input shape
    (None for a free height or width), no head with `features`, the remat setting."""
    a = arch
    check_choice("block", a.block, BLOCK_TYPES)
    check_unit_arguments(strides=1, bottleneck_stride=a.bottleneck_stride,
                         synchronized=a.synchronized_bn, **{k: getattr(a, k) for k in _UNIT_FIELDS})
    stages = {name: _positive_ints(name, getattr(a, name))
              for name in ("stage_blocks", "stage_filters", "stage_strides")}
    if len(set(map(len, stages.values()))) != 1:
        raise ValueError(
            "`stage_blocks`, `stage_filters` and `stage_strides` must have one entry per stage. "
            + "Received: " + ", ".join(f"{k}={v}" for k, v in stages.items()))
    for name in ("stem_filters", "stem_kernel_size", "stem_strides", "bottleneck_expansion"):
        check_int(name, getattr(a, name), minimum=1)
    widths, expansion = stages["stage_filters"], a.bottleneck_expansion
    if a.block == "bottleneck" and any(f % expansion for f in widths):
        raise ValueError("Bottleneck stage widths must be divisible by `bottleneck_expansion`. "
                         f"Received: stage_filters={widths}, bottleneck_expansion={expansion}")
    for name in ("include_top", "features", "zero_init_last"):
        check_bool(name, getattr(a, name))
    include_top = a.include_top and not a.features
    _check_head(include_top, a.pooling, a.classes, a.classifier_activation, a.features, widths[-1])
    for name, optional in (("head_dropout", True), ("stochastic_depth", False)):
        rate = getattr(a, name)
        if not (rate is None and optional or isinstance(rate, (int, float)) and 0 <= rate < 1):
            raise ValueError(f"`{name}` must be {'None or ' * optional}a rate in [0, 1). "
                             f"Received: {name}={rate!r}")
    data_format = normalize_data_format(a.data_format)
    check_choice("stem", a.stem, STEMS)
    check_stride_position(a.stride_position, stages["stage_blocks"], stages["stage_strides"])
    check_dtype(a.dtype)
    try:
        keras.initializers.get(a.kernel_initializer)
    except (ValueError, TypeError):
        raise ValueError("Unknown `kernel_initializer`. Received: kernel_initializer="
                         f"{a.kernel_initializer!r}. Valid: a keras.initializers name "
                         "('he_normal', 'glorot_uniform', ...) or instance") from None
    resolve_preprocessing(a.preprocessing)
    # The ImageNet stems' max pool halves the size once more.
    total_stride = (a.stem_strides * (2 if a.stem in POOLED_STEMS else 1)
                    * math.prod(stages["stage_strides"]))
    input_shape = _check_input_shape(a.input_shape, data_format, total_stride)
    return dataclasses.replace(a, **stages, data_format=data_format, input_shape=input_shape,
                               include_top=include_top,
                               remat=check_remat(a.remat, a.unit, a.stochastic_depth))


def _stem(x, a):
    # Layer creation order is frozen (weights files match by it).
    if (preprocessing := resolve_preprocessing(a.preprocessing)) is not None:  # scale, mean, std
        x = ImageNormalization(*preprocessing, data_format=a.data_format, dtype=a.dtype,
                               name=PREPROCESSING_LAYER)(x)
    padding = "same"
    if a.stem in POOLED_STEMS and a.stem_strides > 1:
        # Torch pads (k - 1) // 2 on every side; Keras' "same" would shift the grid.
        x = keras.layers.ZeroPadding2D((a.stem_kernel_size - 1) // 2, data_format=a.data_format,
                                       dtype=a.dtype, name="stem_pad")(x)
        padding = "valid"
    x = call_on_host(keras.layers.Conv2D(
        a.stem_filters, a.stem_kernel_size, strides=a.stem_strides, padding=padding,
        use_bias=a.conv_bias and a.stem != "imagenet", kernel_initializer=a.kernel_initializer,
        data_format=a.data_format, dtype=a.dtype, name=STEM_CONV_LAYER), x)
    if a.stem == "imagenet" or not variants.get_unit(a.unit).preactivation:
        # conv-BN-ReLU (He et al. 2015) for units that start with a conv (Fig. 4a-c, 2).
        x = _bn(a, "stem_bn", x)
        x = keras.layers.Activation("relu", dtype=a.dtype, name="stem_relu")(x)
    if a.stem in POOLED_STEMS:
        # After a ReLU zero padding is Torch's -inf one ("imagenet_preact": no ReLU, as ResNetV2).
        x = keras.layers.ZeroPadding2D(1, data_format=a.data_format, dtype=a.dtype,
                                       name="stem_pool_pad")(x)
        x = keras.layers.MaxPooling2D(3, strides=2, data_format=a.data_format, dtype=a.dtype,
                                      name="stem_pool")(x)
    return x


def _bn(a, name, x):
    return call_on_host(keras.layers.BatchNormalization(
        axis=-1 if a.data_format == "channels_last" else 1, momentum=a.bn_momentum,
        epsilon=a.bn_epsilon, synchronized=a.synchronized_bn, dtype=a.dtype, name=name), x)


def _stages(x, a):
    # The first unit shares its pre-activation with its shortcut unless first_shared_preact=False.
    preact = variants.get_unit(a.unit).preactivation
    kwargs = dict(kernel_initializer=a.kernel_initializer, synchronized=a.synchronized_bn,
                  data_format=a.data_format, dtype=a.dtype, stride_position=a.stride_position,
                  remat=a.remat, **{k: getattr(a, k) for k in _UNIT_FIELDS})
    if a.block == "bottleneck":
        kwargs.update(expansion=a.bottleneck_expansion, bottleneck_stride=a.bottleneck_stride)
    outputs, total = [], sum(a.stage_blocks)
    for i, (units, filters, strides) in enumerate(
            zip(a.stage_blocks, a.stage_filters, a.stage_strides), start=1):
        shared = True if i == 1 and a.first_shared_preact and preact else None
        # Unit l of L drops F with probability l / L * stochastic_depth (Huang et al. 2016).
        first = sum(a.stage_blocks[:i - 1]) + 1
        drop = [a.stochastic_depth * u / total for u in range(first, first + units)]
        x = PreActStage(a.block, filters, units, strides=strides, first_shared_preact=shared,
                        name=f"stage{i}", drop_path=drop if a.stochastic_depth else 0.0,
                        **kwargs)(x)
        outputs.append(x)
    return outputs


def _levels(a):
    """keras-hub's pyramid level names of the stages: "P{n}" for a stage whose output is
    2**n times smaller than the input (CIFAR: P0, P1, P2; ImageNet: P2 ... P5)."""
    stem = a.stem_strides * (2 if a.stem in POOLED_STEMS else 1)
    strides = [stem * math.prod(a.stage_strides[:i + 1]) for i in range(len(a.stage_strides))]
    return [f"P{s.bit_length() - 1}" if s.bit_count() == 1 else f"stride{s}" for s in strides]


def _final_activation(x, a):
    """The last unit's activation (the paper's rule: BN-ReLU for Fig. 4e, ReLU for
    4d, nothing for units ending in a ReLU or, unspecified by the paper, Fig. 4c)."""
    if (variant := variants.get_unit(a.unit)).bn_before_conv:
        x = _bn(a, "post_bn", x)
    if variant.preactivation:
        x = keras.layers.Activation("relu", dtype=a.dtype, name="post_relu")(x)
    return x


def _head(x, a):
    """Pooling and the classifier."""
    pools = {"max": keras.layers.GlobalMaxPooling2D, "avg": keras.layers.GlobalAveragePooling2D}
    pool = pools.get(a.pooling, keras.layers.GlobalAveragePooling2D if a.include_top else None)
    if pool is not None:
        x = pool(data_format=a.data_format, dtype=a.dtype, name=POOL_LAYER)(x)
    if a.include_top and a.head_dropout:
        x = keras.layers.Dropout(a.head_dropout, dtype=a.dtype, name="head_dropout")(x)
    if a.include_top:
        x = call_on_host(keras.layers.Dense(a.classes, dtype=a.dtype, name=HEAD_LAYER), x)
        # Float32 (or float64) so softmax stays accurate under mixed precision.
        float64 = (a.dtype is not None
                   and keras.dtype_policies.get(a.dtype).compute_dtype == "float64")
        x = keras.layers.Activation(a.classifier_activation, name=PREDICTIONS_LAYER,
                                    dtype="float64" if float64 else "float32")(x)
    return x


def _zero_last_convs(model):
    """Sets the last conv kernel of every residual branch to zero (`zero_init_last`)."""
    for stage in [layer for layer in model.layers if isinstance(layer, PreActStage)]:
        units = [(u, u.spec) for u in (stage.unit1, stage.unit_last) if u is not None]
        for layer, spec in units + ([(stage, stage.repeat_spec)] if stage.num_stacked else []):
            kernel = layer.get_variable(f"{spec.convs[-1][0]}_kernel")
            kernel.assign(keras.ops.zeros(kernel.shape, kernel.dtype))


@keras.saving.register_keras_serializable(package="keras_preact")
class PreActResNet(keras.Model):
    """A pre-activation ResNet (He et al. 2016): stem -> stages of residual units -> the
    last unit's BN-ReLU -> pooling -> dense head. The first unit applies its BN-ReLU
    before the split (its shortcut sees the activated stem output) and nothing follows
    any addition (paper Section 4 and its official code).

    Every argument is keyword-only and checked before any layer is built.

    Args:
        block: str, the residual unit type, "basic" or "bottleneck". Defaults to `"basic"`.
        stage_blocks: sequence of positive ints, the units of each stage, e.g.
            (18, 18, 18) for ResNet-110. Defaults to `(3, 3, 3)`.
        stage_filters: sequence of positive ints, the output width of each stage, e.g.
            (16, 32, 64) for ResNet-110. Defaults to `(16, 32, 64)`.
        stage_strides: sequence of positive ints, the stride of each stage, e.g. (1, 2, 2)
            for ResNet-110. Defaults to `(1, 2, 2)`. The three stage sequences must have one
            entry per stage.
        stem_filters: int >= 1, the stem conv's filters. Defaults to `16`.
        stem_kernel_size: int >= 1, the stem conv's kernel size. Defaults to `3`.
        stem_strides: int >= 1, the stem conv's stride. Defaults to `1`.
        bottleneck_stride: str, see `BOTTLENECK_STRIDES` ("middle" or "first").
            Defaults to `"middle"`.
        bottleneck_expansion: int >= 1, a bottleneck unit's output width over its inner
            width; bottleneck stage widths must be divisible by it. Defaults to `4`.
        first_shared_preact: bool, the first unit shares its BN-ReLU with an identity
            shortcut too (the paper's code; not pytorchcv's basic CIFAR nets); deprecated
            alias ``first_unit_shared_preact``. Defaults to `True`.
        stride_position: str, "first" or "last" (ResNet50V2: the stride on "unit_last").
            Defaults to `"first"`.
        strided_shortcut: str, see `STRIDED_SHORTCUTS` ("projection" or "subsample").
            Defaults to `"projection"`.
        conv_bias: bool, biases on the convs no BN follows (each unit's last conv and
            projection, the stem conv without a stem BN); "full_preact" only.
            Defaults to `False`.
        stem: str, see `STEMS` ("cifar", "imagenet" or "imagenet_preact"; "imagenet" with
            ``stem_kernel_size=7, stem_strides=2, stem_filters=64``). Defaults to `"cifar"`.
        include_top: bool, build the classifier head. Defaults to `True`.
        pooling: None, "avg" or "max". Without the top, None returns the 4D features;
            with it, "max" replaces the global average pooling. Defaults to `None`.
        features: bool, return `pyramid_outputs`, a dict of feature maps by level, instead
            of the head (a backbone for detection or segmentation; no head is built,
            whatever `include_top` says). Defaults to `False`.
        classes: int >= 1, the classifier's outputs (with the top). Defaults to `10`.
        classifier_activation: the head's activation (a `keras.activations` name or
            function); None returns logits. Defaults to `"softmax"`.
        head_dropout: float in [0, 1) or None, dropout rate before the classifier in
            training (timm's ``drop_rate``); None or 0: none, as the paper.
            Defaults to `None`.
        preprocessing: None, a name of `layers.preprocessing.PRESETS` or a dict with
            "mean", "std" and optional "scale": the model then takes [0, 255] pixels.
            Defaults to `None`.
        input_shape: tuple of 3 ints (None for a free height or width); default
            (None, None, 3) (or channels first); sizes >= 2x total stride.
        data_format: None, "channels_last" or "channels_first"; None:
            `keras.config.image_data_format()`. Defaults to `None`.
        kernel_initializer: the convs' kernel initializer, a `keras.initializers` name or
            instance. Defaults to `"he_normal"`.
        zero_init_last: bool, start every residual branch's last conv at zero (timm's): an
            untrained ResNet-1001 otherwise overflows to NaN in inference.
            Defaults to `False`.
        bn_momentum: float in [0, 1), BatchNorm's momentum: Torch's default 0.9 (Keras'
            convention). Defaults to `0.9`.
        bn_epsilon: float > 0, BatchNorm's epsilon: Torch's default. Defaults to `1e-5`.
        synchronized_bn: bool, cross-replica BN statistics under `tf.distribute`
            (TensorFlow only). Defaults to `False`.
        unit: str, a name of `UNIT_TYPES` (`layers.variants`). Units that end in a ReLU get
            a conv-BN-ReLU stem and nothing after the last unit (He et al. 2015).
            Defaults to `"full_preact"`.
        shortcut_scale: float >= 0 or None, the shortcut's lambda of unit="constant_scaling";
            None: the paper's value. Defaults to `None`.
        residual_scale: float >= 0 or None, the residual's lambda of
            unit="constant_scaling"; None: the paper's value. Defaults to `None`.
        gate_bias: float or None, the initial gate bias of the gating units; None: the
            paper's value. Defaults to `None`.
        dropout_rate: float or None, the shortcut drop rate of unit="dropout_shortcut";
            None: the paper's value. Defaults to `None`.
        stochastic_depth: float in [0, 1), the last unit's rate of dropping its residual
            branch in training, unit l of L dropping at l / L of it (Huang et al. 2016;
            per example, as timm's ``drop_path_rate``); 0: off. The weights are the same
            with or without it. Defaults to `0.0`.
        remat: rematerialisation in training (`layers.remat`): same results, ~1 extra
            forward. None or False (off), True or "segment", "unit", or an int >= 1; not
            with unit="dropout_shortcut" or `stochastic_depth`. Defaults to `None`.
        dtype: a floating-point dtype or dtype policy, or None; the final activation
            computes in float32 at least. Defaults to `None`.
        input_tensor: optional Keras input tensor (not serialised). Defaults to `None`.
        name: str, the model's name. Defaults to `"preact_resnet"`.
        **kwargs: `trainable`; any other name raises ValueError.

    Raises:
        ValueError: for an unknown or invalid argument, before any layer is built.

    Example:
        >>> model = PreActResNet(block="basic", stage_blocks=(3, 3, 3),
        ...                      stage_filters=(16, 32, 64), input_shape=(32, 32, 3))
        >>> model.depth
        20
    """

    def __init__(self, *, input_tensor=None, name="preact_resnet", **kwargs):
        kwargs = rename_deprecated(kwargs, "PreActResNet")
        check_known_arguments(kwargs, MODEL_ARGUMENTS, where="PreActResNet")
        trainable = {k: kwargs.pop(k) for k in ("trainable",) if k in kwargs}
        a = validate_config(Architecture(**kwargs))
        check_input_tensor(input_tensor)
        inputs = (keras.Input(shape=a.input_shape, name=INPUT_NAME) if input_tensor is None
                  else input_tensor)
        stages = _stages(_stem(inputs, a), a)
        x = _final_activation(stages[-1], a)
        # The last level is what the head sees (timm's ``norm=True``), the others the sums.
        pyramid = dict(zip(_levels(a), stages[:-1] + [x]))
        super().__init__(inputs=inputs, outputs=pyramid if a.features else _head(x, a),
                         name=name, **trainable)
        self._pyramid_outputs = pyramid
        if a.dtype is not None:  # the model object carries the policy too, as keras-hub's do
            self.dtype_policy = keras.dtype_policies.get(a.dtype)
        if a.zero_init_last:
            _zero_last_convs(self)
        self.spec = a
        for key in _ATTRIBUTES:
            setattr(self, key, getattr(a, key))

    @property
    def pyramid_outputs(self):
        """The stages' outputs by level, as keras-hub's backbones name them ("P{n}": 2**n times
        smaller than the input, e.g. ImageNet models P2 ... P5; of stages ending at the same
        stride, the last), the last after the final BN-ReLU, the others the stages' sums.
        ``keras.Model(model.input, model.pyramid_outputs)`` is the `features=True` model."""
        return dict(self._pyramid_outputs)

    @property
    def depth(self):
        """Weighted layers as the paper counts them: main-path convs and the head."""
        return 1 + (2 if self.block == "basic" else 3) * sum(self.stage_blocks) + 1

    def get_config(self):
        a, lists = self.spec, ("stage_blocks", "stage_filters", "stage_strides", "input_shape")
        config = {k: list(getattr(a, k)) if k in lists else getattr(a, k) for k in ARGUMENTS}
        dtype, init = a.dtype, a.kernel_initializer
        return dict(
            config, input_tensor=None, name=self.name, trainable=self.trainable,
            dtype=dtype if dtype is None or isinstance(dtype, str)
            else keras.dtype_policies.serialize(dtype),
            kernel_initializer=init if isinstance(init, str)
            else keras.initializers.serialize(keras.initializers.get(init)))

    def _pruning_off(self):
        """Grappler's model pruning would undo remat on TensorFlow: off while it trains."""
        on_tensorflow = self.remat is not None and keras.backend.backend() == "tensorflow"
        return model_pruning_off() if on_tensorflow else contextlib.nullcontext()

    def fit(self, *args, **kwargs):
        # Around the whole call: switching it each step slows remat training.
        with self._pruning_off():
            return super().fit(*args, **kwargs)

    def make_train_function(self, force=False):
        """With remat on TensorFlow each call (e.g. `train_on_batch`) runs with Grappler's
        model pruning off (`remat.model_pruning_off`); inside `fit` it already is.

        Args:
            force: bool, make a new train function even if one exists, as in Keras'
                `Model.make_train_function`. Defaults to `False`.

        Returns:
            The train function (`self.train_function`): with remat on TensorFlow, the one
            that turns pruning off."""
        fresh = force or self.train_function is None
        super().make_train_function(force)
        if fresh and self.remat is not None and keras.backend.backend() == "tensorflow":
            train_function = self.train_function

            def train_without_pruning(*args, **kwargs):
                with self._pruning_off():
                    return train_function(*args, **kwargs)

            self.train_function = train_without_pruning
        return self.train_function

    def save_weights(self, filepath, overwrite=True, max_shard_size=None):
        """Saves the weights as Keras' `Model.save_weights` does; a `.weights.h5` file also
        records the architecture arguments, preprocessing and input shape:
        ``get_model(name, weights=filepath)`` rebuilds the model.

        Args:
            filepath: str or `os.PathLike`, the file to write.
            overwrite: bool, replace an existing file without asking. Defaults to `True`.
            max_shard_size: int, float or None, the most GB each shard file holds, as in
                Keras' `Model.save_weights`; None: no sharding. Defaults to `None`.

        Returns:
            None."""
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


#: Every keyword argument `PreActResNet` accepts, for the unknown-argument checks.
MODEL_ARGUMENTS = frozenset(ARGUMENTS) | {"input_tensor", "name", "trainable"}
#: The record's fields kept as attributes (a Keras model has its own `input_shape`, `dtype`).
_ATTRIBUTES = tuple(k for k in ARGUMENTS if k not in ("input_shape", "dtype"))
PreActResNet.__init__.__signature__ = inspect.Signature([
    inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY),
    *(inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v)
      for k, v in {**DEFAULTS, "input_tensor": None, "name": "preact_resnet"}.items())])
