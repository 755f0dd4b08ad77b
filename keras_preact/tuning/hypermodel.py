"""`PreActResNetHyperModel`: a KerasTuner search over depth, unit and recipe.

The search space is data: depths (any valid CIFAR depth), block ("auto", "basic",
"bottleneck"), residual unit (when the library has unit variants), width multiplier,
learning rate, weight decay and warm-up. Models come from the library's factories
(`keras_preact.preact_resnet_cifar`, or `keras_preact.PreActResNet` with the CIFAR
layout for widened nets); fitting uses the library's data pipeline
(`keras_preact.data.dataset_from_arrays`) and recipe (`optimizers.make_optimizer`:
`CoupledSGD` with `WarmupPiecewiseConstant`).

Cost awareness. A `Budget` caps parameters, multiply-adds (`count_macs`) or the
measured time of one training step. Parameters and multiply-adds are exact and known
before training, so candidates over the budget leave the search space before the
first trial; a budget no candidate fits is refused. Step time is measured per trial
(a few steps of a throwaway copy, before training); a trial over the budget is not
trained and scores 0 (``within_budget=0``), which steers the oracle away from it.

Validation data. Scores are accuracies on a stratified `validation_fraction` of the
training split (default 10%), never on the test split, so the test split stays
untouched for the final report (``validation_fraction=0`` scores on the test split,
an optimistic shortcut for quick demos).
"""

import dataclasses
import itertools
import logging
import math
import time

import keras
import keras_tuner

from keras_preact.training.optimizers import make_optimizer

logger = logging.getLogger("keras_preact.tuning")

#: The objective every tuner maximises.
OBJECTIVE = "val_accuracy"
#: Kinds of budget: trainable parameters, multiply-adds per image, seconds per step.
BUDGET_KINDS = ("params", "macs", "step_time")
#: The CIFAR depths of the model registry (basic 6n+2 up to 110, bottleneck 9n+2 from 164).
DEFAULT_DEPTHS = (20, 32, 44, 56, 110, 164, 272, 542, 1001)
BLOCKS = ("auto", "basic", "bottleneck")
_COST_NAMES = {"params": "parameters", "macs": "multiply-adds", "step_time": "seconds per step"}
# Steps timed (after one untimed step that traces the graph) for a step-time budget.
_TIMED_STEPS = 5


@dataclasses.dataclass(frozen=True)
class Budget:
    """A cap on a candidate's cost.

    Args:
        kind: "params" (trainable parameters), "macs" (multiply-adds per image,
            `keras_preact.count_macs`) or "step_time" (seconds per training step at
            the search's batch size, measured).
        limit: the largest allowed value (> 0).

    Example:
        >>> Budget("params", 300_000)
    """

    kind: str
    limit: float

    def __post_init__(self):
        if self.kind not in BUDGET_KINDS:
            raise ValueError(
                f"Unknown budget kind. Received: kind={self.kind!r}. Valid: {list(BUDGET_KINDS)}"
            )
        if isinstance(self.limit, bool) or not isinstance(self.limit, (int, float)) or not (
            self.limit > 0 and math.isfinite(self.limit)
        ):
            raise ValueError(
                f"The budget limit must be a finite number > 0. Received: limit={self.limit!r}"
            )

    def to_dict(self):
        return {"kind": self.kind, "limit": self.limit}


def unit_types():
    """The residual units the installed library offers, or None (feature detection)."""
    from keras_preact import layers

    return getattr(layers, "UNIT_TYPES", None)


def _values(name, values, check, *, allow_none=False):
    """Normalises a list argument: a non-empty tuple of distinct checked values."""
    if values is None and allow_none:
        return None
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        values = (values,)
    values = tuple(values)
    if not values:
        raise ValueError(
            f"Empty search space: `{name}` has no values. Received: {name}={values!r}. "
            "Give at least one value (or leave the default)."
        )
    out = []
    for v in values:
        check(v)
        if v not in out:
            out.append(v)
    return tuple(out)


