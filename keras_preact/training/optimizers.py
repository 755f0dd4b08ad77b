"""SGD with coupled L2 weight decay (Keras 3, any backend): the paper's "weight decay 0.0001" as
Caffe and Torch apply it, ``wd * w`` added to the gradient *before* the momentum update and (in
the official Torch code) to every learnable parameter, BatchNorm and biases included."""

import keras
from keras import ops

from keras_preact import private_api
from keras_preact.checks import check_choice, is_number
from keras_preact.training.config import DECAY_VARIABLES


def decays_variable(variable, decay_variables):
    """Whether `variable` gets the L2 term: "all": always; "kernels": named kernel or *_kernel."""
    name = variable.name.split("/")[-1].split(":")[0]
    return decay_variables == "all" or name == "kernel" or name.endswith("_kernel")


@keras.saving.register_keras_serializable(package="keras_preact")
class CoupledSGD(keras.optimizers.SGD):
    """SGD with momentum and coupled (Caffe / Torch) L2 weight decay.

    One update of a decayed variable ``w`` with loss gradient ``g``, rate ``lr``,
    momentum ``m`` and decay ``wd`` (Keras' velocity convention, which is Caffe's)::

        d = g + wd * w
        v = m * v - lr * d
        w = w + v                        (nesterov: w = w + m * v - lr * d)

    Torch keeps ``lr`` outside the velocity; the two differ only in the steps after a rate change.

    Args:
        learning_rate: float or a learning-rate schedule, as `keras.optimizers.SGD`'s.
            Defaults to `0.1`.
        momentum: float, as `keras.optimizers.SGD`'s. Defaults to `0.9`.
        nesterov: bool, as `keras.optimizers.SGD`'s. Defaults to `False`.
        l2: float >= 0, the coupled decay ``wd``. Defaults to `1e-4`.
        decay_variables: str, "all" (every trainable variable) or "kernels"
            (`decays_variable`). Defaults to `"all"`.
        name: str, the optimizer's name. Defaults to `"coupled_sgd"`.
        **kwargs: as `keras.optimizers.SGD` (e.g. `use_ema`), but not ``weight_decay``.

    Raises:
        ValueError: for an invalid argument or Keras' decoupled ``weight_decay``."""

    def __init__(self, learning_rate=0.1, momentum=0.9, nesterov=False, l2=1e-4,
                 decay_variables="all", name="coupled_sgd", **kwargs):
        if weight_decay := kwargs.pop("weight_decay", None):
            raise ValueError("CoupledSGD applies coupled L2 through `l2`; Keras' decoupled "
                             f"`weight_decay` is not supported. Received: weight_decay="
                             f"{weight_decay!r}")
        if not is_number(l2) or l2 < 0:
            raise ValueError(f"`l2` must be a float >= 0. Received: l2={l2!r}")
        check_choice("decay_variables", decay_variables, DECAY_VARIABLES)
        super().__init__(learning_rate=learning_rate, momentum=float(momentum),
                         nesterov=nesterov, name=name, **kwargs)
        self.l2, self.decay_variables = float(l2), decay_variables

    def build(self, variables):
        if not self.built:
            super().build(variables)
            # Indexed like the momentum slots: `update_step` may get the raw per-replica variable.
            self._decay_mask = [decays_variable(v, self.decay_variables) for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        if self.l2 and self._decay_mask[private_api.optimizer_variable_index(self, variable)]:
            decay = ops.multiply(ops.cast(self.l2, variable.dtype), variable)
            gradient = ops.add(ops.cast(gradient, variable.dtype), decay)
        super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        return {**super().get_config(), "l2": self.l2, "decay_variables": self.decay_variables}


def make_optimizer(config, steps_per_epoch):
    """The `TrainConfig`'s `CoupledSGD` with its schedule (`config.make_schedule`) and the
    moving average of its `ema_momentum`."""
    ema = config.ema_momentum  # Keras' `fit` puts the average in the model at its end
    return CoupledSGD(learning_rate=config.make_schedule(steps_per_epoch),
                      momentum=float(config.momentum), nesterov=bool(config.nesterov),
                      l2=float(config.weight_decay), decay_variables=config.weight_decay_on,
                      use_ema=ema is not None, ema_momentum=0.99 if ema is None else float(ema))
