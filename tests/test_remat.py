"""Rematerialisation (`remat=`): segments, validation, equivalence, memory.

A rematerialised stage must compute exactly what the plain stage computes: the same
outputs, the same gradients, and the same BatchNorm moving statistics, updated once
per step (the backward pass recomputes the segments but must not update them again).
"""

import concurrent.futures
import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_preact as kp
from keras_preact.layers import PreActStage
from keras_preact.layers.remat import normalize_remat, segment_lengths
from tests.harness import randomize
from tests.helpers import run_python, to_numpy

BAD_REMAT = ["bogus", "Unit", "", 0, -1, 1.5, [2], "2"]
REMAT_MODES = ["unit", "segment", 2]
BLOCK_KWARGS = {
    # Two stages: 3 then 2 stacked units; a strided, projecting second stage.
    "basic": dict(block="basic", stage_filters=(8, 16)),
    "bottleneck": dict(block="bottleneck", stage_filters=(16, 32)),
}


def _model(block="basic", remat=None, **overrides):
    kwargs = dict(BLOCK_KWARGS[block], stage_blocks=(4, 3), stage_strides=(1, 2),
                  stem_filters=8, input_shape=(8, 8, 3), classes=5, bn_momentum=0.7,
                  remat=remat)
    kwargs.update(overrides)
    return kp.PreActResNet(**kwargs)


def _images(n=8, size=8, channels=3, seed=0):
    return np.random.RandomState(seed).randn(n, size, size, channels).astype("float32")


def _twins(make, remat, seed=0):
    """(plain, rematerialised) copies of one layer/model with the same weights."""
    plain, rem = make(None), make(remat)
    randomize(plain, seed)
    rem.set_weights(plain.get_weights())
    return plain, rem


def _grads_and_step(layer, x, w, tf_graph=None):
    """One training-mode forward pass and its backward pass, on any backend.

    `tf_graph` (TensorFlow only): None runs the tape eagerly, "graph" inside a
    `tf.function` (where `tf.while_loop` is a real loop with its own gradient),
    "xla" inside a `tf.function(jit_compile=True)`.

    Returns the gradients of sum(layer(x) * w) for `layer.trainable_variables`, and
    leaves the moving statistics as the training call updated them (the backward
    pass, which recomputes rematerialised segments, runs too).
    """
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        def step(x, w):
            with tf.GradientTape() as tape:
                loss = ops.sum(layer(x, training=True) * w)
            return tape.gradient(loss, layer.trainable_variables)

        if tf_graph is not None:
            step = tf.function(step, jit_compile=tf_graph == "xla")
        grads = step(tf.constant(x), tf.constant(w))
    elif backend == "torch":
        loss = ops.sum(layer(ops.convert_to_tensor(x), training=True) * ops.convert_to_tensor(w))
        loss.backward()
        grads = [v.value.grad for v in layer.trainable_variables]
    elif backend == "jax":
        import jax

        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss_fn(trainable):
            y, new_non_trainable = layer.stateless_call(trainable, non_trainable, x,
                                                        training=True)
            return ops.sum(y * w), new_non_trainable

        grads, new_non_trainable = jax.grad(loss_fn, has_aux=True)(
            [v.value for v in layer.trainable_variables])
        for v, value in zip(layer.non_trainable_variables, new_non_trainable):
            v.assign(value)
    else:  # the suite runs on these three backends only (tests/run_all.sh)
        pytest.fail(f"no gradient helper for the {backend} backend")
    assert all(g is not None for g in grads)
    return [to_numpy(g) for g in grads]


def _assert_same_weights(a, b, atol, what, rtol=1e-6):
    """Same paths and equal values. `rtol` admits float32 rounding of values of any
    size (a moving variance of ~4 differs by a few ulps, ~5e-7 relative, when a
    backend's loop orders its sums differently); `atol` covers values near zero."""
    for kind in ("trainable_weights", "non_trainable_weights"):
        wa, wb = getattr(a, kind), getattr(b, kind)
        assert [v.path for v in wa] == [v.path for v in wb]
        for va, vb in zip(wa, wb):
            np.testing.assert_allclose(to_numpy(vb), to_numpy(va), atol=atol, rtol=rtol,
                                       err_msg=f"{what}: {va.path}")


