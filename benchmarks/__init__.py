"""What the benchmark scripts share: the child-process launcher, the table printer, the
report writer and the machine's description. Every case runs in a fresh process
(`launch`), so the peak resident memory a case reports is that case's alone."""

import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def launch(script, *args, env=None, path=REPO, check=False, timeout=3600):
    """Runs ``benchmarks/<script>.py args`` in a fresh process, `path` first on its import
    path, and returns the last JSON object it printed (which carries the case's peak
    resident memory where the script measures it). A failed child gives
    ``{"error": ..., "args": ...}``, or with `check` a RuntimeError holding its stderr."""
    args = [str(a) for a in args]
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {}),
                "PYTHONPATH": os.pathsep.join(filter(None, (path, os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, os.path.join(HERE, script + ".py"), *args],
                          env=full_env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    if check:
        raise RuntimeError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return {"error": proc.stderr.strip().splitlines()[-1:] or ["failed"], "args": args}


def take_turns(sides, rounds):
    """Runs every one of `sides` ({name: function}) once a round, in reverse order every
    other round, so that a shared machine's drift hits them alike: [{name: result}] a round."""
    order = list(sides)
    return [{name: sides[name]() for name in (order if i % 2 == 0 else order[::-1])}
            for i in range(rounds)]


def print_table(rows, columns):
    """Prints `rows` (dicts) as a table: `columns` are (header, key, format spec) triples. A
    missing value prints as '-'; a row with an ``error`` prints its first column and the
    error."""
    def cells(row):
        return ["-" if row.get(key) is None else format(row[key], spec) for _, key, spec in columns]

    body = [cells(r) for r in rows if not r.get("error")]
    widths = [max(map(len, col)) for col in zip([h for h, _, _ in columns], *body)]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                    for i, ((h, _, _), w) in enumerate(zip(columns, widths))))
    for row in rows:
        if row.get("error"):
            print(f"{str(row.get(columns[0][1])).ljust(widths[0])}  error: {row['error']}")
        else:
            print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                            for i, (c, w) in enumerate(zip(cells(row), widths))))


def write_report(report, path):
    """Writes `report` as JSON to `path` (through a temporary file) and says so."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(path + ".tmp", path)
    print(f"wrote {path}")


def results_path(name):
    return os.path.join(HERE, "results", name + ".json")  # a script's default report


def median(values):
    """The median of the values that are not None, or None."""
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def check_counts(parser, args, *names, minimum=1):
    """A usage error for the first of `names` (an int or a list of them) below `minimum`."""
    for name in names:
        value = getattr(args, name)
        if value is not None and min(value if isinstance(value, list) else [value]) < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}. Received: {value}")


def cpu_info():
    """The CPU's model name and the vector features that decide which kernels run
    (TensorFlow turns oneDNN on by itself only with recent AVX-512 extensions or AMX;
    AVX512_BF16 or AMX give bfloat16 its speed), from /proc/cpuinfo where there is one."""
    fields = {}
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for key, _, value in (line.partition(":") for line in f):
                fields.setdefault(key.strip(), value.strip())  # the first CPU's
    flags = set(fields.get("flags", "").split())
    return {"model": fields.get("model name") or platform.processor() or platform.machine(),
            "features": [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                                     "amx_bf16", "amx_tile") if f in flags]}


def machine(**extra):
    """The platform, core count, Python version and CPU a report was measured on."""
    return {"platform": platform.platform(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "cpu": cpu_info(), **extra}
