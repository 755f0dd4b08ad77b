"""Gradient-flow diagnostics: the paper's argument, measured.

He et al. 2016 (Section 3, Eq. 5) argue that with identity shortcuts and nothing after
the addition, ``dL/dx_l = dL/dx_L * (1 + d/dx_l sum F)``: the gradient reaches every
unit directly. `gradient_flow` measures, for one fixed batch, the per-element RMS of
``dL/dx_l`` at the input ``x_l`` of every residual unit, with BatchNorm in training
mode and the model's own initialisation (or trained weights), plus the mean, standard
deviation and RMS of ``x_l`` itself. The summary figure is the *first-to-last ratio*,
``rms(dL/dx_1) / rms(dL/dx_L)``: how much the gradient grows from the last unit back
to the first. At initialisation it grows toward the input for every unit (the
activations' scale grows along an identity path and BN divides by it), so a ratio near
1 is not the claim; the claim is that the full pre-activation unit keeps it much
smaller than the original unit does (for ResNet-164, about 10x; see the README).

TensorFlow only (it uses ``tf.GradientTape`` on the unit inputs that
`PreActStage.call(..., return_unit_inputs=True)` returns); TensorFlow is imported on
first use. The model's BatchNorm moving statistics and dropout seeds are restored
afterwards, so measuring does not change the model.

Example:
    >>> import keras_preact as kp
    >>> from keras_preact import diagnostics
    >>> model = kp.preact_resnet164(input_shape=(16, 16, 3))
    >>> report = diagnostics.gradient_flow(model, batch_size=8, seed=0)
    >>> report.first_to_last  # about 2e3 at initialisation
"""

import csv
import dataclasses
import math

import numpy as np

from keras_preact.files import atomic_save

CSV_FIELDS = ("unit", "stage", "index_in_stage", "grad_rms", "act_mean", "act_std", "act_rms")


@dataclasses.dataclass
class GradientFlowReport:
    """Per-unit measurements of one model on one batch.

    Attributes:
        label: a name for tables and plot legends (default: the model's name).
        rows: one dict per residual unit, in depth order, with `CSV_FIELDS`:
            ``unit`` (1-based over the whole network), ``stage``, ``index_in_stage``,
            ``grad_rms`` (per-element RMS of dL/dx at the unit's input) and the
            input's ``act_mean``, ``act_std``, ``act_rms``.
        loss: the batch's mean cross-entropy.
    """

    label: str
    rows: list
    loss: float

    @property
    def grad_rms(self):
        return np.array([r["grad_rms"] for r in self.rows])

    @property
    def first_to_last(self):
        """RMS of dL/dx at the first unit's input over that at the last unit's input."""
        g = self.grad_rms
        return float(g[0] / g[-1])

    def stage_ratios(self):
        """{stage: first-to-last ratio within that stage} (stages with >= 2 units)."""
        out = {}
        for stage in sorted({r["stage"] for r in self.rows}):
            g = [r["grad_rms"] for r in self.rows if r["stage"] == stage]
            if len(g) > 1:
                out[stage] = float(g[0] / g[-1])
        return out


def _check_batch(batch_size, seed):
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 2:
        raise ValueError(
            "`batch_size` must be an int >= 2 (BatchNorm in training mode needs a batch). "
            f"Received: batch_size={batch_size!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be an int >= 0. Received: seed={seed!r}")


def random_batch(model, batch_size=16, seed=0):
    """A fixed random batch for `model`: images and labels.

    Standard normal values when the model takes normalised inputs, uniform 0..255
    when it has a built-in preprocessing layer (it takes raw pixels).

    Returns:
        (float32 images of the model's input shape, int32 labels).
    """
    _check_batch(batch_size, seed)
    shape = tuple(model.inputs[0].shape[1:])
    if any(d is None for d in shape):
        raise ValueError(
            "The model has a free input size; build it with a fixed `input_shape` or "
            f"pass `images`. Received: input shape {shape}"
        )
    rng = np.random.RandomState(seed)
    raw = any(layer.name == "preprocessing" for layer in model.layers)
    if raw:
        images = rng.uniform(0.0, 255.0, (batch_size,) + shape)
    else:
        images = rng.standard_normal((batch_size,) + shape)
    labels = rng.randint(0, _num_classes(model), batch_size)
    return images.astype("float32"), labels.astype("int32")


def _num_classes(model):
    return int(model.outputs[0].shape[-1])


