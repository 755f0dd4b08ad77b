"""Fine-tune a pretrained pre-activation ResNet on a folder of images.

The folder holds one sub-folder per class (``root/<class>/*.png``; or ``root/train/``
and ``root/test/`` holding those). Two phases, the usual recipe for a small dataset:

1. the new classifier alone, everything else frozen (BatchNorm of frozen parts stays
   in inference mode, so its statistics are the pretrained ones);
2. the last stage and the classifier together at a tenth of the rate.

Run (the weights come from the catalog, or any .weights.h5 / .keras file):
    keras-preact weights fetch preact_resnet56.cifar10
    python examples/finetune.py --folder /data/flowers --model preact_resnet56 \
        --weights cifar10 --out /tmp/flowers

Offline, with a file you have:
    python examples/finetune.py --folder /data/flowers --weights runs/c10/model.keras

The same from the command line, in one phase:
    keras-preact train --model preact_resnet56 --weights cifar10 --dataset folder \
        --data-path /data/flowers --freeze stem,stage1,stage2 --epochs 10 --workdir /tmp/ft
"""

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# keras_preact before Keras: it picks TensorFlow's CPU kernels before TensorFlow loads.
import keras_preact as kp  # noqa: E402  isort: skip
import keras  # noqa: E402

from keras_preact import data, finetune  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", required=True, help="image folder, one sub-folder per class")
    parser.add_argument("--model", default="preact_resnet20",
                        help="a model from `keras-preact list`")
    parser.add_argument("--weights", default="cifar10",
                        help="catalog tag, .weights.h5 or .keras file, or URL#sha256=<hex>")
    parser.add_argument("--epochs-head", type=int, default=3)
    parser.add_argument("--epochs-all", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--out", default="finetuned", help="folder for the fine-tuned model")
    args = parser.parse_args(argv)

    info = data.dataset_info("folder", path=args.folder)
    # The pretrained network, its preprocessing built in (it takes raw pixels).
    base = kp.get_model(args.model, weights=args.weights, input_shape=tuple(info["input_shape"]),
                        include_top=True, classes=None)
    model = finetune.replace_head(base, classes=info["classes"])
    print(f"{args.model} from {args.weights!r}: {info['classes']} classes "
          f"{list(info['class_names'])}, {info['num_train']} training images")

    def dataset(split):
        return data.make_dataset("folder", split, path=args.folder, batch_size=args.batch_size,
                                 normalize=False, drop_remainder=False)

    train, test = dataset("train"), dataset("test")

    def fit(epochs, lr):
        # Compile after every change of what is trainable.
        model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        model.fit(train, validation_data=test, epochs=epochs, verbose=2, shuffle=False)

    finetune.freeze(model, "backbone")
    print("Phase 1: the classifier only")
    fit(args.epochs_head, args.lr)
    last_stage = finetune.parts(model)[-2]
    finetune.unfreeze(model, [last_stage])
    print(f"Phase 2: {last_stage} and the classifier, lr {args.lr / 10}")
    fit(args.epochs_all, args.lr / 10)

    loss, accuracy = model.evaluate(test, verbose=0)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "model.keras")
    model.save(path)
    print(f"test accuracy {100 * accuracy:.2f}%  loss {loss:.4f}\nmodel: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
