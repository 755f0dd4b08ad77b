"""The PyTorch reference of the speed benchmarks: a plain eager pre-activation ResNet,
committed so that it cannot drift. The paper's CIFAR layout (basic units for 6n+2,
bottleneck units for 9n+2, projection shortcuts fed by the shared pre-activation), He
initialisation, SGD with momentum 0.9 and weight decay 1e-4, fp32, no ``torch.compile``.
Prints one JSON line: images/s, seconds per step, peak resident memory.

    python benchmarks/torch_reference.py --depth 110 --batch 128 --steps 20 --threads 2
"""

import argparse
import json
import resource
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F


class Unit(nn.Module):
    """A full pre-activation unit (basic or bottleneck; stride on the 3x3 conv). The
    shortcut takes the pre-activated input where it projects, and in the first unit."""

    def __init__(self, cin, cout, stride, bottleneck, first):
        super().__init__()
        mid = cout // 4
        shapes = ([(cin, mid, 1, 1), (mid, mid, 3, stride), (mid, cout, 1, 1)] if bottleneck
                  else [(cin, cout, 3, stride), (cout, cout, 3, 1)])
        self.bns = nn.ModuleList(nn.BatchNorm2d(c) for c, _, _, _ in shapes)
        self.convs = nn.ModuleList(nn.Conv2d(c_in, c_out, k, stride=s, padding=k // 2, bias=False)
                                   for c_in, c_out, k, s in shapes)
        project = stride != 1 or cin != cout
        self.projection = nn.Conv2d(cin, cout, 1, stride=stride, bias=False) if project else None
        self.share = project or first

    def forward(self, x):
        a = F.relu(self.bns[0](x))
        r = self.convs[0](a)
        for bn, conv in zip(self.bns[1:], self.convs[1:]):
            r = conv(F.relu(bn(r)))
        s = a if self.share else x
        return (self.projection(s) if self.projection else s) + r


class PreActResNet(nn.Module):
    def __init__(self, depth=110, classes=10):
        super().__init__()
        bottleneck = depth >= 164 and (depth - 2) % 9 == 0
        n = (depth - 2) // (9 if bottleneck else 6)
        widths = (64, 128, 256) if bottleneck else (16, 32, 64)
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        units, cin = [], 16
        for stage, width in enumerate(widths):
            for i in range(n):
                stride = 2 if (stage > 0 and i == 0) else 1
                units.append(Unit(cin, width, stride, bottleneck, stage == 0 and i == 0))
                cin = width
        self.units = nn.Sequential(*units)
        self.post_bn = nn.BatchNorm2d(cin)
        self.fc = nn.Linear(cin, classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.units(self.stem(x))
        x = F.relu(self.post_bn(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def run(depth, batch, steps, warmup, threads, size=32):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = PreActResNet(depth)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    elapsed = time.perf_counter() - t0
    return {"framework": "torch", "torch": torch.__version__, "depth": depth, "batch": batch,
            "threads": threads, "steps": steps, "images_per_s": batch * steps / elapsed,
            "s_per_step": elapsed / steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "params": sum(p.numel() for p in model.parameters())}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=110)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    print(json.dumps(run(**vars(p.parse_args(argv)))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