def _number(name, minimum, *, strict):
    def check(v):
        bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
        if bad or (v <= minimum if strict else v < minimum):
            op = ">" if strict else ">="
            raise ValueError(
                f"Every value of `{name}` must be a number {op} {minimum}. Received: {name} "
                f"value {v!r}"
            )

    return check


def _floats(values):
    out = []
    for v in values:
        if float(v) not in out:
            out.append(float(v))
    return out


def search_space_spec(
    *,
    dataset="digits",
    depths=DEFAULT_DEPTHS,
    blocks=("auto",),
    units=None,
    width_multipliers=(1,),
    learning_rates=(0.1,),
    weight_decays=(1e-4,),
    warmups=(400,),
    epochs=1,
    batch_size=128,
    validation_fraction=0.1,
    seed=0,
    budget=None,
    data_dir=None,
    data_source="auto",
    data_path=None,
):
    """Validates a search space without building anything; returns it as a dict.

    The arguments are those of `PreActResNetHyperModel`. This is the cheap first
    check (and the identity of a study, stored as ``study.json``).

    Raises:
        ValueError: naming the argument, the value received and what is valid.
    """
    from keras_preact import data
    from keras_preact.models.cifar import CIFAR_WIDTHS
    from keras_preact.models.cifar import cifar_units_per_stage

    if dataset not in data.list_datasets():
        raise ValueError(
            f"Unknown dataset. Received: dataset={dataset!r}. Valid: {data.list_datasets()}"
        )

    def check_depth(d):
        if isinstance(d, bool) or not isinstance(d, int) or d < 8:
            raise ValueError(
                "Every depth must be an integer >= 8 of the form 6n+2 (basic) or 9n+2 "
                f"(bottleneck). Received: depths value {d!r}"
            )

    def check_block(b):
        if b not in BLOCKS:
            raise ValueError(f"Unknown block. Received: blocks value {b!r}. Valid: {list(BLOCKS)}")

    depths = _values("depths", depths, check_depth)
    blocks = _values("blocks", blocks, check_block)
    # Every depth must fit at least one requested block; pairs that do not fit are
    # simply not in the space (e.g. depth 32 with "bottleneck" when "basic" is also
    # requested).
    arch = {}
    for d in depths:
        valid = []
        for b in blocks:
            try:
                concrete, _ = cifar_units_per_stage(d, b)
            except ValueError:
                continue
            if concrete not in valid:
                valid.append(concrete)
        if not valid:
            raise ValueError(
                f"depth {d} is invalid for the block(s) {list(blocks)}: basic networks need "
                "depth 6n+2 (8, 14, 20, 32, ...), bottleneck networks 9n+2 (11, 20, 29, ..., "
                f"164, 1001). Received: depths={list(depths)}, blocks={list(blocks)}"
            )
        arch[d] = valid
    available = unit_types()
    if units is not None:
        if available is None:
            raise ValueError(
                "This keras-preact has no residual unit variants (keras_preact.layers."
                f"UNIT_TYPES); leave `units` unset. Received: units={units!r}"
            )

        def check_unit(u):
            if u not in available:
                raise ValueError(f"Unknown unit. Received: units value {u!r}. Valid: {list(available)}")

        units = _values("units", units, check_unit)

    def check_width(w):
        _number("width_multipliers", 0, strict=True)(w)
        for concrete in {b for bs in arch.values() for b in bs}:
            for f in CIFAR_WIDTHS[concrete]:
                scaled = f * w
                # A bottleneck's inner width is out / 4: keep it a whole number.
                step = 4 if concrete == "bottleneck" else 1
                if abs(scaled - round(scaled)) > 1e-9 or round(scaled) % step or round(scaled) < step:
                    raise ValueError(
                        f"width multiplier {w} gives {scaled:g} filters for a {concrete} "
                        f"stage of {f}; it must give whole numbers"
                        + (" divisible by 4" if step == 4 else "")
                        + f". Received: width_multipliers value {w!r}"
                    )

    width_multipliers = _values("width_multipliers", width_multipliers, check_width)
    learning_rates = _values("learning_rates", learning_rates, _number("learning_rates", 0, strict=True))
    weight_decays = _values("weight_decays", weight_decays, _number("weight_decays", 0, strict=False))
    warmups = _values("warmups", warmups, _number("warmups", 0, strict=False))
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"`seed` must be an int >= 0. Received: seed={seed!r}")
    if isinstance(validation_fraction, bool) or not isinstance(validation_fraction, (int, float)) or not (
        0 <= validation_fraction < 1
    ):
        raise ValueError(
            "`validation_fraction` must be in [0, 1) (0: score on the test split). "
            f"Received: validation_fraction={validation_fraction!r}"
        )
    if budget is not None and not isinstance(budget, Budget):
        if isinstance(budget, dict):
            budget = Budget(**budget)
        else:
            raise ValueError(
                "`budget` must be None, a Budget or a dict {'kind': ..., 'limit': ...}. "
                f"Received: budget={budget!r}"
            )
    return {
        "dataset": dataset,
        "depths": list(depths),
        "blocks": list(blocks),
        "units": list(units) if units is not None else None,
        # Floats throughout: a KerasTuner Choice holds one type, and 1 and 1.0 must
        # be the same study.
        "width_multipliers": _floats(width_multipliers),
        "learning_rates": _floats(learning_rates),
        "weight_decays": _floats(weight_decays),
        "warmups": _floats(warmups),
        "epochs": epochs,
        "batch_size": batch_size,
        "validation_fraction": float(validation_fraction),
        "seed": seed,
        "budget": budget.to_dict() if budget is not None else None,
        "data_dir": data_dir,
        "data_source": data_source,
        "data_path": data_path,
    }


