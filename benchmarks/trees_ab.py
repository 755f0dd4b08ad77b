"""A/B of two source trees of keras-preact on one case (`keras_step.py`, or `--case
train_case` for a whole training run), in turns.

The reference tree (e.g. a `git worktree` of the commit before a change to the training
step) and the changed tree run the same case in fresh processes, alternating. Reports each
tree's median images/s and peak resident memory and the changed/reference ratios.

    python benchmarks/trees_ab.py --reference /tmp/before --changed . --pairs 3 \
        [--out result.json] -- --model preact_resnet110 --batch 128 --steps 10
"""

import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import (  # noqa: E402
    REPO,
    count,
    launch,
    parser,
    print_table,
    take_turns,
    write_report,
)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = parser(__doc__)
    p.add_argument("--reference", required=True, help="the tree before the change")
    p.add_argument("--changed", default=REPO, help="the tree after it")
    p.add_argument("--pairs", type=count, default=3)
    p.add_argument("--case", default="keras_step", choices=("keras_step", "train_case"),
                   help="the benchmarks script each tree runs")
    args, case_args = p.parse_args(argv[:split]), argv[split + 1:]
    trees = {"reference": args.reference, "changed": args.changed}
    # Each tree first on the import path in turn: its keras_preact runs the case.
    rounds = take_turns({label: lambda tree=tree: launch(
        args.case, *case_args, check=True, path=os.path.abspath(tree))
        for label, tree in trees.items()}, args.pairs)
    runs = {label: [r[label] for r in rounds] for label in trees}
    print_table([{"tree": label, **r} for label, rows in runs.items() for r in rows],
                [("tree", "tree", "s"), ("img/s", "images_per_s", ".1f"),
                 ("peak MB", "peak_rss_mb", ".0f")])
    report = {"script": args.case, "case": case_args, "pairs": args.pairs}
    for key in ("images_per_s", "peak_rss_mb"):
        medians = {label: statistics.median(r[key] for r in rows) for label, rows in runs.items()}
        report[key] = {**medians, "ratio": medians["changed"] / medians["reference"]}
    print(json.dumps(report))
    if args.out:
        write_report({**report, "runs": runs}, args.out)


if __name__ == "__main__":
    main()
