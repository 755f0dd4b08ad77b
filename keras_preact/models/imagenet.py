"""The ImageNet pre-activation ResNets (paper Section 5, Table 5), laid out as its Torch
code and the imgclsmob/pytorchcv models: a 7x7 stride-2 stem conv of 64 filters, BN, ReLU
and a 3x3 stride-2 max pool; four stages of widths 64/128/256/512 (basic) or
256/512/1024/2048 (bottleneck); stride 2 in the first unit of stages 2-4; BN-ReLU, global
average pooling and a 1000-way dense head.
- ``bottleneck_stride="first"``, as the official code and pytorchcv's
  ``preresnet50/101/152`` (their ``...b`` models and ``preresnet200b``: "middle").
- ``first_shared_preact=False``: the first unit of stage 1 keeps an identity
  shortcut on the stem's activated output unless it projects (the layout of the
  published pytorchcv weights)."""

from keras_preact.models.factory import build_with_weights, check_reserved, register_factory
from keras_preact.models.preact_resnet import POOLED_STEMS

#: depth -> (block, units per stage)
IMAGENET_DEPTHS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
                   50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
                   152: ("bottleneck", (3, 8, 36, 3)), 200: ("bottleneck", (3, 24, 36, 3))}
IMAGENET_WIDTHS = {"basic": (64, 128, 256, 512), "bottleneck": (256, 512, 1024, 2048)}


def preact_resnet_imagenet(depth, *, include_top=True, weights=None, input_tensor=None,
                           input_shape=None, pooling=None, classes=None,
                           classifier_activation="softmax", name=None, **kwargs):
    """An ImageNet pre-activation ResNet of depth 18, 34, 50, 101, 152 or 200.

    Arguments as in `preact_resnet_cifar`. Of the layout, `stage_strides`, `stem`
    ("imagenet" or "imagenet_preact"), `stride_position`, `strided_shortcut` and
    `conv_bias` may change; the stages, widths and stem conv are the depth's.

    Args:
        depth: int, 18, 34, 50, 101, 152 or 200.
        include_top: bool, build the pooling and dense classifier. Defaults to `True`.
        weights: as in `preact_resnet_cifar` (e.g. the catalog tag "imagenet", a file or a
            URL with its hash). Defaults to `None` (random initialisation).
        input_tensor: optional Keras tensor to use as the model's input. Defaults to `None`.
        input_shape: tuple of 3 ints (None for a free size); default the weights' input size
            or (224, 224, 3) ((3, 224, 224) channels first); sizes at least twice the total
            stride (64 with the default `stage_strides`).
        pooling: None, "avg" or "max"; see `PreActResNet`. Defaults to `None`.
        classes: int, default the weights' classes, or 1000.
        classifier_activation: the head's activation; None returns logits.
            Defaults to `"softmax"`.
        name: str, the model's name. Defaults to `None` (``"preact_resnet{depth}"``).
        **kwargs: any other `PreActResNet` argument but `block`, `stage_blocks`,
            `stage_filters`, `stem_filters`, `stem_kernel_size` and `stem_strides`, which
            `depth` fixes; `stem` only as "imagenet" or "imagenet_preact".

    Returns:
        A `PreActResNet`.

    Raises:
        ValueError: for an unsupported depth or an invalid argument, before any layer is
            built.

    Example:
        >>> features = preact_resnet_imagenet(50, include_top=False, pooling="avg")
    """
    if isinstance(depth, bool) or depth not in IMAGENET_DEPTHS:
        raise ValueError(f"Unsupported ImageNet depth. Received: depth={depth!r}. "
                         f"Valid: {sorted(IMAGENET_DEPTHS)}")
    block, units = IMAGENET_DEPTHS[depth]
    check_reserved(kwargs, ("stage_blocks", "stage_filters", "block", "stem_filters",
                            "stem_kernel_size", "stem_strides")
                   + (() if kwargs.get("stem") in POOLED_STEMS else ("stem",)))
    return build_with_weights(
        f"preact_resnet{depth}",
        dict(block=block, stage_blocks=units, stage_filters=IMAGENET_WIDTHS[block],
             stem_filters=64, stem_kernel_size=7, stem_strides=2),
        defaults=dict(bottleneck_stride="first", first_shared_preact=False,
                      stage_strides=(1, 2, 2, 2), stem="imagenet"),
        weights=weights, include_top=include_top, input_tensor=input_tensor, size=224,
        input_shape=input_shape, pooling=pooling, classes=classes, default_classes=1000,
        classifier_activation=classifier_activation, name=name, kwargs=kwargs)


def _register(depth):
    block, units = IMAGENET_DEPTHS[depth]
    return register_factory(
        preact_resnet_imagenet, depth, block,
        f"Pre-activation ResNet-{depth} for ImageNet ({block} units, stages {list(units)}).",
        weights_help="or 'imagenet', a file or a URL", size=224, default_classes=1000)


preact_resnet18 = _register(18)
preact_resnet34 = _register(34)
preact_resnet50 = _register(50)
preact_resnet101 = _register(101)
preact_resnet152 = _register(152)
preact_resnet200 = _register(200)
