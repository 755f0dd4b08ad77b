"""`keras-preact tune`: a resumable depth sweep with KerasTuner (`keras_preact.tuning`)."""

from keras_preact.cli.common import float_list, int_list, print_table, str_list, verbosity


def add_commands(subparsers):
    p = subparsers.add_parser(
        "tune", help="search depth / unit / recipe with KerasTuner under a cost budget (resumable)",
        description="Depth sweep with KerasTuner. Writes WORKDIR/results.csv, results.png and "
        "the best trial as best/model.keras and best/saved_model/. Running the same command again "
        "continues the search; --overwrite starts it again. Distributed: run it in several "
        "processes with KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT and "
        "KERASTUNER_TUNER_ID=chief (one) / tuner0, tuner1, ... (workers).")
    g = p.add_argument_group("search space")
    g.add_argument("--dataset", default="cifar10", help="cifar10, cifar100, digits or folder")
    g.add_argument("--depths", type=int_list, help="CIFAR depths, e.g. 20,56 (default 20..1001)")
    g.add_argument("--blocks", type=str_list, default=["auto"], help="auto, basic, bottleneck")
    g.add_argument("--units", type=str_list, help="residual unit variants (default: the library's)")
    g.add_argument("--widths", type=float_list, default=[1], help="width multipliers, e.g. 1,2")
    g.add_argument("--lrs", type=float_list, default=[0.1], help="learning rates at batch 128")
    g.add_argument("--weight-decays", type=float_list, default=[1e-4],
                   help="coupled L2 factors, e.g. 1e-4,5e-4 (default 1e-4)")
    g.add_argument("--warmups", type=float_list, default=[400],
                   help="warm-up iterations of the paper's 64k schedule (stretched with the run)")
    g = p.add_argument_group("budget (one of)")
    b = g.add_mutually_exclusive_group()
    b.add_argument("--max-params", type=float, help="trainable parameters")
    b.add_argument("--max-macs", type=float, help="multiply-adds per image")
    b.add_argument("--max-step-time", type=float, help="measured seconds per step at --batch-size")
    g = p.add_argument_group("search")
    g.add_argument("--tuner", default="random", help="random, bayesian or hyperband")
    g.add_argument("--max-trials", type=int, default=10,
                   help="trials in all (default 10; may grow between runs)")
    g.add_argument("--epochs", type=int, default=1, help="epochs per trial")
    g.add_argument("--batch-size", type=int, default=128, help="images per step (default 128)")
    g.add_argument("--validation-fraction", type=float, default=0.1,
                   help="held-out share of the training split that scores trials (0: test split)")
    g.add_argument("--seed", type=int, default=0,
                   help="oracle, initialisation, data order and split (default 0)")
    g.add_argument("--workdir", required=True,
                   help="folder of the study (a rerun continues it)")
    g.add_argument("--overwrite", action="store_true", help="start this study again")
    g.add_argument("--no-export", action="store_true", help="skip exporting the best trial")
    g.add_argument("--strategy", default=None, choices=("default", "mirrored", "tpu"),
                   help="mirrored: each trial on every local device (one worker)")
    g.add_argument("--cpu-devices", type=int, help="split the CPU into N devices (for mirrored)")
    g.add_argument("--data-dir", help="CIFAR files or TFDS data folder")
    g.add_argument("--data-source", default="auto", help="auto, tfds or archive")
    g.add_argument("--data-path", help="an archive, extracted folder or image folder")
    g.add_argument("--verbose", default="auto", type=verbosity,
                   help="auto (progress bars on a terminal, else a line per epoch), 0, 1, 2")
    p.set_defaults(func=cmd_tune)


def _number(value):
    """1.0 -> 1, so that the study records (and its table shows) whole numbers as such."""
    return int(value) if value == int(value) else value


def cmd_tune(args):
    budget = None
    for kind, value in (("params", args.max_params), ("macs", args.max_macs),
                        ("step_time", args.max_step_time)):
        if value is not None:
            budget = {"kind": kind, "limit": value if kind == "step_time" else _number(value)}
    space = dict(dataset=args.dataset, blocks=args.blocks, units=args.units,
                 width_multipliers=[_number(w) for w in args.widths],
                 learning_rates=args.lrs, weight_decays=args.weight_decays,
                 warmups=[_number(w) for w in args.warmups],
                 epochs=args.epochs, batch_size=args.batch_size,
                 validation_fraction=args.validation_fraction, seed=args.seed, budget=budget,
                 data_dir=args.data_dir, data_source=args.data_source, data_path=args.data_path)
    if args.depths is not None:
        space["depths"] = args.depths
    if args.cpu_devices:
        from keras_preact.training.distribute import configure_runtime
        configure_runtime(cpu_devices=args.cpu_devices)
    from keras_preact.tuning.study import tune
    strategy = None if args.strategy == "default" else args.strategy
    result = tune(args.workdir, tuner=args.tuner, max_trials=args.max_trials,
                  overwrite=args.overwrite, export=not args.no_export,
                  distribution_strategy=strategy, verbose=args.verbose, **space)
    if result["role"] == "worker":
        print("Worker done: the chief writes the results.")
        return 0
    _print_results(result["rows"])
    if (best := result["best"]) is None:
        print("No finished trial within the budget.")
    else:
        print(f"best: trial {best['trial']}, depth {best['depth']} {best['block']}, validation "
              f"accuracy {100 * best['val_accuracy']:.2f}%, {best['params']:,} parameters, "
              f"{best['macs'] / 1e6:,.1f}M multiply-adds")
    print(f"results: {result['csv']}")
    print(f"plot:    {result['png']}")
    if result["best_model"]:
        print(f"model:   {result['best_model']}")
        print(f"export:  {result['saved_model']}")
    return 0


def _print_results(rows):
    lines = []
    for r in rows:
        acc = "" if r["val_accuracy"] is None else f"{100 * r['val_accuracy']:.2f}%"
        over = "" if r["within_budget"] in (None, 1) else " (over budget)"
        lines.append((
            str(r["trial"]), str(r["depth"]), str(r["block"]), str(r["width"]),
            str(r["learning_rate"]), str(r["weight_decay"]),
            "" if r["params"] is None else f"{r['params']:,}",
            "" if r["macs"] is None else f"{r['macs'] / 1e6:,.1f}M",
            (acc or r["status"]) + over,
            "" if r["train_time_s"] is None else f"{r['train_time_s']:.1f}"))
    header = ("trial", "depth", "block", "width", "lr", "wd", "params", "MACs", "val acc", "time s")
    print_table(header, lines)