def gradient_flow(model, images=None, labels=None, *, batch_size=16, seed=0, label=None):
    """Per-unit gradient and activation statistics of a `PreActResNet`.

    Args:
        model: a `keras_preact.PreActResNet` with ``include_top=True`` (any unit).
        images, labels: the batch; None draws `random_batch(model, batch_size, seed)`.
        batch_size: int >= 2, default 16 (ignored when `images` is given).
        seed: int >= 0, default 0: the random batch (the weights are the model's).
        label: name for tables and plots; default the model's name.

    Returns:
        A `GradientFlowReport`.

    Raises:
        ValueError: for a model without residual stages or classifier, or a bad batch.
    """
    import keras
    import tensorflow as tf

    from keras_preact.layers.blocks import PreActStage

    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            "gradient_flow uses tf.GradientTape and needs the TensorFlow backend. "
            f"Received: KERAS_BACKEND={keras.backend.backend()!r}"
        )
    layers = [l for l in model.layers if not isinstance(l, keras.layers.InputLayer)]
    if not any(isinstance(l, PreActStage) for l in layers):
        raise ValueError(
            f"`model` must be a PreActResNet (it has no PreActStage). Received: {model.name!r}"
        )
    names = [l.name for l in layers]
    if "logits" not in names:
        raise ValueError(
            "`model` needs its classifier (include_top=True): the loss is the "
            f"cross-entropy of its logits. Received: model {model.name!r} without 'logits'"
        )
    if images is None:
        images, labels = random_batch(model, batch_size, seed)
    elif labels is None or len(labels) != len(images):
        raise ValueError(
            "`labels` must be given with `images`, one per image. "
            f"Received: {len(images)} images and labels={labels!r}"
        )
    else:
        _check_batch(len(images), seed)
    # Measuring runs BN in training mode, which updates the moving statistics (and
    # advances dropout seeds): keep them and put them back.
    saved = [(v, np.array(keras.ops.convert_to_numpy(v))) for v in model.variables if not v.trainable]
    try:
        x = tf.convert_to_tensor(np.asarray(images, dtype="float32"))
        y = tf.convert_to_tensor(np.asarray(labels, dtype="int32"))
        stage_of = []
        with tf.GradientTape() as tape:
            tape.watch(x)
            h = x
            unit_inputs = []
            for layer in layers[: names.index("logits") + 1]:
                if isinstance(layer, PreActStage):
                    h, inputs = layer(h, training=True, return_unit_inputs=True)
                    stage_number = 1 + len({s for s, _ in stage_of})
                    unit_inputs.extend(inputs)
                    stage_of.extend((stage_number, i + 1) for i in range(len(inputs)))
                else:
                    h = layer(h, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, tf.cast(h, "float32"), from_logits=True)
            )
        grads = tape.gradient(loss, unit_inputs)
    finally:
        for v, value in saved:
            v.assign(value)
    rows = []
    for n, ((stage, index), g, a) in enumerate(zip(stage_of, grads, unit_inputs), start=1):
        g = tf.cast(g, "float32")
        a = tf.cast(a, "float32")
        rows.append({
            "unit": n,
            "stage": stage,
            "index_in_stage": index,
            "grad_rms": float(tf.sqrt(tf.reduce_mean(tf.square(g)))),
            "act_mean": float(tf.reduce_mean(a)),
            "act_std": float(tf.math.reduce_std(a)),
            "act_rms": float(tf.sqrt(tf.reduce_mean(tf.square(a)))),
        })
    return GradientFlowReport(label=label or model.name, rows=rows, loss=float(loss))


def compare_units(model_name, units=("original", "full_preact"), *, batch_size=16, seed=0,
                  input_size=32, classes=10, **model_kwargs):
    """Measures `gradient_flow` of one registered network built with each unit.

    Every model is built after ``keras.utils.set_random_seed(seed)`` (so its own He
    initialisation is reproducible) and measured on the same random batch.

    Args:
        model_name: a name from `keras_preact.list_models()`, e.g. "preact_resnet164".
        units: names from `keras_preact.layers.UNIT_TYPES`.
        batch_size: int >= 2, default 16.
        seed: int >= 0, default 0.
        input_size: height and width of the random images, >= 8, default 32.
        classes: default 10.
        **model_kwargs: other model arguments (e.g. ``gate_bias``).

    Returns:
        list of `GradientFlowReport`, labelled by unit.

    Raises:
        ValueError: for an unknown model or unit, or a bad size, batch or seed;
            before any model is built.
    """
    import keras

    import keras_preact
    from keras_preact.layers.variants import check_unit_name

    keras_preact.model_info(model_name)  # raises for an unknown name, listing the valid ones
    units = [units] if isinstance(units, str) else list(units)
    if not units:
        raise ValueError(f"`units` must name at least one unit. Received: units={units!r}")
    for unit in units:
        check_unit_name(unit)
    _check_batch(batch_size, seed)
    if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 8:
        raise ValueError(f"`input_size` must be an int >= 8. Received: input_size={input_size!r}")
    reports = []
    for unit in units:
        keras.utils.set_random_seed(seed)
        model = keras_preact.get_model(
            model_name, unit=unit, classes=classes, input_shape=(input_size, input_size, 3),
            classifier_activation=None, **model_kwargs,
        )
        reports.append(gradient_flow(model, batch_size=batch_size, seed=seed, label=unit))
        del model
    return reports


