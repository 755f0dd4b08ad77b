"""Gradient-flow diagnostics (He et al. 2016, Sec. 3): on one batch with BatchNorm in
training mode, the RMS of ``dL/dx_l`` at every residual unit's input ``x_l`` and the
statistics of ``x_l``. TensorFlow only."""

import csv
import dataclasses
import math

import keras
import numpy as np

from keras_preact.architecture import HEAD_LAYER, PREPROCESSING_LAYER
from keras_preact.checks import check_int, pop_deprecated
from keras_preact.file_io import atomic_write_bytes, figure_png, write_csv_rows
from keras_preact.layers.blocks import PreActStage
from keras_preact.layers.variants import check_unit_name
from keras_preact.models.registry import get_model, model_info

CSV_FIELDS = ("unit", "stage", "index_in_stage", "grad_rms", "act_mean", "act_std", "act_rms")


@dataclasses.dataclass
class GradientFlowReport:
    """Per-unit measurements of one model on one batch: `rows`, one dict of `CSV_FIELDS`
    per unit in depth order (``unit`` counts from 1); `loss`, the mean cross-entropy."""

    label: str
    rows: list
    loss: float

    @property
    def grad_rms(self):
        """The per-element RMS of dL/dx at each unit's input, as a NumPy array."""
        return np.array([r["grad_rms"] for r in self.rows])

    @property
    def first_to_last(self):
        """RMS of dL/dx at the first unit's input over that at the last unit's input."""
        return float(self.rows[0]["grad_rms"] / self.rows[-1]["grad_rms"])

    def stage_ratios(self):
        """{stage: first-to-last ratio within that stage} (stages with >= 2 units)."""
        by_stage = {}
        for r in self.rows:
            by_stage.setdefault(r["stage"], []).append(r["grad_rms"])
        return {s: float(g[0] / g[-1]) for s, g in sorted(by_stage.items()) if len(g) > 1}


def _check_batch(batch_size, seed):
    check_int("batch_size", batch_size, minimum=2)  # BatchNorm in training mode needs 2+
    check_int("seed", seed, minimum=0)


def _as_reports(reports):
    return [reports] if isinstance(reports, GradientFlowReport) else list(reports)


def random_batch(model, batch_size=16, seed=0):
    """A fixed random batch ``(float32 images, int32 labels)`` for `model`: standard normal,
    or uniform 0..255 for a model with a preprocessing layer. ValueError for a bad batch
    size or seed, or a model with a free input size."""
    _check_batch(batch_size, seed)
    if None in (shape := tuple(model.inputs[0].shape[1:])):
        raise ValueError("The model has a free input size; build it with a fixed `input_shape` or "
                         f"pass `images`. Received: input shape {shape}")
    rng, size = np.random.RandomState(seed), (batch_size,) + shape
    raw_pixels = any(layer.name == PREPROCESSING_LAYER for layer in model.layers)
    images = rng.uniform(0.0, 255.0, size) if raw_pixels else rng.standard_normal(size)
    labels = rng.randint(0, int(model.outputs[0].shape[-1]), batch_size)
    return images.astype("float32"), labels.astype("int32")


def gradient_flow(model, images=None, labels=None, *, batch_size=16, seed=0, label=None):
    """The `GradientFlowReport`, labelled `label` (default: the model's name), of a
    `PreActResNet` with ``include_top=True`` on `images`, `labels` (None: `random_batch`),
    leaving the model's variables unchanged. ValueError on another backend than
    TensorFlow, for a model without residual stages or classifier, or a bad batch."""
    import tensorflow as tf
    if keras.backend.backend() != "tensorflow":
        raise ValueError("gradient_flow uses tf.GradientTape and needs the TensorFlow backend. "
                         f"Received: KERAS_BACKEND={keras.backend.backend()!r}")
    layers = [la for la in model.layers if not isinstance(la, keras.layers.InputLayer)]
    if not any(isinstance(la, PreActStage) for la in layers):
        raise ValueError("`model` must be a PreActResNet (it has no PreActStage). "
                         f"Received: {model.name!r}")
    if HEAD_LAYER not in (names := [la.name for la in layers]):
        raise ValueError("`model` needs its classifier (include_top=True): the loss is the cross-"
                         f"entropy of its logits. Received: model {model.name!r} without "
                         f"{HEAD_LAYER!r}")
    if images is None:
        images, labels = random_batch(model, batch_size, seed)
    elif labels is None or len(labels) != len(images):
        raise ValueError("`labels` must be given with `images`, one per image. "
                         f"Received: {len(images)} images and labels={labels!r}")
    _check_batch(len(images), seed)
    # Training-mode BN updates the moving statistics (and dropout advances its seeds).
    saved = [(v, np.array(keras.ops.convert_to_numpy(v)))
             for v in model.variables if not v.trainable]
    h = tf.convert_to_tensor(np.asarray(images, dtype="float32"))
    y = tf.convert_to_tensor(np.asarray(labels, dtype="int32"))
    unit_inputs = []  # of each stage
    try:
        with tf.GradientTape() as tape:
            tape.watch(h)
            for layer in layers[: names.index(HEAD_LAYER) + 1]:
                if isinstance(layer, PreActStage):
                    h, inputs = layer(h, training=True, return_unit_inputs=True)
                    unit_inputs.append(inputs)
                else:
                    h = layer(h, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, tf.cast(h, "float32"), from_logits=True))
        grads = tape.gradient(loss, unit_inputs)
    finally:
        for v, value in saved:
            v.assign(value)

    def rms(t):
        return float(tf.sqrt(tf.reduce_mean(tf.square(t))))

    rows = []
    for stage, (inputs, stage_grads) in enumerate(zip(unit_inputs, grads), start=1):
        for index, (a, g) in enumerate(zip(inputs, stage_grads), start=1):
            g, a = tf.cast(g, "float32"), tf.cast(a, "float32")
            rows.append({"unit": len(rows) + 1, "stage": stage, "index_in_stage": index,
                         "grad_rms": rms(g), "act_mean": float(tf.reduce_mean(a)),
                         "act_std": float(tf.math.reduce_std(a)), "act_rms": rms(a)})
    return GradientFlowReport(label=label or model.name, rows=rows, loss=float(loss))


