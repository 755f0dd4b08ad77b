"""Two-replica MirroredStrategy on two logical CPU devices vs one device (e2e).

Logical devices can only be configured before TensorFlow initialises, so the runs
happen in a fresh interpreter.

What is compared: three `train_and_evaluate` runs of the same tiny network from the
same initialisation on the same batches (global batch 64, 3 steps, constant lr 0.1,
op determinism on): one device; two replicas (32 images each); two replicas with
synchronized BatchNorm.

Tolerances, and why:
- Synchronized BN: every replica normalises with the global batch's moments, so the
  computation is the single-device one except for float32 summation order (the
  gradient all-reduce adds two halves; the synchronized moments are E[x^2] - E[x]^2
  from all-reduced sums instead of TensorFlow's two-pass moments over 64x32x32 values
  per channel). Measured here: training loss within 1e-5 relative, weights within
  3e-4 absolute after 3 steps. Asserted: 1e-4 relative and 2e-3 absolute.
- Per-replica BN (the default): each replica normalises with its own 32 images'
  statistics, a different function of the weights, so the loss differs by a
  genuine amount (measured 5e-4..2e-3 relative, weights 2e-2 absolute). Asserted:
  within 2% (the same training), and at least 10x further from the single-device
  run than the synchronized run is -- the difference is the BN statistics.

Per-replica moving statistics: each replica's copy follows its own share of the
batch; `average_replica_statistics` (run by `train_and_evaluate` at every epoch end
and before evaluation) gives every copy their mean.
"""

import json

import pytest

from tests.helpers import run_python

SCRIPT = r"""
import json, os, sys
import numpy as np
from keras_preact.training import TrainConfig, train_and_evaluate

TINY = {"architecture": {"stage_blocks": [1, 1, 1], "stage_filters": [8, 16, 32],
                         "stem_filters": 8}}
base = dict(model="tiny", model_kwargs=TINY, dataset="digits", batch_size=64, steps=3,
            eval_every=0, warmup=0, boundaries=(), learning_rate=0.1, deterministic=True,
            cpu_devices=2, seed=0, verbose=0)
root = sys.argv[1]
out = {}
for name, kw in [("single", dict(strategy="default")),
                 ("mirrored", dict(strategy="mirrored")),
                 ("mirrored_sync", dict(strategy="mirrored", synchronized_bn=True))]:
    r = train_and_evaluate(TrainConfig(**base, **kw), os.path.join(root, name))
    import keras
    model = keras.saving.load_model(r["model_path"], compile=False)
    np.savez(os.path.join(root, name + ".npz"), *[np.asarray(w) for w in model.get_weights()])
    out[name] = {"loss": r["history"][0]["loss"], "replicas": r["num_replicas"],
                 "steps": r["steps"]}

# A global batch that does not split across the two replicas: refused up front.
try:
    train_and_evaluate(TrainConfig(**{**base, "batch_size": 63}, strategy="mirrored"),
                       os.path.join(root, "odd"))
    out["odd"] = "no error"
except ValueError as err:
    out["odd"] = str(err)
out["odd_workdir_exists"] = os.path.exists(os.path.join(root, "odd"))

# Per-replica moving statistics drift apart; averaging gives every copy the mean.
import keras, tensorflow as tf
from keras_preact.training.distribute import average_replica_statistics, make_strategy
strategy = make_strategy("mirrored")
rng = np.random.default_rng(0)
x = np.concatenate([rng.normal(0, 1, (8, 4)), rng.normal(5, 1, (8, 4))]).astype("float32")
with strategy.scope():
    net = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(momentum=0.0),
                            keras.layers.Dense(1)])
    net.compile("sgd", "mse")
net.fit(tf.data.Dataset.from_tensor_slices((x, np.zeros((16, 1), "float32"))).batch(16),
        verbose=0, shuffle=False)
copies = lambda: [c.numpy() for c in net.layers[0].moving_mean.value.values]
before = copies()
out["stats_before"] = [b.tolist() for b in before]
out["stats_changed"] = average_replica_statistics(strategy, net)
out["stats_after"] = [a.tolist() for a in copies()]
out["stats_halves"] = [x[:8].mean(0).tolist(), x[8:].mean(0).tolist()]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.e2e
def test_two_replica_mirrored_matches_single_device(tmp_path):
    import numpy as np

    proc = run_python(SCRIPT.replace("sys.argv[1]", repr(str(tmp_path))), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    out = json.loads(line[len("RESULT "):])
    assert out["single"]["replicas"] == 1
    assert out["mirrored"]["replicas"] == 2 and out["mirrored_sync"]["replicas"] == 2
    assert {r["steps"] for k, r in out.items() if isinstance(r, dict)} == {3}

    def weights(name):
        with np.load(tmp_path / f"{name}.npz") as f:
            return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]

    single, plain, sync = weights("single"), weights("mirrored"), weights("mirrored_sync")
    loss = out["single"]["loss"]
    sync_rel = abs(out["mirrored_sync"]["loss"] - loss) / loss
    plain_rel = abs(out["mirrored"]["loss"] - loss) / loss
    sync_dw = max(float(np.max(np.abs(a - b))) for a, b in zip(sync, single))
    plain_dw = max(float(np.max(np.abs(a - b))) for a, b in zip(plain, single))

    assert sync_rel < 1e-4, (sync_rel, out)
    assert sync_dw < 2e-3, sync_dw
    assert plain_rel < 2e-2, (plain_rel, out)
    assert plain_rel > 10 * sync_rel, (plain_rel, sync_rel)
    assert plain_dw > 10 * sync_dw, (plain_dw, sync_dw)

    assert "divide evenly across the 2 replicas" in out["odd"] and "batch_size=63" in out["odd"]
    assert out["odd_workdir_exists"] is False

    # Without synchronized BN each replica's moving mean follows its own half ...
    halves = np.array(out["stats_halves"])
    np.testing.assert_allclose(np.array(out["stats_before"]), halves, atol=1e-5)
    # ... until they are averaged (at every epoch end and before evaluation).
    assert out["stats_changed"] == 2  # moving mean and variance
    after = np.array(out["stats_after"])
    np.testing.assert_allclose(after[0], halves.mean(0), atol=1e-5)
    np.testing.assert_array_equal(after[0], after[1])
