"""What the model families' factories share."""

from keras_preact.architecture import ARGUMENTS, Architecture
from keras_preact.checks import check_bool, check_known_arguments
from keras_preact.layers.shapes import normalize_data_format
from keras_preact.models.preact_resnet import (
    MODEL_ARGUMENTS, PreActResNet, check_input_tensor, rename_deprecated, validate_config)
from keras_preact.models.registry import get_model, register_model
from keras_preact.weights import argument as weights_argument


def check_reserved(kwargs, reserved):
    """ValueError for an argument of `kwargs` a registered model fixes."""
    for name in reserved:
        if name in kwargs:
            raise ValueError(f"`{name}` is fixed by the registered model; use another depth "
                             "(`keras_preact.list_models()`) or PreActResNet directly to "
                             f"change it. Received: {name}={kwargs[name]!r}")


def build_with_weights(model_name, architecture, *, weights, include_top, input_tensor,
                       input_shape, size, pooling, classes, default_classes,
                       classifier_activation, name, kwargs, defaults=None):
    """Builds a registered model's `PreActResNet` and loads its `weights`, validated
    (and fetched) before any layer is built; they may set architecture arguments, the
    preprocessing and the input size (`weights.argument`; else `size` squared). `architecture`
    holds the arguments the model's name fixes; `defaults` the family's, which the weights'
    recorded architecture and the caller's `kwargs` override."""
    kwargs = rename_deprecated(kwargs, model_name)
    check_known_arguments(kwargs, MODEL_ARGUMENTS, where=model_name)
    check_input_tensor(input_tensor)
    check_bool("include_top", include_top)
    include_top = include_top and not kwargs.get("features")  # a backbone loads as no-top
    classes = default_classes if weights is None and classes is None else classes
    channels_last = normalize_data_format(kwargs.get("data_format")) == "channels_last"
    request = weights_argument.WeightsRequest(
        weights=weights, model=model_name, include_top=include_top, classes=classes,
        input_shape=tuple(input_tensor.shape[1:]) if input_tensor is not None else input_shape,
        channels_last=channels_last, kwargs=kwargs, fixed=architecture)
    plan = weights_argument.plan_weights(request)
    overrides = dict(plan["overrides"])
    recorded_shape = overrides.pop("input_shape", None)
    if input_shape is None and input_tensor is None:
        input_shape = recorded_shape or ((size, size, 3) if channels_last else (3, size, size))
    config = {**(defaults or {}), **architecture, "include_top": include_top,
              "pooling": pooling, "classes": plan["classes"],
              "classifier_activation": classifier_activation, "input_shape": input_shape,
              "input_tensor": input_tensor, "name": name or model_name, **overrides, **kwargs}
    if plan["kind"] in ("entry", "url"):
        # Bad arguments must not cost a download (a URL's classes come with its file: until
        # then, 2 stands in, a count every head takes).
        known = 2 if config["classes"] is None else config["classes"]
        validate_config(Architecture(**{k: v for k, v in {**config, "classes": known}.items()
                                        if k in ARGUMENTS}))
    weights_argument.materialize(plan, request, build=get_model)
    if plan["kind"] == "url":
        # The verified file decided the classes and may record the input size.
        config["classes"] = plan["classes"]
        recorded = plan["overrides"]
        if input_tensor is None and request.input_shape is None and "input_shape" in recorded:
            config["input_shape"] = recorded["input_shape"]
        config.update({k: v for k, v in recorded.items() if k != "input_shape" and k not in kwargs})
    return weights_argument.load_planned_weights(PreActResNet(**config), plan)


def register_factory(build, depth, block, summary, *, weights_help, size, default_classes,
                     fixed=None):
    """Registers ``preact_resnet{depth}``, `build(depth, **fixed, ...)` with
    keras.applications' keyword-only arguments, documented by `summary` and the defaults."""

    def factory(*, include_top=True, weights=None, input_tensor=None, input_shape=None,
                pooling=None, classes=None, classifier_activation="softmax", **kwargs):
        check_reserved(kwargs, ("depth", *(fixed or {})))
        return build(depth, include_top=include_top, weights=weights, input_tensor=input_tensor,
                     input_shape=input_shape, pooling=pooling, classes=classes,
                     classifier_activation=classifier_activation, **(fixed or {}), **kwargs)

    factory.__name__ = factory.__qualname__ = f"preact_resnet{depth}"
    factory.__doc__ = (
        f"{summary}\n\nKeyword-only arguments as in keras.applications: include_top=True, "
        f"weights=None ({weights_help}), input_tensor=None, input_shape=None ({size}, {size}, 3), "
        f"pooling=None, classes=None (the weights' or {default_classes}), classifier_activation="
        f"'softmax'; any other `PreActResNet` argument is forwarded. See `{build.__name__}`.\n")
    family = build.__name__.removeprefix("preact_resnet_")
    return register_model(depth=depth, block=block, family=family)(factory)