class PreActResNetHyperModel(keras_tuner.HyperModel):
    """A KerasTuner HyperModel over pre-activation ResNet depth, unit and recipe.

    Hyperparameters (KerasTuner names): ``depth``; ``block`` (only where a depth fits
    several requested blocks); ``unit`` (only with `units`); ``width``;
    ``learning_rate``; ``weight_decay``; ``warmup``. Each list's first value is the
    hyperparameter's default (the first trial of a random search).

    Args:
        dataset: a `keras_preact.data` dataset name, default "digits" (ships with
            scikit-learn, no download).
        depths: CIFAR depths, default `DEFAULT_DEPTHS` (20 ... 1001).
        blocks: any of "auto" (default; bottleneck for 9n+2 depths >= 164, basic
            otherwise), "basic", "bottleneck". Every depth must fit one of them.
        units: None (default: the library's default unit, no hyperparameter) or a
            list of `keras_preact.layers.UNIT_TYPES` (when the library has them).
        width_multipliers: default (1,): stage widths x k (16/32/64 basic,
            64/128/256 bottleneck; the 16-filter stem is kept, as wide ResNets do).
        learning_rates: default (0.1,), the paper's rate at batch 128.
        weight_decays: default (1e-4,), coupled L2.
        warmups: default (400,): warm-up iterations of the paper's 64k schedule,
            stretched with the run like every `TrainConfig` boundary (0: none).
        epochs: epochs per trial, default 1.
        batch_size: default 128 (rates follow the linear scaling rule).
        validation_fraction: held-out share of the training split that scores the
            trials, default 0.1; 0 scores on the test split.
        seed: int, default 0: initialisation, data order, augmentation and the
            validation split. Every trial uses it, so trials differ only by their
            hyperparameters and retraining a trial reproduces it.
        budget: None, a `Budget` or ``{"kind": ..., "limit": ...}``.
        data_dir, data_source, data_path: where the data is (see
            `keras_preact.data.make_dataset`).

    Raises:
        ValueError: for an empty or invalid search space, depths invalid for the
            blocks, or a budget no candidate fits (before any training).

    Example:
        >>> hm = PreActResNetHyperModel(dataset="digits", depths=(8, 14, 20),
        ...                             budget=Budget("params", 200_000))
        >>> tuner = make_tuner(hm, "random", directory="runs/tune", max_trials=3)
    """

    def __init__(self, name="preact_resnet_hypermodel", tunable=True, **space):
        super().__init__(name=name, tunable=tunable)
        self.spec = search_space_spec(**space)
        for key, value in self.spec.items():
            setattr(self, key, value)
        self.budget = Budget(**self.spec["budget"]) if self.spec["budget"] else None
        self.distribution_strategy = None
        self._arrays_cache = None
        self._costs = {}
        self._prune()

    # -- the space ------------------------------------------------------------
    def _dataset_info(self):
        from keras_preact.training.trainer import dataset_info

        return dataset_info(self.dataset, self.data_path)

    def _candidate_blocks(self, depth):
        from keras_preact.models.cifar import cifar_units_per_stage

        out = []
        for b in self.blocks:
            try:
                concrete, _ = cifar_units_per_stage(depth, b)
            except ValueError:
                continue
            if concrete not in out:
                out.append(concrete)
        return out

    def candidates(self):
        """Every architecture of the space: dicts with depth, block, width, unit."""
        units = self.units or [None]
        return [
            {"depth": d, "block": b, "width": w, "unit": u}
            for d in self.depths
            for b in self._candidate_blocks(d)
            for w, u in itertools.product(self.width_multipliers, units)
        ]

    def _prune(self):
        """Drops the values no candidate within the budget uses (params / macs)."""
        self.over_budget = []
        if self.budget is None:
            return
        if self.budget.kind == "step_time":
            # Measured, not computed: only the cheapest candidate is timed up front,
            # to refuse a budget nothing can meet; each trial times its own.
            cheapest = min(self.candidates(), key=lambda a: self.cost(a)["macs"])
            seconds = self.measure_step_time(cheapest)
            if seconds > self.budget.limit:
                raise ValueError(
                    f"No candidate fits the budget: the cheapest ({_label(cheapest)}, "
                    f"{self.cost(cheapest)['macs']:,} multiply-adds) takes {seconds:.4f} s "
                    f"per step at batch {self.batch_size}. Received: budget "
                    f"step_time <= {self.budget.limit}"
                )
            return
        fits = []
        for arch in self.candidates():
            value = self.cost(arch)[self.budget.kind]
            (fits if value <= self.budget.limit else self.over_budget).append(arch)
        if not fits:
            cheapest = min(self.over_budget, key=lambda a: self.cost(a)[self.budget.kind])
            raise ValueError(
                f"No candidate fits the budget: the cheapest, {_label(cheapest)}, has "
                f"{self.cost(cheapest)[self.budget.kind]:,} {_COST_NAMES[self.budget.kind]}. "
                f"Received: budget {self.budget.kind} <= {self.budget.limit:,}"
            )
        self.depths = [d for d in self.depths if any(a["depth"] == d for a in fits)]
        self.width_multipliers = [
            w for w in self.width_multipliers if any(a["width"] == w for a in fits)
        ]
        if self.units:
            self.units = [u for u in self.units if any(a["unit"] == u for a in fits)]
        if self.over_budget:
            logger.info(
                "Left out over the %s budget: %s", self.budget.kind,
                ", ".join(_label(a) for a in self.over_budget),
            )

    def declare(self, hp):
        """Declares the hyperparameters on `hp`; returns the chosen architecture."""
        depth = hp.Choice("depth", self.depths, ordered=True)
        multi = [d for d in self.depths if len(self._candidate_blocks(d)) > 1]
        block = None
        if multi:
            with hp.conditional_scope("depth", multi):
                choice = hp.Choice("block", ["basic", "bottleneck"])
            if depth in multi:
                block = choice
        if block is None:
            block = self._candidate_blocks(depth)[0]
        width = hp.Choice("width", self.width_multipliers)
        unit = hp.Choice("unit", self.units) if self.units else None
        hp.Choice("learning_rate", self.learning_rates)
        hp.Choice("weight_decay", self.weight_decays)
        hp.Choice("warmup", self.warmups)
        return {"depth": depth, "block": block, "width": width, "unit": unit}

    def declare_hyperparameters(self, hp):
        self.declare(hp)

    # -- models ---------------------------------------------------------------
    def make_model(self, arch, **kwargs):
        """The library model of an architecture dict (see `candidates`)."""
        import keras_preact
        from keras_preact.models.cifar import CIFAR_WIDTHS
        from keras_preact.models.cifar import cifar_units_per_stage
        from keras_preact.training.trainer import dataset_preprocessing

        info = self._dataset_info()
        common = dict(
            classes=info["num_classes"],
            input_shape=tuple(info["image_shape"]),
            preprocessing=dataset_preprocessing(info),
            **kwargs,
        )
        if arch.get("unit") is not None:
            common["unit"] = arch["unit"]
        name = f"preact_resnet{arch['depth']}"
        if arch["width"] == 1:
            return keras_preact.preact_resnet_cifar(
                arch["depth"], block=arch["block"], name=name, **common
            )
        block, n = cifar_units_per_stage(arch["depth"], arch["block"])
        # The CIFAR layout of `preact_resnet_cifar`, with wider stages.
        return keras_preact.PreActResNet(
            block=block,
            stage_blocks=(n,) * 3,
            stage_filters=tuple(int(round(f * arch["width"])) for f in CIFAR_WIDTHS[block]),
            stage_strides=(1, 2, 2),
            name=f"{name}_w{arch['width']:g}".replace(".", "_"),
            **common,
        )

    def cost(self, arch):
        """``{"params": int, "macs": int}`` of an architecture (cached)."""
        import keras_preact

        key = _key(arch)
        if key not in self._costs:
            model = self.make_model(arch)
            self._costs[key] = {
                "params": int(keras_preact.count_params(model)),
                "macs": int(keras_preact.count_macs(model)),
            }
            del model
        return self._costs[key]

    def train_config(self, hp_values, *, epochs=None):
        """The `TrainConfig` of a trial (the paper's recipe with the trial's rates)."""
        from keras_preact.training.config import TrainConfig

        return TrainConfig(
            model="preact_resnet_cifar",
            model_kwargs={"architecture": {}},
            dataset=self.dataset,
            batch_size=self.batch_size,
            learning_rate=float(hp_values["learning_rate"]),
            weight_decay=float(hp_values["weight_decay"]),
            warmup=float(hp_values["warmup"]),
            epochs=int(epochs or self.epochs),
            seed=self.seed,
        ).validate()

    def measure_step_time(self, arch):
        """Median seconds of one training step (batch `batch_size`) on a throwaway model."""
        import numpy as np

        info = self._dataset_info()
        model = self.make_model(arch)
        model.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss="sparse_categorical_crossentropy",
        )
        rng = np.random.default_rng(0)
        x = rng.uniform(0, 255, (self.batch_size, *info["image_shape"])).astype("float32")
        y = rng.integers(0, info["num_classes"], self.batch_size)
        model.train_on_batch(x, y)  # traces the step
        times = []
        for _ in range(_TIMED_STEPS):
            t0 = time.perf_counter()
            model.train_on_batch(x, y)
            times.append(time.perf_counter() - t0)
        del model
        return float(np.median(times))

    # -- KerasTuner -----------------------------------------------------------
    def build(self, hp):
        arch = self.declare(hp)
        # Same seed for every trial: trials differ only by their hyperparameters,
        # and retraining a trial's values reproduces it.
        keras.utils.set_random_seed(self.seed)
        return self.make_model(arch)

    def _arrays(self):
        import numpy as np

        from keras_preact import data
        from keras_preact.data.splits import stratified_split

        if self._arrays_cache is None:
            kw = dict(data_dir=self.data_dir, source=self.data_source, path=self.data_path)
            x, y = data.load_arrays(self.dataset, "train", **kw)
            if self.validation_fraction > 0:
                train, val = stratified_split(y, test_fraction=self.validation_fraction, seed=self.seed)
                self._arrays_cache = (x[train], y[train], x[val], y[val])
            else:
                tx, ty = data.load_arrays(self.dataset, "test", **kw)
                self._arrays_cache = (np.asarray(x), np.asarray(y), tx, ty)
        return self._arrays_cache

    def datasets(self, *, epochs, initial_epoch=0, replicas=1):
        """``(train_ds, val_ds, steps_per_epoch)`` through the library's pipeline.

        With several replicas the validation batches are a multiple of the replica
        count and the last partial batch is dropped (at most ``replicas - 1``
        images): tf.distribute cannot split a batch unevenly here.
        """
        from keras_preact import data

        x, y, vx, vy = self._arrays()
        spe = len(x) // self.batch_size
        if spe < 1:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than the {len(x)} training images "
                f"of {self.dataset!r} left after the validation split."
            )
        info = self._dataset_info()
        train = data.dataset_from_arrays(
            x, y, batch_size=self.batch_size, shuffle=True, augment=info.get("augmentation", "none"),
            normalize=False, seed=self.seed, epoch=initial_epoch, drop_remainder=True,
            repeat_epochs=epochs - initial_epoch,
        )
        val_batch = 256 if replicas == 1 else min(256, len(vx) // replicas * replicas)
        val = data.dataset_from_arrays(
            vx, vy, batch_size=val_batch, shuffle=False, augment="none", normalize=False,
            drop_remainder=replicas > 1,
        )
        return train, val, spe

    def fit(self, hp, model, *args, epochs=None, initial_epoch=0, callbacks=None,
            verbose="auto", **kwargs):
        """Trains `model` with the recipe; returns the trial's metrics dict.

        Returns:
            dict: ``val_accuracy`` (best epoch; 0 for a trial over a step-time
            budget), ``within_budget`` (1 or 0), ``params``, ``macs``,
            ``step_time_s`` (measured during training, or by the budget probe),
            ``train_time_s``, ``replicas`` (devices the trial trained on).
        """
        arch = self.declare(hp)
        epochs = int(epochs or self.epochs)
        cost = dict(self.cost(arch))
        if self.budget is not None and self.budget.kind != "step_time":
            if cost[self.budget.kind] > self.budget.limit:
                # Reachable only through a combination of width / unit values that
                # each fit on their own.
                logger.info("%s is over the %s budget: not trained.", _label(arch), self.budget.kind)
                return {OBJECTIVE: 0.0, "within_budget": 0.0, "step_time_s": 0.0,
                        "train_time_s": 0.0, **cost}
        if self.budget is not None and self.budget.kind == "step_time":
            seconds = self.measure_step_time(arch)
            if seconds > self.budget.limit:
                logger.info("%s takes %.4f s per step, over the budget: not trained.",
                            _label(arch), seconds)
                return {OBJECTIVE: 0.0, "within_budget": 0.0, "step_time_s": seconds,
                        "train_time_s": 0.0, **cost}
        config = self.train_config(hp.values, epochs=epochs)
        replicas = 1
        if self.distribution_strategy is not None:
            from keras_preact.training.distribute import check_global_batch

            replicas = int(self.distribution_strategy.num_replicas_in_sync)
            check_global_batch(self.batch_size, replicas)
        train_ds, val_ds, spe = self.datasets(
            epochs=epochs, initial_epoch=initial_epoch, replicas=replicas
        )
        scope = self.distribution_strategy.scope() if self.distribution_strategy else _null()
        with scope:
            optimizer = make_optimizer(config, spe)
            model.compile(
                optimizer=optimizer,
                loss=keras.losses.SparseCategoricalCrossentropy(),
                metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
            )
            if initial_epoch:
                # Hyperband continues a trial: the schedule goes on where it stopped.
                optimizer.build(model.trainable_variables)
                optimizer.iterations.assign(initial_epoch * spe)
        t0 = time.time()
        history = model.fit(
            train_ds, epochs=epochs, initial_epoch=initial_epoch, steps_per_epoch=spe,
            validation_data=val_ds, callbacks=callbacks, verbose=verbose, shuffle=False,
        )
        elapsed = time.time() - t0
        steps = max(1, (epochs - initial_epoch) * spe)
        return {
            OBJECTIVE: float(max(history.history[OBJECTIVE])),
            "within_budget": 1.0,
            "step_time_s": elapsed / steps,
            "train_time_s": elapsed,
            "replicas": float(replicas),
            **cost,
        }


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _key(arch):
    return (arch["depth"], arch["block"], float(arch["width"]), arch.get("unit"))


def _label(arch):
    text = f"depth {arch['depth']} {arch['block']}"
    if arch["width"] != 1:
        text += f" x{arch['width']:g}"
    if arch.get("unit"):
        text += f" {arch['unit']}"
    return text
