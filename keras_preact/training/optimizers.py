"""SGD with coupled L2 weight decay, as Caffe and Torch apply it (Keras 3, any backend).

The paper's recipe uses "weight decay 0.0001" (He et al. 2016, appendix; He et al.
2015, Section 4.2) in the Caffe / Torch sense: the decay term ``wd * w`` is added to
the gradient *before* the momentum update, so it is accumulated in the velocity like
the loss gradient. Torch's ``optim.sgd`` does ``dfdx:add(wd, x)`` and then the
momentum step (torch/optim ``sgd.lua``); Caffe's SGD solver adds ``weight_decay *
w`` to the diff in ``Regularize`` before ``ComputeUpdateValue``. Keras' own
``weight_decay=`` argument is *decoupled* (AdamW-style, ``w -= lr * wd * w`` outside
the momentum), which is a different optimiser, so it is not used here.

Which parameters are decayed: the official code (fb.resnet.torch ``train.lua``, on
which the paper's released Torch code ``KaimingHe/resnet-1k-layers`` is built) passes
``model:getParameters()`` -- one flat vector of *all* learnable parameters, BatchNorm
scales and shifts and the classifier bias included -- to ``optim.sgd`` with one
``weightDecay``. So the default is ``decay_variables="all"``; ``"kernels"`` restricts
the decay to convolution and dense kernels, a common later practice.
"""

import keras
from keras import ops

from keras_preact.training.config import DECAY_VARIABLES


def decays_variable(variable, decay_variables):
    """Whether `variable` gets the L2 term: always for "all"; for "kernels" only
    variables named ``kernel`` or ``*_kernel`` (not BatchNorm gamma/beta, not biases)."""
    if decay_variables == "all":
        return True
    name = variable.name.split("/")[-1].split(":")[0]
    return name == "kernel" or name.endswith("_kernel")


@keras.saving.register_keras_serializable(package="keras_preact")
class CoupledSGD(keras.optimizers.SGD):
    """SGD with momentum and coupled (Caffe / Torch) L2 weight decay.

    One update of a decayed variable ``w`` with loss gradient ``g``, rate ``lr``,
    momentum ``m`` and decay ``wd`` (Keras' velocity convention, which is Caffe's)::

        d = g + wd * w
        v = m * v - lr * d
        w = w + v                        (nesterov: w = w + m * v - lr * d)

    Torch's ``optim.sgd`` keeps ``lr`` outside the velocity (``v = m * v + d;
    w -= lr * v``); the two are the same update while ``lr`` is constant and differ
    only in the few steps after a rate change (Caffe's form damps the change).

    `l2` is the coupled decay ``wd``; `decay_variables` is "all" (every trainable
    variable, as the official Torch code) or "kernels". `nesterov` defaults to False
    (the paper's Caffe solver; fb.resnet.torch uses Nesterov). Other `kwargs` go to
    `keras.optimizers.Optimizer`, except the decoupled ``weight_decay``, which raises
    ValueError (as do a negative `l2` and an unknown `decay_variables`).

    Example:
        >>> opt = CoupledSGD(learning_rate=0.1, momentum=0.9, l2=1e-4)
        >>> model.compile(optimizer=opt, loss="sparse_categorical_crossentropy")
    """

    def __init__(self, learning_rate=0.1, momentum=0.9, nesterov=False, l2=1e-4,
                 decay_variables="all", name="coupled_sgd", **kwargs):
        if kwargs.get("weight_decay"):
            raise ValueError(
                "CoupledSGD applies coupled L2 through `l2`; Keras' decoupled "
                f"`weight_decay` is not supported. Received: weight_decay="
                f"{kwargs['weight_decay']!r}"
            )
        kwargs.pop("weight_decay", None)
        if isinstance(l2, bool) or not isinstance(l2, (int, float)) or l2 < 0:
            raise ValueError(f"`l2` must be a float >= 0. Received: l2={l2!r}")
        if decay_variables not in DECAY_VARIABLES:
            raise ValueError(
                f"`decay_variables` must be one of {DECAY_VARIABLES}. "
                f"Received: decay_variables={decay_variables!r}"
            )
        super().__init__(learning_rate=learning_rate, momentum=float(momentum), nesterov=nesterov,
                         name=name, **kwargs)
        self.l2 = float(l2)
        self.decay_variables = decay_variables

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        # Decided once per variable, indexed like the momentum slots: inside
        # `update_step` TensorFlow hands over the raw (per-replica) variable.
        self._decay_mask = [decays_variable(v, self.decay_variables) for v in variables]

    def update_step(self, gradient, variable, learning_rate):
        if self.l2 and self._decay_mask[self._get_variable_index(variable)]:
            gradient = ops.add(
                ops.cast(gradient, variable.dtype),
                ops.multiply(ops.cast(self.l2, variable.dtype), variable),
            )
        super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        config = super().get_config()
        config.update({"l2": self.l2, "decay_variables": self.decay_variables})
        return config


def make_optimizer(config, steps_per_epoch):
    """The `TrainConfig`'s `CoupledSGD` with its schedule (`config.make_schedule`).

    Example:
        >>> optimizer = make_optimizer(TrainConfig(), steps_per_epoch=390)
    """
    return CoupledSGD(
        learning_rate=config.make_schedule(steps_per_epoch),
        momentum=float(config.momentum),
        nesterov=bool(config.nesterov),
        l2=float(config.weight_decay),
        decay_variables=config.weight_decay_on,
    )
