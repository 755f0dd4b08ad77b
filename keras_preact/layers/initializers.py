"""Initial values drawn on the host with NumPy: on the JAX backend every initializer call is
an XLA program compiled for its shape, and those compilations were nearly all of a model's
build time (`benchmarks/build_save_load.py --backends` times the builds)."""

import math
import zlib

import numpy as np

import keras

#: The initializer attributes of the Keras layers a model creates (Conv2D, Dense, BN).
_LAYER_INITIALIZERS = ("kernel_initializer", "bias_initializer", "gamma_initializer",
                       "beta_initializer", "moving_mean_initializer", "moving_variance_initializer")
#: Keras' truncated normal keeps draws within 2 standard deviations and divides by this
#: (the standard deviation of a unit normal truncated there), so that the result has the
#: intended one.
_TRUNCATED_STD = 0.87962566103423978


def _fans(shape, input_axes=None, output_axes=None):
    """Keras' fans of a weight shape: (fan_in, fan_out)."""
    if input_axes is not None and output_axes is not None:
        return math.prod(shape[a] for a in input_axes), math.prod(shape[a] for a in output_axes)
    if len(shape) < 2:
        return (shape[0],) * 2 if shape else (1, 1)
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _variance_scaling(init, shape, unit_shape, rng):
    fan_in, fan_out = _fans(unit_shape, init.input_axes, init.output_axes)
    fan = {"fan_in": fan_in, "fan_out": fan_out}.get(init.mode, (fan_in + fan_out) / 2.0)
    scale = init.scale / max(1.0, fan)
    if init.distribution == "uniform":
        limit = math.sqrt(3.0 * scale)
        return rng.uniform(-limit, limit, shape)
    values = rng.standard_normal(shape)
    if init.distribution == "truncated_normal":
        while (outside := np.abs(values) > 2.0).any():
            values[outside] = rng.standard_normal(int(outside.sum()))
        return values * (math.sqrt(scale) / _TRUNCATED_STD)
    return values * math.sqrt(scale)


class HostInitializer(keras.initializers.Initializer):
    """`base`'s distribution drawn with NumPy: no compilation on any backend, and the
    same values on every backend for the same seed.

    Constants and `VarianceScaling` (He, Glorot, LeCun) are drawn on the host; other
    random initializers are called as they are, seeded per variable; one seeded by a
    `keras.random.SeedGenerator`, or a non-random one, is called unchanged.
    The values come from the stream (the base's seed, `key`): unlike a Keras initializer
    called twice, variables initialised by one initializer differ. An unseeded
    initializer follows `keras.utils.set_random_seed` as Keras' own do (its seed is drawn
    when it is made).

    Args:
        base: anything `keras.initializers.get` takes.
        key: a string naming the variable, e.g. ``"stage1/conv1_kernel"``.
        stacked: the first axis stacks independent draws, each with the distribution of
            one slice (the fans of the other axes).
    """

    def __init__(self, base, key, stacked=False):
        self.base, self.key, self.stacked = keras.initializers.get(base), key, stacked

    def __call__(self, shape, dtype=None):
        base, shape = self.base, tuple(shape)
        if isinstance(base, (keras.initializers.Zeros, keras.initializers.Ones)):
            values = np.full(shape, float(isinstance(base, keras.initializers.Ones)))
        elif isinstance(base, keras.initializers.Constant):
            values = np.full(shape, base.value)
        elif isinstance(getattr(base, "seed", None), int):
            rng = np.random.default_rng([base.seed, zlib.crc32(self.key.encode())])
            if not isinstance(base, keras.initializers.VarianceScaling):
                # Other random initializers run as they are, a copy seeded from the stream
                # for each variable (and each stacked slice).
                def draw(shape):
                    copy = type(base).from_config({**base.get_config(),
                                                   "seed": int(rng.integers(2**31 - 1))})
                    return copy(shape, dtype=dtype)

                return (keras.ops.stack([draw(shape[1:]) for _ in range(shape[0])])
                        if self.stacked else draw(shape))
            values = _variance_scaling(base, shape, shape[1:] if self.stacked else shape, rng)
        else:
            return base(shape, dtype=dtype)
        dtype = keras.backend.standardize_dtype(dtype or keras.config.floatx())
        # Cast by NumPy where it can (on JAX a cast of a new shape is a compilation too).
        return keras.ops.convert_to_tensor(
            values.astype("float32" if dtype == "bfloat16" else dtype), dtype=dtype)


def call_on_host(layer, *args):
    """`layer(*args)`, its variables created by `HostInitializer`s of its initializers.
    The layer keeps its own initializers (and so its config)."""
    saved = {n: getattr(layer, n) for n in _LAYER_INITIALIZERS if hasattr(layer, n)}
    for name, init in saved.items():
        setattr(layer, name, HostInitializer(init, key=f"{layer.path}/{name}"))
    try:
        return layer(*args)
    finally:
        for name, init in saved.items():
            setattr(layer, name, init)
