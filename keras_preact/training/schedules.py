"""The learning-rate schedule of the paper's recipes (Keras 3, any backend)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_preact")
class WarmupPiecewiseConstant(keras.optimizers.schedules.LearningRateSchedule):
    """A constant warm-up followed by a piecewise-constant ("step") schedule: at ``step``
    (the updates already applied, ``optimizer.iterations``: the first update sees 0) the rate
    is `warmup_learning_rate` while ``step < warmup_steps``, else ``values[k]`` with ``k`` the
    number of boundaries ``<= step``.

    Args:
        boundaries: sequence of ints, strictly increasing positive step numbers, each the
            first step at a new rate.
        values: sequence of floats, the rates, one more than `boundaries` (>= 0).
        warmup_steps: int >= 0, at most the first boundary. Defaults to `0` (no warm-up).
        warmup_learning_rate: float >= 0 or None, the warm-up rate (needed with a warm-up,
            ignored when `warmup_steps` is 0). Defaults to `None`.
        name: str, the schedule's name. Defaults to `"WarmupPiecewiseConstant"`.

    Raises:
        ValueError: for arguments that break the rules above."""

    def __init__(self, boundaries, values, *, warmup_steps=0, warmup_learning_rate=None,
                 name="WarmupPiecewiseConstant"):
        super().__init__()
        boundaries = [int(b) for b in boundaries]
        values = [float(v) for v in values]
        if len(values) != len(boundaries) + 1:
            raise ValueError("`values` must have one more entry than `boundaries`. Received: "
                             f"boundaries={boundaries}, values={values}")
        if any(b < 1 for b in boundaries) or boundaries != sorted(set(boundaries)):
            raise ValueError("`boundaries` must be strictly increasing positive step numbers. "
                             f"Received: boundaries={boundaries}")
        if any(v < 0 for v in values):
            raise ValueError(f"`values` must be >= 0. Received: values={values}")
        warmup_steps = int(warmup_steps)
        if warmup_steps < 0:
            raise ValueError(f"`warmup_steps` must be >= 0. Received: warmup_steps={warmup_steps}")
        if warmup_steps and boundaries and warmup_steps > boundaries[0]:
            raise ValueError("`warmup_steps` must not exceed the first boundary. Received: "
                             f"warmup_steps={warmup_steps}, boundaries={boundaries}")
        if warmup_steps and (warmup_learning_rate is None or warmup_learning_rate < 0):
            raise ValueError("A warm-up needs `warmup_learning_rate` >= 0. Received: "
                             f"warmup_learning_rate={warmup_learning_rate!r}")
        self.boundaries, self.values, self.warmup_steps = boundaries, values, warmup_steps
        self.name, self.warmup_learning_rate = name, (
            None if warmup_learning_rate is None else float(warmup_learning_rate))

    def __call__(self, step):
        step = ops.cast(ops.convert_to_tensor(step), "int64")
        index = ops.zeros((), dtype="int64")
        for boundary in self.boundaries:
            index = index + ops.cast(ops.greater_equal(step, boundary), "int64")
        lr = ops.take(ops.convert_to_tensor(self.values, dtype="float32"), index)
        if self.warmup_steps:
            warmup_lr = ops.convert_to_tensor(self.warmup_learning_rate, dtype="float32")
            lr = ops.where(ops.less(step, self.warmup_steps), warmup_lr, lr)
        return lr

    def value_at(self, step):
        """The rate at `step` as a Python float (no tensors; for logs and plots).

        Args:
            step: int, the updates already applied.

        Returns:
            float: the rate at `step`."""
        step = int(step)
        if step < self.warmup_steps:
            return self.warmup_learning_rate
        return self.values[sum(step >= b for b in self.boundaries)]

    def get_config(self):
        return {"boundaries": list(self.boundaries), "values": list(self.values),
                "warmup_steps": self.warmup_steps,
                "warmup_learning_rate": self.warmup_learning_rate, "name": self.name}
