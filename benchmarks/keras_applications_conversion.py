"""Checks the keras.applications converter on every catalog entry and records the figure.

For each entry of `zoo/weights/keras_applications.json`: build keras.applications'
ResNet{50,101,152}V2 (with or without its head) with random weights (random BatchNorm
parameters and statistics, random biases too), write it in the publisher's legacy
`.h5` format (as Keras 2's ``save_weights`` did), convert that file with the catalog's
converter into the entry's keras-preact architecture, and compare the outputs (logits,
or the feature map of the ``_notop`` networks) on random images in [-1, 1]. Prints a
table, writes JSON, and with ``--write`` records each entry's
``converter_max_abs_diff`` in the manifest (written to a temporary file and renamed).

    python benchmarks/keras_applications_conversion.py [--only preact_resnet50.keras_imagenet ...] [--write]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MANIFEST = os.path.join(REPO, "zoo", "weights", "keras_applications.json")


def measure(key, entry, *, seed=0, batch_size=2):
    import keras

    import keras_preact as kp
    from keras_preact.weights.converters import keras_applications as conv
    from references import keras_reference
    from references import save_legacy_h5

    depth = int(entry["model"][len("preact_resnet"):])
    include_top = entry["architecture"].get("include_top", True)
    net = keras_reference(depth, include_top=include_top, seed=seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = save_legacy_h5(net, os.path.join(tmp, os.path.basename(entry["url"])))
        model = kp.get_model(entry["model"], **entry["architecture"], classifier_activation=None)
        conv.convert(path, model, entry)
    x = np.random.RandomState(seed).uniform(-1, 1, (batch_size, *entry["input_shape"])).astype("float32")
    ref = np.asarray(net(x, training=False))
    out = np.asarray(model(x, training=False))
    row = {
        "key": key,
        "max_abs_diff": float(np.abs(out - ref).max()),
        "output_scale": float(np.abs(ref).max()),
        "params_keras_preact": kp.count_params(model),
        "params_catalog": entry["params"],
        "count_params_keras_applications": int(net.count_params()),
        "count_params_keras_preact": int(model.count_params()),
        "count_params_catalog": entry.get("params_keras_count_params"),
    }
    del net, model
    keras.utils.clear_session()
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="catalog keys to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help="record the figures in the manifest")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "keras_applications_conversion.json"))
    args = parser.parse_args(argv)
    with open(MANIFEST, encoding="utf-8") as f:
        doc = json.load(f)
    keys = args.only or list(doc["entries"])
    unknown = [k for k in keys if k not in doc["entries"]]
    if unknown:
        parser.error(f"not keras_applications catalog keys: {unknown}")
    rows = []
    for key in keys:
        t0 = time.time()
        row = measure(key, doc["entries"][key], seed=args.seed)
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(f"{key:40s} max|diff| {row['max_abs_diff']:.2e}  (outputs up to {row['output_scale']:.1f})  "
              f"count_params keras.applications {row['count_params_keras_applications']:,} "
              f"keras-preact {row['count_params_keras_preact']:,}; trainable "
              f"{row['params_keras_preact']:,}  {row['seconds']} s", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    bad = [
        r for r in rows
        if r["max_abs_diff"] > 1e-4
        or r["params_keras_preact"] != r["params_catalog"]
        or not (r["count_params_keras_applications"] == r["count_params_keras_preact"]
                == r["count_params_catalog"])
    ]
    if args.write:
        from keras_preact.weights import catalog

        catalog.record_max_diffs(MANIFEST, doc, {r["key"]: r["max_abs_diff"] for r in rows})
    print(f"{len(rows) - len(bad)}/{len(rows)} within 1e-4 with equal parameter counts; wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
