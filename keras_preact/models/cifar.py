"""The CIFAR pre-activation ResNets of the paper, as thin factories.

Basic units for depth 6n+2 (stage widths 16/32/64), bottleneck units for depth 9n+2
(stage outputs 64/128/256, inner width out/4); a 3x3 stem of 16 filters; stride 2 in
the first unit of stages 2 and 3 (paper Section 4 and Table 3 / 4).
"""

import inspect

from keras_preact.layers.utils import check_known_arguments
from keras_preact.layers.utils import normalize_data_format
from keras_preact.models.preact_resnet import MODEL_ARGUMENTS
from keras_preact.models.preact_resnet import PreActResNet
from keras_preact.models.preact_resnet import validate_config
from keras_preact.models.registry import get_model
from keras_preact.models.registry import register_model
from keras_preact.weights import hooks as weights_hooks

CIFAR_BLOCKS = ("auto", "basic", "bottleneck")
CIFAR_WIDTHS = {"basic": (16, 32, 64), "bottleneck": (64, 128, 256)}
#: Minimum input height and width for the CIFAR networks (total stride 4).
CIFAR_MIN_INPUT_SIZE = 8


def cifar_units_per_stage(depth, block="auto"):
    """Resolves `block` and the units per stage for a CIFAR depth.

    "auto" means bottleneck when depth >= 164 and (depth - 2) is divisible by 9, basic
    otherwise (so 110 and 1202 are basic; 164, 272, 542 and 1001 bottleneck).

    Returns:
        (block, units_per_stage).

    Raises:
        ValueError: for an unknown block or a depth not of the block's form.
    """
    if block not in CIFAR_BLOCKS:
        raise ValueError(
            f"Unknown `block`. Received: block={block!r}. Valid: {list(CIFAR_BLOCKS)}"
        )
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 8:
        raise ValueError(
            "`depth` must be an integer of the form 6n+2 (basic: 8, 14, 20, ...) or "
            f"9n+2 (bottleneck: 11, 20, 29, ...), n >= 1. Received: depth={depth!r}"
        )
    if block == "auto":
        block = "bottleneck" if depth >= 164 and (depth - 2) % 9 == 0 else "basic"
    per_unit = 6 if block == "basic" else 9
    if (depth - 2) % per_unit:
        form = "6n+2 (8, 14, 20, 32, 44, 56, 110, ...)" if block == "basic" else "9n+2 (11, 20, ..., 164, 272, 542, 1001)"
        raise ValueError(
            f"A {block} CIFAR network needs depth of the form {form}. "
            f"Received: depth={depth}, block={block!r}"
        )
    return block, (depth - 2) // per_unit


