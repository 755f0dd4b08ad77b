"""`PreActStage`'s stacked units, run unrolled, in checkpointed segments (`remat`) or as
a backend loop. They share one variable per name with a leading unit axis, so a ResNet-1001
is a few dozen variables instead of ~5,000 (it builds, saves and loads in seconds)."""

from keras import ops

from keras_preact.layers import unit_ops as F
from keras_preact.layers import remat as remat_lib


def stacked_units(x, stacked, spec, kwargs, unit_inputs=None, drop_paths=None):
    """Runs the units of `stacked` (name -> tensor with a leading unit axis), unrolled, with
    `drop_paths` (a stochastic depth rate per unit, or None), appending each unit's input to
    `unit_inputs` when given. Returns (x, {bn: (means, variances)}): the new moving
    statistics, stacked like the variables (not assigned)."""
    length = next(iter(stacked.values())).shape[0]
    # Read each stacked tensor once, then slice per unit.
    slices = {k: ops.unstack(t, num=length, axis=0) for k, t in stacked.items()}
    new_stats = {}
    for i in range(length):
        if unit_inputs is not None:
            unit_inputs.append(x)
        x, updates = F.unit_forward(x, {k: s[i] for k, s in slices.items()}, spec, **kwargs,
                                    drop_path=drop_paths[i] if drop_paths else 0.0)
        for bn, stats in updates.items():
            new_stats.setdefault(bn, []).append(stats)
    return x, {bn: (ops.stack([m for m, _ in stats]), ops.stack([v for _, v in stats]))
               for bn, stats in new_stats.items()}


def segmented_units(x, stacked, spec, kwargs, *, remat, loop):
    """`stacked_units` in checkpointed segments of `remat`'s lengths (``remat=None``:
    plain segments of one unit). A segment returns its new moving statistics instead of
    assigning them, so the backward pass's recomputation cannot update them twice. With
    `loop` the equal segments run as one `remat.scan` over a (count, size, ...) view of
    the variables: the traced graph holds one segment (what keeps ResNet-1001's train
    step small)."""
    names = sorted(stacked)
    bns = [name[: -len("_moving_mean")] for name, _, kind in spec.variable_specs()
           if kind == "moving_mean"]

    def segment(x, *tensors):
        # Positional tensors in, a flat tuple out: what every backend's checkpoint takes.
        y, stats = stacked_units(x, dict(zip(names, tensors)), spec, kwargs)
        return (y,) + tuple(t for bn in bns for t in stats[bn])

    run = segment if remat is None else remat_lib.checkpoint(segment)
    tensors = [stacked[name] for name in names]
    num = int(tensors[0].shape[0])
    lengths = remat_lib.segment_lengths(num, "unit" if remat is None else remat)
    size, count = lengths[0], lengths.count(lengths[0])
    pieces = {bn: ([], []) for bn in bns}

    def collect(stats, looped=False):
        # Statistics of looped segments come as (count, size, channels).
        for j, bn in enumerate(bns):
            for k in (0, 1):
                t = stats[2 * j + k]
                pieces[bn][k].append(ops.reshape(t, (-1,) + tuple(t.shape[2:])) if looped else t)

    start = 0
    if count > 1 and loop:
        def body(x, slices):
            out = run(x, *slices)
            return out[0], out[1:]

        views = [ops.reshape(t[: count * size], (count, size) + tuple(t.shape[1:]))
                 for t in tensors]
        # The new statistics are shaped like the old ones.
        stats_like = [views[names.index(f"{bn}_moving_{field}")]
                      for bn in bns for field in ("mean", "variance")]
        x, stats = remat_lib.scan(body, x, views, stats_like)
        collect(stats, looped=True)
        start, lengths = count * size, lengths[count:]
    for length in lengths:
        out = run(x, *[t[start:start + length] for t in tensors])
        collect(out[1:])
        x, start = out[0], start + length
    return x, {bn: (ops.concatenate(means, axis=0), ops.concatenate(variances, axis=0))
               for bn, (means, variances) in pieces.items()}
