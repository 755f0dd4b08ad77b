"""Converter for the imgclsmob / pytorchcv pre-activation ResNet checkpoints (CIFAR,
SVHN and ImageNet).

The published files are PyTorch ``state_dict`` pickles (``{name}-{error}-{sha1[:8]}.pth``
inside a ``.pth.zip`` release asset), read with ``torch.load(..., weights_only=True)``,
which refuses anything but tensors and plain containers, so a checkpoint cannot run code.

The mapping (``features.stage{s}.unit{u}.body.conv{i}`` -> ``conv{i}_kernel``, its BN
-> ``preact_bn_*`` for i = 1, else ``bn{i}_*``) is `_cifar_assignments`. Every tensor
must be used exactly once and every variable assigned exactly once, with
equal shapes; anything else raises ``ValueError`` listing the differences. The
architecture itself (``first_unit_shared_preact=False`` for the basic nets, whose first
unit keeps an identity shortcut on the raw stem output; the bottleneck stride on the
3x3 conv) comes from the catalog entry.
"""

import numpy as np

from keras_preact.weights.converters import assign_all
from keras_preact.weights.converters import match_arrays
from keras_preact.weights.converters import require_preact_resnet

#: pytorchcv BatchNorm buffer/parameter names -> keras-preact BN field names.
_BN_FIELDS = {
    "weight": "gamma",
    "bias": "beta",
    "running_mean": "moving_mean",
    "running_var": "moving_variance",
}


def _import_torch():
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(
            "Converting PyTorch checkpoints needs PyTorch. Install the CPU build with "
            "`pip install \"keras-preact[torch]\"` (or `pip install torch==2.13.0`)."
        ) from None
    return torch


def _numpy(state):
    # num_batches_tracked is bookkeeping with no counterpart in Keras.
    return {k: v.detach().cpu().numpy() for k, v in state.items()
            if not k.endswith("num_batches_tracked")}


def read_state_dict(path):
    """Reads a `.pth` state dict as numpy arrays (dict name -> array), without
    running pickled code.

    Raises:
        ModuleNotFoundError: when torch is not installed (with the install command).
        ValueError: when the file is not a readable weights-only state dict.
    """
    torch = _import_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError...
        raise ValueError("The file is not a PyTorch state dict that can be read with "
                         f"weights_only=True ({type(err).__name__}: {str(err)[:300]}). "
                         f"Received: {path!r}") from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError("The checkpoint does not hold a state dict (a mapping of names to tensors). "
                         f"Received: {path!r}")
    return _numpy(state)


def _conv_kernel(w):
    # torch (out, in, kh, kw) -> keras (kh, kw, in, out)
    return np.transpose(w, (2, 3, 1, 0))


def _cifar_assignments(model):
    """Yields (variable, [(torch key, transform), ...], stacked) for every variable;
    a stacked variable lists one key per stacked unit (rows in order)."""
    from keras_preact.layers.functional import BN_FIELDS

    torch_bn = {v: k for k, v in _BN_FIELDS.items()}

    def unit_key(stage, unit, var_name):
        prefix = f"features.stage{stage}.unit{unit}."
        if var_name == "shortcut_kernel":
            return prefix + "identity_conv.weight", _conv_kernel
        head, _, field = var_name.partition("_")
        if var_name.startswith("preact_bn_"):
            return prefix + f"body.conv1.bn.{torch_bn[var_name[len('preact_bn_'):]]}", None
        if head.startswith("bn") and field in BN_FIELDS:
            return prefix + f"body.conv{int(head[2:])}.bn.{torch_bn[field]}", None
        if head.startswith("conv") and field == "kernel":
            return prefix + f"body.{head}.conv.weight", _conv_kernel
        raise ValueError(f"No pytorchcv counterpart for unit variable {var_name!r}")

    def batchnorm(layer, prefix):
        for torch_name, field in _BN_FIELDS.items():
            yield getattr(layer, field), [(f"{prefix}.{torch_name}", None)], False

    stem = model.get_layer("stem_conv")
    if getattr(model, "stem", "cifar") == "imagenet":
        # PreResInitBlock: 7x7/2 conv, BN, ReLU, 3x3/2 max pool.
        yield stem.kernel, [("features.init_block.conv.weight", _conv_kernel)], False
        yield from batchnorm(model.get_layer("stem_bn"), "features.init_block.bn")
    else:
        yield stem.kernel, [("features.init_block.weight", _conv_kernel)], False
    for s in range(1, len(model.stage_blocks) + 1):
        stage = model.get_layer(f"stage{s}")
        for name, var in stage.unit1._vars.items():
            yield var, [unit_key(s, 1, name)], False
        for name, var in stage._stacked.items():
            yield var, [unit_key(s, u, name) for u in range(2, stage.units + 1)], True
    yield from batchnorm(model.get_layer("post_bn"), "features.post_activ.bn")
    if model.include_top:
        dense = model.get_layer("logits")
        yield dense.kernel, [("output.weight", np.transpose)], False
        yield dense.bias, [("output.bias", None)], False


