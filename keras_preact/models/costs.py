"""Model costs: multiply-adds and parameter counts."""

import math

import keras

from keras_preact import private_api


def _model(model, what):
    """`model`, or the registered model of that name built with its defaults."""
    if isinstance(model, str):
        from keras_preact.models.registry import get_model
        return get_model(model)
    if not isinstance(model, keras.Model):
        raise ValueError(f"{what} needs a Keras model or a registered model name. "
                         f"Received: model={model!r}")
    return model


def count_macs(model):
    """Multiply-adds of one forward pass for one image.

    Convolutions and dense layers are counted (BN, ReLU, pooling and additions are not),
    the convention of the paper and of pytorchcv's model table; nested functional models
    are included.

    Args:
        model: a functional `keras.Model` with a fixed input size, or str, the name of a
            registered model (built with its defaults).

    Returns:
        int: the multiply-adds.

    Raises:
        ValueError: if `model` is neither a Keras model nor a registered model name, is
            not functional, or has a layer without a fixed input size.

    Example:
        >>> count_macs("preact_resnet110")  # about 253M
        253149824
    """
    model = _model(model, "count_macs")
    if not private_api.is_functional(model):
        raise ValueError("count_macs needs a functional Keras model (such as a PreActResNet). "
                         f"Received: model={type(model).__name__}")
    total = 0
    for layer in [x for x in model.layers if not isinstance(x, keras.layers.InputLayer)]:
        shape = tuple(layer.input.shape)
        if any(d is None for d in shape[1:]):
            raise ValueError("count_macs needs a fixed input size; build the model with e.g. "
                             f"input_shape=(32, 32, 3). Layer {layer.name!r} has input shape "
                             f"{shape}")
        if hasattr(layer, "compute_macs"):
            total += layer.compute_macs(shape)
        elif isinstance(layer, keras.Model) and private_api.is_functional(layer):
            total += count_macs(layer)
        elif isinstance(layer, keras.layers.Conv2D):
            from keras_preact.layers.shapes import conv_macs
            total += conv_macs(layer, shape, layer.data_format)
        elif isinstance(layer, keras.layers.Dense):
            total += int(layer.kernel.shape[0] * layer.kernel.shape[1])
    return int(total)


def count_params(model, trainable_only=True):
    """Number of (trainable) parameters, as the published model tables count them.

    Args:
        model: a `keras.Model`, or str, the name of a registered model (built with its
            defaults).
        trainable_only: bool, count only the trainable weights; False counts every weight
            (non-trainable ones too, such as BatchNorm's moving statistics).
            Defaults to `True`.

    Returns:
        int: the number of parameters.

    Raises:
        ValueError: if `model` is neither a Keras model nor a registered model name."""
    model = _model(model, "count_params")
    weights = model.trainable_weights if trainable_only else model.weights
    return int(sum(math.prod(int(d) for d in w.shape) for w in weights))
