"""One shared check of a model, in the spirit of keras-hub's `run_vision_backbone_test`:
`run_model_test` runs the round trips (config, `.keras`, `.weights.h5`, preset), the data
formats, the precision policies and a training step on one model. tests/test_models.py runs
it over the registry and the architecture's variants."""

import os

import keras
import numpy as np

import keras_preact as kp
from tests.helpers import to_numpy

CASES = ("config", "keras", "weights", "preset", "data_format", "precision", "train")
#: The paper's variant units' parameters (Fig. 2): values that differ from each other and
#: from 1, so a scale or gate applied in the wrong place shows up.
UNIT_PARAMS = {"constant_scaling": dict(shortcut_scale=0.3, residual_scale=0.7),
               "exclusive_gating": dict(gate_bias=-1.0),
               "shortcut_only_gating": dict(gate_bias=0.5),
               "dropout_shortcut": dict(dropout_rate=0.3)}
#: compute dtype -> how far a mixed-precision model may be from the float32 one.
PRECISIONS = {"mixed_float16": 5e-2, "mixed_bfloat16": 2e-1}


def randomize(layer, seed=0):
    """Non-trivial values in every BatchNorm variable and gate bias (so that inference mode
    is really compared: at initialisation the moving statistics are the identity)."""
    rng = np.random.RandomState(seed)
    ranges = {"gamma": (0.5, 1.5), "beta": (-0.5, 0.5), "moving_mean": (-0.5, 0.5),
              "moving_variance": (0.5, 2.0), "gate_bias": (-1.0, 1.0)}
    for w in layer.weights:
        for field, (lo, hi) in ranges.items():
            if w.path.endswith(field):
                w.assign(rng.uniform(lo, hi, tuple(w.shape)).astype("float32"))
    return layer


def outputs(model, x, training=False):
    """The model's outputs as NumPy: an array, or a dict of them (a backbone's levels)."""
    out = model(x, training=training)
    if isinstance(out, dict):
        return {k: to_numpy(v) for k, v in out.items()}
    return to_numpy(out)


def assert_same_outputs(got, want, atol=1e-6, rtol=1e-6):
    if isinstance(want, dict):
        assert list(got) == list(want)
        for key in want:
            np.testing.assert_allclose(got[key], want[key], atol=atol, rtol=rtol, err_msg=key)
    else:
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)


def images(input_shape, n=2, seed=0):
    return np.random.RandomState(seed).uniform(0, 1, (n, *input_shape)).astype("float32")


def run_model_test(make, input_shape, tmp_path, cases=CASES):
    """Checks `make(input_shape=..., **overrides)`, a fresh model each call, for each of
    `cases` (a subset of `CASES`):

    - config: `from_config(get_config())` gives the same config and, with the same weights,
      the same outputs; the model serialises by its registered name.
    - keras / weights / preset: a `.keras` file, a `.weights.h5` file loaded into a fresh
      model, a keras-hub preset read by `kp.from_preset`: same config, same outputs.
    - data_format: a channels_first twin with the same weights gives the transposed outputs
      (where the backend has channels_first convolutions).
    - precision: mixed_float16 and mixed_bfloat16: float32 variables, the policy on the model
      and every layer (also after `from_config`), outputs near the float32 model's.
    - train: two SGD steps move the loss and every trainable weight (each gets a gradient);
      training mode differs from inference.
    """
    unknown = set(cases) - set(CASES)
    assert not unknown, unknown
    model = randomize(make(input_shape=input_shape))
    x = images(input_shape)
    expected = outputs(model, x)
    for case in CASES:  # in this order: "train" changes the model
        if case in cases:
            CHECKS[case](make, model, x, expected, str(tmp_path))


def _check_config(make, model, x, expected, tmp):
    config = model.get_config()
    clone = type(model).from_config(config)
    assert clone.get_config() == config
    clone.set_weights(model.get_weights())
    assert_same_outputs(outputs(clone, x), expected)
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert type(revived) is type(model) and revived.get_config() == config