def load_state_dict(model, state, *, source="checkpoint"):
    """Loads a pytorchcv pre-activation ResNet state dict (name -> numpy array, see
    `read_state_dict`) into a `PreActResNet` of the checkpoint's architecture.

    Returns:
        dict with "converted_tensors" (int).

    Raises:
        ValueError: when the checkpoint and the model do not match one to one
            (another depth, block, width or number of classes), before any variable
            of the model is changed.
    """
    require_preact_resnet(model, "pytorchcv")
    imagenet_checkpoint = "features.init_block.conv.weight" in state
    imagenet_model = getattr(model, "stem", "cifar") == "imagenet"
    if imagenet_checkpoint != imagenet_model:
        kinds = ("a CIFAR PreResNet (3x3 stem)", "an ImageNet PreResNet (7x7 stem with "
                 "BatchNorm and max pooling)")
        raise ValueError(f"The checkpoint is {kinds[imagenet_checkpoint]}, but {model.name!r} is "
                         f"{kinds[imagenet_model]}. Received: {source}")
    plan, missing, mismatched, unexpected = match_arrays(_cifar_assignments(model), state)
    problems = [f"{len(mismatched)} shape mismatches, e.g. " + str([
        f"{keys[0]}{f' (+{len(keys) - 1} units)' if len(keys) > 1 else ''}: checkpoint "
        f"{shape} vs model {tuple(var.shape)} ({var.path})" for keys, shape, var in mismatched[:3]
    ])] if mismatched else []
    for keys, what in ((missing, "tensors missing"), (sorted(unexpected), "unexpected tensors")):
        if keys:
            problems.append(f"{len(keys)} {what}, e.g. {keys[:3]}")
    if problems:
        raise ValueError(
            f"The checkpoint does not match the architecture of {model.name!r} "
            f"(depth {model.depth}, {model.block} units, stages {list(model.stage_blocks)}, "
            f"classes {model.classes if model.include_top else None}): "
            + "; ".join(problems) + f". Received: {source}"
        )
    assign_all(plan)
    return {"converted_tensors": len(state)}


def convert(source_path, model, entry):
    """Catalog converter (see `keras_preact.weights.converters`)."""
    return load_state_dict(model, read_state_dict(source_path), source=f"{source_path!r}")


def pytorchcv_reference(upstream_name, *, seed=0):
    """pytorchcv's model `upstream_name` (a torch module in eval mode) with random
    weights, BatchNorm parameters and running statistics included.

    Needs ``pytorchcv`` (install it with ``pip install --no-deps pytorchcv==0.0.74``
    after torch: its model provider imports torchvision, which we do not need).
    """
    torch = _import_torch()
    try:
        # The modules themselves: pytorchcv's model provider imports torchvision.
        from pytorchcv.models import preresnet
        from pytorchcv.models import preresnet_cifar
    except ImportError:
        raise ModuleNotFoundError("Comparing against the reference models needs pytorchcv: "
                                  "`pip install --no-deps pytorchcv==0.0.74` (after torch).") from None
    names = [n for m in (preresnet_cifar, preresnet) for n in m.__all__ if n.startswith("preresnet")]
    if upstream_name not in names:
        raise ValueError(f"pytorchcv has no pre-activation model {upstream_name!r}. Valid: {names}")
    module = preresnet_cifar if upstream_name in preresnet_cifar.__all__ else preresnet
    torch.manual_seed(seed)
    net = getattr(module, upstream_name)()
    g = torch.Generator().manual_seed(seed + 1)
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # Every unit adds to the residual stream: shrink the scales with depth so that the
    # logits of a 1202-layer net stay of the order of a trained net's, where float32
    # rounding is far below the 1e-4 bound.
    shrink = min(1.0, (60.0 / max(len(bns), 1)) ** 0.5)
    with torch.no_grad():
        for m in bns:
            m.weight.uniform_(0.2 * shrink, 0.6 * shrink, generator=g)
            m.bias.uniform_(-0.1, 0.1, generator=g)
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
    return net.eval()


def reference_logits(net, images_nhwc):
    """Logits of a torch reference model for NHWC float images (already normalised)."""
    torch = _import_torch()
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(np.transpose(images_nhwc, (0, 3, 1, 2))))
        return net(x).numpy()


def state_dict_arrays(net):
    """A torch module's state dict as numpy arrays (bookkeeping buffers dropped)."""
    return _numpy(net.state_dict())
