"""Checks the pytorchcv converter on every catalog architecture and records the figure.

For each pytorchcv entry of the catalog (`zoo/weights/pytorchcv_*.json`): build
pytorchcv's model with
random weights (random BatchNorm statistics too), convert its state dict into the
entry's keras-preact architecture, and compare logits on random normalised images.
Prints a table, writes JSON, and with ``--write`` records each entry's
``converter_max_abs_diff`` in the manifest (written to a temporary file and renamed).

Needs torch and pytorchcv: ``pip install torch==2.13.0`` then
``pip install --no-deps pytorchcv==0.0.74``.

    python benchmarks/pytorchcv_conversion.py [--only preact_resnet20.cifar10 ...] [--write]
"""

import argparse
import glob
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MANIFESTS = sorted(glob.glob(os.path.join(REPO, "zoo", "weights", "pytorchcv_*.json")))


def measure(key, entry, *, seed=0, batch_size=2):
    import keras_preact as kp
    from keras_preact.weights.converters import pytorchcv as conv
    from references import pytorchcv_reference
    from references import reference_logits
    from references import state_dict_arrays

    net = pytorchcv_reference(entry["upstream_name"], seed=seed)
    torch_params = sum(p.numel() for p in net.parameters())
    model = kp.get_model(entry["model"], **entry["architecture"], classifier_activation=None)
    conv.load_state_dict(model, state_dict_arrays(net), source=key)
    x = np.random.RandomState(seed).randn(batch_size, *entry["input_shape"]).astype("float32")
    ref = reference_logits(net, x)
    out = np.asarray(model(x, training=False))
    return {
        "key": key,
        "max_abs_diff": float(np.abs(out - ref).max()),
        "logit_scale": float(np.abs(ref).max()),
        "params_keras": kp.count_params(model),
        "params_torch": int(torch_params),
        "params_catalog": entry["params"],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="catalog keys to check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help="record the figures in the manifest")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "pytorchcv_conversion.json"))
    args = parser.parse_args(argv)
    docs, owner = {}, {}
    for path in MANIFESTS:
        with open(path, encoding="utf-8") as f:
            docs[path] = json.load(f)
        owner.update({key: path for key in docs[path]["entries"]})
    keys = args.only or list(owner)
    unknown = [k for k in keys if k not in owner]
    if unknown:
        parser.error(f"not pytorchcv catalog keys: {unknown}")
    rows = []
    for key in keys:
        t0 = time.time()
        row = measure(key, docs[owner[key]]["entries"][key], seed=args.seed)
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(f"{key:28s} max|diff| {row['max_abs_diff']:.2e}  (logits up to {row['logit_scale']:.1f})  "
              f"params keras {row['params_keras']:,} torch {row['params_torch']:,} "
              f"catalog {row['params_catalog']:,}  {row['seconds']} s", flush=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)
    bad = [r for r in rows if r["max_abs_diff"] > 1e-4 or not (r["params_keras"] == r["params_torch"] == r["params_catalog"])]
    if args.write:
        from keras_preact.weights import catalog

        for path in {owner[row["key"]] for row in rows}:
            catalog.record_max_diffs(path, docs[path], {
                r["key"]: r["max_abs_diff"] for r in rows if owner[r["key"]] == path})
    print(f"{len(rows) - len(bad)}/{len(rows)} within 1e-4 with equal parameter counts; wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
