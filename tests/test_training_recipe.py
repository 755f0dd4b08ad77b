"""The paper's recipe: schedule, coupled-L2 SGD, config scaling and serialisation.

These pieces are plain Keras 3, so most tests also run under JAX and PyTorch.
"""

import json
import os

import numpy as np
import pytest

from tests.helpers import to_numpy


def _config(**kw):
    from keras_preact.training import TrainConfig

    return TrainConfig(**kw)


# ----------------------------------------------------------------------------------
# Schedule
# ----------------------------------------------------------------------------------

# (iteration, rate) from the paper: 0.01 warm-up for the first 400 iterations, then
# 0.1, divided by 10 at 32k and 48k iterations.
PAPER_POINTS = [
    (0, 0.01),
    (399, 0.01),
    (400, 0.1),
    (31999, 0.1),
    (32000, 0.01),
    (47999, 0.01),
    (48000, 0.001),
    (63999, 0.001),
]


@pytest.mark.multibackend
def test_schedule_matches_the_paper_at_its_iterations():
    config = _config()  # the defaults are the paper's CIFAR recipe
    resolved = config.resolve_schedule(steps_per_epoch=50000 // 128)
    assert resolved["total_steps"] == 64000
    assert resolved["warmup_steps"] == 400
    assert resolved["boundaries"] == [32000, 48000]
    assert resolved["epochs"] == 165  # ceil(64000 / 390); the last one is cut short
    schedule = config.make_schedule(390)
    for step, lr in PAPER_POINTS:
        assert float(to_numpy(schedule(step))) == pytest.approx(lr, rel=1e-6), step
        assert schedule.value_at(step) == pytest.approx(lr, rel=1e-12), step


@pytest.mark.multibackend
def test_optimizer_uses_the_schedule_by_its_iteration_count():
    import keras

    from keras_preact.training import CoupledSGD
    from keras_preact.training.optimizers import make_optimizer

    opt = make_optimizer(_config(), 390)
    assert isinstance(opt, CoupledSGD)
    var = keras.Variable(np.ones((2,), "float32"))
    opt.build([var])
    for step in (0, 399, 400, 32000):
        opt.iterations.assign(step)
        expected = dict(PAPER_POINTS)[step] if step in dict(PAPER_POINTS) else None
        assert float(to_numpy(opt.learning_rate)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.multibackend
def test_schedule_serialises_and_round_trips():
    import keras

    from keras_preact.training import WarmupPiecewiseConstant

    schedule = _config().make_schedule(390)
    blob = json.dumps(keras.optimizers.schedules.serialize(schedule))
    back = keras.optimizers.schedules.deserialize(json.loads(blob))
    assert isinstance(back, WarmupPiecewiseConstant)
    assert back.get_config() == schedule.get_config()
    for step, lr in PAPER_POINTS:
        assert float(to_numpy(back(step))) == pytest.approx(lr, rel=1e-6)


def test_schedule_rejects_bad_arguments():
    from keras_preact.training import WarmupPiecewiseConstant

    with pytest.raises(ValueError, match="one more entry"):
        WarmupPiecewiseConstant([10], [0.1])
    with pytest.raises(ValueError, match="strictly increasing"):
        WarmupPiecewiseConstant([10, 5], [0.1, 0.01, 0.001])
    with pytest.raises(ValueError, match="must not exceed the first boundary"):
        WarmupPiecewiseConstant([10], [0.1, 0.01], warmup_steps=20, warmup_learning_rate=0.01)
    with pytest.raises(ValueError, match="warmup_learning_rate"):
        WarmupPiecewiseConstant([10], [0.1, 0.01], warmup_steps=5)


def test_linear_scaling_rule_for_other_batch_sizes():
    # Goyal et al. 2017: rate x k, iterations / k for batch = k * 128.
    big = _config(batch_size=256).resolve_schedule(50000 // 256)
    assert big["values"] == pytest.approx([0.2, 0.02, 0.002])
    assert big["warmup_learning_rate"] == pytest.approx(0.02)
    assert (big["warmup_steps"], big["boundaries"], big["total_steps"]) == (
        200, [16000, 24000], 32000)
    small = _config(batch_size=64).resolve_schedule(50000 // 64)
    assert small["values"] == pytest.approx([0.05, 0.005, 0.0005])
    assert (small["warmup_steps"], small["boundaries"], small["total_steps"]) == (
        800, [64000, 96000], 128000)
    # Same images seen at every boundary, whatever the batch.
    for r, batch in ((big, 256), (small, 64)):
        assert [b * batch for b in r["boundaries"]] == [32000 * 128, 48000 * 128]
    root = _config(batch_size=512, lr_scaling="sqrt").resolve_schedule(97)
    assert root["values"][0] == pytest.approx(0.2)
    fixed = _config(batch_size=512, lr_scaling="none").resolve_schedule(97)
    assert fixed["values"][0] == pytest.approx(0.1)
    assert fixed["total_steps"] == 16000


def test_schedule_in_epochs():
    # fb.resnet.torch's CIFAR schedule: /10 at epochs 81 and 122, 164 epochs.
    r = _config(schedule_unit="epochs", warmup=1, boundaries=(81, 122),
                total=164).resolve_schedule(390)
    assert (r["warmup_steps"], r["boundaries"], r["total_steps"], r["epochs"]) == (
        390, [81 * 390, 122 * 390], 164 * 390, 164,
    )


def test_epochs_and_steps_stretch_the_whole_schedule():
    r = _config(epochs=10).resolve_schedule(100)
    # Warm-up 400/64k, drops at 1/2 and 3/4 of the run.
    assert (r["total_steps"], r["warmup_steps"], r["boundaries"], r["epochs"]) == (
        1000, 6, [500, 750], 10)
    r = _config(steps=64).resolve_schedule(100)
    assert (r["total_steps"], r["boundaries"], r["epochs"]) == (64, [32, 48], 1)
    with pytest.raises(ValueError, match="at most one of `epochs` and `steps`"):
        _config(epochs=2, steps=3).validate()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"model": "resnet_nope"}, r"Unknown model.*resnet_nope.*preact_resnet20"),
        ({"dataset": "imagenet22k"}, r"Unknown dataset.*imagenet22k.*cifar10"),
        ({"strategy": "parameter_server"}, r"`strategy` must be one of.*parameter_server"),
        ({"precision": "fp16"}, r"`precision` must be one of.*fp16"),
        ({"batch_size": 0}, r"batch_size.*positive integer.*0"),
        ({"weight_decay_on": "biases"}, r"weight_decay_on.*biases"),
        ({"boundaries": (48000, 32000)}, r"boundaries.*strictly increasing"),
        ({"boundaries": (32000, 70000)}, r"every boundary < total"),
        ({"lr_scaling": "cubic"}, r"lr_scaling.*cubic"),
    ],
)
def test_config_validation_names_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _config(**kwargs).validate()


