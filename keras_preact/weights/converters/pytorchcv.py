"""Converter for the imgclsmob / pytorchcv pre-activation ResNet checkpoints (CIFAR,
SVHN and ImageNet).

The published files are PyTorch ``state_dict`` pickles (``{name}-{error}-{sha1[:8]}.pth``
inside a ``.pth.zip`` release asset). They are read with
``torch.load(..., weights_only=True)``, which refuses anything but tensors and plain
containers, so a checkpoint cannot run code.

Mapping (pytorchcv ``CIFARPreResNet`` -> `PreActResNet`):

============================================================  ===========================
pytorchcv key                                                 keras-preact variable
============================================================  ===========================
``features.init_block.weight`` (O, I, kh, kw)                 ``stem_conv`` kernel
``features.init_block.{conv.weight, bn.*}`` (ImageNet)        ``stem_conv``, ``stem_bn``
``features.stage{s}.unit{u}.body.conv{i}.bn.*``               ``preact_bn_*`` (i = 1),
                                                              ``bn{i}_*`` (i > 1)
``features.stage{s}.unit{u}.body.conv{i}.conv.weight``        ``conv{i}_kernel``
``features.stage{s}.unit{u}.identity_conv.weight``            ``shortcut_kernel``
``features.post_activ.bn.*``                                  ``post_bn``
``output.weight`` / ``output.bias``                           ``logits`` kernel / bias
============================================================  ===========================

Units 2..n of a stage are stacked variables in keras-preact (one row per unit).
Every tensor of the checkpoint must be used exactly once and every variable of the
model assigned exactly once, with equal shapes; anything else is a checkpoint of
another architecture and raises ``ValueError`` listing the differences. The
architecture itself (``first_unit_shared_preact=False`` for the basic nets, whose first
unit keeps an identity shortcut on the raw stem output; the bottleneck stride on the
3x3 conv) comes from the catalog entry.
"""

import numpy as np

#: pytorchcv BatchNorm buffer/parameter names -> keras-preact BN field names.
_BN_FIELDS = {
    "weight": "gamma",
    "bias": "beta",
    "running_mean": "moving_mean",
    "running_var": "moving_variance",
}
# Bookkeeping buffers with no counterpart in Keras.
_IGNORED_SUFFIXES = ("num_batches_tracked",)

TORCH_INSTALL_HINT = (
    "Converting PyTorch checkpoints needs PyTorch. Install the CPU build with "
    "`pip install \"keras-preact[torch]\"` (or `pip install torch==2.13.0`)."
)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(TORCH_INSTALL_HINT) from None
    return torch


def read_state_dict(path):
    """Reads a `.pth` state dict as numpy arrays, without running pickled code.

    Args:
        path: a file written by ``torch.save(model.state_dict(), path)``.

    Returns:
        dict name -> numpy array.

    Raises:
        ImportError: when torch is not installed (with the install command).
        ValueError: when the file is not a readable weights-only state dict.
    """
    torch = _import_torch()
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError...
        raise ValueError(
            "The file is not a PyTorch state dict that can be read with "
            f"weights_only=True ({type(err).__name__}: {str(err)[:300]}). "
            f"Received: {path!r}"
        ) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(torch.is_tensor(v) for v in state.values()):
        raise ValueError(
            "The checkpoint does not hold a state dict (a mapping of names to tensors). "
            f"Received: {path!r}"
        )
    return {
        k: v.detach().cpu().numpy()
        for k, v in state.items()
        if not k.endswith(_IGNORED_SUFFIXES)
    }


def _conv_kernel(w):
    # torch (out, in, kh, kw) -> keras (kh, kw, in, out)
    return np.transpose(w, (2, 3, 1, 0))


