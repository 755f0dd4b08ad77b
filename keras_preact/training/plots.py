"""The training-curve figure (matplotlib's Agg canvas: no display, no global state)."""

import io


def plot_training_curve(history, *, title=""):
    """Draws loss and error per epoch, as the paper's Fig. 6 plots them.

    Uses `matplotlib.figure.Figure` with an Agg canvas directly, so it works
    without a display and leaves `matplotlib.pyplot`'s backend alone.

    Args:
        history: list of per-epoch dicts with "epoch" and any of "loss",
            "accuracy", "val_loss", "val_accuracy" (accuracies in [0, 1]).
        title: optional figure title.

    Returns:
        bytes: a PNG image.

    Example:
        >>> png = plot_training_curve([{"epoch": 1, "loss": 2.0, "accuracy": 0.3}])
        >>> png[:4]
        b'\\x89PNG'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax_loss, ax_err = fig.subplots(1, 2)

    def series(key, scale=1.0, invert=False):
        xs, ys = [], []
        for row in history:
            value = row.get(key)
            if value is None or value == "":
                continue
            value = float(value)
            xs.append(row["epoch"])
            ys.append(scale * (1.0 - value) if invert else value)
        return xs, ys

    for key, label, style in (("loss", "train", "-"), ("val_loss", "test", "--")):
        xs, ys = series(key)
        if xs:
            ax_loss.plot(xs, ys, style, marker="." if len(xs) < 30 else None, label=label)
    for key, label, style in (("accuracy", "train", "-"), ("val_accuracy", "test", "--")):
        xs, ys = series(key, scale=100.0, invert=True)
        if xs:
            ax_err.plot(xs, ys, style, marker="." if len(xs) < 30 else None, label=label)
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("loss")
    ax_err.set_xlabel("epoch")
    ax_err.set_ylabel("error (%)")
    for ax in (ax_loss, ax_err):
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