def compare_units(model_name, units=("original", "full_preact"), *, batch_size=16, seed=0,
                  input_shape=(32, 32, 3), classes=10, **model_kwargs):
    """`gradient_flow` reports (labelled by unit) of one registered network built with
    each of `units` after ``keras.utils.set_random_seed(seed)``, on the same random batch
    (``input_size=n``, deprecated, means ``input_shape=(n, n, 3)``). ValueError for an
    unknown model or unit, or a bad size, batch or seed, before any model is built."""
    size = pop_deprecated(model_kwargs, "input_size", "input_shape", "compare_units")
    input_shape = input_shape if size is None else (size, size, 3)
    model_info(model_name)  # raises for an unknown name, listing the valid ones
    units = [units] if isinstance(units, str) else list(units)
    if not units:
        raise ValueError(f"`units` must name at least one unit. Received: units={units!r}")
    for unit in units:
        check_unit_name(unit)
    _check_batch(batch_size, seed)

    def build(unit):
        keras.utils.set_random_seed(seed)
        return get_model(model_name, unit=unit, classes=classes, input_shape=input_shape,
                         classifier_activation=None, **model_kwargs)

    # No reference to a model is kept: each is freed before the next one is built.
    return [gradient_flow(build(unit), batch_size=batch_size, seed=seed, label=unit)
            for unit in units]


def format_table(reports, *, every=None):
    """A text table of one or more reports (same depth) side by side: one line per unit,
    or every `every`-th plus the last (None: about 20 lines), and the first/last ratios."""
    reports = _as_reports(reports)
    n = len(reports[0].rows)
    every = every or max(1, n // 20)
    header = ["unit", "stage"]
    header += [f"{k}[{r.label}]" for r in reports for k in ("grad_rms", "act_std")]
    lines = [[str(reports[0].rows[i][k]) for k in ("unit", "stage")] + [
        c for r in reports for c in (f"{r.rows[i]['grad_rms']:.3e}", f"{r.rows[i]['act_std']:.3g}")]
        for i in sorted({*range(0, n, every), n - 1})]
    footer = ["first/last", ""] + [c for r in reports for c in (f"{r.first_to_last:.3g}", "")]
    widths = [max(len(x) for x in col) for col in zip(header, footer, *lines)]

    def fmt(cells):
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    rule = "-" * len(fmt(header))
    return "\n".join([fmt(header), rule] + [fmt(c) for c in lines] + [rule, fmt(footer)])


def write_csv(reports, path):
    """Writes the rows of one or more reports as CSV, a "model" column first; returns `path`."""
    rows = [{"model": r.label, **row} for r in _as_reports(reports) for row in r.rows]
    write_csv_rows(path, rows, ("model",) + CSV_FIELDS, lineterminator="\r\n")
    return path


def read_csv(path):
    """Reads `write_csv` output back into a list of `GradientFlowReport` (loss is NaN)."""
    by_label = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            by_label.setdefault(row.pop("model"), []).append(
                {k: int(v) if k in ("unit", "stage", "index_in_stage") else float(v)
                 for k, v in row.items()})
    return [GradientFlowReport(label=k, rows=v, loss=math.nan) for k, v in by_label.items()]


def plot_gradient_flow(reports, path, *, title=None):
    """Saves a PNG of RMS of dL/dx_l (top) and std of x_l (bottom) against depth for one
    or more reports, without `matplotlib.pyplot`; returns `path`."""
    from matplotlib.figure import Figure
    reports = _as_reports(reports)
    fig = Figure(figsize=(8, 7))
    ax_g, ax_a = fig.subplots(2, 1, sharex=True)
    for r in reports:
        units = [row["unit"] for row in r.rows]
        ax_g.semilogy(units, r.grad_rms, label=f"{r.label} (first/last {r.first_to_last:.3g})")
        ax_a.semilogy(units, [row["act_std"] for row in r.rows], label=r.label)
    first = reports[0].rows  # the stage boundaries of the first report
    boundaries = [b["unit"] - 0.5 for a, b in zip(first, first[1:]) if b["stage"] != a["stage"]]
    for ax, ylabel in ((ax_g, "RMS of dL/dx_l (per element)"), (ax_a, "std of x_l")):
        for x in boundaries:
            ax.axvline(x, color="grey", lw=0.6, ls=":")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
    ax_a.set_xlabel("residual unit l (input side = 1)")
    atomic_write_bytes(path, figure_png(fig, title, dpi=110))
    return path
