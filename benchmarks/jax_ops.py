"""Where a JAX training step's time goes on a CPU: ResNet-56's convolutions and BN-ReLUs,
forward and backward, each timed alone in XLA:CPU and in PyTorch and weighted by how often
the step runs it, beside both whole steps; each side in its own process, rounds alternating.

    python benchmarks/jax_ops.py [--rounds 2] [--out benchmarks/results/jax_ops.json]
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import (  # noqa: E402
    count,
    launch,
    machine,
    now,
    parser,
    print_table,
    take_turns,
    write_report,
)

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


def op_times(side, reps, batch, threads):
    """Every op shape's forward and backward step in `side` ("jax" or "torch") timed alone,
    times how often the training step runs it, summed (a child process)."""
    conv, bn_relu = jax_steps() if side == "jax" else torch_steps(threads)
    return {"conv": sum(n * _time(conv(batch, *shape), reps) for n, *shape in CONVS),
            "bn_relu": sum(n * _time(bn_relu(batch, *shape), reps) for n, *shape in BN_RELUS)}


def jax_steps():
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(0)

    def conv(batch, size, cin, cout, k, stride):
        x = jnp.asarray(rng.random((batch, size, size, cin), "float32"))
        w = jnp.asarray(rng.random((k, k, cin, cout), "float32"))

        def loss(x, w):
            y = jax.lax.conv_general_dilated(x, w, (stride, stride), [((k - 1) // 2,) * 2] * 2,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(y * y)

        step = jax.jit(jax.grad(loss, argnums=(0, 1)))
        return lambda: jax.block_until_ready(step(x, w))

    def bn_relu(batch, size, channels):
        x = jnp.asarray(rng.random((batch, size, size, channels), "float32"))
        gamma, beta = jnp.ones(channels), jnp.zeros(channels)

        def loss(x, gamma, beta):
            mean, var = jnp.mean(x, (0, 1, 2)), jnp.var(x, (0, 1, 2))
            return jnp.sum(jax.nn.relu((x - mean) * jax.lax.rsqrt(var + 1e-5) * gamma + beta) ** 2)

        step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
        return lambda: jax.block_until_ready(step(x, gamma, beta))

    return conv, bn_relu


def torch_steps(threads):
    import torch

    torch.set_num_threads(threads)

    def conv(batch, size, cin, cout, k, stride):
        x = torch.rand(batch, cin, size, size, requires_grad=True)
        w = torch.rand(cout, cin, k, k, requires_grad=True)
        return lambda: (torch.nn.functional.conv2d(x, w, stride=stride, padding=(k - 1) // 2)
                        ** 2).sum().backward()

    def bn_relu(batch, size, channels):
        x = torch.rand(batch, channels, size, size, requires_grad=True)
        bn = torch.nn.BatchNorm2d(channels)
        return lambda: (torch.relu(bn(x)) ** 2).sum().backward()

    return conv, bn_relu


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("--rounds", type=count, default=2)
    p.add_argument("--reps", type=count, default=10)
    p.add_argument("--batch", type=count, default=128)
    p.add_argument("--steps", type=count, default=8, help="whole training steps timed a round")
    p.add_argument("--threads", type=count, default=2, help="PyTorch's threads")
    args = p.parse_args(argv)
    steps = {"jax": ("keras_step", "--model", "preact_resnet56", "--warmup", 1),
             "torch": ("torch_reference", "--depth", 56, "--threads", args.threads)}

    def side(name):  # its ops, then its whole step
        ops = launch(op_times, name, args.reps, args.batch, args.threads, check=True,
                     env={"JAX_PLATFORMS": "cpu"})
        return {**ops, "step": launch(*steps[name], "--batch", args.batch, "--steps", args.steps,
                                      check=True, env={"KERAS_BACKEND": "jax"})["s_per_step"]}

    rounds = take_turns({"jax": lambda: side("jax"), "torch": lambda: side("torch")}, args.rounds)
    rows = [{"round": i + 1, "side": name, **r} for i, row in enumerate(rounds)
            for name, r in row.items()]
    print_table(rows, [("round", "round", "d"), ("side", "side", "s"), ("conv s", "conv", ".3f"),
                       ("BN-ReLU s", "bn_relu", ".3f"), ("step s", "step", ".3f")])
    write_report({"model": "preact_resnet56", "batch": args.batch, "threads_torch": args.threads,
                  "machine": machine(), "started": now(), "rounds": rounds}, args.out, "jax_ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
