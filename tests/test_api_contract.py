"""The API contract: unknown arguments, registration for loading, dtype policy,
`zero_init_last`."""

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers import unit_ops as F
from tests.helpers import run_python, tiny_model, to_numpy


@pytest.mark.multibackend
@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: kp.preact_resnet20(clases=5),
         r"Unknown argument `clases` for preact_resnet20\. Did you mean `classes`\? "
         r"Received: clases=5"),
        (lambda: kp.get_model("preact_resnet56", foo=1),
         r"Unknown argument `foo` for preact_resnet56\. Received: foo=1"),
        (lambda: kp.preact_resnet50(stemfilters=32), r"`stemfilters`.*Did you mean `stem_filters`"),
        (lambda: kp.preact_resnet_cifar(20, pooling_="avg"), r"`pooling_`.*Did you mean `pooling`"),
        (lambda: kp.PreActResNet(foo=1),
         r"Unknown argument `foo` for PreActResNet\. Received: foo=1"),
        (lambda: kp.PreActResNet(zero_init_last=1), r"zero_init_last=1"),
    ],
)
def test_unknown_arguments_raise_and_name_the_closest(call, match, built_convs):
    with pytest.raises(ValueError, match=match):
        call()
    assert built_convs == []  # refused before any layer is built


def test_keras_load_model_reads_a_compiled_run_after_import_keras_preact(tmp_path):
    """A training run compiles with `CoupledSGD` and `WarmupPiecewiseConstant`: a
    fresh process that imports only keras_preact reads the file back, compiled."""
    from keras_preact.training import CoupledSGD, WarmupPiecewiseConstant

    model = tiny_model()
    schedule = WarmupPiecewiseConstant(boundaries=[10], values=[0.1, 0.01], warmup_steps=2,
                                       warmup_learning_rate=0.01)
    model.compile(optimizer=CoupledSGD(schedule, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    path = str(tmp_path / "model.keras")
    model.save(path)
    load = f"""
for load in (keras.models.load_model, kp.load_model):
    model = load({path!r})
    assert type(model.optimizer).__name__ == "CoupledSGD", model.optimizer
print("loaded")
"""
    # Either import order: keras_preact first does not load Keras, and registers its
    # classes when Keras is imported.
    for imports in ("import keras\nimport keras_preact as kp\n",
                    "import sys\nimport keras_preact as kp\nassert 'keras' not in sys.modules\n"
                    "import keras\n"):
        out = run_python(imports + load)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "loaded" in out.stdout


@pytest.mark.multibackend
def test_float64_policy_keeps_batch_norm_in_float64():
    """Batch normalisation of float64 inputs computes in float64, as Keras' own layer
    does (it used to cast to float32: ~1e-7 away from the float64 result)."""
    if keras.backend.backend() == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            pytest.skip("JAX computes in float64 only with jax_enable_x64")
    rng = np.random.RandomState(0)
    x = rng.randn(4, 6, 6, 5) * 3 + 1
    params = {"gamma": rng.rand(5) + 0.5, "beta": rng.randn(5), "moving_mean": rng.randn(5),
              "moving_variance": rng.rand(5) + 0.5}
    tensors = {k: keras.ops.convert_to_tensor(v, "float64") for k, v in params.items()}
    for training in (True, False):
        ours, _ = F.batch_norm(keras.ops.convert_to_tensor(x, "float64"), tensors,
                               training=training, momentum=0.9, epsilon=1e-5, channel_axis=-1)
        assert keras.backend.standardize_dtype(ours.dtype) == "float64"
        if training:
            mean, var = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
        else:
            mean, var = params["moving_mean"], params["moving_variance"]
        expected = (x - mean) / np.sqrt(var + 1e-5) * params["gamma"] + params["beta"]
        np.testing.assert_allclose(to_numpy(ours), expected, rtol=0, atol=1e-12)

    model = kp.PreActResNet(stage_blocks=(2, 2, 1), stage_filters=(8, 16, 32), stem_filters=8,
                            input_shape=(16, 16, 3), dtype="float64")
    images = np.random.RandomState(1).rand(2, 16, 16, 3)
    for training in (True, False):
        assert keras.backend.standardize_dtype(model(images, training=training).dtype) == "float64"
    assert {keras.backend.standardize_dtype(v.dtype) for v in model.weights} == {"float64"}


@pytest.mark.multibackend
def test_zero_init_last_starts_every_unit_as_the_identity(tiny_model_kwargs):
    kwargs = dict(tiny_model_kwargs, stage_blocks=(3, 3, 3))
    plain = kp.PreActResNet(**kwargs)
    zeroed = kp.PreActResNet(**kwargs, zero_init_last=True)
    assert zeroed.get_config()["zero_init_last"] is True
    stage = zeroed.get_layer("stage2")
    last = stage.unit1.spec.convs[-1][0]
    assert not np.any(to_numpy(stage.unit1.get_variable(f"{last}_kernel")))
    assert not np.any(to_numpy(stage.get_variable(f"{last}_kernel")))
    # Nothing else changes: the other variables are the default initialisation's
    # (same seed), and the round trip keeps the option.
    assert np.any(to_numpy(stage.unit1.get_variable("conv1_kernel")))
    again = kp.PreActResNet.from_config(zeroed.get_config())
    assert again.zero_init_last is True
    assert len(plain.weights) == len(zeroed.weights)


@pytest.mark.slow
@pytest.mark.parametrize("name", kp.list_models())
def test_zero_init_last_makes_untrained_inference_finite(name):
    size = 64 if kp.model_info(name)["family"] == "imagenet" else 32
    model = kp.get_model(name, zero_init_last=True, input_shape=(size, size, 3))
    x = np.random.RandomState(0).rand(1, size, size, 3).astype("float32")
    assert np.all(np.isfinite(to_numpy(model(x, training=False))))
