"""Initial weights: drawn on the host with NumPy, each variable from its initializer's
distribution, reproducible from the seed, equal on every backend, and (on JAX) built
without compiling anything."""

import json
import math

import keras
import numpy as np
import pytest

import keras_preact as kp
from keras_preact.layers.initializers import HostInitializer
from tests.helpers import run_python, to_numpy

pytestmark = pytest.mark.multibackend


def _weights(name="preact_resnet20", seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    model = kp.get_model(name, **kwargs)
    return {w.path: to_numpy(w) for w in model.weights}


@pytest.mark.parametrize("name", ["preact_resnet20", "preact_resnet164"])
def test_every_variable_starts_from_its_initializers_distribution(name):
    weights = _weights(name)
    slices = []
    for path, value in weights.items():
        field = path.rsplit("_", 1)[-1].rsplit("/", 1)[-1]
        if path == "logits/kernel":  # Dense: glorot_uniform
            limit = math.sqrt(6.0 / sum(value.shape))
            assert np.abs(value).max() <= limit
            np.testing.assert_allclose(value.std(), limit / math.sqrt(3.0), rtol=0.1)
        elif field == "kernel":  # he_normal, a stacked one with each unit's fans
            unit = value[0] if value.ndim == 5 else value
            std = math.sqrt(2.0 / math.prod(unit.shape[:-1]))
            np.testing.assert_allclose(value.std(), std, rtol=0.1, err_msg=path)
            assert np.abs(value).max() <= 2.0 * std / 0.87962566103423978 + 1e-6, path
            assert abs(value.mean()) < 0.1 * std, path
            slices += [s.tobytes() for s in (value if value.ndim == 5 else [value])]
        else:
            expected = 1.0 if path.endswith(("gamma", "variance")) else 0.0
            np.testing.assert_array_equal(value, expected, err_msg=path)
    # Every kernel, and every unit of a stacked one, is its own draw.
    assert len(set(slices)) == len(slices)


def test_the_seed_reproduces_the_weights():
    first, again, other = _weights(seed=1), _weights(seed=1), _weights(seed=2)
    for path, value in first.items():
        np.testing.assert_array_equal(again[path], value, err_msg=path)
        if path.endswith("kernel"):
            assert not np.allclose(other[path], value), path


def test_a_seeded_initializer_gives_each_variable_its_own_draw():
    init = keras.initializers.HeNormal(seed=7)
    kernels = {path: value for path, value in _weights(kernel_initializer=init).items()
               if path.endswith("conv1_kernel") or path.endswith("conv2_kernel")}
    again = {p: v for p, v in _weights(seed=99, kernel_initializer=init).items() if p in kernels}
    # The initializer's seed decides, not the global one; conv1 and conv2 of a unit differ.
    for path, value in kernels.items():
        np.testing.assert_array_equal(again[path], value)
    assert not np.array_equal(kernels["stage1/unit1/conv1_kernel"],
                              kernels["stage1/unit1/conv2_kernel"])


@pytest.mark.parametrize("base", ["orthogonal", "random_normal", "seeded"])
def test_other_random_initializers_give_each_variable_its_own_draw(base):
    # One initializer object (an unseeded one draws its seed when it is made).
    name, base = base, (keras.initializers.RandomNormal(seed=3) if base == "seeded"
                        else keras.initializers.get(base))
    one, two = (to_numpy(HostInitializer(base, key=k)((4, 4), dtype="float32")) for k in "ab")
    assert not np.allclose(one, two)
    np.testing.assert_array_equal(
        one, to_numpy(HostInitializer(base, key="a")((4, 4), dtype="float32")))
    if name == "orthogonal":
        np.testing.assert_allclose(one @ one.T, np.eye(4), atol=1e-5)
    stacked = to_numpy(HostInitializer(base, key="k", stacked=True)((3, 4, 4)))
    assert stacked.shape == (3, 4, 4) and not np.allclose(stacked[0], stacked[1])


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="counts XLA compilations")
def test_building_a_model_on_jax_compiles_nothing():
    code = ("import jax, jax.monitoring, keras_preact as kp\n"
            "compiled = []\n"
            "jax.monitoring.register_event_duration_secs_listener(lambda event, d, **kw:\n"
            "    compiled.append(event) if event.endswith('backend_compile_duration') else None)\n"
            "for name in ('preact_resnet56', 'preact_resnet1001', 'preact_resnet50'):\n"
            "    kp.get_model(name)\n"
            "built = len(compiled)\n"
            "jax.jit(lambda x: x * 3 + 1)(jax.numpy.ones((7, 5)))  # one it must hear\n"
            "print(built, len(compiled))\n")
    proc = run_python(code, env={"KERAS_BACKEND": "jax", "JAX_ENABLE_COMPILATION_CACHE": "false"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    built, after = map(int, proc.stdout.split()[-2:])
    assert built == 0 and after > 0, proc.stdout


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="starts the other backends")
def test_the_same_seed_gives_the_same_weights_on_every_backend(tmp_path):
    code = ("import json, keras, numpy as np, keras_preact as kp\n"
            "keras.utils.set_random_seed(5)\n"
            "m = kp.get_model('preact_resnet20')\n"
            f"np.savez({str(tmp_path)!r} + '/' + keras.backend.backend() + '.npz', "
            "*[keras.ops.convert_to_numpy(w) for w in m.weights])\n"
            "print(json.dumps([w.path for w in m.weights]))\n")
    paths = {}
    for backend in ("jax", "torch"):
        proc = run_python(code, env={"KERAS_BACKEND": backend})
        assert proc.returncode == 0, proc.stderr[-2000:]
        paths[backend] = json.loads(proc.stdout.strip().splitlines()[-1])
    tf_weights = _weights(seed=5)
    for backend in ("jax", "torch"):
        assert paths[backend] == list(tf_weights)
        saved = np.load(tmp_path / f"{backend}.npz")
        for i, (path, value) in enumerate(tf_weights.items()):
            np.testing.assert_array_equal(saved[f"arr_{i}"], value, err_msg=f"{backend} {path}")