# --- segment_lengths / normalize_remat -----------------------------------------
# (Plain loops, not parametrize: every test pays for a Keras clear_session.)
SEGMENTS = [
    (15, "segment", [4, 4, 4, 3]),  # ceil(sqrt(15)) = 4
    (16, "segment", [4, 4, 4, 4]),
    (17, "segment", [5, 5, 5, 2]),
    (110, "segment", [11] * 10),
    (3, "segment", [2, 1]),
    (2, "segment", [2]),
    (1, "segment", [1]),
    (4, True, [2, 2]),
    (3, "unit", [1, 1, 1]),
    (5, 2, [2, 2, 1]),
    (6, 3, [3, 3]),
    (3, 10, [3]),
    (1, 1, [1]),
    (5, None, [5]),
    (5, False, [5]),
    (0, "unit", []),
    (0, None, []),
]


@pytest.mark.multibackend
def test_segment_lengths():
    for units, remat, expected in SEGMENTS:
        assert segment_lengths(units, remat) == expected, (units, remat)
    for units in range(1, 60):
        for remat in ("unit", "segment", 1, 2, 3, 7, 100):
            lengths = segment_lengths(units, remat)
            assert sum(lengths) == units and all(n >= 1 for n in lengths), (units, remat)
            # Equal segments, the last one possibly shorter.
            assert all(n == lengths[0] for n in lengths[:-1]) and lengths[-1] <= lengths[0]


@pytest.mark.multibackend
def test_normalize_remat():
    for value, expected in [(None, None), (False, None), (True, "segment"),
                            ("segment", "segment"), ("unit", "unit"), (1, 1), (4, 4)]:
        assert normalize_remat(value) == expected, value


@pytest.mark.multibackend
def test_invalid_remat_is_refused_with_argument_and_value():
    for value in BAD_REMAT:
        pattern = re.escape(f"remat={value!r}")
        with pytest.raises(ValueError, match=pattern) as info:
            normalize_remat(value)
        assert "`remat`" in str(info.value)
        for build in (lambda v=value: segment_lengths(4, v), lambda v=value: _model("basic", v),
                      lambda v=value: PreActStage("basic", 8, num_blocks=3, remat=v),
                      lambda v=value: kp.get_model("preact_resnet20", remat=v)):
            with pytest.raises(ValueError, match=pattern):
                build()


# --- equivalence with the plain path ------------------------------------------
# Tracing a fit step costs seconds (TensorFlow, JAX), so each block's plain twin is
# fitted once and compared with its rematerialised models; every mode on both
# blocks is covered by the (cheap) direct gradient and statistics tests below.
FIT_MODES = {"basic": ["unit", 2], "bottleneck": ["segment"]}


@pytest.mark.multibackend
@pytest.mark.parametrize("block", ["basic", "bottleneck"])
def test_remat_model_matches_plain_model_in_calls_and_fit(block):
    x = _images()
    y = np.arange(8) % 5
    plain = _model(block, None)
    randomize(plain)
    start = plain.get_weights()
    rems = []
    for remat in FIT_MODES[block]:
        rem = _model(block, remat)
        rem.set_weights(start)
        rems.append(rem)
        # Inference mode (the plain path in both) and training mode (segments).
        np.testing.assert_allclose(to_numpy(rem(x, training=False)),
                                   to_numpy(plain(x, training=False)), atol=1e-6)
        np.testing.assert_allclose(to_numpy(rem(x, training=True)),
                                   to_numpy(plain(x, training=True)), atol=1e-6)
        # That training call updated the moving statistics of both, identically.
        _assert_same_weights(plain, rem, 1e-6, f"remat={remat!r}, after a training call")
        plain.set_weights(start)
        rem.set_weights(start)

    # Two SGD-with-momentum steps of fit on identical batches: equal gradients give
    # equal weights; moving statistics updated once per step give equal statistics.
    for model in [plain] + rems:
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert not np.allclose(to_numpy(plain.trainable_weights[0]), start[0]), "no training"
    for remat, rem in zip(FIT_MODES[block], rems):
        _assert_same_weights(plain, rem, 1e-5, f"remat={remat!r}, after fit")
        np.testing.assert_allclose(to_numpy(rem(x, training=False)),
                                   to_numpy(plain(x, training=False)), atol=1e-5)


