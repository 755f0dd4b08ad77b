"""The paper's unit ablations (He et al. 2016, Tables 1 and 2) as training runs.

GPU mode (the paper's experiment) trains each unit on CIFAR-10 with the paper's recipe
(batch 128, SGD momentum 0.9, weight decay 1e-4, lr 0.1 with a 0.01 warm-up for 400
iterations, /10 at 32k and 48k, stop at 64k; `keras_preact.training`), one workdir per
run, and prints the test errors beside the paper's. Table 2 (where BN and ReLU sit) is
ResNet-110 and ResNet-164; Table 1 (shortcut variants) is ResNet-110. One run of
ResNet-110 is a few hours on one modern GPU; runs resume where they stopped.

    python examples/ablation.py gpu --table 2 --workdir runs/ablation
    python examples/ablation.py gpu --table 1 --data-dir ~/tensorflow_datasets

Local mode runs every unit at a small depth (default ResNet-20) on scikit-learn's
digits for a few epochs on a CPU (no download) and prints the same kind of table. It
shows that every variant trains end to end; a few epochs on 1,438 small images cannot
rank units the way 64k iterations on CIFAR-10 do, so read its errors as a smoke test.

    python examples/ablation.py local --epochs 3
"""

import argparse
import os
import sys

# (unit, model arguments, the paper's label). The paper's numbers are in
# keras_preact.layers.variants.PAPER_RESULTS.
TABLE2_UNITS = ["original", "bn_after_addition", "relu_before_addition", "relu_only_preact",
                "full_preact"]
TABLE1_RUNS = [
    ("original", {}, "6.61"),
    ("constant_scaling", {"shortcut_scale": 0.5, "residual_scale": 0.5}, "12.35"),
    ("constant_scaling", {"shortcut_scale": 0.5, "residual_scale": 1.0}, "fail"),
    ("exclusive_gating", {"gate_bias": -6.0}, "8.70"),
    ("exclusive_gating", {"gate_bias": -7.0}, "9.81"),
    ("shortcut_only_gating", {"gate_bias": -6.0}, "6.91"),
    ("shortcut_only_gating", {"gate_bias": 0.0}, "12.86"),
    ("conv_shortcut", {}, "12.22"),
    ("dropout_shortcut", {"dropout_rate": 0.5}, "fail"),
]


def _run_name(model, unit, kwargs):
    tag = "-".join(f"{k}{v:g}" for k, v in sorted(kwargs.items()))
    return f"{model}-{unit}" + (f"-{tag}" if tag else "")


def gpu_runs(table):
    from keras_preact.layers.variants import PAPER_RESULTS

    if table == 1:
        return [("preact_resnet110", unit, kw, paper) for unit, kw, paper in TABLE1_RUNS]
    runs = []
    for model, key in (("preact_resnet110", "resnet110"), ("preact_resnet164", "resnet164")):
        for unit in TABLE2_UNITS:
            runs.append((model, unit, {}, PAPER_RESULTS[unit][key]))
    return runs


def local_runs(depth):
    from keras_preact.layers import UNIT_TYPES, resolve_unit_options
    from keras_preact.layers.variants import PAPER_RESULTS

    # The paper's parameter values, spelled out so the table shows them.
    return [(f"preact_resnet{depth}", unit, resolve_unit_options(unit),
             PAPER_RESULTS[unit]["resnet110"].split(" ")[0]) for unit in UNIT_TYPES]


def run_all(runs, workdir, make_config):
    """Trains each run (resuming finished or interrupted ones) and returns result rows."""
    from keras_preact.training import train_and_evaluate

    rows = []
    for model, unit, kwargs, paper in runs:
        config = make_config(model, {"unit": unit, **kwargs})
        path = os.path.join(workdir, _run_name(model, unit, kwargs))
        print(f"== {model} unit={unit} {kwargs or ''} -> {path}", flush=True)
        result = train_and_evaluate(config, path)
        rows.append((model, unit, kwargs, paper, 100.0 * (1.0 - result["test_accuracy"]),
                     result["train_time_s"]))
    return rows


def print_table(rows, dataset):
    header = ("model", "unit", "parameters", f"error % ({dataset})", "paper CIFAR-10 %", "time s")
    cells = [
        (m, u, ", ".join(f"{k}={v:g}" for k, v in kw.items()) or "-", f"{err:.2f}", paper,
         f"{t:.0f}")
        for m, u, kw, paper, err, t in rows
    ]
    widths = [max(len(str(c[i])) for c in cells + [header]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(str(x).ljust(w) for x, w in zip(c, widths)))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    g = sub.add_parser("gpu", help="the paper's Table 1 or 2 on CIFAR-10 with its recipe")
    g.add_argument("--table", type=int, choices=(1, 2), default=2)
    g.add_argument("--workdir", default="runs/ablation")
    g.add_argument("--data-dir", default=None, help="TFDS data directory (CIFAR-10 must be there)")
    g.add_argument("--download", action="store_true", help="let TFDS download CIFAR-10")
    g.add_argument("--seed", type=int, default=0)
    loc = sub.add_parser("local", help="every unit on digits for a few epochs (CPU)")
    loc.add_argument("--depth", type=int, default=20, help="6n+2 <= 56 (default 20)")
    loc.add_argument("--epochs", type=int, default=3)
    loc.add_argument("--workdir", default="runs/ablation_local")
    loc.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from keras_preact.training import TrainConfig

    if args.mode == "gpu":
        runs = gpu_runs(args.table)

        def make_config(model, kwargs):
            # All other fields are the paper's CIFAR recipe (TrainConfig's defaults).
            return TrainConfig(model=model, model_kwargs=kwargs, dataset="cifar10",
                               data_dir=args.data_dir, download=args.download, seed=args.seed,
                               verbose=2)

        dataset = "CIFAR-10"
    else:
        if args.depth > 56 or args.depth < 8 or (args.depth - 2) % 6:
            print(f"error: `--depth` must be 6n+2 between 8 and 56. Received: --depth={args.depth}",
                  file=sys.stderr)
            return 2
        runs = local_runs(args.depth)

        def make_config(model, kwargs):
            # The offline demo's settings (keras_preact.training.demo), shortened.
            return TrainConfig(model=model, model_kwargs=kwargs, dataset="digits",
                               batch_size=32, lr_scaling="sqrt", epochs=args.epochs,
                               seed=args.seed, verbose=0)

        dataset = f"digits, {args.epochs} epochs"
    rows = run_all(runs, args.workdir, make_config)
    print()
    print_table(rows, dataset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
