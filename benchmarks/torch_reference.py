"""The PyTorch reference of the speed benchmarks: a plain eager pre-activation ResNet,
committed so that it cannot drift. The paper's CIFAR layout (basic units for 6n+2,
bottleneck units for 9n+2, projection shortcuts fed by the shared pre-activation), He
initialisation, SGD with momentum 0.9 and weight decay 1e-4, fp32, no ``torch.compile``.
Prints one JSON line: images/s, seconds per step, peak resident memory.

    python benchmarks/torch_reference.py --depth 110 --batch 128 --steps 20 --threads 2

With ``--data-path`` it is a full trainer of the paper's CIFAR recipe on an image folder
(``train/<class>/*`` and ``test/<class>/*``, read with Pillow): batch 128, lr 0.1 after a
warm-up at 0.01 for the first 400/64000 of the run, divided by 10 at 50% and 75% of it,
coupled weight decay 1e-4 on every parameter, 4-pixel zero padding, random crop and flip,
per-channel statistics of the train split, Keras' initialisers (He normal truncated at 2
standard deviations, fan-in; Glorot uniform head) and BatchNorm settings (momentum 0.9 in
Keras' sense, epsilon 1e-5). One JSON line per epoch: training seconds, test accuracy.

    python benchmarks/torch_reference.py --data-path cifar10 --depth 20 --epochs 20 --seed 0
"""

import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class Unit(nn.Module):
    """A full pre-activation unit (basic or bottleneck; stride on the 3x3 conv). The
    shortcut takes the pre-activated input where it projects, and in the first unit."""

    def __init__(self, cin, cout, stride, bottleneck, first):
        super().__init__()
        mid = cout // 4
        shapes = ([(cin, mid, 1, 1), (mid, mid, 3, stride), (mid, cout, 1, 1)] if bottleneck
                  else [(cin, cout, 3, stride), (cout, cout, 3, 1)])
        self.bns = nn.ModuleList(nn.BatchNorm2d(c, eps=1e-5, momentum=0.1) for c, _, _, _ in shapes)
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
        for m in self.modules():  # Keras' he_normal and glorot_uniform, zero bias
            if isinstance(m, nn.Conv2d):
                std = math.sqrt(2.0 / (m.weight[0].numel())) / 0.87962566103423978
                nn.init.trunc_normal_(m.weight, std=std, a=-2 * std, b=2 * std)
            elif isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

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


def read_folder(root, split):
    """uint8 (N, 32, 32, 3) images and int64 labels of ``root/split/<class>/*``, classes sorted."""
    from PIL import Image
    classes = sorted(os.listdir(os.path.join(root, "train")))
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(root, split, name)
        for file in sorted(os.listdir(folder)):
            with Image.open(os.path.join(folder, file)) as image:
                images.append(np.asarray(image.convert("RGB").resize((32, 32), Image.BILINEAR)))
            labels.append(label)
    return np.stack(images), np.asarray(labels, np.int64)


def augment(x, generator, pad=4):
    """Zero-pads NCHW `x` by `pad`, crops back at random and flips half the images."""
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
    flips = torch.rand(n, generator=generator) < 0.5
    out = torch.stack([padded[i, :, a:a + h, b:b + w] for i, (a, b) in enumerate(offsets.tolist())])
    return torch.where(flips[:, None, None, None], out.flip(3), out)


def train(data_path, depth, epochs, seed, batch=128, threads=2):
    """Trains the paper's recipe on the folder, printing a JSON line per epoch."""
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    (x_train, y_train), (x_test, y_test) = (read_folder(data_path, s) for s in ("train", "test"))
    mean = x_train.reshape(-1, 3).mean(0) / 255
    std = x_train.reshape(-1, 3).std(0) / 255
    to_tensor = lambda x: torch.from_numpy(x).permute(0, 3, 1, 2).float().contiguous()  # noqa: E731
    x_train, x_test = to_tensor(x_train), to_tensor(x_test)
    y_train, y_test = torch.from_numpy(y_train), torch.from_numpy(y_test)
    norm_mean = torch.tensor(mean * 255, dtype=torch.float32)[None, :, None, None]
    norm_std = torch.tensor(std * 255, dtype=torch.float32)[None, :, None, None]
    normalize = lambda x: (x - norm_mean) / norm_std  # noqa: E731
    print(json.dumps({"read_s": time.perf_counter() - t0, "train": len(y_train),
                      "test": len(y_test)}), flush=True)
    model = PreActResNet(depth)
    steps_per_epoch = len(y_train) // batch
    total = epochs * steps_per_epoch
    warmup, bounds = round(400 / 64000 * total), [round(0.5 * total), round(0.75 * total)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    step, train_s = 0, 0.0
    for epoch in range(epochs):
        model.train()
        start = time.perf_counter()
        order = torch.randperm(len(y_train), generator=generator)
        for i in range(steps_per_epoch):
            idx = order[i * batch:(i + 1) * batch]
            lr = 0.01 if step < warmup else 0.1 * 0.1 ** sum(step >= b for b in bounds)
            for group in opt.param_groups:
                group["lr"] = lr
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(normalize(augment(x_train[idx], generator))), y_train[idx])
            loss.backward()
            opt.step()
            step += 1
        train_s += time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(normalize(x_test[i:i + 1000])).argmax(1)
                               == y_test[i:i + 1000]).sum()) for i in range(0, len(y_test), 1000))
        print(json.dumps({"framework": "torch", "epoch": epoch + 1, "train_s": train_s,
                          "loss": loss.item(), "test_accuracy": correct / len(y_test),
                          "seed": seed, "depth": depth}), flush=True)
    return {"framework": "torch", "epochs": epochs, "train_s": train_s,
            "test_accuracy": correct / len(y_test), "seed": seed, "depth": depth}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--depth", type=int, default=110)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data-path", help="train the paper's recipe on this image folder")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.data_path:
        print(json.dumps(train(args.data_path, args.depth, args.epochs, args.seed, args.batch,
                               args.threads)))
    else:
        print(json.dumps(run(args.depth, args.batch, args.steps, args.warmup, args.threads)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
