"""The paper's argument at 1001 layers: gradient flow, original vs full pre-activation.

He et al. 2016 (Section 3) argue that a clean identity path lets the gradient reach
every unit directly. This script builds ResNet-1001 (333 bottleneck units) with the
original unit (Fig. 4a) and with full pre-activation (Fig. 4e), and measures the
per-element RMS of dL/dx_l at every unit's input (`keras_preact.diagnostics`):

1. at initialisation, on a fixed batch of digits (BatchNorm in training mode);
2. after a short training run on scikit-learn's digits (no download), on the same batch.

It prints the first-to-last ratio of each (how much the gradient grows from the last
unit back to the first; smaller is flatter) and writes a CSV and a PNG. To fit a CPU,
the digits are used at their native 8 x 8 pixels (the 32 x 32 dataset images are 4x
nearest-neighbour copies of them), with a small batch.

    python examples/gradient_flow.py --out-dir runs/gradient_flow
    python examples/gradient_flow.py --depth 164 --steps 50   # faster
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def digits_8x8(split):
    """The digits at their native 8 x 8 size, standardised, and their labels."""
    import numpy as np

    from keras_preact.data.digits import UPSAMPLE, read_digits

    images, labels, _ = read_digits(split)
    small = images[:, ::UPSAMPLE, ::UPSAMPLE, :].astype("float32") / 255.0
    return small, labels.astype("int32"), np


def train(model, images, labels, *, steps, batch_size, lr, rng):
    """A short SGD run (momentum 0.9) in one `tf.function`; returns the step losses.

    A plain training step instead of `fit`: tracing a 1001-layer graph is the slow
    part on a CPU, and this traces once. Grappler's graph rewrites are switched off:
    on this CPU they tripled the first step of ResNet-164 (21 s vs 7.6 s) and did not
    speed up the following ones.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    bar = keras.utils.Progbar(steps, unit_name="step")
    losses = []
    order = np.resize(rng.permutation(len(images)), steps * batch_size)
    for i in range(steps):
        idx = order[i * batch_size : (i + 1) * batch_size]
        losses.append(float(step(tf.constant(images[idx]), tf.constant(labels[idx]))))
        bar.update(i + 1, values=[("loss", losses[-1])])
    return losses


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=1001,
                        help="9n+2 bottleneck depth (default 1001)")
    parser.add_argument("--batch", type=int, default=8, help="measurement batch (default 8)")
    parser.add_argument("--train-batch", type=int, default=16, help="training batch (default 16)")
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    # At 0.01 (the paper's warm-up rate) both 1001-layer networks blew up their first
    # stage within 30 steps of batch 16 (activation std 2e4-4e4); 0.001 keeps the
    # pre-activation network stable on this short run.
    parser.add_argument("--lr", type=float, default=0.001, help="SGD rate (default 0.001)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default="runs/gradient_flow")
    args = parser.parse_args(argv)
    if (args.depth - 2) % 9 or args.depth < 11:
        print(f"error: `--depth` must be 9n+2 (bottleneck). Received: --depth={args.depth}",
              file=sys.stderr)
        return 2
    if args.batch < 2 or args.train_batch < 2 or args.steps < 1:
        print("error: `--batch` and `--train-batch` must be >= 2 and `--steps` >= 1. Received: "
              f"--batch={args.batch}, --train-batch={args.train_batch}, --steps={args.steps}",
              file=sys.stderr)
        return 2

    import keras

    import keras_preact as kp
    from keras_preact import diagnostics

    train_x, train_y, np = digits_8x8("train")
    mean, std = train_x.mean(), train_x.std()
    train_x = (train_x - mean) / std
    rng = np.random.RandomState(args.seed)
    probe = rng.choice(len(train_x), args.batch, replace=False)
    probe_x, probe_y = train_x[probe], train_y[probe]

    reports = []
    summary = []
    for unit in ("original", "full_preact"):
        keras.utils.set_random_seed(args.seed)
        start = time.time()
        model = kp.preact_resnet_cifar(args.depth, block="bottleneck", unit=unit,
                                       input_shape=(8, 8, 3), classifier_activation=None)
        init = diagnostics.gradient_flow(model, probe_x, probe_y, label=f"{unit}, init")
        print(f"{unit}: built and measured in {time.time() - start:.0f} s; "
              f"first/last at initialisation {init.first_to_last:.3g}", flush=True)
        start = time.time()
        losses = train(model, train_x, train_y, steps=args.steps, batch_size=args.train_batch,
                       lr=args.lr, rng=rng)
        trained = diagnostics.gradient_flow(model, probe_x, probe_y,
                                            label=f"{unit}, {args.steps} steps")
        loss = float(np.mean(losses[-5:]))
        print(f"{unit}: {args.steps} steps in {time.time() - start:.0f} s (mean loss of the "
              f"last 5 steps {loss:.3f}); first/last after training {trained.first_to_last:.3g}",
              flush=True)
        reports += [init, trained]
        summary.append((unit, init, trained, loss))
        del model
        keras.utils.clear_session()  # the next model's graph starts empty

    print()
    print(f"ResNet-{args.depth}, batch of {args.batch} digits (8x8), BatchNorm in training mode")
    print(f"{'unit':<14}{'first/last init':>17}{'first/last trained':>20}{'last-stage init':>17}"
          f"{'train loss':>12}")
    for unit, init, trained, loss in summary:
        last_stage = init.stage_ratios()[max(init.stage_ratios())]
        print(f"{unit:<14}{init.first_to_last:>17.3g}{trained.first_to_last:>20.3g}"
              f"{last_stage:>17.3g}{loss:>12.3f}")
    stem = os.path.join(args.out_dir, f"resnet{args.depth}_gradient_flow")
    print("wrote", diagnostics.write_csv(reports, stem + ".csv"))
    print("wrote", diagnostics.plot_gradient_flow(
        reports, stem + ".png",
        title=f"ResNet-{args.depth} on digits: original vs full pre-activation"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
