"""The fast recipe and each of its ingredients: the cosine schedule, label smoothing,
cutout, stochastic depth, the moving average of the weights, test-time flips and
`--recipe` on the command line (TensorFlow; the layer and schedule tests on every backend)."""

import json
import math
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from tests.helpers import TINY, run_cli, to_numpy
from tests.test_training import digits_run, tiny_config  # noqa: F401 (a fixture)

# ----------------------------------------------------------------------------------
# Recipes
# ----------------------------------------------------------------------------------

def test_recipes_are_the_paper_defaults_and_the_fast_overrides():
    from keras_preact.training import TrainConfig, recipe
    from keras_preact.training.config import RECIPES

    assert recipe("paper") == TrainConfig()
    fast = recipe("fast", epochs=12)
    assert fast.epochs == 12 and fast.schedule == "cosine" and fast.label_smoothing > 0
    assert {k: getattr(fast, k) for k in RECIPES["fast"]} == RECIPES["fast"]
    fast.validate()
    with pytest.raises(ValueError, match=r"Unknown `recipe`. Received: recipe='quick'. Valid: "
                                         r"\['paper', 'fast'\]"):
        recipe("quick")


def test_cli_recipe_fills_only_the_flags_not_given(tmp_path, capsys):
    workdir = tmp_path / "run"
    # --label-smoothing 0 equals the paper's default, and still wins over the recipe's 0.1.
    code, out, err = run_cli(["train", "--recipe", "fast", "--model", "tiny", "--model-kwargs",
                              json.dumps(TINY), "--dataset", "digits", "--steps", "2",
                              "--label-smoothing", "0", "--cutout", "4", "--workdir",
                              str(workdir), "--verbose", "0"], capsys)
    assert code == 0, err
    stored = json.load(open(workdir / "config.json"))["train_config"]
    assert stored["label_smoothing"] == 0 and stored["cutout"] == 4
    assert stored["schedule"] == "cosine" and stored["nesterov"] is True
    assert stored["momentum"] == 0.9  # neither given nor in the recipe: the default
    code, _, err = run_cli(["train", "--recipe", "quick", "--workdir", str(tmp_path / "x")],
                           capsys)
    assert code == 2 and "invalid choice: 'quick'" in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------------------
# Cosine schedule
# ----------------------------------------------------------------------------------

@pytest.mark.multibackend
def test_cosine_schedule_warms_up_linearly_then_follows_the_half_cosine():
    from keras_preact.training import TrainConfig

    config = TrainConfig(schedule="cosine", schedule_unit="epochs", warmup=2, boundaries=(),
                         total=10, learning_rate=0.2, warmup_learning_rate=0.0)
    spe = 50
    schedule = config.make_schedule(spe)
    rate = lambda step: float(to_numpy(schedule(step)))  # noqa: E731
    assert rate(0) == pytest.approx(0.0, abs=1e-7)
    assert rate(50) == pytest.approx(0.1, rel=1e-5)  # half-way through the warm-up
    assert rate(100) == pytest.approx(0.2, rel=1e-5)
    for step in (150, 300, 450, 499):
        expected = 0.1 * (1 + math.cos(math.pi * (step - 100) / 400))
        assert rate(step) == pytest.approx(expected, rel=1e-4, abs=1e-7)
    # The default boundaries do not apply: a cosine run of any length is valid.
    TrainConfig(schedule="cosine", schedule_unit="epochs", total=5).validate()
    resolved = config.replace(batch_size=256).resolve_schedule(25)
    assert resolved["values"] == [0.4] and resolved["boundaries"] == []


def test_a_cosine_run_records_its_rates(tmp_path):
    from keras_preact.training import train_and_evaluate

    config = tiny_config(schedule="cosine", schedule_unit="epochs", warmup=0, boundaries=(),
                         total=2, epochs=2)
    result = train_and_evaluate(config, str(tmp_path / "run"))
    schedule = config.make_schedule(result["history"][0]["step"])
    for entry in result["history"]:
        assert entry["learning_rate"] == pytest.approx(
            float(to_numpy(schedule(entry["step"] - 1))), rel=1e-6)
    assert result["history"][-1]["learning_rate"] < 0.01 < result["history"][0]["learning_rate"]