def preact_resnet_cifar(
    depth,
    *,
    block="auto",
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
    """A CIFAR pre-activation ResNet of any valid depth.

    Args:
        depth: int, 6n+2 for basic units or 9n+2 for bottleneck units.
        block: "auto" (default), "basic" or "bottleneck"; see
            `cifar_units_per_stage`.
        include_top: bool, default True.
        weights: None (random He initialisation), a catalog tag ("cifar10",
            "cifar100", "svhn", "DEFAULT" or "preact_resnet110.cifar10"), a path to
            a `.weights.h5` or `.keras` file, or a URL with its hash
            ("https://host/f.weights.h5#sha256=<hex>"); see
            `keras_preact.weights.hooks`. The weights' architecture arguments and
            preprocessing are applied unless passed explicitly.
        input_tensor: optional Keras tensor used as the input.
        input_shape: default the weights' input size or (32, 32, 3); height and
            width must be >= 8.
        pooling: None, "avg" or "max" (see `PreActResNet`).
        classes: int >= 1; default None: the weights' classes, or 10.
        classifier_activation: default "softmax"; None returns logits.
        name: model name, default "preact_resnet{depth}".
        **kwargs: any other `PreActResNet` argument (`preprocessing`,
            `data_format`, `bottleneck_stride`, `dtype`, ...).

    Returns:
        A `PreActResNet`.

    Raises:
        ValueError: for any invalid argument, before a layer is built.

    Example:
        >>> model = preact_resnet_cifar(56, classes=100)
    """
    block, units = cifar_units_per_stage(depth, block)
    for reserved in ("stage_blocks", "stage_filters", "block"):
        if reserved in kwargs:
            raise ValueError(
                f"`{reserved}` is set by the depth; use PreActResNet directly to "
                f"change it. Received: {reserved}={kwargs[reserved]!r}"
            )
    if input_shape is None and input_tensor is None:
        fmt = normalize_data_format(kwargs.get("data_format"))
        default_shape = (32, 32, 3) if fmt == "channels_last" else (3, 32, 32)
    else:
        default_shape = None
    architecture = dict(
        block=block,
        stage_blocks=(units,) * 3,
        stage_filters=CIFAR_WIDTHS[block],
        stage_strides=(1, 2, 2),
    )
    return build_with_weights(
        f"preact_resnet{depth}", architecture, weights=weights, include_top=include_top,
        input_tensor=input_tensor, input_shape=input_shape, default_input_shape=default_shape,
        pooling=pooling, classes=classes, default_classes=weights_hooks.DEFAULT_CLASSES,
        classifier_activation=classifier_activation, name=name or f"preact_resnet{depth}",
        kwargs=kwargs,
    )


def build_with_weights(model_name, architecture, *, weights, include_top, input_tensor,
                       input_shape, default_input_shape, pooling, classes, default_classes,
                       classifier_activation, name, kwargs, defaults=None):
    """Builds a registered model's `PreActResNet` and loads its `weights`.

    Shared by the model families' factories. The weights are validated (and fetched)
    before any layer is built; they may set architecture arguments, the preprocessing
    and the input size (see `keras_preact.weights.hooks`).

    Args:
        model_name: the registered name (for catalog tags).
        architecture: the `PreActResNet` arguments fixed by the model's name.
        defaults: optional `PreActResNet` arguments of the family that the weights'
            architecture and the caller's `kwargs` may override.
        default_input_shape: the input shape when neither the caller nor the weights
            give one.
        default_classes: the classes when neither the caller nor the weights give them.
        kwargs: the caller's other `PreActResNet` arguments.
        (the rest: the factory's keras.applications arguments.)

    Returns:
        A `PreActResNet`.
    """
    check_known_arguments(kwargs, MODEL_ARGUMENTS, where=model_name)
    if weights is None and classes is None:
        classes = default_classes
    # The weights are validated (and fetched) before any layer is built; they may
    # set architecture arguments, the preprocessing and the input size (see
    # `keras_preact.weights.hooks`).
    weights_args = dict(
        include_top=include_top,
        classes=classes,
        input_shape=tuple(input_tensor.shape[1:]) if input_tensor is not None else input_shape,
        channels_last=normalize_data_format(kwargs.get("data_format")) == "channels_last",
        kwargs=kwargs,
        fixed=architecture,
        weights=weights,
    )
    plan = weights_hooks.plan_weights(
        weights,
        model=model_name,
        **{k: v for k, v in weights_args.items() if k != "weights"},
    )
    classes = plan["classes"]
    overrides = dict(plan["overrides"])
    if input_shape is None and input_tensor is None:
        input_shape = overrides.get("input_shape")
    overrides.pop("input_shape", None)
    if input_shape is None and input_tensor is None:
        input_shape = default_input_shape
    config = {
        **(defaults or {}),
        **architecture,
        "include_top": include_top,
        "pooling": pooling,
        "classes": classes,
        "classifier_activation": classifier_activation,
        "input_shape": input_shape,
        "input_tensor": input_tensor,
        "name": name,
        **overrides,
        **kwargs,
    }
    if plan["kind"] in ("entry", "url"):
        # Bad arguments must not cost a download (a URL's classes come with its file).
        classes_known = config["classes"] if config["classes"] is not None else 1
        _check_model_arguments({**config, "classes": classes_known})
    weights_hooks.materialize(plan, build=get_model, **weights_args)
    if plan["kind"] == "url":
        # The verified file decided the classes and may record the input size.
        config["classes"] = plan["classes"]
        if input_tensor is None and weights_args["input_shape"] is None and "input_shape" in plan["overrides"]:
            config["input_shape"] = plan["overrides"]["input_shape"]
        config.update({k: v for k, v in plan["overrides"].items() if k != "input_shape" and k not in kwargs})
    model = PreActResNet(**config)
    return weights_hooks.load_planned_weights(model, plan)


def _check_model_arguments(config):
    """Runs `PreActResNet`'s argument checks on a factory's `config`, building nothing.

    Raises:
        ValueError: for any invalid argument (so bad input never costs a download).
    """
    wanted = set(inspect.signature(validate_config).parameters)
    defaults = {
        name: p.default
        for name, p in inspect.signature(PreActResNet.__init__).parameters.items()
        if name in wanted
    }
    validate_config(**{**defaults, **{k: v for k, v in config.items() if k in wanted}})


def _factory(depth, block):
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
        return preact_resnet_cifar(
            depth,
            block=block,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            **kwargs,
        )

    units = (depth - 2) // (6 if block == "basic" else 9)
    factory.__name__ = factory.__qualname__ = f"preact_resnet{depth}"
    factory.__doc__ = (
        f"Pre-activation ResNet-{depth} for CIFAR ({block} units, {units} per stage).\n\n"
        "Keyword-only arguments as in keras.applications: include_top=True, "
        "weights=None (or a tag, .weights.h5, .keras or URL#sha256=...), "
        "input_tensor=None, input_shape=None (32, 32, 3), pooling=None, "
        "classes=None (the weights' or 10), classifier_activation='softmax'; any other `PreActResNet` "
        "argument is forwarded. See `preact_resnet_cifar`.\n"
    )
    return register_model(depth=depth, block=block, family="cifar")(factory)


preact_resnet20 = _factory(20, "basic")
preact_resnet32 = _factory(32, "basic")
preact_resnet44 = _factory(44, "basic")
preact_resnet56 = _factory(56, "basic")
preact_resnet110 = _factory(110, "basic")
preact_resnet164 = _factory(164, "bottleneck")
preact_resnet272 = _factory(272, "bottleneck")
preact_resnet542 = _factory(542, "bottleneck")
preact_resnet1001 = _factory(1001, "bottleneck")
preact_resnet1202 = _factory(1202, "basic")