def _cifar_assignments(model):
    """Yields (variable, [(torch key, transform), ...], stacked) for every variable.

    For a stacked variable the list has one key per stacked unit (rows in order).
    """
    from keras_preact.layers.functional import BN_FIELDS

    torch_bn = {v: k for k, v in _BN_FIELDS.items()}

    def unit_key(stage, unit, var_name):
        prefix = f"features.stage{stage}.unit{unit}."
        if var_name == "shortcut_kernel":
            return prefix + "identity_conv.weight", _conv_kernel
        head, _, field = var_name.partition("_")
        if var_name.startswith("preact_bn_"):
            field = var_name[len("preact_bn_"):]
            return prefix + f"body.conv1.bn.{torch_bn[field]}", None
        if head.startswith("bn") and field in BN_FIELDS:
            i = int(head[2:])
            return prefix + f"body.conv{i}.bn.{torch_bn[field]}", None
        if head.startswith("conv") and field == "kernel":
            return prefix + f"body.{head}.conv.weight", _conv_kernel
        raise ValueError(f"No pytorchcv counterpart for unit variable {var_name!r}")

    stem = model.get_layer("stem_conv")
    if getattr(model, "stem", "cifar") == "imagenet":
        # PreResInitBlock: 7x7/2 conv, BN, ReLU, 3x3/2 max pool.
        yield stem.kernel, [("features.init_block.conv.weight", _conv_kernel)], False
        bn = model.get_layer("stem_bn")
        for field, var in (("weight", bn.gamma), ("bias", bn.beta),
                           ("running_mean", bn.moving_mean), ("running_var", bn.moving_variance)):
            yield var, [(f"features.init_block.bn.{field}", None)], False
    else:
        yield stem.kernel, [("features.init_block.weight", _conv_kernel)], False
    for s in range(1, len(model.stage_blocks) + 1):
        stage = model.get_layer(f"stage{s}")
        for name, var in stage.unit1._vars.items():
            yield var, [unit_key(s, 1, name)], False
        for name, var in stage._stacked.items():
            keys = [unit_key(s, u, name) for u in range(2, stage.units + 1)]
            yield var, keys, True
    post = model.get_layer("post_bn")
    for field, var in (("weight", post.gamma), ("bias", post.beta),
                       ("running_mean", post.moving_mean), ("running_var", post.moving_variance)):
        yield var, [(f"features.post_activ.bn.{field}", None)], False
    if model.include_top:
        dense = model.get_layer("logits")
        yield dense.kernel, [("output.weight", np.transpose)], False
        yield dense.bias, [("output.bias", None)], False


def load_state_dict(model, state, *, source="checkpoint"):
    """Loads a pytorchcv CIFAR pre-activation ResNet state dict into `model`.

    Args:
        model: a `keras_preact.PreActResNet` with the checkpoint's architecture.
        state: dict name -> numpy array (see `read_state_dict`).
        source: how to name the checkpoint in error messages.

    Returns:
        dict with "converted_tensors" (int).

    Raises:
        ValueError: when the checkpoint and the model do not match one to one
            (another depth, block, width or number of classes), before any variable
            of the model is changed.
    """
    # Told apart by its stages, not its class: weights/ never imports models/.
    if not hasattr(model, "stage_blocks"):
        raise ValueError(
            "The pytorchcv converter loads into a keras_preact PreActResNet. "
            f"Received: {type(model).__name__}"
        )
    imagenet_checkpoint = "features.init_block.conv.weight" in state
    imagenet_model = getattr(model, "stem", "cifar") == "imagenet"
    if imagenet_checkpoint != imagenet_model:
        kinds = ("a CIFAR PreResNet (3x3 stem)", "an ImageNet PreResNet (7x7 stem with "
                 "BatchNorm and max pooling)")
        raise ValueError(
            f"The checkpoint is {kinds[imagenet_checkpoint]}, but {model.name!r} is "
            f"{kinds[imagenet_model]}. "
            f"Received: {source}"
        )
    used, missing, mismatched, plan = set(), [], [], []
    for var, keys, stacked in _cifar_assignments(model):
        arrays = []
        for key, transform in keys:
            if key not in state:
                missing.append(key)
                continue
            used.add(key)
            value = state[key]
            arrays.append(transform(value) if transform is not None else value)
        if len(arrays) != len(keys):
            continue
        value = np.stack(arrays) if stacked else arrays[0]
        if tuple(value.shape) != tuple(var.shape):
            mismatched.append(
                f"{keys[0][0]}{' (+%d units)' % (len(keys) - 1) if stacked else ''}: "
                f"checkpoint {tuple(value.shape)} vs model {tuple(var.shape)} ({var.path})"
            )
            continue
        plan.append((var, value))
    unexpected = sorted(set(state) - used)
    if missing or mismatched or unexpected:
        problems = []
        if mismatched:
            problems.append(f"{len(mismatched)} shape mismatches, e.g. {mismatched[:3]}")
        if missing:
            problems.append(f"{len(missing)} tensors missing, e.g. {missing[:3]}")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected tensors, e.g. {unexpected[:3]}")
        raise ValueError(
            f"The checkpoint does not match the architecture of {model.name!r} "
            f"(depth {model.depth}, {model.block} units, stages {list(model.stage_blocks)}, "
            f"classes {model.classes if model.include_top else None}): "
            + "; ".join(problems)
            + f". Received: {source}"
        )
    for var, value in plan:
        var.assign(value.astype(var.dtype))
    return {"converted_tensors": len(used)}


