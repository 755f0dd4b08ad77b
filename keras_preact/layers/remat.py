"""Rematerialisation (gradient checkpointing) of a stage's stacked units.

A stage of ``n`` identical units normally keeps every intermediate tensor of every
unit for the backward pass. With rematerialisation the units are cut into segments:
the forward pass keeps only each segment's input, and the backward pass recomputes
one segment at a time. Memory falls from ~n units' activations to ~n/k segment
inputs plus one segment's activations (k units a segment); the price is about one
extra forward pass (~1.33x the compute of a training step).

The checkpoint is the backend's own:

* TensorFlow: `tf.recompute_grad` (works inside `model.fit`'s `tf.function`;
  `keras.RematScope(mode="full")` around the model fails there as soon as `fit` traces
  it: "The custom_gradient decorator currently supports keywords arguments only when
  eager execution is enabled", Keras 3.15.1 / TF 2.21);
* JAX: `jax.checkpoint`;
* PyTorch: `torch.utils.checkpoint.checkpoint` (non-reentrant).

The checkpointed function is pure: it returns the new BatchNorm moving statistics
as outputs instead of assigning them, and the stage assigns them once after the
forward pass. Recomputation therefore never updates them a second time.

The equal segments run as one loop of the backend (`scan`: `tf.while_loop`,
`jax.lax.scan`), so a traced training step holds one segment's graph however deep
the stage is. Measured on ResNet-1001 (TensorFlow, 2 CPU cores, batch 8): with the
segments unrolled, tracing and optimising the step took minutes and ~3.3 GB; looped,
the first step takes 37 s and the process peaks at 1.8 GB.

Modes (the `remat` argument of `PreActStage`, `PreActResNet` and the factories):

* ``None`` / ``False``: off (default).
* ``True`` or ``"segment"``: segments of ``ceil(sqrt(n))`` units, about ``sqrt(n)``
  checkpoints per stage (the memory-optimal split for equal units).
* ``"unit"``: every unit is its own segment (keeps every unit's input).
* an int ``N >= 1``: segments of ``N`` units.
"""

import logging
import math

import keras

REMAT_MODES = ("unit", "segment")


def normalize_remat(remat):
    """Validates a `remat` argument and returns None, "unit", "segment" or an int.

    Raises:
        ValueError: naming the value received and what is valid.
    """
    if remat is None or remat is False:
        return None
    if remat is True:
        return "segment"
    if isinstance(remat, str) and remat in REMAT_MODES:
        return remat
    if isinstance(remat, int) and not isinstance(remat, bool) and remat >= 1:
        return remat
    raise ValueError(
        "`remat` must be None/False (off), True, 'unit', 'segment' or a positive int "
        f"(units per segment). Received: remat={remat!r}"
    )


def check_remat(remat, unit):
    """`normalize_remat(remat)`, refused for a unit whose recomputation would differ.

    Raises:
        ValueError: for an invalid `remat`, or any remat with unit="dropout_shortcut"
            (a recomputed unit would draw another dropout mask).
    """
    mode = normalize_remat(remat)
    if mode is not None and unit == "dropout_shortcut":
        raise ValueError(
            "`remat` cannot be combined with unit='dropout_shortcut': recomputing a "
            f"unit would draw a different dropout mask. Received: remat={remat!r} "
            f"with unit={unit!r}"
        )
    return mode