@pytest.mark.multibackend
@pytest.mark.parametrize("block", ["basic", "bottleneck"])
@pytest.mark.parametrize("remat", REMAT_MODES)
def test_remat_model_gradients_equal_plain_gradients(block, remat):
    """One step's gradients, directly (tf.GradientTape on TensorFlow)."""
    plain, rem = _twins(lambda r: _model(block, r), remat, seed=1)
    x = _images(seed=1)
    w = np.random.RandomState(2).randn(8, 5).astype("float32")
    g_plain = _grads_and_step(plain, x, w)
    g_rem = _grads_and_step(rem, x, w)
    assert len(g_plain) == len(g_rem) == len(plain.trainable_variables)
    for v, a, b in zip(plain.trainable_variables, g_plain, g_rem):
        assert np.any(a), v.path
        # Elementwise relative error alone fails where a gradient cancels to
        # ~0 (a float32 sum of terms ~100x larger); the absolute floor scales
        # with the gradient's own size: 1e-5 of its largest element.
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max(),
                                   err_msg=v.path)
    _assert_same_weights(plain, rem, 1e-6, "moving statistics after one step")


@pytest.mark.multibackend
@pytest.mark.parametrize("block", ["basic", "bottleneck"])
@pytest.mark.parametrize("remat", REMAT_MODES)
def test_stage_moving_statistics_updated_once_per_step(block, remat):
    """After one training step (forward and the recomputing backward pass) every
    stacked moving mean is m * old + (1 - m) * batch mean, the batch mean being
    that of the plain stage's unit inputs: the update is applied once, not again
    by the recomputation."""
    m = 0.7
    filters = 8 if block == "basic" else 16
    x = _images(n=6, size=8, channels=filters, seed=3)

    def make(r):
        stage = PreActStage(block, filters, num_blocks=5, bn_momentum=m, remat=r, name="stage")
        stage.build(x.shape)
        return stage

    plain, rem = _twins(make, remat, seed=4)
    old = to_numpy(rem._stacked["preact_bn_moving_mean"]).copy()
    assert old.shape == (4, filters)

    # The plain path: its unit inputs give the batch means of each unit's preact BN.
    _, unit_inputs = plain(x, training=True, return_unit_inputs=True)
    batch_means = np.stack([to_numpy(u).mean(axis=(0, 1, 2)) for u in unit_inputs[1:]])
    expected = m * old + (1 - m) * batch_means
    np.testing.assert_allclose(to_numpy(plain._stacked["preact_bn_moving_mean"]), expected,
                               atol=1e-5)

    w = np.random.RandomState(5).randn(6, 8, 8, filters).astype("float32")
    _grads_and_step(rem, x, w)
    np.testing.assert_allclose(to_numpy(rem._stacked["preact_bn_moving_mean"]), expected,
                               atol=1e-5)
    twice = m * expected + (1 - m) * batch_means
    assert not np.allclose(to_numpy(rem._stacked["preact_bn_moving_mean"]), twice, atol=1e-4)
    # Every moving statistic of the stage (stacked and unit1) equals the plain one.
    _assert_same_weights(plain, rem, 1e-6, "stage after one step")


# Equal remat segments run as one backend loop (`remat.scan`): 7 stacked units in segments of
# 3 (two looped, one left over) or of 1 (seven looped). Without remat, a very deep stage
# (`plain_loop_min_units`, lowered here to 2) trains its stacked units as a loop of one unit
# an iteration. Under XLA (TensorFlow only: JAX always compiles its scan) the loop's gradient
# buffers need a fixed size (`maximum_iterations`).
LOOPS = [
    *[pytest.param(block, remat, None, "graph", id=f"{block}-remat={remat}",
                   marks=pytest.mark.multibackend)
      for block in ("basic", "bottleneck") for remat in (3, "unit")],
    *[pytest.param(block, None, 2, "graph", id=f"{block}-plain", marks=pytest.mark.multibackend)
      for block in ("basic", "bottleneck")],
    *[pytest.param("basic", remat, 2, "xla", id=f"xla-remat={remat}") for remat in (2, None)],
]


