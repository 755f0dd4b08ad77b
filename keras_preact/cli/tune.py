"""`keras-preact tune`: a resumable depth sweep with KerasTuner (`keras_preact.tuning`)."""

from keras_preact.cli.common import float_list, int_list, print_table, str_list
from keras_preact.cli.train import CONFIG_FIELDS, add_config_arguments
from keras_preact.training.config import RECIPES, recipe
from keras_preact.tuning import SPACE_FLAGS


def add_commands(subparsers):
    p = subparsers.add_parser(
        "tune", help="search depth / unit / recipe with KerasTuner under a cost budget (resumable)",
        description="Depth sweep with KerasTuner. Writes WORKDIR/results.csv, results.png and "
        "the best trial as best/model.keras and best/saved_model/. Running the same command again "
        "continues the search; --overwrite starts it again. Distributed: run it in several "
        "processes with KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT and "
        "KERASTUNER_TUNER_ID=chief (one) / tuner0, tuner1, ... (workers).")
    g = p.add_argument_group("search space")
    g.add_argument("--depths", type=int_list, help="CIFAR depths, e.g. 20,56 (default 20..1001)")
    g.add_argument("--blocks", type=str_list, default=["auto"], help="auto, basic, bottleneck")
    g.add_argument("--units", type=str_list, help="residual unit variants (default: the library's)")
    g.add_argument("--widths", type=float_list, default=[1], help="width multipliers, e.g. 1,2")
    g.add_argument("--lrs", type=float_list, help="learning rates at batch 128 (default: the "
                   "recipe's)")
    g.add_argument("--weight-decays", type=float_list,
                   help="coupled L2 factors, e.g. 1e-4,5e-4 (default: the recipe's)")
    g.add_argument("--warmups", type=float_list, help="warm-up lengths in the recipe's schedule "
                   "units, stretched with the run (default: the recipe's)")
    g = p.add_argument_group("budget (one of)")
    b = g.add_mutually_exclusive_group()
    b.add_argument("--max-params", type=float, help="trainable parameters")
    b.add_argument("--max-macs", type=float, help="multiply-adds per image")
    b.add_argument("--max-step-time", type=float, help="measured seconds per step at --batch-size")
    g = p.add_argument_group("search")
    g.add_argument("--tuner", default="random", help="random, bayesian or hyperband")
    g.add_argument("--max-trials", type=int, default=10,
                   help="trials in all (default 10; may grow between runs)")
    g.add_argument("--validation-fraction", type=float, default=0.1,
                   help="held-out share of the training split that scores trials (0: test split)")
    g.add_argument("--workdir", required=True, help="folder of the study (a rerun continues it)")
    g.add_argument("--overwrite", action="store_true", help="start this study again")
    g.add_argument("--no-export", action="store_true", help="skip exporting the best trial")
    p.add_argument("--recipe", choices=list(RECIPES), default="paper", help="the training "
                   "recipe of every trial (see `keras-preact train --help`); the flags below win")
    # Every trial trains as `keras-preact train` with these flags: the same flags, made from
    # `TrainConfig` (--epochs: per trial, default 1; --strategy: of each trial, one worker).
    add_config_arguments(p)
    p.set_defaults(func=cmd_tune)


def _number(value):
    """1.0 -> 1, so that the study records (and its table shows) whole numbers as such."""
    return int(value) if value == int(value) else value


def cmd_tune(args):
    limits = {"params": args.max_params, "macs": args.max_macs, "step_time": args.max_step_time}
    budget = next(({"kind": kind, "limit": value if kind == "step_time" else _number(value)}
                   for kind, value in limits.items() if value is not None), None)
    config = recipe(args.recipe, **{k: getattr(args, k) for k in CONFIG_FIELDS if hasattr(args, k)})
    for name, instead in SPACE_FLAGS.items():
        if (value := getattr(config, name)) != getattr(recipe(args.recipe), name):
            raise ValueError(f"tune searches `{name}`: use {instead}. Received: "
                             f"--{name.replace('_', '-')} {value!r}")
    # The recipe's dataset, batch size, seed and data paths: those of every trial.
    space = dict(blocks=args.blocks, units=args.units, budget=budget, config=config,
                 width_multipliers=[_number(w) for w in args.widths],
                 learning_rates=args.lrs or [config.learning_rate],
                 weight_decays=args.weight_decays or [config.weight_decay],
                 warmups=[_number(w) for w in args.warmups or [config.warmup]],
                 epochs=config.epochs or 1, validation_fraction=args.validation_fraction,
                 **{name: getattr(config, name) for name in (
                     "dataset", "batch_size", "seed", "data_dir", "data_source", "data_path")},
                 **({"depths": args.depths} if args.depths is not None else {}))
    if config.cpu_devices:
        from keras_preact.training.distribute import configure_runtime
        configure_runtime(cpu_devices=config.cpu_devices)
    from keras_preact.tuning.study import tune
    strategy = None if config.strategy == "default" else config.strategy
    result = tune(args.workdir, tuner=args.tuner, max_trials=args.max_trials,
                  overwrite=args.overwrite, export=not args.no_export,
                  distribution_strategy=strategy, verbose=config.verbose, **space)
    if result["role"] == "worker":
        print("Worker done: the chief writes the results.")
        return 0
    _print_results(result["rows"])
    print("No finished trial within the budget." if (best := result["best"]) is None else
          f"best: trial {best['trial']}, depth {best['depth']} {best['block']}, validation "
          f"accuracy {100 * best['val_accuracy']:.2f}%, {best['params']:,} parameters, "
          f"{best['macs'] / 1e6:,.1f}M multiply-adds")
    print(f"results: {result['csv']}\nplot:    {result['png']}")
    if result["best_model"]:
        print(f"model:   {result['best_model']}\nexport:  {result['saved_model']}")
    return 0


def _print_results(rows):
    plain = ("trial", "depth", "block", "width", "learning_rate", "weight_decay")
    lines = [(*(str(r[k]) for k in plain), "" if r["params"] is None else f"{r['params']:,}",
              "" if r["macs"] is None else f"{r['macs'] / 1e6:,.1f}M",
              (r["status"] if r["val_accuracy"] is None else f"{100 * r['val_accuracy']:.2f}%")
              + ("" if r["within_budget"] in (None, 1) else " (over budget)"),
              "" if r["train_time_s"] is None else f"{r['train_time_s']:.1f}") for r in rows]
    header = ("trial", "depth", "block", "width", "lr", "wd", "params", "MACs", "val acc", "time s")
    print_table(header, lines)
