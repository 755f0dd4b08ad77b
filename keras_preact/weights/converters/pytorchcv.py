"""Converter for the imgclsmob / pytorchcv pre-activation ResNet checkpoints (CIFAR, SVHN,
ImageNet): PyTorch ``state_dict`` files, read without torch by
`keras_preact.weights.torch_checkpoint.read_state_dict`, which runs no code from the file.
The architecture (e.g. ``first_shared_preact=False`` for the basic nets) comes from the
catalog entry."""

import numpy as np

from keras_preact.architecture import HEAD_LAYER, STEM_CONV_LAYER
from keras_preact.weights.converters import assign_arrays, require_preact_resnet
from keras_preact.weights.torch_checkpoint import read_state_dict

_TORCH_BN = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
             "moving_variance": "running_var"}


def _conv_kernel(w):
    """torch (out, in, kh, kw) -> keras (kh, kw, in, out)."""
    return np.transpose(w, (2, 3, 1, 0))


def _unit_source(stage, unit, var_name):
    """(torch key, transform) of a unit variable: ``body.conv{i}`` is ``conv{i}_kernel``,
    its BN ``preact_bn_*`` for i = 1, else ``bn{i}_*``."""
    prefix = f"features.stage{stage}.unit{unit}."
    if var_name == "shortcut_kernel":
        return prefix + "identity_conv.weight", _conv_kernel
    head, _, field = var_name.partition("_")
    if var_name.startswith("preact_bn_"):
        return prefix + f"body.conv1.bn.{_TORCH_BN[var_name[len('preact_bn_'):]]}", None
    if head.startswith("bn") and field in _TORCH_BN:
        return prefix + f"body.conv{int(head[2:])}.bn.{_TORCH_BN[field]}", None
    if head.startswith("conv") and field == "kernel":
        return prefix + f"body.{head}.conv.weight", _conv_kernel
    raise ValueError(f"No pytorchcv counterpart for unit variable {var_name!r}")


def _batchnorm(layer, prefix):
    for field, torch_name in _TORCH_BN.items():
        yield getattr(layer, field), [(f"{prefix}.{torch_name}", None)], False


def _assignments(model, imagenet):
    """Yields `assign_arrays` assignments: (variable, [(torch key, transform), ...], stacked),
    of a model with the ImageNet stem or not (`imagenet`)."""
    stem_key = "features.init_block.conv.weight" if imagenet else "features.init_block.weight"
    yield model.get_layer(STEM_CONV_LAYER).kernel, [(stem_key, _conv_kernel)], False
    if imagenet:  # PreResInitBlock: 7x7/2 conv, BN, ReLU, 3x3/2 max pool.
        yield from _batchnorm(model.get_layer("stem_bn"), "features.init_block.bn")
    for s in range(1, len(model.stage_blocks) + 1):
        stage = model.get_layer(f"stage{s}")
        for name, *_ in stage.unit1.spec.variable_specs():
            yield stage.unit1.get_variable(name), [_unit_source(s, 1, name)], False
        for name, *_ in stage.repeat_spec.variable_specs() if stage.num_stacked else ():
            units = range(2, stage.num_blocks + 1)  # pytorchcv strides unit 1: no "unit_last"
            yield stage.get_variable(name), [_unit_source(s, u, name) for u in units], True
    yield from _batchnorm(model.get_layer("post_bn"), "features.post_activ.bn")
    if model.include_top:
        dense = model.get_layer(HEAD_LAYER)
        yield dense.kernel, [("output.weight", np.transpose)], False
        yield dense.bias, [("output.bias", None)], False


def load_state_dict(model, state, *, source="checkpoint"):
    """Loads a pytorchcv pre-activation ResNet state dict (name -> numpy array) into a
    `PreActResNet` of the checkpoint's architecture; returns ``{"converted_tensors": n}``.
    ValueError, with nothing changed, when they do not match one to one."""
    require_preact_resnet(model, "pytorchcv")
    # num_batches_tracked is bookkeeping with no counterpart in Keras.
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    imagenet_checkpoint = "features.init_block.conv.weight" in state
    imagenet_model = getattr(model, "stem", "cifar") == "imagenet"
    if imagenet_checkpoint != imagenet_model:
        kinds = ("a CIFAR PreResNet (3x3 stem)", "an ImageNet PreResNet (7x7 stem with "
                 "BatchNorm and max pooling)")
        raise ValueError(f"The checkpoint is {kinds[imagenet_checkpoint]}, but {model.name!r} is "
                         f"{kinds[imagenet_model]}. Received: {source}")
    return assign_arrays(model, _assignments(model, imagenet_model), state, what="checkpoint",
                         noun="tensor", source=source)


def convert(source_path, model, entry):
    """Catalog converter (see `keras_preact.weights.converters`)."""
    return load_state_dict(model, read_state_dict(source_path), source=f"{source_path!r}")