def convert(source_path, model, entry):
    """Catalog converter: loads the `.pth` at `source_path` into `model`.

    See `keras_preact.weights.converters` for the interface.
    """
    state = read_state_dict(source_path)
    return load_state_dict(model, state, source=f"{source_path!r}")


def _randomize_batchnorm(module, seed):
    """Gives every BatchNorm of a torch module random affine parameters and running
    statistics, so a comparison exercises every converted field. The scales are kept
    below 1 so that deep random networks stay finite in inference mode."""
    import torch

    g = torch.Generator().manual_seed(seed)
    bns = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # Every unit adds to the residual stream: shrink the scales with depth so that the
    # logits of a 1202-layer net stay of the order of a trained net's, where float32
    # rounding is far below the 1e-4 bound.
    shrink = min(1.0, (60.0 / max(len(bns), 1)) ** 0.5)
    with torch.no_grad():
        for m in bns:
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.uniform_(0.2 * shrink, 0.6 * shrink, generator=g)
                m.bias.uniform_(-0.1, 0.1, generator=g)
                m.running_mean.uniform_(-0.1, 0.1, generator=g)
                m.running_var.uniform_(0.5, 1.5, generator=g)


def pytorchcv_reference(upstream_name, *, seed=0):
    """Builds pytorchcv's model `upstream_name` with random weights (eval mode).

    Needs ``pytorchcv`` (install it with ``pip install --no-deps pytorchcv==0.0.74``
    after torch: its model provider imports torchvision, which we do not need).

    Returns:
        the torch module.
    """
    torch = _import_torch()
    try:
        # The modules themselves: pytorchcv's model provider imports torchvision.
        from pytorchcv.models import preresnet
        from pytorchcv.models import preresnet_cifar
    except ImportError:
        raise ModuleNotFoundError(
            "Comparing against the reference models needs pytorchcv: "
            "`pip install --no-deps pytorchcv==0.0.74` (after torch)."
        ) from None
    names = [n for m in (preresnet_cifar, preresnet) for n in m.__all__ if n.startswith("preresnet")]
    if upstream_name not in names:
        raise ValueError(
            f"pytorchcv has no pre-activation model {upstream_name!r}. Valid: {names}"
        )
    module = preresnet_cifar if upstream_name in preresnet_cifar.__all__ else preresnet
    torch.manual_seed(seed)
    net = getattr(module, upstream_name)()
    _randomize_batchnorm(net, seed + 1)
    return net.eval()


def reference_logits(net, images_nhwc):
    """Logits of a torch reference model for NHWC float images (already normalised)."""
    torch = _import_torch()
    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(np.transpose(images_nhwc, (0, 3, 1, 2))))
        return net(x).numpy()


def state_dict_arrays(net):
    """A torch module's state dict as numpy arrays (bookkeeping buffers dropped)."""
    return {
        k: v.detach().cpu().numpy()
        for k, v in net.state_dict().items()
        if not k.endswith(_IGNORED_SUFFIXES)
    }