# ----------------------------------------------------------------------------------
# Label smoothing
# ----------------------------------------------------------------------------------

@pytest.mark.multibackend
def test_smoothed_crossentropy_is_the_cross_entropy_against_smoothed_targets():
    import keras

    from keras_preact.training.losses import SmoothedCrossentropy

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=8).astype("float32")
    labels = rng.integers(0, 5, size=8)
    targets = np.full((8, 5), 0.1 / 5) + 0.9 * np.eye(5)[labels]
    expected = np.mean(-np.sum(targets * np.log(probs), axis=-1))
    loss = SmoothedCrossentropy(0.1)
    assert float(to_numpy(loss(labels, probs))) == pytest.approx(expected, rel=1e-5)
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert again.label_smoothing == 0.1


def test_label_smoothing_trains_and_the_model_reloads_compiled(tmp_path):
    import keras

    from keras_preact.training import train_and_evaluate
    from keras_preact.training.losses import SmoothedCrossentropy

    result = train_and_evaluate(tiny_config(label_smoothing=0.2, epochs=1),
                                str(tmp_path / "run"))
    model = keras.saving.load_model(result["model_path"])  # with its compiled loss
    assert isinstance(model.loss, SmoothedCrossentropy) and model.loss.label_smoothing == 0.2
    # A new process that imports keras_preact (not its training modules) loads it compiled,
    # also a file written when the loss lived in keras_preact.training.run.
    old = str(tmp_path / "old.keras")
    with zipfile.ZipFile(result["model_path"]) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "config.json":
                assert b'"keras_preact.training.losses"' in data
                data = data.replace(b'"keras_preact.training.losses"',
                                    b'"keras_preact.training.run"')
            dst.writestr(item, data)
    script = ("import sys, keras_preact, keras\n"
              "for path in sys.argv[1:]:\n"
              "    print(keras.saving.load_model(path).loss.label_smoothing)")
    out = subprocess.run([sys.executable, "-c", script, result["model_path"], old],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0.2", "0.2"]


# ----------------------------------------------------------------------------------
# Cutout
# ----------------------------------------------------------------------------------

def test_cutout_blacks_out_one_square_per_image_keyed_like_the_other_augmentation():
    from keras_preact.data import dataset_from_arrays

    images = np.full((64, 12, 12, 3), 255, np.uint8)
    labels = np.zeros(64, np.int64)
    make = lambda **kw: dataset_from_arrays(  # noqa: E731
        images, labels, batch_size=16, shuffle=True, normalize=False, **kw)
    batches = [x.numpy() for x, _ in make(cutout=6)]
    again = [x.numpy() for x, _ in make(cutout=6)]
    later = [x.numpy() for x, _ in make(cutout=6, epoch=1)]
    for batch, same in zip(batches, again):
        np.testing.assert_array_equal(batch, same)
    assert any(not np.array_equal(a, b) for a, b in zip(batches, later))
    masks = np.concatenate(batches)[..., 0] == 0
    assert np.all((np.concatenate(batches) == 0).all(-1) == masks)  # every channel
    for mask in masks:
        rows, cols = np.nonzero(mask.any(1))[0], np.nonzero(mask.any(0))[0]
        # One rectangle, a 6 x 6 square clipped at the borders (at least 3 x 3 of it).
        assert mask.sum() == len(rows) * len(cols) and 3 <= len(rows) <= 6 and 3 <= len(cols)
        assert np.all(np.diff(rows) == 1) and np.all(np.diff(cols) == 1)
    assert np.mean([m.sum() == 36 for m in masks]) > 0.2
    assert all(np.all(x.numpy() == 255) for x, _ in make(cutout=0))


def test_cutout_reaches_the_training_data_only(tmp_path):
    from keras_preact.training.run import Run, Stepper

    def first_batches(**kw):
        run = Run(tiny_config(**kw).validate(), str(tmp_path / "run"), Stepper())
        run.stepper.start(run)
        run.stepper.load_data(run)
        return [next(iter(d))[0].numpy() for d in (run.train_data(epoch=0), run.test_data)]

    (train, test), (cut_train, cut_test) = first_batches(), first_batches(cutout=8)
    np.testing.assert_array_equal(test, cut_test)
    changed = np.any(train != cut_train, axis=-1)
    assert changed.any() and np.all(cut_train[changed] == cut_train.min())  # black squares
    np.testing.assert_array_equal(train[~changed], cut_train[~changed])


# ----------------------------------------------------------------------------------
# Stochastic depth
# ----------------------------------------------------------------------------------

@pytest.mark.multibackend
def test_stochastic_depth_drops_whole_residual_branches_per_example():
    from keras_preact.layers import PreActBasicBlock

    x = np.random.default_rng(0).normal(size=(64, 6, 6, 8)).astype("float32")
    plain, dropping = PreActBasicBlock(8), PreActBasicBlock(8, drop_path=0.5)
    plain.build(x.shape)
    dropping.build(x.shape)
    for a, b in zip(dropping.weights, plain.weights):
        a.assign(b)
    branch = to_numpy(plain(x, training=True)) - x  # F(x), batch statistics
    y = to_numpy(dropping(x, training=True))
    kept = np.abs(y - x).reshape(64, -1).max(1) > 1e-6
    assert 10 < kept.sum() < 54  # about half of 64
    np.testing.assert_allclose(y[~kept], x[~kept])
    np.testing.assert_allclose(y[kept], x[kept] + 2 * branch[kept], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(to_numpy(dropping(x, training=False)),
                               to_numpy(plain(x, training=False)), rtol=1e-6, atol=1e-6)


@pytest.mark.multibackend
def test_stochastic_depth_follows_the_linear_decay_rule_and_keeps_the_weights(tmp_path):
    import keras_preact as kp

    model = kp.get_model("preact_resnet20", stochastic_depth=0.3, input_shape=(32, 32, 3))
    rates = [r for i in (1, 2, 3) for r in model.get_layer(f"stage{i}").drop_rates]
    np.testing.assert_allclose(rates, [0.3 * k / 9 for k in range(1, 10)])
    plain = kp.get_model("preact_resnet20", input_shape=(32, 32, 3))
    path = str(tmp_path / "sd.weights.h5")
    model.save_weights(path)
    plain.load_weights(path)  # the same file format, both ways
    x = np.random.default_rng(0).uniform(0, 255, (2, 32, 32, 3)).astype("float32")
    np.testing.assert_allclose(to_numpy(plain(x)), to_numpy(model(x)), rtol=1e-6, atol=1e-6)
    again = kp.PreActResNet.from_config(model.get_config())
    assert again.spec.stochastic_depth == 0.3
    with pytest.raises(ValueError, match="`remat` cannot be combined with .* stochastic depth"):
        kp.get_model("preact_resnet20", stochastic_depth=0.1, remat=True)
    with pytest.raises(ValueError, match=r"`stochastic_depth` must be a rate in \[0, 1\). "
                                         r"Received: stochastic_depth=1.5"):
        kp.get_model("preact_resnet20", stochastic_depth=1.5)


def test_stochastic_depth_trains_from_the_config(tmp_path):
    import keras

    from keras_preact.training import train_and_evaluate

    result = train_and_evaluate(
        tiny_config(model="preact_resnet20", model_kwargs={}, stochastic_depth=0.2, steps=3,
                    epochs=None), str(tmp_path / "run"))
    model = keras.saving.load_model(result["model_path"], compile=False)
    assert model.spec.stochastic_depth == 0.2 and np.isfinite(result["test_loss"])


# ----------------------------------------------------------------------------------
# Moving average of the weights
# ----------------------------------------------------------------------------------

def _weights(path):
    import keras

    return [np.asarray(w) for w in keras.saving.load_model(path, compile=False).weights]


def test_ema_puts_the_average_in_the_final_model_and_keeps_it_in_checkpoints(tmp_path):
    import keras

    from keras_preact.training import train_and_evaluate
    from keras_preact.training.losses import compile_model
    from keras_preact.training.optimizers import make_optimizer
    from keras_preact.weights.local import load_weights_file

    def last_checkpoint(config, result):
        """The run's model and optimizer as its last checkpoint left them."""
        model = keras.saving.load_model(result["model_path"], compile=False)
        optimizer = make_optimizer(config, result["history"][0]["step"])
        compile_model(model, optimizer)
        optimizer.build(model.trainable_variables)
        load_weights_file(model, os.path.join(result["workdir"], "checkpoints",
                                              f"ckpt-{result['epochs']:05d}.weights.h5"))
        return model, optimizer, _weights(result["model_path"])

    config = tiny_config(ema_momentum=0.9)
    assert make_optimizer(config, 10).use_ema and make_optimizer(config, 10).ema_momentum == 0.9
    result = train_and_evaluate(config, str(tmp_path / "a"))
    model, optimizer, final = last_checkpoint(config, result)
    assert any(not np.allclose(np.asarray(w), f) for w, f in zip(model.weights, final))
    # The checkpoint holds the average too (a resumed run goes on averaging): put in the
    # model, it gives the final model.
    optimizer.finalize_variable_values(model.trainable_variables)
    for w, f in zip(model.weights, final):
        np.testing.assert_allclose(np.asarray(w), f, rtol=1e-6, atol=1e-7)
    # Each epoch scores the averaged weights (the last one: the final model's) and the raw ones.
    last = result["history"][-1]
    assert last["val_loss"] == pytest.approx(result["test_loss"], abs=1e-6)
    assert last["raw_val_loss"] != pytest.approx(last["val_loss"], abs=1e-6)
    # Scoring the averages leaves training as it was: without any evaluation, the same weights.
    again = train_and_evaluate(config.replace(eval_every=0, deterministic=True),
                               str(tmp_path / "c"))
    once = train_and_evaluate(config.replace(deterministic=True), str(tmp_path / "d"))
    for a, b in zip(_weights(again["model_path"]), _weights(once["model_path"])):
        np.testing.assert_array_equal(a, b)
    # Without the average, the final model is the last checkpoint's weights.
    config = tiny_config()
    model, _, final = last_checkpoint(config, train_and_evaluate(config, str(tmp_path / "b")))
    for w, f in zip(model.weights, final):
        np.testing.assert_array_equal(np.asarray(w), f)


# ----------------------------------------------------------------------------------
# Test-time flips
# ----------------------------------------------------------------------------------

def test_evaluate_with_flip_scores_the_mean_of_an_image_and_its_mirror(
        digits_run, capsys):  # noqa: F811 (the fixture imported above)
    import keras

    from keras_preact import data
    from keras_preact.training import evaluate

    _, workdir, _ = digits_run
    result = evaluate(workdir, flip=True, verbose=0)
    model = keras.saving.load_model(os.path.join(workdir, "model.keras"), compile=False)
    x, y = data.load_arrays("digits", "test")
    x = x.astype("float32")
    probs = (to_numpy(model.predict(x, verbose=0))
             + to_numpy(model.predict(x[:, :, ::-1], verbose=0))) / 2
    assert result["flip"] is True and result["num_examples"] == len(y)
    assert result["accuracy"] == pytest.approx(np.mean(probs.argmax(-1) == y))
    assert evaluate(workdir, verbose=0)["flip"] is False
    code, out, err = run_cli(["evaluate", "--workdir", workdir, "--flip", "--verbose", "0"],
                             capsys)
    assert code == 0, err
    assert f"test (flip): accuracy {100 * result['accuracy']:.2f}%" in out

# Every ingredient on every path: tests/test_multiworker.py, test_jax_parallel.py and
# test_training_paths.py.