def test_config_json_round_trip_and_differences():
    from keras_preact.training import TrainConfig

    config = _config(model="preact_resnet56", epochs=3, model_kwargs={"bottleneck_stride": "first"})
    text = config.to_json()
    back = TrainConfig.from_dict(json.loads(text))
    assert back == config
    assert back.differences(config) == {}
    other = config.replace(batch_size=64, data_dir="/elsewhere")
    # data_dir is where the files are, not what is computed: not a difference.
    assert other.differences(config) == {"batch_size": (64, 128)}
    with pytest.raises(ValueError, match="Unknown training config keys.*'bogus'"):
        TrainConfig.from_dict({**config.to_dict(), "bogus": 1})


# ----------------------------------------------------------------------------------
# Coupled weight decay
# ----------------------------------------------------------------------------------


def _numpy_sgd(w, grads, lrs, *, momentum, l2, decayed, nesterov=False):
    """Caffe's SGD with weight decay, written out: d = g + wd * w before momentum."""
    w = np.array(w, np.float64)
    v = np.zeros_like(w)
    for g, lr in zip(grads, lrs):
        d = g + (l2 * w if decayed else 0.0)
        v = momentum * v - lr * d
        w = w + (momentum * v - lr * d if nesterov else v)
    return w


@pytest.mark.multibackend
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("decay_variables", ["all", "kernels"])
def test_coupled_sgd_matches_hand_computed_update(nesterov, decay_variables):
    import keras

    from keras_preact.training import CoupledSGD, WarmupPiecewiseConstant

    rng = np.random.default_rng(0)
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    bn = keras.layers.BatchNormalization()
    bn.build((None, 3))
    variables = [layer.kernel, layer.bias, bn.gamma, bn.beta]
    for v in variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    start = [to_numpy(v).astype(np.float64) for v in variables]
    steps = 4
    grads = [[rng.normal(size=v.shape) for v in variables] for _ in range(steps)]
    # The rate changes between steps 1 and 2 (a warm-up ending).
    schedule = WarmupPiecewiseConstant([3], [0.5, 0.05], warmup_steps=2, warmup_learning_rate=0.1)
    lrs = [schedule.value_at(i) for i in range(steps)]
    opt = CoupledSGD(
        learning_rate=schedule, momentum=0.9, nesterov=nesterov, l2=0.01,
        decay_variables=decay_variables,
    )
    for step in range(steps):
        opt.apply([keras.ops.convert_to_tensor(g, "float32") for g in grads[step]], variables)
    decayed = {"all": [True] * 4, "kernels": [True, False, False, False]}[decay_variables]
    for i, v in enumerate(variables):
        expected = _numpy_sgd(
            start[i], [g[i] for g in grads], lrs, momentum=0.9, l2=0.01,
            decayed=decayed[i], nesterov=nesterov,
        )
        np.testing.assert_allclose(to_numpy(v), expected, rtol=1e-5, atol=1e-6, err_msg=v.path)
    assert int(to_numpy(opt.iterations)) == steps