def segment_lengths(units, remat):
    """Lengths of the consecutive segments that `units` stacked units are cut into.

    Example:
        >>> segment_lengths(110, "segment")  # ceil(sqrt(110)) = 11
        [11, 11, 11, 11, 11, 11, 11, 11, 11, 11]
        >>> segment_lengths(5, 2)
        [2, 2, 1]
    """
    remat = normalize_remat(remat)
    if units < 1 or remat is None:
        return [units] if units else []
    if remat == "unit":
        size = 1
    elif remat == "segment":
        size = max(1, math.ceil(math.sqrt(units)))
    else:
        size = remat
    lengths = [size] * (units // size)
    if units % size:
        lengths.append(units % size)
    return lengths


def checkpoint(fn):
    """Wraps `fn(*tensors) -> tuple of tensors` so that the backward pass recomputes
    it instead of keeping its intermediate tensors.

    `fn` must take positional tensor arguments only and have no side effects
    (no variable assignment): it is called again during the backward pass. On a
    backend without a checkpoint primitive `fn` is returned unchanged.
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return _tf_checkpoint(fn)
    if backend == "jax":
        import jax

        return jax.checkpoint(fn)
    if backend == "torch":
        from torch.utils import checkpoint as torch_checkpoint

        def wrapped(*args):
            # checkpoint saves its inputs with their version; the moving-statistic
            # slices are views of variables assigned in place after the forward pass.
            args = tuple(a if a.requires_grad else a.clone() for a in args)
            return torch_checkpoint.checkpoint(fn, *args, use_reentrant=False)

        return wrapped
    return fn


def _tf_checkpoint(fn):
    """`tf.recompute_grad(fn)`, made effective inside a `tf.function`.

    Grappler's model pruning, on by default, undoes the rematerialisation in a
    traced train step (such as `model.fit`'s). Measured here on ResNet-164 at batch
    64 (segments of 5 units): plain 3.04 GB peak, rematerialised 2.86 GB with model
    pruning on and 1.61 GB with it off. So the first rematerialised stage turns model
    pruning off for the process (`tf.config.optimizer.set_experimental_options`),
    with a log line.
    """
    import tensorflow as tf

    if not tf.config.optimizer.get_experimental_options().get("disable_model_pruning"):
        tf.config.optimizer.set_experimental_options({"disable_model_pruning": True})
        logging.getLogger("keras_preact").info(
            "remat: turned off Grappler model pruning for this process; it undoes "
            "rematerialisation inside tf.function."
        )
    return tf.recompute_grad(fn)


def scan(fn, carry, xs, ys_like):
    """Runs ``carry, ys = fn(carry, xs[i])`` for every i along the leading axis of
    `xs` as a loop of the backend, so the traced graph holds one body, whatever
    the length.

    Args:
        fn: ``fn(carry, slices) -> (carry, ys)``: `carry` a tensor, `slices` a tuple
            of tensors (one leading-axis slice of each of `xs`), `ys` a tuple of
            tensors with the same shape and dtype at every step.
        carry: the initial carry, a tensor.
        xs: a non-empty tuple of tensors with the same static leading size.
        ys_like: a tuple of tensors with the shapes and dtypes of the stacked `ys`
            (TensorFlow allocates the outputs from them; only their shapes and
            dtypes are read).

    Returns:
        ``(carry, ys)``: the final carry and `ys` stacked along a new leading axis.

    The loop is `tf.while_loop` on TensorFlow and `jax.lax.scan` on JAX; elsewhere
    (PyTorch, which traces nothing) a Python loop. Both compiled loops are
    differentiable, including through a `checkpoint`-ed `fn`.
    """
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

    xs_ta = [
        tf.TensorArray(x.dtype, size=length, element_shape=x.shape[1:]).unstack(x)
        for x in xs
    ]
    ys_ta = [tf.TensorArray(y.dtype, size=length, element_shape=y.shape[1:])
             for y in ys_like]

    def body(i, c, *tas):
        c, ys = fn(c, tuple(ta.read(i) for ta in xs_ta))
        return (i + 1, c) + tuple(ta.write(i, y) for ta, y in zip(tas, ys))

    out = tf.while_loop(
        lambda i, *_: i < length, body, (tf.constant(0), carry) + tuple(ys_ta),
        parallel_iterations=1,
        # A known trip count: the gradient's per-iteration buffers get a fixed
        # size, which XLA (jit_compile=True) requires.
        maximum_iterations=length,
    )
    return out[1], tuple(ta.stack() for ta in out[2:])