@pytest.mark.parametrize("block,remat,plain_loop_min_units,tf_graph", LOOPS)
def test_looped_stage_trains_like_its_unrolled_units(block, remat, plain_loop_min_units,
                                                     tf_graph):
    """The looped stage must train like the unrolled one: equal gradients, moving statistics
    and outputs (training and inference mode) after one step. On TensorFlow the looped step
    runs as a graph (`tf_graph`), where the loop is a real `tf.while_loop`; the unrolled
    reference runs eagerly."""
    filters = 8 if block == "basic" else 16
    x = _images(n=4, size=6, channels=filters, seed=7)
    w = np.random.RandomState(8).randn(4, 6, 6, filters).astype("float32")

    def make(loop):
        stage = PreActStage(block, filters, num_blocks=8, bn_momentum=0.6, remat=remat,
                            name="stage")
        stage.remat_loop = loop
        if plain_loop_min_units:
            stage.plain_loop_min_units = plain_loop_min_units
        stage.build(x.shape)
        return stage

    unrolled = randomize(make(False), seed=9)
    looped = make(True)
    looped.set_weights(unrolled.get_weights())
    g_unrolled = _grads_and_step(unrolled, x, w)
    g_looped = _grads_and_step(looped, x, w, tf_graph=tf_graph)
    for v, a, b in zip(unrolled.trainable_variables, g_unrolled, g_looped):
        assert np.any(a), v.path
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * np.abs(a).max(), err_msg=v.path)
    _assert_same_weights(unrolled, looped, 1e-6, "after one step")
    for training in (True, False):
        # Rounding relative to the outputs' scale, as for the gradients above: JAX's scan
        # rounds differently (in CI: 4.4e-6 relative on a value of 2.3, and 1.8e-5
        # absolute on a value of 0.054 among outputs of magnitude ~4).
        ref = to_numpy(unrolled(x, training=training))
        np.testing.assert_allclose(to_numpy(looped(x, training=training)), ref, rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(ref).max())))


def _train_step_size(units, loop, remat=2):
    """The size of a traced gradient step of one stage: TensorFlow graph nodes, counting
    the functions it calls (the loop body, the recomputed segment), or lines of JAX's
    lowered StableHLO."""
    stage = PreActStage("basic", 8, num_blocks=units, remat=remat)
    stage.remat_loop = loop
    stage.plain_loop_min_units = 2
    stage.build((2, 4, 4, 8))
    if keras.backend.backend() == "jax":
        import jax

        def loss(trainable, non_trainable, x):
            y, non_trainable = stage.stateless_call(trainable, non_trainable, x, training=True)
            return jax.numpy.sum(y), non_trainable

        values = [[v.value for v in vs] for vs in (stage.trainable_variables,
                                                    stage.non_trainable_variables)]
        lowered = jax.jit(jax.grad(loss, has_aux=True)).lower(*values,
                                                              np.zeros((2, 4, 4, 8), "float32"))
        return len(lowered.as_text().splitlines())
    import tensorflow as tf

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(stage(x, training=True))
        return tape.gradient(loss, stage.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec((2, 4, 4, 8))).graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)


@pytest.mark.multibackend
def test_looped_train_step_does_not_grow_with_depth():
    """What the loop is for: a traced training step of 11 or 41 units (5 or 20
    segments of 2) has the same size, so ResNet-1001 traces like ResNet-164;
    unrolled, it grows with the number of segments."""
    if keras.backend.backend() == "torch":
        pytest.skip("PyTorch runs eagerly: nothing is traced")
    small, large = _train_step_size(11, True), _train_step_size(41, True)
    assert large == small, (small, large)
    unrolled_small = _train_step_size(11, False)
    unrolled_large = _train_step_size(41, False)
    assert unrolled_large > 3 * unrolled_small, (unrolled_small, unrolled_large)
    assert large < unrolled_large / 3, (large, unrolled_large)
    # Without remat, a stage from `plain_loop_min_units` stacked units on loops too.
    plain_small = _train_step_size(11, True, remat=None)
    plain_large = _train_step_size(41, True, remat=None)
    assert plain_large == plain_small, (plain_small, plain_large)
    assert _train_step_size(41, False, remat=None) > 3 * plain_large


@pytest.mark.multibackend
def test_no_loop_with_synchronized_bn_or_dropout(monkeypatch):
    """Synchronized BatchNorm (a cross-replica all-reduce) and dropout (a seed
    generator) cannot run inside a loop body: such stages train unrolled, never
    entering `remat.scan`, where an ordinary stage of the same depth does."""
    from keras_preact.layers import remat as remat_lib

    calls = []
    real_scan = remat_lib.scan

    def counting_scan(*args, **kwargs):
        calls.append(1)
        return real_scan(*args, **kwargs)

    monkeypatch.setattr(remat_lib, "scan", counting_scan)
    x = _images(n=4, size=6, channels=8, seed=15)

    def train_call(**kwargs):
        stage = PreActStage("basic", 8, num_blocks=5, **kwargs)
        stage.plain_loop_min_units = 2
        stage.build(x.shape)
        del calls[:]
        assert stage(x, training=True).shape == x.shape
        return len(calls)

    assert train_call() == 1  # the check can fail: an ordinary stage loops
    assert train_call(unit="dropout_shortcut", seed=3) == 0
    if keras.backend.backend() == "tensorflow":  # synchronized BN is TensorFlow's
        assert train_call(synchronized=True) == 0


