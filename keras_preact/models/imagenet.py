"""The ImageNet pre-activation ResNets (paper Section 5, Table 5) as thin factories.

Layout (the paper's, as in its official Torch code and the imgclsmob/pytorchcv models):
a 7x7 stride-2 stem conv of 64 filters, BN, ReLU and a 3x3 stride-2 max pool; four
stages of widths 64/128/256/512 (basic units) or 256/512/1024/2048 (bottleneck units,
inner width out/4); stride 2 in the first unit of stages 2-4; after the last unit one
BN-ReLU, global average pooling and the 1000-way dense head.

Choices with documented defaults:

- ``bottleneck_stride="first"``: the bottleneck's stride on its first 1x1 conv, as in
  the official code and pytorchcv's ``preresnet50/101/152`` (their ``...b`` models and
  ``preresnet200b`` put it on the 3x3 conv: pass ``bottleneck_stride="middle"``).
- The first unit of stage 1 keeps an identity shortcut on the stem's (already
  activated) output when its shape does not change (basic units), and shares its
  BN-ReLU with the projection otherwise (``first_unit_shared_preact=False``): the
  layout of the published pytorchcv weights.
- Strided convs and the max pool pad symmetrically, as Torch does.
"""

from keras_preact.layers.utils import normalize_data_format
from keras_preact.models.preact_resnet import POOLED_STEMS
from keras_preact.models.registry import register_model

#: depth -> (block, units per stage)
IMAGENET_DEPTHS = {
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
    200: ("bottleneck", (3, 24, 36, 3)),
}
IMAGENET_WIDTHS = {"basic": (64, 128, 256, 512), "bottleneck": (256, 512, 1024, 2048)}
#: Minimum input height and width (total stride 32).
IMAGENET_MIN_INPUT_SIZE = 32


def preact_resnet_imagenet(
    depth,
    *,
    include_top=True,
    weights=None,
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=None,
    classifier_activation="softmax",
    name=None,
    **kwargs,
):
    """An ImageNet pre-activation ResNet of depth 18, 34, 50, 101, 152 or 200.

    Args:
        depth: int, one of `IMAGENET_DEPTHS`.
        include_top: bool, default True.
        weights: None, a catalog tag or key, or a weights file (see the CIFAR
            factories; `keras_preact.weights`).
        input_tensor: optional Keras tensor used as the input.
        input_shape: default (224, 224, 3); height and width must be >= 32.
        pooling: None, "avg" or "max" (with include_top=False: feature extraction).
        classes: int >= 1; default None: the weights' classes, or 1000.
        classifier_activation: default "softmax"; None returns logits.
        name: model name, default "preact_resnet{depth}".
        **kwargs: any other `PreActResNet` argument (`preprocessing`,
            `bottleneck_stride`, `data_format`, `dtype`, ...). The layout options
            `stage_strides` (default (1, 2, 2, 2)), `stem` ("imagenet" or
            "imagenet_preact"), `stride_position`, `strided_shortcut` and
            `conv_bias` may change; the stages, widths and stem conv are the
            depth's.

    Returns:
        A `PreActResNet`.

    Raises:
        ValueError: for an unsupported depth or any invalid argument, before a layer
            is built.

    Example:
        >>> features = preact_resnet_imagenet(50, include_top=False, pooling="avg")
    """
    from keras_preact.models.cifar import build_with_weights

    if isinstance(depth, bool) or depth not in IMAGENET_DEPTHS:
        raise ValueError(
            f"Unsupported ImageNet depth. Received: depth={depth!r}. "
            f"Valid: {sorted(IMAGENET_DEPTHS)}"
        )
    block, units = IMAGENET_DEPTHS[depth]
    for reserved in ("stage_blocks", "stage_filters", "block", "stem",
                     "stem_kernel_size", "stem_strides"):
        # The layout options of the same depth stay open: the stride placement
        # (keras.applications strides (2, 2, 2, 1) on each stage's last unit) and
        # either ImageNet stem.
        if reserved == "stem" and kwargs.get("stem") in POOLED_STEMS:
            continue
        if reserved in kwargs:
            raise ValueError(
                f"`{reserved}` is set by the depth; use PreActResNet directly to "
                f"change it. Received: {reserved}={kwargs[reserved]!r}"
            )
    default_shape = None
    if input_shape is None and input_tensor is None:
        fmt = normalize_data_format(kwargs.get("data_format"))
        default_shape = (224, 224, 3) if fmt == "channels_last" else (3, 224, 224)
    kwargs = dict(kwargs)
    # In kwargs (not defaults): the weights-file checks compare the stem width.
    kwargs.setdefault("stem_filters", 64)
    return build_with_weights(
        f"preact_resnet{depth}",
        dict(block=block, stage_blocks=units, stage_filters=IMAGENET_WIDTHS[block],
             stem_kernel_size=7, stem_strides=2),
        defaults=dict(bottleneck_stride="first", first_unit_shared_preact=False,
                      stage_strides=(1, 2, 2, 2), stem="imagenet"),
        weights=weights, include_top=include_top, input_tensor=input_tensor,
        input_shape=input_shape, default_input_shape=default_shape, pooling=pooling,
        classes=classes, default_classes=1000, classifier_activation=classifier_activation,
        name=name or f"preact_resnet{depth}", kwargs=kwargs,
    )


def _factory(depth):
    block, units = IMAGENET_DEPTHS[depth]

    def factory(
        *,
        include_top=True,
        weights=None,
        input_tensor=None,
        input_shape=None,
        pooling=None,
        classes=None,
        classifier_activation="softmax",
        **kwargs,
    ):
        return preact_resnet_imagenet(
            depth,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            **kwargs,
        )

    factory.__name__ = factory.__qualname__ = f"preact_resnet{depth}"
    factory.__doc__ = (
        f"Pre-activation ResNet-{depth} for ImageNet ({block} units, stages "
        f"{list(units)}).\n\n"
        "Keyword-only arguments as in keras.applications: include_top=True, "
        "weights=None (or 'imagenet', a file or a URL), input_tensor=None, "
        "input_shape=None (224, 224, 3), pooling=None, classes=None (the weights' or "
        "1000), classifier_activation='softmax'; any other `PreActResNet` argument is "
        "forwarded. See `preact_resnet_imagenet`.\n"
    )
    return register_model(depth=depth, block=block, family="imagenet")(factory)


preact_resnet18 = _factory(18)
preact_resnet34 = _factory(34)
preact_resnet50 = _factory(50)
preact_resnet101 = _factory(101)
preact_resnet152 = _factory(152)
preact_resnet200 = _factory(200)
