"""A/B of two source trees of keras-preact on one `keras_step.py` case, in turns.

A refactor that touches the training step is checked here: the reference tree (e.g. a
`git worktree` of the commit before) and the changed tree each run the same case in
fresh processes, alternating, so a shared machine's drift hits both. Reports each
tree's median images/s and peak resident memory and the changed/reference ratios.

    python benchmarks/trees_ab.py --reference /tmp/before --changed . --pairs 3 \
        [--out result.json] -- --model preact_resnet110 --batch 128 --steps 10

Everything after ``--`` goes to `keras_step.py` unchanged.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run_case(tree, case_args):
    """One `keras_step.py` case with `tree` first on the import path; its JSON line."""
    env = {**os.environ, "PYTHONPATH": os.path.abspath(tree)}
    out = subprocess.run([sys.executable, os.path.join(HERE, "keras_step.py"), *case_args],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, help="the tree before the change")
    p.add_argument("--changed", default=os.path.dirname(HERE), help="the tree after it")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--out", default=None)
    args, case_args = p.parse_args(argv[:split]), argv[split + 1:]
    runs = {"reference": [], "changed": []}
    for _ in range(args.pairs):
        for label in runs:
            runs[label].append(run_case(getattr(args, label), case_args))
            print(label, json.dumps(runs[label][-1]), flush=True)
    report = {"case": case_args, "pairs": args.pairs}
    for key in ("images_per_s", "peak_rss_mb"):
        medians = {label: statistics.median(r[key] for r in rows) for label, rows in runs.items()}
        report[key] = {**medians, "ratio": medians["changed"] / medians["reference"]}
    print(json.dumps(report))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**report, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
