"""Where a JAX training step's time goes on a CPU: the convolutions and BN-ReLUs of
ResNet-56's step (batch 128 by default), forward and backward, in XLA:CPU and in PyTorch, each op
shape timed alone and multiplied by how often the step runs it; beside them, both
frameworks' whole training steps (`keras_step.py`, `torch_reference.py`). Each side runs
in its own process, the sides alternating round by round. Prints a table, writes JSON.

    python benchmarks/jax_ops.py [--rounds 2] [--out benchmarks/results/jax_ops.json]
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
#: ResNet-56's convolutions: (count, input size, in channels, out channels, kernel, stride).
CONVS = [(1, 32, 3, 16, 3, 1), (18, 32, 16, 16, 3, 1), (1, 32, 16, 32, 3, 2),
         (1, 32, 16, 32, 1, 2), (17, 16, 32, 32, 3, 1), (1, 16, 32, 64, 3, 2),
         (1, 16, 32, 64, 1, 2), (17, 8, 64, 64, 3, 1)]
#: Its training-mode BN-ReLUs: (count, size, channels).
BN_RELUS = [(19, 32, 16), (18, 16, 32), (18, 8, 64)]


def _time(fn, reps):
    fn()
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def jax_ops(reps, batch):
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)
    out = {"conv": 0.0, "bn_relu": 0.0}
    for count, size, cin, cout, k, stride in CONVS:
        x = jnp.asarray(rng.random((batch, size, size, cin), "float32"))
        w = jnp.asarray(rng.random((k, k, cin, cout), "float32"))

        def loss(x, w, k=k, stride=stride):
            y = jax.lax.conv_general_dilated(x, w, (stride, stride), [((k - 1) // 2,) * 2] * 2,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(y * y)

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        out["conv"] += count * _time(lambda: jax.block_until_ready(step(x, w)), reps)
    for count, size, channels in BN_RELUS:
        x = jnp.asarray(rng.random((batch, size, size, channels), "float32"))
        gamma, beta = jnp.ones(channels), jnp.zeros(channels)

        def loss(x, gamma, beta):
            mean, var = jnp.mean(x, (0, 1, 2)), jnp.var(x, (0, 1, 2))
            y = jax.nn.relu((x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta)
            return jnp.sum(y * y)

        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        out["bn_relu"] += count * _time(lambda: jax.block_until_ready(step(x, gamma, beta)), reps)
    return out


def torch_ops(reps, batch, threads):
    import torch

    torch.set_num_threads(threads)
    out = {"conv": 0.0, "bn_relu": 0.0}
    for count, size, cin, cout, k, stride in CONVS:
        x = torch.rand(batch, cin, size, size, requires_grad=True)
        w = torch.rand(cout, cin, k, k, requires_grad=True)

        def step(x=x, w=w, k=k, stride=stride):
            y = torch.nn.functional.conv2d(x, w, stride=stride, padding=(k - 1) // 2)
            (y * y).sum().backward()

        out["conv"] += count * _time(step, reps)
    for count, size, channels in BN_RELUS:
        x = torch.rand(batch, channels, size, size, requires_grad=True)
        bn = torch.nn.BatchNorm2d(channels)

        def step(x=x, bn=bn):
            y = torch.relu(bn(x))
            (y * y).sum().backward()

        out["bn_relu"] += count * _time(step, reps)
    return out


def _child(argv, env=None):
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=HERE,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **(env or {})))
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=8, help="whole training steps timed a round")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads")
    p.add_argument("--side", choices=("jax", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--out", default=os.path.join(HERE, "results", "jax_ops.json"))
    args = p.parse_args(argv)
    for name in ("rounds", "reps", "batch", "steps", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1. Received: {getattr(args, name)}")
    if args.side:
        ops = (jax_ops(args.reps, args.batch) if args.side == "jax"
               else torch_ops(args.reps, args.batch, args.threads))
        print(json.dumps(ops))
        return 0
    rounds = []
    for i in range(args.rounds):
        sides = ("jax", "torch") if i % 2 == 0 else ("torch", "jax")
        row = {}
        for side in sides:
            row[side] = _child([__file__, "--side", side, "--reps", str(args.reps), "--batch",
                                str(args.batch), "--threads", str(args.threads)],
                               env={"JAX_PLATFORMS": "cpu"})
            step = (_child(["keras_step.py", "--model", "preact_resnet56", "--batch", str(args.batch),
                            "--steps", str(args.steps), "--warmup", "1"],
                           env={"KERAS_BACKEND": "jax", "PYTHONPATH": os.path.dirname(HERE)})
                    if side == "jax" else
                    _child(["torch_reference.py", "--depth", "56", "--batch", str(args.batch),
                            "--steps", str(args.steps), "--threads", str(args.threads)]))
            row[side]["step"] = step["s_per_step"]
        rounds.append(row)
        print(f"round {i + 1}: " + ", ".join(
            f"{side} conv {r['conv']:.3f} s, BN-ReLU {r['bn_relu']:.3f} s, step {r['step']:.3f} s"
            for side, r in row.items()))
    report = {"model": "preact_resnet56", "batch": args.batch, "threads_torch": args.threads,
              "cpus": os.cpu_count(), "rounds": rounds,
              "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
