"""One benchmark case of a whole training run: images/s of `keras-preact train`'s path on
digits (the tf.data pipeline, augmentation, the epoch's checkpoint), on any backend
(KERAS_BACKEND). Prints one JSON line. Like `keras_step.py` it imports nothing else of
benchmarks/, so `trees_ab.py --case train_case` runs it over another source tree, whose
keras_preact may train JAX through `train_data_parallel` (before that became
``strategy="data_parallel"`` of `train_and_evaluate`).

    KERAS_BACKEND=jax python benchmarks/train_case.py --model preact_resnet20 --batch 64 \
        --epochs 3

``images_per_s`` is the median of the epochs after the first (which compiles); evaluation
is off (``eval_every=0``), so an epoch is training steps and its checkpoint.
"""

import argparse
import json
import resource
import statistics
import tempfile


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="preact_resnet20")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args(argv)
    from keras_preact import training

    config = training.TrainConfig(model=args.model, dataset="digits", batch_size=args.batch,
                                  epochs=args.epochs, eval_every=0, verbose=0)
    if hasattr(training, "train_data_parallel"):  # the tree before the one contract
        result = training.train_data_parallel(config, devices=1)
    else:
        result = training.train_and_evaluate(config, tempfile.mkdtemp())
    rates = [e["images_per_s"] for e in result["history"][1:]]
    print(json.dumps({"images_per_s": statistics.median(rates), "epochs": rates,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
