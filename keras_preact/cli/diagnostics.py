"""`keras-preact diagnose`: the gradient-flow measurement of `keras_preact.diagnostics`."""

import os


def add_commands(subparsers):
    p = subparsers.add_parser(
        "diagnose", help="gradient flow at initialisation: RMS of dL/dx at every unit's input",
        description="Build MODEL with each --unit (He initialisation, seeded by --seed), run one "
        "random batch with BatchNorm in training mode, and report the per-element RMS of dL/dx_l "
        "at every residual unit's input and the statistics of x_l. Prints a table with the "
        "first-to-last ratio and writes OUT_DIR/MODEL_gradient_flow.csv and .png. TensorFlow "
        "backend.")
    p.add_argument("model", help="a model name from `keras-preact list`, e.g. preact_resnet164")
    p.add_argument("--unit", action="append", default=None, metavar="UNIT",
                   help="residual unit (repeat to compare several; default: full_preact). "
                        "One of keras_preact.layers.UNIT_TYPES")
    p.add_argument("--batch", type=int, default=16, help="batch size (default 16)")
    p.add_argument("--seed", type=int, default=0, help="initialisation and batch seed (default 0)")
    p.add_argument("--input-size", type=int, default=32, help="image height and width (default 32)")
    p.add_argument("--classes", type=int, default=10, help="classifier outputs (default 10)")
    p.add_argument("--out-dir", default="diagnostics",
                   help="where the CSV and PNG go (default ./diagnostics)")
    p.add_argument("--every", type=int, help="print every n-th unit (default: about 20 lines)")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args):
    # Checked before the model is built and run, which takes a while.
    if args.every is not None and args.every < 1:
        raise ValueError(f"`--every` must be >= 1. Received: --every={args.every}")
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"`--out-dir` must be a folder; {args.out_dir} is a file. Received: "
                         f"--out-dir={args.out_dir}")
    from keras_preact import diagnostics
    reports = diagnostics.compare_units(
        args.model, args.unit or ["full_preact"], batch_size=args.batch, seed=args.seed,
        input_shape=(args.input_size, args.input_size, 3), classes=args.classes)
    print(f"{args.model}, batch {args.batch} of random {args.input_size}x{args.input_size} "
          f"images, seed {args.seed}, BatchNorm in training mode")
    print(diagnostics.format_table(reports, every=args.every))
    stem = os.path.join(args.out_dir, f"{args.model}_gradient_flow")
    title = f"{args.model}: gradient flow at initialisation (seed {args.seed})"
    for path in (diagnostics.write_csv(reports, stem + ".csv"),
                 diagnostics.plot_gradient_flow(reports, stem + ".png", title=title)):
        print(f"wrote {path}")
    return 0
