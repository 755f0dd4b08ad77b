"""What the benchmark scripts share: the child-process launcher, turn-taking, the table
printer, the argument parser and report writer, and the machine's description. Every case
runs in a fresh process (`launch`), so the peak resident memory a case reports is its own.
A script prints a table and writes a JSON report (``--out``, or benchmarks/results/)."""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks.keras_step import count, json_object  # noqa: F401 (keras_step stands alone)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def launch(target, *args, env=None, path=REPO, check=False, timeout=3600):
    """Runs ``benchmarks/<target>.py args``, or ``target(*args)`` for a function of a
    benchmarks script, in a fresh process with `path` first on its import path; returns
    the last JSON object it printed (a function's result). A failed child gives
    ``{"error": ..., "args": ...}``, or with `check` a RuntimeError holding its stderr."""
    if callable(target):
        module = os.path.basename(target.__code__.co_filename)[:-3]
        command = ["-c", f"import json, sys; from benchmarks.{module} import {target.__name__} "
                   "as f; print(json.dumps(f(*json.loads(sys.argv[1]))))", json.dumps(args)]
    else:
        command = [os.path.join(HERE, target + ".py"), *map(str, args)]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {}),
                "PYTHONPATH": os.pathsep.join(filter(None, (path, os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, *command], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    if check:
        raise RuntimeError(f"{command[-1]} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"], "args": command[1:]}


def take_turns(sides, rounds):
    """Runs every one of `sides` ({name: function}) once a round, in reverse order every
    other round, so that a shared machine's drift hits them alike: [{name: result}] a round."""
    order = list(sides)
    return [{name: sides[name]() for name in (order if i % 2 == 0 else order[::-1])}
            for i in range(rounds)]


def median(values):
    """The median of the values that are not None, or None."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def print_table(rows, columns):
    """Prints `rows` (dicts) under `columns`, (header, key, format spec) triples. A missing
    value prints as '-'; a failed row (one with an ``error``) as its first cell and the error."""
    def cells(row):
        if row.get("error"):
            return [str(row.get(columns[0][1])), f"error: {row['error']}"]
        return ["-" if row.get(key) is None else format(row[key], spec) for _, key, spec in columns]

    lines = [[header for header, _, _ in columns], *map(cells, rows)]
    widths = [max(map(len, col)) for col in zip(*(c for c in lines if len(c) == len(columns)))]
    for line in lines:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(line, widths))))


def parser(doc):
    """An argument parser described by the first line of `doc`, with ``--out``."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", help="where to write the JSON report")
    return p


def write_report(report, path, name=None):
    """Writes `report` as JSON to `path` (no `path`: benchmarks/results/<name>.json)."""
    path = path or os.path.join(HERE, "results", name + ".json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {path}")


def machine(**extra):
    """The platform, core count, Python version and CPU a report was measured on, with the
    CPU features that decide which kernels run (oneDNN's AVX-512 and AMX paths, bfloat16)."""
    fields = {}
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for key, _, value in (line.partition(":") for line in f):
                fields.setdefault(key.strip(), value.strip())  # the first CPU's
    flags = set(fields.get("flags", "").split())
    cpu = {"model": fields.get("model name") or platform.processor() or platform.machine(),
           "features": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                                    "amx_bf16", "amx_tile") if f in flags]}
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "cpu": cpu, **extra}


def now():
    return time.strftime("%Y-%m-%dT%H:%M:%S")