def _check_keras(make, model, x, expected, tmp):
    path = os.path.join(tmp, "model.keras")
    model.save(path)
    for load in (keras.saving.load_model, kp.load_model):
        loaded = load(path)
        assert type(loaded) is type(model) and loaded.get_config() == model.get_config()
        assert_same_outputs(outputs(loaded, x), expected)
    if model.get_config().get("unit") != "dropout_shortcut":  # a new mask every call
        weights = model.get_weights()  # a training call updates the moving statistics
        assert_same_outputs(outputs(loaded, x, training=True), outputs(model, x, training=True))
        model.set_weights(weights)


def _check_weights(make, model, x, expected, tmp):
    path = os.path.join(tmp, "model.weights.h5")
    model.save_weights(path)
    fresh = make(input_shape=x.shape[1:])
    fresh.load_weights(path)
    assert_same_outputs(outputs(fresh, x), expected)


def _check_preset(make, model, x, expected, tmp):
    folder = kp.save_preset(model, os.path.join(tmp, "preset"))
    loaded = kp.from_preset(folder)
    # The preset's model keeps every argument; its name and (float32) dtype are defaults.
    same = lambda config: {k: v for k, v in config.items() if k not in ("name", "dtype")}  # noqa
    assert same(loaded.get_config()) == same(model.get_config())
    assert_same_outputs(outputs(loaded, x), expected)
    if model.get_config()["include_top"]:  # keras-hub's loader: the same head
        import keras_hub

        task = keras_hub.models.ImageClassifier.from_preset(folder)
        assert task.dropout == (model.get_config()["head_dropout"] or 0)
        assert_same_outputs(outputs(task, x), expected)


def _check_data_format(make, model, x, expected, tmp):
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            return  # TensorFlow's CPU convolutions are NHWC only (keras.layers.Conv2D too)
    h, w, c = x.shape[1:]
    first = make(input_shape=(c, h, w), data_format="channels_first")
    first.set_weights(model.get_weights())
    got = outputs(first, np.transpose(x, (0, 3, 1, 2)))
    to_last = lambda y: np.transpose(y, (0, 2, 3, 1)) if y.ndim == 4 else y  # noqa: E731
    got = {k: to_last(v) for k, v in got.items()} if isinstance(got, dict) else to_last(got)
    assert_same_outputs(got, expected, atol=1e-5, rtol=1e-5)


def _check_precision(make, model, x, expected, tmp):
    for policy, tolerance in PRECISIONS.items():
        mixed = make(input_shape=x.shape[1:], dtype=policy)
        compute = policy.split("_")[1]
        assert (mixed.dtype_policy.name, mixed.compute_dtype) == (policy, compute)
        clone = type(mixed).from_config(mixed.get_config())
        for m in (mixed, clone):
            assert {layer.dtype_policy.name for layer in m.layers if layer.weights} == {policy}
        assert {keras.backend.standardize_dtype(w.dtype) for w in mixed.weights} == {"float32"}
        mixed.set_weights(model.get_weights())
        out = mixed(x)
        if not isinstance(out, dict):  # a classifier's softmax computes in float32
            assert keras.backend.standardize_dtype(out.dtype) == "float32"
        got = outputs(mixed, x)
        got = {k: v.astype("float32") for k, v in got.items()} if isinstance(got, dict) else (
            got.astype("float32"))
        assert_same_outputs(got, expected, atol=tolerance, rtol=tolerance)


def _check_train(make, model, x, expected, tmp):
    assert not np.allclose(to_numpy(model(x, training=True)), expected)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    y = np.arange(len(x)) % model.output_shape[-1]
    before = [to_numpy(w).copy() for w in model.trainable_weights]
    loss0 = float(model.train_on_batch(x, y))
    loss1 = float(model.train_on_batch(x, y))
    assert np.isfinite(loss0) and not np.isclose(loss1, loss0, rtol=1e-4)
    unchanged = [w.path for w, b in zip(model.trainable_weights, before)
                 if np.array_equal(to_numpy(w), b)]
    assert not unchanged, f"weights without gradient: {unchanged[:5]}"


CHECKS = {"config": _check_config, "keras": _check_keras, "weights": _check_weights,
          "preset": _check_preset, "data_format": _check_data_format,
          "precision": _check_precision, "train": _check_train}
