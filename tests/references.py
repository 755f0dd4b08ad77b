"""The publishers' own models with random weights, for the converter tests and benchmarks.

`keras_reference` and `save_legacy_h5` stand in for the keras.applications ResNetV2
files; `pytorchcv_reference`, `state_dict_arrays` and `reference_logits` for the
imgclsmob / pytorchcv checkpoints (they need torch and pytorchcv).
"""

import numpy as np

from keras_preact.weights.converters.keras_applications import UPSTREAM_NAMES


def _bn_shrink(count):
    """Scales below 1, shrinking with depth, keep a deep random net's logits of the order
    of a trained net's, where float32 rounding is far below the 1e-4 bound."""
    return min(1.0, (60.0 / max(count, 1)) ** 0.5)


def keras_reference(depth, *, include_top=True, input_shape=None, seed=0):
    """keras.applications' ResNet{depth}V2 (depth 50, 101 or 152; logits, default
    224x224 input) with random weights, BatchNorm statistics included."""
    import keras

    if depth not in UPSTREAM_NAMES:
        raise ValueError(f"No keras.applications ResNetV2 of depth {depth}. "
                         f"Valid: {sorted(UPSTREAM_NAMES)}")
    keras.utils.set_random_seed(seed)
    kwargs = dict(weights=None, include_top=include_top, classifier_activation=None)
    if input_shape is not None:
        kwargs["input_shape"] = tuple(input_shape)
    net = getattr(keras.applications, UPSTREAM_NAMES[depth])(**kwargs)
    rng = np.random.RandomState(seed + 1)
    bns = [layer for layer in net.layers if isinstance(layer, keras.layers.BatchNormalization)]
    shrink = _bn_shrink(len(bns))
    for layer in bns:
        n = layer.gamma.shape[0]
        layer.gamma.assign(rng.uniform(0.2 * shrink, 0.6 * shrink, n).astype("float32"))
        layer.beta.assign(rng.uniform(-0.1, 0.1, n).astype("float32"))
        layer.moving_mean.assign(rng.uniform(-0.1, 0.1, n).astype("float32"))
        layer.moving_variance.assign(rng.uniform(0.5, 1.5, n).astype("float32"))
    for layer in net.layers:
        biased = isinstance(layer, (keras.layers.Conv2D, keras.layers.Dense))
        if biased and layer.bias is not None:
            layer.bias.assign(rng.uniform(-0.1, 0.1, layer.bias.shape).astype("float32"))
    return net


def save_legacy_h5(net, path, *, keras_version="2.2.4", backend="tensorflow"):
    """Writes a Keras model's weights as Keras 2's ``save_weights("....h5")`` did, the
    format of the published keras.applications files: ``layer_names`` lists every layer,
    weights or not, and each layer's arrays are in Keras' legacy order (trainable, then
    non-trainable). Returns `path`."""
    import h5py

    # Fixed-length byte strings, as h5py 2 stored Keras 2's lists of bytes.
    with h5py.File(path, "w") as f:
        f.attrs["layer_names"] = np.asarray([layer.name.encode("utf8") for layer in net.layers])
        f.attrs["backend"] = np.bytes_(backend.encode("utf8"))
        f.attrs["keras_version"] = np.bytes_(keras_version.encode("utf8"))
        for layer in net.layers:
            group = f.create_group(layer.name)
            weights = layer.trainable_weights + layer.non_trainable_weights
            names = [f"{layer.name}/{w.name}:0".encode() for w in weights]
            group.attrs["weight_names"] = np.asarray(names)
            for name, w in zip(names, weights):
                group.create_dataset(name.decode("utf8"), data=np.asarray(w))
    return path


def pytorchcv_reference(upstream_name, *, seed=0):
    """pytorchcv's model `upstream_name` (a torch module in eval mode) with random
    weights, BatchNorm parameters and running statistics included.

    Needs ``pytorchcv`` (``pip install --no-deps pytorchcv==0.0.74`` after torch: its
    model provider imports torchvision, which we do not need).
    """
    import torch

    try:
        # The modules themselves: pytorchcv's model provider imports torchvision.
        from pytorchcv.models import preresnet, preresnet_cifar
    except ImportError:
        raise ModuleNotFoundError(
            "Comparing against the reference models needs pytorchcv: "
            "`pip install --no-deps pytorchcv==0.0.74` (after torch).") from None
    modules = (preresnet_cifar, preresnet)
    names = [n for m in modules for n in m.__all__ if n.startswith("preresnet")]
    if upstream_name not in names:
        raise ValueError(f"pytorchcv has no pre-activation model {upstream_name!r}. Valid: {names}")
    module = preresnet_cifar if upstream_name in preresnet_cifar.__all__ else preresnet
    torch.manual_seed(seed)
    net = getattr(module, upstream_name)()
    g = torch.Generator().manual_seed(seed + 1)
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    # Every unit adds to the residual stream, up to 1202 layers deep.
    shrink = _bn_shrink(len(bns))
    with torch.no_grad():
        for m in bns:
            m.weight.uniform_(0.2 * shrink, 0.6 * shrink, generator=g)
            m.bias.uniform_(-0.1, 0.1, generator=g)
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
    return net.eval()


def state_dict_arrays(net):
    """A torch module's state dict as numpy arrays."""
    return {k: v.detach().cpu().numpy() for k, v in net.state_dict().items()}


def reference_logits(net, images_nhwc):
    """Logits of a torch reference model for NHWC float images (already normalised)."""
    import torch

    with torch.no_grad():
        x = torch.from_numpy(np.ascontiguousarray(np.transpose(images_nhwc, (0, 3, 1, 2))))
        return net(x).numpy()