def format_table(reports, *, every=None):
    """A text table: one line per unit (or every `every`-th, plus first and last).

    Args:
        reports: a `GradientFlowReport` or a list of them (same depth), side by side.
        every: show every n-th unit; None picks a step giving about 20 lines.

    Returns:
        str.
    """
    if isinstance(reports, GradientFlowReport):
        reports = [reports]
    n = len(reports[0].rows)
    every = every or max(1, n // 20)
    header = ["unit", "stage"]
    for r in reports:
        header += [f"grad_rms[{r.label}]", f"act_std[{r.label}]"]
    lines = []
    for i in range(n):
        if i % every and i != n - 1:
            continue
        row = reports[0].rows[i]
        cells = [str(row["unit"]), str(row["stage"])]
        for r in reports:
            cells += [f"{r.rows[i]['grad_rms']:.3e}", f"{r.rows[i]['act_std']:.3g}"]
        lines.append(cells)
    footer = ["first/last", ""]
    for r in reports:
        footer += [f"{r.first_to_last:.3g}", ""]
    widths = [max(len(x) for x in col) for col in zip(header, footer, *lines)]
    fmt = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))
    out = [fmt(header), "-" * len(fmt(header))] + [fmt(c) for c in lines]
    out += ["-" * len(fmt(header)), fmt(footer)]
    return "\n".join(out)


def write_csv(reports, path):
    """Writes the per-unit rows of one or more reports as CSV (a "model" column first).

    The file is written to a temporary name and renamed into place.
    """
    if isinstance(reports, GradientFlowReport):
        reports = [reports]

    def write(tmp):
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=("model",) + CSV_FIELDS)
            writer.writeheader()
            for r in reports:
                for row in r.rows:
                    writer.writerow({"model": r.label, **row})

    atomic_save(path, write)
    return path


def read_csv(path):
    """Reads `write_csv` output back into a list of `GradientFlowReport` (loss is NaN)."""
    by_label = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            label = row.pop("model")
            parsed = {k: (int(v) if k in ("unit", "stage", "index_in_stage") else float(v))
                      for k, v in row.items()}
            by_label.setdefault(label, []).append(parsed)
    return [GradientFlowReport(label=k, rows=v, loss=math.nan) for k, v in by_label.items()]


def plot_gradient_flow(reports, path, *, title=None):
    """Saves a PNG: RMS of dL/dx_l (top) and std of x_l (bottom) against depth.

    Needs matplotlib; draws on an Agg canvas directly, so it works without a
    display and leaves `matplotlib.pyplot`'s backend alone.

    Args:
        reports: a `GradientFlowReport` or a list of them.
        path: the PNG to write (temporary name, then renamed into place).
        title: optional figure title.

    Returns:
        `path`.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if isinstance(reports, GradientFlowReport):
        reports = [reports]
    fig = Figure(figsize=(8, 7))
    FigureCanvasAgg(fig)
    ax_g, ax_a = fig.subplots(2, 1, sharex=True)
    for r in reports:
        units = [row["unit"] for row in r.rows]
        ax_g.semilogy(units, r.grad_rms, label=f"{r.label} (first/last {r.first_to_last:.3g})")
        ax_a.semilogy(units, [row["act_std"] for row in r.rows], label=r.label)
    # Mark the stage boundaries of the first report.
    first = reports[0].rows
    for a, b in zip(first, first[1:]):
        if b["stage"] != a["stage"]:
            for ax in (ax_g, ax_a):
                ax.axvline(b["unit"] - 0.5, color="grey", lw=0.6, ls=":")
    ax_g.set_ylabel("RMS of dL/dx_l (per element)")
    ax_a.set_ylabel("std of x_l")
    ax_a.set_xlabel("residual unit l (input side = 1)")
    ax_g.legend(fontsize=8)
    ax_a.legend(fontsize=8)
    ax_g.grid(True, which="both", alpha=0.3)
    ax_a.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    atomic_save(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    return path
