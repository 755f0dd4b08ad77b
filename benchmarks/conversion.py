"""Checks a catalog converter on every entry it converts and records the figure.

Each entry of `zoo/weights/keras_applications.json` or `zoo/weights/pytorchcv_*.json` is
converted from the publisher's own model with random weights (`tests/references.py`), and
the outputs on random inputs (logits, or the ``_notop`` networks' feature maps) and every
parameter count are compared; ``--write`` records each entry's ``converter_max_abs_diff`` in
its manifest. pytorchcv needs ``pip install torch==2.13.0`` then ``pip install --no-deps
pytorchcv==0.0.74``.

    python benchmarks/conversion.py keras_applications|pytorchcv [--only KEY ...] [--write]
"""

import glob
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import REPO, parser, print_table, write_report  # noqa: E402

BOUND = 1e-4  # the largest allowed output difference


def keras_applications(key, entry, model, seed, batch_size):
    """keras.applications' network converted from its legacy `.h5` file into `model`:
    (inputs, the network's outputs, {what is counted: counts that must agree})."""
    from keras_preact.weights.converters import keras_applications as conv
    from tests.references import keras_reference, save_legacy_h5

    net = keras_reference(int(entry["model"][len("preact_resnet"):]), seed=seed,
                          include_top=entry["architecture"].get("include_top", True))
    with tempfile.TemporaryDirectory() as tmp:
        conv.convert(save_legacy_h5(net, os.path.join(tmp, os.path.basename(entry["url"]))),
                     model, entry)
    x = np.random.RandomState(seed).uniform(-1, 1, (batch_size, *entry["input_shape"]))
    x = x.astype("float32")
    return x, np.asarray(net(x, training=False)), {
        "params": {"catalog": entry["params"]},
        "count_params": {"keras.applications": int(net.count_params()),
                         "keras-preact": int(model.count_params()),
                         "catalog": entry.get("params_keras_count_params")}}


def pytorchcv(key, entry, model, seed, batch_size):
    """pytorchcv's model converted from its state dict into `model` (as above)."""
    from keras_preact.weights.converters import pytorchcv as conv
    from tests.references import pytorchcv_reference, reference_logits, state_dict_arrays

    net = pytorchcv_reference(entry["upstream_name"], seed=seed)
    conv.load_state_dict(model, state_dict_arrays(net), source=key)
    x = np.random.RandomState(seed).randn(batch_size, *entry["input_shape"]).astype("float32")
    return x, reference_logits(net, x), {
        "params": {"pytorchcv": int(sum(p.numel() for p in net.parameters())),
                   "catalog": entry["params"]}}


def measure(source, key, entry, *, seed=0, batch_size=2):
    """The entry's converted model against the publisher's: its largest output difference,
    the outputs' scale and the parameter counts."""
    import keras

    import keras_preact as kp

    t0 = time.time()
    print(f"checking {key}", flush=True)
    model = kp.get_model(entry["model"], **entry["architecture"], classifier_activation=None)
    x, ref, counts = globals()[source](key, entry, model, seed, batch_size)  # a function above
    counts["params"]["keras-preact"] = kp.count_params(model)
    diff = float(np.abs(np.asarray(model(x, training=False)) - ref).max())
    keras.utils.clear_session()
    return {"key": key, "max_abs_diff": diff, "output_scale": float(np.abs(ref).max()),
            "trainable_params": counts["params"]["keras-preact"], **counts,
            "ok": diff <= BOUND and all(len(set(c.values())) == 1 for c in counts.values()),
            "seconds": round(time.time() - t0, 1)}


def main(argv=None):
    p = parser(__doc__)
    p.add_argument("source", choices=("keras_applications", "pytorchcv"))
    p.add_argument("--only", nargs="*", default=None, help="catalog keys to check")
    p.add_argument("--write", action="store_true", help="record the figures in the manifests")
    args = p.parse_args(argv)
    docs, owner = {}, {}
    for path in sorted(glob.glob(os.path.join(REPO, "zoo", "weights", args.source + "*.json"))):
        with open(path, encoding="utf-8") as f:
            docs[path] = json.load(f)
        owner.update({key: path for key in docs[path]["entries"]})
    keys = args.only or list(owner)
    unknown = [k for k in keys if k not in owner]
    if unknown:
        p.error(f"not {args.source} catalog keys: {unknown}")
    rows = [measure(args.source, key, docs[owner[key]]["entries"][key]) for key in keys]
    print_table(rows, [("key", "key", "s"), ("max |diff|", "max_abs_diff", ".2e"),
                       ("outputs up to", "output_scale", ".1f"),
                       ("params", "trainable_params", ","), ("counts agree", "ok", ""),
                       ("s", "seconds", "")])
    write_report(rows, args.out, args.source + "_conversion")
    if args.write:
        from keras_preact.weights import catalog

        for path in {owner[row["key"]] for row in rows}:
            catalog.record_max_diffs(path, docs[path], {
                r["key"]: r["max_abs_diff"] for r in rows if owner[r["key"]] == path})
    bad = [r["key"] for r in rows if not r["ok"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} within {BOUND} with equal parameter counts"
          + (f"; not: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
