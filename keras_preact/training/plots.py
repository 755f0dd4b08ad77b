"""The training-curve figure (matplotlib's Agg canvas: no display, no global state)."""

import io


def plot_training_curve(history, *, title=""):
    """Draws loss and error per epoch (as the paper's Fig. 6); returns PNG bytes.

    Args:
        history: per-epoch dicts with "epoch" and any of "loss", "accuracy", "val_loss",
            "val_accuracy" (accuracies in [0, 1]).
        title: the figure's title.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    panels = ((axes[0], "loss", "loss", float),
              (axes[1], "accuracy", "error (%)", lambda v: 100.0 * (1.0 - float(v))))
    for ax, key, ylabel, to_y in panels:
        for name, label, style in ((key, "train", "-"), ("val_" + key, "test", "--")):
            rows = [row for row in history if row.get(name) not in (None, "")]
            if rows:
                ax.plot([r["epoch"] for r in rows], [to_y(r[name]) for r in rows], style,
                        marker="." if len(rows) < 30 else None, label=label)
        ax.set_xlabel("epoch")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
