"""The paper's CIFAR pre-activation ResNets: basic units for depth 6n+2 (stage widths
16/32/64), bottleneck units for depth 9n+2 (stage outputs 64/128/256, inner width out/4);
a 3x3 stem of 16 filters; stride 2 in the first unit of stages 2 and 3 (Section 4, Tables
3 / 4)."""

from keras_preact.checks import check_choice
from keras_preact.layers.blocks import BLOCK_TYPES
from keras_preact.models.factory import build_with_weights, check_reserved, register_factory
from keras_preact.weights import argument as weights_argument

CIFAR_BLOCKS = ("auto",) + BLOCK_TYPES
CIFAR_WIDTHS = {"basic": (16, 32, 64), "bottleneck": (64, 128, 256)}


def cifar_units_per_stage(depth, block="auto"):
    """Returns (block, units per stage) of a CIFAR depth.

    Args:
        depth: int >= 8, 6n+2 for basic units or 9n+2 for bottleneck units.
        block: str, "auto", "basic" or "bottleneck". "auto" means bottleneck when
            depth >= 164 and (depth - 2) is divisible by 9, basic otherwise (so 110 and 1202
            are basic; 164, 272, 542 and 1001 bottleneck). Defaults to `"auto"`.

    Returns:
        tuple ``(block, units)``: the resolved block type ("basic" or "bottleneck") and the
        number of units in each of the three stages.

    Raises:
        ValueError: for an unknown `block`, or a `depth` that is not an integer of the
            block's form."""
    check_choice("block", block, CIFAR_BLOCKS)
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8:
        raise ValueError("`depth` must be an integer of the form 6n+2 (basic: 8, 14, 20, ...) or "
                         f"9n+2 (bottleneck: 11, 20, 29, ...), n >= 1. Received: depth={depth!r}")
    if block == "auto":
        block = "bottleneck" if depth >= 164 and (depth - 2) % 9 == 0 else "basic"
    if (depth - 2) % (per_unit := 6 if block == "basic" else 9):
        form = ("6n+2 (8, 14, 20, 32, 44, 56, 110, ...)" if block == "basic"
                else "9n+2 (11, 20, ..., 164, 272, 542, 1001)")
        raise ValueError(f"A {block} CIFAR network needs depth of the form {form}. "
                         f"Received: depth={depth}, block={block!r}")
    return block, (depth - 2) // per_unit


def preact_resnet_cifar(depth, *, block="auto", include_top=True, weights=None,
                        input_tensor=None, input_shape=None, pooling=None, classes=None,
                        classifier_activation="softmax", name=None, **kwargs):
    """A CIFAR pre-activation ResNet of any valid depth.

    Args:
        depth: int, 6n+2 for basic units or 9n+2 for bottleneck units.
        block: str, "auto", "basic" or "bottleneck"; see `cifar_units_per_stage`.
            Defaults to `"auto"`.
        include_top: bool, build the pooling and dense classifier. Defaults to `True`.
        weights: None (random He initialisation), a catalog tag ("cifar10", "cifar100",
            "svhn", "DEFAULT" or "preact_resnet110.cifar10"), a `.weights.h5` or `.keras`
            path, or a URL with its hash ("https://host/f.weights.h5#sha256=<hex>"); see
            `weights.argument`. Their architecture and preprocessing apply unless passed.
            Defaults to `None`.
        input_tensor: optional Keras tensor to use as the model's input. Defaults to `None`.
        input_shape: tuple of 3 ints (None for a free size); default the weights' input size
            or (32, 32, 3) ((3, 32, 32) channels first); sizes >= 8.
        pooling: None, "avg" or "max"; see `PreActResNet`. Defaults to `None`.
        classes: int, default the weights' classes, or 10.
        classifier_activation: the head's activation; None returns logits.
            Defaults to `"softmax"`.
        name: str, the model's name. Defaults to `None` (``"preact_resnet{depth}"``).
        **kwargs: any other `PreActResNet` argument but `stage_blocks` and
            `stage_filters`, which `depth` and `block` fix.

    Returns:
        A `PreActResNet`.

    Raises:
        ValueError: for an invalid argument, before any layer is built.

    Example:
        >>> model = preact_resnet_cifar(56, classes=100)
    """
    block, units = cifar_units_per_stage(depth, block)
    check_reserved(kwargs, ("stage_blocks", "stage_filters", "block"))
    architecture = dict(block=block, stage_blocks=(units,) * 3, stage_filters=CIFAR_WIDTHS[block],
                        stage_strides=(1, 2, 2))
    return build_with_weights(
        f"preact_resnet{depth}", architecture, weights=weights, include_top=include_top,
        input_tensor=input_tensor, input_shape=input_shape, size=32, pooling=pooling,
        classes=classes, default_classes=weights_argument.DEFAULT_CLASSES,
        classifier_activation=classifier_activation, name=name, kwargs=kwargs)


def _register(depth):
    block, units = cifar_units_per_stage(depth)
    return register_factory(
        preact_resnet_cifar, depth, block,
        f"Pre-activation ResNet-{depth} for CIFAR ({block} units, {units} per stage).",
        weights_help="or a tag, .weights.h5, .keras or URL#sha256=...", size=32,
        default_classes=weights_argument.DEFAULT_CLASSES, fixed={"block": block})


preact_resnet20 = _register(20)
preact_resnet32 = _register(32)
preact_resnet44 = _register(44)
preact_resnet56 = _register(56)
preact_resnet110 = _register(110)
preact_resnet164 = _register(164)
preact_resnet272 = _register(272)
preact_resnet542 = _register(542)
preact_resnet1001 = _register(1001)
preact_resnet1202 = _register(1202)
