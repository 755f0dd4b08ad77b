"""Rematerialisation (gradient checkpointing) of a stage's stacked units. The forward
pass keeps only each segment's input; the backward pass recomputes one segment at a
time (about one more forward pass). The checkpoint is the backend's: `tf.recompute_grad`
(works under `fit`, where `keras.RematScope` fails in Keras 3.15 / TF 2.21), `jax.checkpoint`
or non-reentrant `torch.utils.checkpoint`. The equal segments run as one backend loop
(`scan`), which traces far sooner and holds less than unrolled segments. Modes (`remat=`):
None / False (off), True or "segment" (segments of ceil(sqrt(n)) units, the memory-optimal
split), "unit" (one unit a segment), or an int N >= 1."""

import contextlib
import math

import keras

from keras_preact.layers.variants import get_unit

REMAT_MODES = ("unit", "segment")


def normalize_remat(remat):
    """Validates `remat`; returns None, "unit", "segment" or an int."""
    if remat is None or isinstance(remat, bool):
        return "segment" if remat else None
    if (isinstance(remat, str) and remat in REMAT_MODES) or (isinstance(remat, int) and remat >= 1):
        return remat  # (True and False, the only bools, are handled above)
    raise ValueError("`remat` must be None/False (off), True, 'unit', 'segment' or a positive int "
                     f"(units per segment). Received: remat={remat!r}")


def check_remat(remat, unit, drop_path=0.0):
    """`normalize_remat(remat)`, refused (ValueError) with random masks: unit="dropout_shortcut"
    or stochastic depth (a `drop_path` rate)."""
    mode = normalize_remat(remat)
    if mode is not None and (get_unit(unit).shortcut == "dropout" or drop_path):
        raise ValueError("`remat` cannot be combined with unit='dropout_shortcut' or stochastic "
                         "depth: recomputing a unit would draw a different mask. Received: "
                         f"remat={remat!r} with unit={unit!r}, stochastic depth {drop_path!r}")
    return mode


def segment_lengths(units, remat):
    """Lengths of the segments that `units` stacked units are cut into, e.g.:

        >>> segment_lengths(110, "segment")  # ceil(sqrt(110)) = 11
        [11, 11, 11, 11, 11, 11, 11, 11, 11, 11]
        >>> segment_lengths(5, 2)
        [2, 2, 1]
    """
    remat = normalize_remat(remat)
    if units < 1 or remat is None:
        return [units] if units else []
    size = {"unit": 1, "segment": max(1, math.ceil(math.sqrt(units)))}.get(remat, remat)
    return [size] * (units // size) + ([units % size] if units % size else [])


def checkpoint(fn):
    """Wraps `fn(*tensors) -> tuple of tensors`, which must have no side effects, so
    that the backward pass recomputes it (unchanged on other backends)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.recompute_grad(fn)
    if backend == "jax":
        import jax
        return jax.checkpoint(fn)
    if backend == "torch":
        from torch.utils import checkpoint as torch_checkpoint

        def wrapped(*args):
            # checkpoint checks its inputs' versions; statistic slices are views assigned in place.
            args = tuple(a if a.requires_grad else a.clone() for a in args)
            return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False)

        return wrapped
    return fn


@contextlib.contextmanager
def model_pruning_off():
    """Turns Grappler's model pruning off inside the block (TensorFlow).

    Model pruning undoes `tf.recompute_grad` in a traced step (the peak memory stays near
    that of no remat; `benchmarks/` measures it). TensorFlow reads the option when a function
    *runs*, not when traced, so the block must enclose the training step's calls
    (`PreActResNet` wraps its train function; a custom `tf.function` loop wraps its calls)."""
    import tensorflow as tf
    if tf.config.optimizer.get_experimental_options().get("disable_model_pruning"):
        yield
        return
    tf.config.optimizer.set_experimental_options({"disable_model_pruning": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_model_pruning": False})


def scan(fn, carry, xs, ys_like):
    """``carry, ys = fn(carry, xs[i])`` along the leading axis of `xs` as one
    differentiable backend loop (`tf.while_loop`, `jax.lax.scan`; a Python loop on
    PyTorch); returns ``(carry, stacked ys)``. `ys_like` are shaped and typed like the
    stacked `ys` (TensorFlow allocates its outputs from them)."""
    xs = tuple(xs)
    length = int(xs[0].shape[0])
    backend = keras.backend.backend()
    if backend == "jax":
        import jax
        return jax.lax.scan(lambda c, s: fn(c, tuple(s)), carry, xs)
    if backend == "tensorflow":
        return _tf_scan(fn, carry, xs, tuple(ys_like), length)
    ys_steps = []
    for i in range(length):
        carry, ys = fn(carry, tuple(x[i] for x in xs))
        ys_steps.append(ys)
    return carry, tuple(keras.ops.stack(list(y), axis=0) for y in zip(*ys_steps))


def _tf_scan(fn, carry, xs, ys_like, length):
    import tensorflow as tf
    xs_ta = [tf.TensorArray(x.dtype, size=length, element_shape=x.shape[1:]).unstack(x)
             for x in xs]
    ys_ta = [tf.TensorArray(y.dtype, size=length, element_shape=y.shape[1:]) for y in ys_like]

    def body(i, c, *tas):
        c, ys = fn(c, tuple(ta.read(i) for ta in xs_ta))
        return (i + 1, c) + tuple(ta.write(i, y) for ta, y in zip(tas, ys))

    out = tf.while_loop(
        lambda i, *_: i < length, body, (tf.constant(0), carry) + tuple(ys_ta),
        # A known trip count gives the gradient's buffers a fixed size (XLA requires it).
        parallel_iterations=1, maximum_iterations=length)
    return out[1], tuple(ta.stack() for ta in out[2:])