@pytest.mark.multibackend
def test_remat_in_mixed_precision_matches_plain():
    """mixed_float16: float16 activations through the looped segments, float32
    moving statistics out of them."""
    keras.mixed_precision.set_global_policy("mixed_float16")  # conftest restores it
    x = _images()
    plain, rem = _twins(lambda r: _model("bottleneck", r, stage_blocks=(5, 3)), "unit")
    np.testing.assert_allclose(to_numpy(rem(x, training=True)).astype("float32"),
                               to_numpy(plain(x, training=True)).astype("float32"),
                               atol=2e-2)
    for va, vb in zip(plain.non_trainable_weights, rem.non_trainable_weights):
        assert str(vb.dtype) == "float32", vb.path
        # rtol: float16 activations summed in another order move a batch variance
        # by about one float16 ulp (~1e-3 relative); JAX moved one of 2.33 by 2.1e-3.
        np.testing.assert_allclose(to_numpy(vb), to_numpy(va), atol=2e-3, rtol=2e-3,
                                   err_msg=vb.path)
    # One fit step each (float16 gradients through the checkpointed loop, loss scaling).
    start = plain.get_weights()
    rem.set_weights(start)
    y = np.arange(8) % 5
    for model in (plain, rem):
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.05),
                      loss="sparse_categorical_crossentropy")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    assert not np.allclose(to_numpy(plain.trainable_weights[0]), start[0]), "no training"
    _assert_same_weights(plain, rem, 2e-3, "mixed_float16, after a fit step", rtol=2e-3)


_MIRRORED_SCRIPT = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, keras_preact as kp
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.RandomState(0).randn(8, 8, 8, 3).astype("float32")
y = np.arange(8) % 5
weights = []
for remat in (None, "unit"):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = kp.PreActResNet(block="basic", stage_blocks=(4,), stage_filters=(8,),
                                stage_strides=(1,), stem_filters=8, input_shape=(8, 8, 3),
                                classes=5, remat=remat)
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                      loss="sparse_categorical_crossentropy")
    if weights:
        model.set_weights(weights[0])
    start = model.get_weights()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    weights.append(start)
    weights.append(model.get_weights())