@pytest.mark.multibackend
def test_coupled_decay_is_not_keras_decoupled_weight_decay():
    import keras

    from keras_preact.training import CoupledSGD

    def run(opt):
        var = keras.Variable(np.full((3,), 2.0, "float32"))
        for _ in range(3):
            opt.apply([keras.ops.ones((3,))], [var])
        return to_numpy(var)

    coupled = run(CoupledSGD(learning_rate=0.1, momentum=0.9, l2=0.1))
    decoupled = run(keras.optimizers.SGD(learning_rate=0.1, momentum=0.9, weight_decay=0.1))
    expected = _numpy_sgd([2.0] * 3, [np.ones(3)] * 3, [0.1] * 3, momentum=0.9, l2=0.1,
                          decayed=True)
    np.testing.assert_allclose(coupled, expected, rtol=1e-6)
    assert np.max(np.abs(coupled - decoupled)) > 1e-3


def test_coupled_sgd_arguments_and_config_round_trip():
    import keras

    from keras_preact.training import CoupledSGD

    opt = CoupledSGD(learning_rate=_config().make_schedule(390), l2=5e-4, decay_variables="kernels")
    back = keras.optimizers.deserialize(json.loads(json.dumps(keras.optimizers.serialize(opt))))
    assert isinstance(back, CoupledSGD)
    assert (back.l2, back.decay_variables, back.momentum) == (5e-4, "kernels", 0.9)
    assert float(to_numpy(back.learning_rate)) == pytest.approx(0.01)  # iteration 0: warm-up
    with pytest.raises(ValueError, match="decoupled `weight_decay` is not supported"):
        CoupledSGD(weight_decay=1e-4)
    with pytest.raises(ValueError, match=r"`l2` must be a float >= 0.*-1"):
        CoupledSGD(l2=-1)
    with pytest.raises(ValueError, match=r"decay_variables.*'biases'"):
        CoupledSGD(decay_variables="biases")


def test_default_decays_every_parameter_of_a_preact_resnet(tiny_model_kwargs):
    # The official Torch code decays model:getParameters(): BN scales and shifts
    # and the classifier bias too.
    import keras_preact
    from keras_preact.training.optimizers import decays_variable

    model = keras_preact.PreActResNet(**tiny_model_kwargs)
    trainable = model.trainable_variables
    assert all(decays_variable(v, "all") for v in trainable)
    kernels = [v.name for v in trainable if decays_variable(v, "kernels")]
    others = [v.name for v in trainable if not decays_variable(v, "kernels")]
    assert kernels and others
    assert all(name.endswith("kernel") for name in kernels)
    # BatchNorm scales and shifts, and the classifier bias.
    assert all(name.endswith(("gamma", "beta", "bias")) for name in others), others
    assert any(name.endswith("bias") for name in others)


# ----------------------------------------------------------------------------------
# Atomic files
# ----------------------------------------------------------------------------------


def test_atomic_writes_leave_the_old_file_when_writing_fails(tmp_path):
    from keras_preact.file_io import atomic_save, atomic_write_json

    target = tmp_path / "state.json"
    atomic_write_json(str(target), {"epoch": 1})

    class Boom(Exception):
        pass

    class Unserialisable:
        pass

    with pytest.raises(TypeError):
        atomic_write_json(str(target), {"epoch": Unserialisable()})
    assert json.loads(target.read_text()) == {"epoch": 1}

    def half_then_crash(path):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise Boom()

    weights = tmp_path / "ckpt.weights.h5"
    weights.write_bytes(b"complete checkpoint")
    with pytest.raises(Boom):
        atomic_save(str(weights), half_then_crash)
    assert weights.read_bytes() == b"complete checkpoint"
    assert sorted(os.listdir(tmp_path)) == ["ckpt.weights.h5", "state.json"]  # no temp files


def test_training_package_is_not_imported_by_keras_preact():
    from tests.helpers import run_python

    proc = run_python(
        "import sys, keras_preact; "
        "print('keras_preact.training' in sys.modules, "
        "'keras_preact.training.api' in sys.modules)"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "False"]


def test_paper_imagenet_recipe_schedule():
    from keras_preact.training import paper_imagenet_recipe

    config = paper_imagenet_recipe(model="preact_resnet18")
    config.validate()
    # 1,281,167 images at batch 256: 5,004 steps per epoch.
    sched = config.resolve_schedule(5004)
    assert sched["boundaries"] == [30 * 5004, 60 * 5004]
    assert sched["total_steps"] == 90 * 5004 and sched["warmup_steps"] == 0
    assert sched["values"] == [0.1, 0.01, 0.001]
    # Batch 512 follows the linear scaling rule: twice the rate, the same epochs.
    wide = paper_imagenet_recipe(batch_size=512).resolve_schedule(2502)
    assert wide["values"][0] == pytest.approx(0.2) and wide["boundaries"] == [30 * 2502, 60 * 2502]