assert not np.allclose(weights[1][0], weights[0][0])
diff = max(float(np.abs(a - b).max()) for a, b in zip(weights[1], weights[3]))
print("MAXDIFF", diff)
"""


def test_remat_under_mirrored_strategy_matches_plain():
    """Two replicas (logical CPUs) of MirroredStrategy: the rematerialised, looped
    model trains to the plain model's weights and moving statistics."""
    proc = run_python(_MIRRORED_SCRIPT, timeout=300, env={"KERAS_BACKEND": "tensorflow"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = float(re.search(r"MAXDIFF (\S+)", proc.stdout).group(1))
    assert diff < 1e-5, diff


# --- configuration, saving, errors --------------------------------------------
@pytest.mark.multibackend
def test_models_and_stages_store_the_normalized_remat():
    """The round trips of remat models: tests/harness.py, cases config and keras."""
    for remat, stored in [(True, "segment"), ("unit", "unit"), (2, 2), (False, None),
                          (None, None)]:
        model = _model("basic", remat)
        stages = [layer for layer in model.layers if isinstance(layer, PreActStage)]
        assert model.get_config()["remat"] == stored and len(stages) == 2
        assert all(stage.get_config()["remat"] == stage.remat == stored for stage in stages)
        config = stages[0].get_config()
        assert PreActStage.from_config(config).get_config() == config


@pytest.mark.multibackend
def test_factories_forward_remat():
    model = kp.get_model("preact_resnet20", remat="segment")
    stages = [layer for layer in model.layers if isinstance(layer, PreActStage)]
    assert model.remat == "segment" and len(stages) == 3
    assert all(stage.remat == "segment" for stage in stages)
    assert kp.preact_resnet20(remat=3).remat == 3


@pytest.mark.multibackend
def test_remat_refuses_dropout_shortcut():
    pattern = r"remat.*dropout_shortcut|dropout_shortcut.*remat"
    for remat in [True, "unit", "segment", 2]:
        with pytest.raises(ValueError, match=pattern):
            _model("basic", remat, unit="dropout_shortcut")
        with pytest.raises(ValueError, match=pattern):
            PreActStage("basic", 8, num_blocks=3, unit="dropout_shortcut", remat=remat)
    # Without remat the unit is accepted.
    _model("basic", None, unit="dropout_shortcut")
    PreActStage("basic", 8, num_blocks=3, unit="dropout_shortcut", remat=False)


def test_remat_turns_model_pruning_off_only_while_its_train_step_runs(monkeypatch):
    """Grappler's model pruning would undo `tf.recompute_grad`: a remat model's train
    function runs with it off, and the process-wide options are unchanged afterwards."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("a TensorFlow (Grappler) option")
    import contextlib

    import tensorflow as tf

    from keras_preact.layers import remat as remat_lib
    from keras_preact.models import preact_resnet

    seen = []

    @contextlib.contextmanager
    def spy():
        with remat_lib.model_pruning_off():
            seen.append(tf.config.optimizer.get_experimental_options().get("disable_model_pruning"))
            yield

    monkeypatch.setattr(preact_resnet, "model_pruning_off", spy)
    before = tf.config.optimizer.get_experimental_options()
    assert not before.get("disable_model_pruning")
    x, y = _images(4), np.arange(4) % 5
    for remat in (None, "segment"):
        model = _model("basic", remat)
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
        model.train_on_batch(x, y)
        model.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert tf.config.optimizer.get_experimental_options() == before
        # The plain model never switches it; the remat one in both calls.
        assert seen == [] if remat is None else (len(seen) >= 2 and all(seen)), (remat, seen)


# --- memory -------------------------------------------------------------------
_MEMORY_SCRIPT = """
import resource
import numpy as np, keras, keras_preact as kp
assert keras.backend.backend() == "tensorflow"
remat = {remat!r}

def peaks_kb():
    # ru_maxrss and this address space's own peak, VmHWM. ru_maxrss starts at the
    # parent's RSS (Linux keeps the pre-exec address space's peak in it), so under
    # pytest it can hide the first ~1 GB of growth; VmHWM cannot.
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, hwm

def build(units):
    model = kp.PreActResNet(block="basic", stage_blocks=(units,), stage_filters=(16,),
                            stage_strides=(1,), stem_filters=16, input_shape=(32, 32, 3),
                            classes=10, remat=remat)
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    return model

rng = np.random.RandomState(0)
x = rng.rand(128, 32, 32, 3).astype("float32")
y = rng.randint(0, 10, 128)
# Warm-up (TF runtime, tf.data, Grappler, the same remat setting) on a 2-unit model, so
# that the growth measured below is the 16-unit step's, not one-off start-up costs.
build(2).fit(x[:64], y[:64], batch_size=64, epochs=1, verbose=0)
model = build(16)
before = peaks_kb()
model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)  # 2 steps
after = peaks_kb()
print("PEAKS_KB", *before, *after)
"""


def _fit_peak_growth_kb(remat):
    # MALLOC_ARENA_MAX=1: one glibc arena, so the peak does not depend on which
    # thread happened to free what (without it the plain run varies by ~30%).
    proc = run_python(_MEMORY_SCRIPT.format(remat=remat), timeout=300,
                      env={"KERAS_BACKEND": "tensorflow", "MALLOC_ARENA_MAX": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    maxrss0, hwm0, maxrss1, hwm1 = map(
        int, re.search(r"PEAKS_KB (\d+) (\d+) (\d+) (\d+)", proc.stdout).groups())
    print(f"remat={remat!r}: ru_maxrss {maxrss0} -> {maxrss1} KB, "
          f"VmHWM {hwm0} -> {hwm1} KB (+{hwm1 - hwm0} KB)")
    return hwm1 - hwm0


@pytest.mark.slow
def test_remat_lowers_peak_memory_of_fit():
    """16 basic units of 16 filters at 32x32, batch 64: the fit's peak-RSS growth with
    remat="segment" (4 checkpoints) is well below the plain model's. Observed on a
    2-core CPU machine: plain ~430-480 MB, remat ~180-200 MB (ratio ~0.4-0.45)."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plain, rem = pool.map(_fit_peak_growth_kb, [None, "segment"])
    print(f"fit peak growth: plain {plain} KB, remat='segment' {rem} KB "
          f"(ratio {rem / plain:.2f})")
    assert plain > 150_000, f"the plain run grew only {plain} KB: the measurement is off"
    assert rem < 0.6 * plain, f"remat {rem} KB vs plain {plain} KB"
