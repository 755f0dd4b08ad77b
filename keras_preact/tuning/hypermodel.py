"""`PreActResNetHyperModel`: a KerasTuner search over depth, block, unit, width and recipe. A
`Budget` on parameters or multiply-adds (exact) removes candidates before the first trial; a
trial over a step-time budget (measured) is not trained and scores 0."""

import contextlib
import dataclasses
import itertools
import logging
import math
from functools import cached_property, partial

import keras
import keras_tuner

import keras_preact
from keras_preact import data
from keras_preact.checks import check_choice, check_int, is_int, is_number
from keras_preact.data.registry import stratified_split
from keras_preact.layers import UNIT_TYPES
from keras_preact.models.cifar import CIFAR_WIDTHS, cifar_units_per_stage
from keras_preact.training.config import TrainConfig
from keras_preact.training.distribute import make_strategy
from keras_preact.training.run import Run, Stepper, build_model
from keras_preact.tuning import SPACE_FLAGS

logger = logging.getLogger("keras_preact.tuning")

OBJECTIVE = "val_accuracy"
BUDGET_KINDS = ("params", "macs", "step_time")
#: The CIFAR depths of the model registry.
DEFAULT_DEPTHS = (20, 32, 44, 56, 110, 164, 272, 542, 1001)
BLOCKS = ("auto", "basic", "bottleneck")
_COST_NAMES = {"params": "parameters", "macs": "multiply-adds", "step_time": "seconds per step"}
_RATES = ("learning_rate", "weight_decay", "warmup")  #: hyperparameters of the recipe
#: `TrainConfig` fields a trial takes from the search space, not from its base `config`.
_TRIAL_FIELDS = (*SPACE_FLAGS, "dataset", "data_dir", "data_source", "data_path", "batch_size",
                 "epochs", "seed", "verbose", "strategy", "cpu_devices")


@dataclasses.dataclass(frozen=True)
class Budget:
    """A cap on a candidate's cost: `kind` "params" (trainable parameters), "macs"
    (multiply-adds per image) or "step_time" (measured seconds per training step at the
    search's batch size); `limit` the largest allowed value (> 0)."""

    kind: str
    limit: float

    def __post_init__(self):
        if self.kind not in BUDGET_KINDS:
            raise ValueError(f"Unknown budget kind. Received: kind={self.kind!r}. "
                             f"Valid: {list(BUDGET_KINDS)}")
        if not is_number(self.limit) or not 0 < self.limit < math.inf:
            raise ValueError("The budget limit must be a finite number > 0. "
                             f"Received: limit={self.limit!r}")


def valid_blocks(depth, blocks):
    """The concrete blocks ("basic", "bottleneck") among `blocks` that fit `depth`."""
    out = []
    for b in blocks:
        with contextlib.suppress(ValueError):
            out.append(cifar_units_per_stage(depth, b)[0])
    return list(dict.fromkeys(out))


def _values(name, values, check=None):
    """A non-empty tuple of the distinct values of a list argument, each `check`ed."""
    scalar = isinstance(values, (str, bytes)) or not hasattr(values, "__iter__")
    values = (values,) if scalar else tuple(values)
    if not values:
        raise ValueError(f"Empty search space: `{name}` has no values. Received: "
                         f"{name}={values!r}. Give at least one value (or leave the default).")
    for v in values if check else ():
        check(v)
    # Deduplicated by ==, not by hash: an unhashable depth gets the clear error later.
    return tuple(v for i, v in enumerate(values) if v not in values[:i])


def _check_number(name, minimum, strict, v):
    if not is_number(v) or not math.isfinite(v) or v < minimum or (strict and v == minimum):
        raise ValueError(f"Every value of `{name}` must be a number {'>' if strict else '>='} "
                         f"{minimum}. Received: {name} value {v!r}")


def _check_one_of(what, valid, v):
    if v not in valid:
        raise ValueError(f"Unknown {what}. Received: {what}s value {v!r}. Valid: {list(valid)}")


def _check_width(blocks, w):
    """Checks `w` gives whole filter counts (bottleneck: divisible by 4) in every stage."""
    _check_number("width_multipliers", 0, True, w)
    for block in blocks:
        step = 4 if block == "bottleneck" else 1
        for f in CIFAR_WIDTHS[block]:
            scaled = f * w
            if abs(scaled - round(scaled)) > 1e-9 or round(scaled) % step or round(scaled) < step:
                raise ValueError(
                    f"width multiplier {w} gives {scaled:g} filters for a {block} stage of {f}; "
                    "it must give whole numbers" + (" divisible by 4" if step == 4 else "")
                    + f". Received: width_multipliers value {w!r}")


def search_space_spec(*, dataset="digits", depths=DEFAULT_DEPTHS, blocks=("auto",), units=None,
                      width_multipliers=(1,), learning_rates=(0.1,), weight_decays=(1e-4,),
                      warmups=(400,), epochs=1, batch_size=128, validation_fraction=0.1, seed=0,
                      budget=None, data_dir=None, data_source="auto", data_path=None, config=None):
    """Validates the `PreActResNetHyperModel` arguments; returns them as a dict (a study's
    identity in ``study.json``; ``config`` only where it holds a setting). Raises ValueError."""
    check_choice("dataset", dataset, data.list_datasets())
    config = config.to_dict() if isinstance(config, TrainConfig) else config
    if not isinstance(config or {}, dict):
        raise ValueError("`config` must be None, a TrainConfig or its dict. Received: "
                         f"config={config!r}")
    # The space's own arguments win; what is left is the recipe every trial trains with.
    base = TrainConfig.from_dict(config or {}).validate()
    if base.precision == "auto":  # trials are timed and compared in one precision
        raise ValueError("Every trial trains in one precision: give fp32, mixed_bfloat16 or "
                         "mixed_float16 (`train --precision auto` shows which pays here). "
                         "Received: precision='auto'")
    config = {k: new for k, (new, _) in
              base.differences(TrainConfig(), ignore=_TRIAL_FIELDS).items()}
    given, depths = depths, _values("depths", depths)
    if not all(is_int(d) for d in depths):
        raise ValueError("`depths` must be a list of integers (CIFAR depths, e.g. [20, 56]). "
                         f"Received: depths={given!r}")
    blocks = _values("blocks", blocks, partial(_check_one_of, "block", BLOCKS))
    # Pairs that do not fit are left out (depth 32 with "bottleneck" when "basic" is also given).
    concrete = set()
    for d in depths:
        if not (valid := valid_blocks(d, blocks)):
            raise ValueError(
                f"depth {d} is invalid for the block(s) {list(blocks)}: basic networks need "
                "depth 6n+2 (8, 14, 20, 32, ...), bottleneck networks 9n+2 (11, 20, 29, ..., "
                f"164, 1001). Received: depths={list(depths)}, blocks={list(blocks)}")
        concrete.update(valid)
    if units is not None:
        units = list(_values("units", units, partial(_check_one_of, "unit", UNIT_TYPES)))
    floats = {}
    for name, given, check in (
        ("width_multipliers", width_multipliers, partial(_check_width, sorted(concrete))),
        ("learning_rates", learning_rates, partial(_check_number, "learning_rates", 0, True)),
        ("weight_decays", weight_decays, partial(_check_number, "weight_decays", 0, False)),
        ("warmups", warmups, partial(_check_number, "warmups", 0, False))):
        # Floats: a KerasTuner Choice holds one type, and 1 and 1.0 must be the same study.
        floats[name] = list(dict.fromkeys(map(float, _values(name, given, check))))
    check_int("epochs", epochs, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    check_int("seed", seed, minimum=0)
    if not is_number(validation_fraction) or not 0 <= validation_fraction < 1:
        raise ValueError("`validation_fraction` must be in [0, 1) (0: score on the test split). "
                         f"Received: validation_fraction={validation_fraction!r}")
    if isinstance(budget, dict):
        budget = Budget(**budget)
    elif budget is not None and not isinstance(budget, Budget):
        raise ValueError("`budget` must be None, a Budget or a dict {'kind': ..., 'limit': ...}. "
                         f"Received: budget={budget!r}")
    return {"dataset": dataset, "depths": list(depths), "blocks": list(blocks), "units": units,
            **floats, "epochs": epochs, "batch_size": batch_size,
            "validation_fraction": float(validation_fraction), "seed": seed,
            "budget": dataclasses.asdict(budget) if budget is not None else None,
            "data_dir": data_dir, "data_source": data_source, "data_path": data_path,
            **({"config": config} if config else {})}


class PreActResNetHyperModel(keras_tuner.HyperModel):
    """A KerasTuner HyperModel over pre-activation ResNet depth, unit and recipe.

    Hyperparameters: ``depth``, ``block`` (where a depth fits several requested blocks),
    ``unit`` (with `units`), ``width``, ``learning_rate``, ``weight_decay``, ``warmup``;
    each list's first value is the default (a random search's first trial).

    Args:
        dataset: a `keras_preact.data` dataset name ("digits" ships with scikit-learn).
        depths: CIFAR depths; each must fit one of `blocks`.
        blocks: any of "auto" (bottleneck for 9n+2 depths >= 164), "basic", "bottleneck".
        units: None (the default unit, not searched) or `keras_preact.layers.UNIT_TYPES`.
        width_multipliers: stage widths x k (the 16-filter stem is kept, as in wide ResNets).
        learning_rates: at batch 128 (the linear scaling rule applies).
        weight_decays, epochs, batch_size: of the training recipe.
        warmups: warm-up iterations of the paper's 64k schedule, stretched with the run.
        validation_fraction: share of the training split that scores the trials (0: test).
        seed: initialisation, data order, augmentation and split, the same for every trial.
        budget: None, a `Budget` or ``{"kind": ..., "limit": ...}``.
        data_dir, data_source, data_path: see `keras_preact.data.make_dataset`.

    Raises ValueError for an invalid search space or a budget no candidate fits."""

    def __init__(self, name="preact_resnet_hypermodel", tunable=True, **space):
        super().__init__(name=name, tunable=tunable)
        self.spec = search_space_spec(**space)
        vars(self).update(self.spec)
        self.budget = Budget(**self.spec["budget"]) if self.spec["budget"] else None
        self.distribution_strategy = None
        self._costs = {}
        self._prune()

    def candidates(self):
        """Every architecture of the space: dicts with depth, block, width, unit."""
        return [{"depth": d, "block": b, "width": w, "unit": u} for d in self.depths
                for b in valid_blocks(d, self.blocks)
                for w, u in itertools.product(self.width_multipliers, self.units or [None])]

    def _prune(self):
        """Drops the values no candidate within the budget uses (params / macs)."""
        self.over_budget = []
        if self.budget is None:
            return
        kind, limit = self.budget.kind, self.budget.limit
        if kind == "step_time":
            # Only the cheapest is timed here, to refuse a budget nothing meets; trials time theirs.
            cheapest = min(self.candidates(), key=lambda a: self.cost(a)["macs"])
            if (seconds := self.measure_step_time(cheapest)) > limit:
                raise ValueError(
                    f"No candidate fits the budget: the cheapest ({_label(cheapest)}, "
                    f"{self.cost(cheapest)['macs']:,} multiply-adds) takes {seconds:.4f} s per "
                    f"step at batch {self.batch_size}. Received: budget step_time <= {limit}")
            return
        fits = [a for a in self.candidates() if self.cost(a)[kind] <= limit]
        self.over_budget = [a for a in self.candidates() if self.cost(a)[kind] > limit]
        if not fits:
            cheapest = min(self.over_budget, key=lambda a: self.cost(a)[kind])
            raise ValueError(f"No candidate fits the budget: the cheapest, {_label(cheapest)}, has "
                             f"{self.cost(cheapest)[kind]:,} {_COST_NAMES[kind]}. "
                             f"Received: budget {kind} <= {limit:,}")
        for attr, key in (("depths", "depth"), ("width_multipliers", "width"), ("units", "unit")):
            if values := getattr(self, attr):
                setattr(self, attr, [v for v in values if any(a[key] == v for a in fits)])
        if self.over_budget:
            logger.info("Left out over the %s budget: %s", kind,
                        ", ".join(_label(a) for a in self.over_budget))

    def declare(self, hp):
        """Declares the hyperparameters on `hp`; returns the chosen architecture dict."""
        depth = hp.Choice("depth", self.depths, ordered=True)
        multi = [d for d in self.depths if len(valid_blocks(d, self.blocks)) > 1]
        if multi:
            with hp.conditional_scope("depth", multi):
                choice = hp.Choice("block", ["basic", "bottleneck"])
        block = choice if depth in multi else valid_blocks(depth, self.blocks)[0]
        width = hp.Choice("width", self.width_multipliers)
        unit = hp.Choice("unit", self.units) if self.units else None
        for name in _RATES:
            hp.Choice(name, getattr(self, name + "s"))
        return {"depth": depth, "block": block, "width": width, "unit": unit}

    declare_hyperparameters = declare

    def trial_config(self, arch, hp_values=None, *, epochs=None):
        """The `TrainConfig` of a trial: the study's `config` with the trial's architecture and
        rates (default: each list's first), what `keras-preact train` would run."""
        block, n = cifar_units_per_stage(arch["depth"], arch["block"])
        wider = f"_w{arch['width']:g}".replace(".", "_") if arch["width"] != 1 else ""
        architecture = dict(  # the layout of `preact_resnet_cifar`, `width` x wider
            block=block, stage_blocks=[n] * 3, stage_strides=[1, 2, 2],
            stage_filters=[int(round(f * arch["width"])) for f in CIFAR_WIDTHS[block]],
            **({"unit": arch["unit"]} if arch.get("unit") is not None else {}))
        rates = {name: float((hp_values or {}).get(name, getattr(self, name + "s")[0]))
                 for name in _RATES}
        return TrainConfig(**self.spec.get("config", {})).replace(
            model=f"preact_resnet{arch['depth']}{wider}",
            model_kwargs={"architecture": architecture}, dataset=self.dataset,
            data_dir=self.data_dir, data_source=self.data_source, data_path=self.data_path,
            batch_size=self.batch_size, epochs=int(epochs or self.epochs), seed=self.seed,
            eval_every=1, verbose=0, **rates).validate()

    def make_model(self, arch):
        """The model of an architecture dict (see `candidates`), built as `train` builds it."""
        config = self.trial_config(arch)
        return build_model(config, data.dataset_info(config.dataset, **config.data_arguments()))

    def cost(self, arch):
        """``{"params": int, "macs": int}`` of an architecture (cached)."""
        key = (arch["depth"], arch["block"], float(arch["width"]), arch.get("unit"))
        if key not in self._costs:
            model = self.make_model(arch)
            self._costs[key] = {"params": int(keras_preact.count_params(model)),
                                "macs": int(keras_preact.count_macs(model))}
        return self._costs[key]

    def measure_step_time(self, arch):
        """Median seconds of one training step (batch `batch_size`) of a throwaway model
        compiled as the trial's (its optimizer, loss and precision)."""
        run = Run(config := self.trial_config(arch), None, Stepper())
        run.spe = max(1, len(self.arrays[1]) // self.batch_size)  # the schedule's length
        return run.step_seconds([config.precision])[config.precision]

    def build(self, hp):
        arch = self.declare(hp)
        keras.utils.set_random_seed(self.seed)  # every trial: so retraining reproduces it
        return self.make_model(arch)

    @cached_property
    def arrays(self):
        """``(x, y, val_x, val_y)``: the training images and the held-out ones that score trials
        (loaded once; ValueError for missing or bad data)."""
        kw = dict(data_dir=self.data_dir, source=self.data_source, path=self.data_path)
        x, y = data.load_arrays(self.dataset, "train", **kw)
        if self.validation_fraction == 0:
            return (x, y, *data.load_arrays(self.dataset, "test", **kw))
        train, val = stratified_split(y, test_fraction=self.validation_fraction, seed=self.seed)
        return x[train], y[train], x[val], y[val]

    def fit(self, hp, model, *args, epochs=None, initial_epoch=0, callbacks=None,
            verbose="auto", **kwargs):
        """Trains `model` as `keras-preact train` trains `trial_config` (one `Run`); returns
        the trial's metrics: ``val_accuracy``
        (best epoch; 0 over the budget), ``within_budget`` (1 or 0), ``params``, ``macs``,
        ``step_time_s`` (in training, or the budget probe's), ``train_time_s`` and
        ``replicas`` (devices the trial trained on)."""
        arch = self.declare(hp)
        cost = dict(self.cost(arch))
        if self.budget is not None:
            # Params / macs: over only by a width / unit combination whose values each fit.
            seconds = self.measure_step_time(arch) if self.budget.kind == "step_time" else 0.0
            if {**cost, "step_time": seconds}[self.budget.kind] > self.budget.limit:
                logger.info("%s is over the %s budget: not trained.", _label(arch),
                            self.budget.kind)
                return {OBJECTIVE: 0.0, "within_budget": 0.0, "step_time_s": seconds,
                        "train_time_s": 0.0, **cost}
        stepper = _TrialStepper(self, callbacks or [], initial_epoch)
        config = self.trial_config(arch, hp.values, epochs=epochs)
        result = Run(config.replace(verbose=verbose), None, stepper, model=model).train()
        steps = result["steps"] - initial_epoch * stepper.spe
        return {OBJECTIVE: max(e["val_accuracy"] for e in result["history"]),
                "within_budget": 1.0, "step_time_s": result["train_time_s"] / max(1, steps),
                "train_time_s": result["train_time_s"], "replicas": float(stepper.replicas), **cost}


class _TrialStepper(Stepper):
    """`keras-preact train`'s loop for a trial: the held-out share of the training split scores
    it, KerasTuner's callbacks come along, and Hyperband's `initial_epoch` continues a trial
    (KerasTuner loaded its weights; the schedule goes on where it stopped)."""

    def __init__(self, hypermodel, callbacks, initial_epoch):
        self.hypermodel, self.extra, self.initial_epoch = hypermodel, callbacks, initial_epoch

    def start(self, run):
        super().start(run, lambda: self.hypermodel.distribution_strategy
                      or make_strategy("default"))

    def load_data(self, run):
        c, info, (x, y, vx, vy) = run.config, run.info, self.hypermodel.arrays
        make = partial(data.dataset_from_arrays, batch_size=c.batch_size, seed=c.seed,
                       normalize=not c.model_normalizes(), mean=info["mean"], std=info["std"])
        run.test_data = make(vx, vy)
        augment = info["augmentation"] if c.augment in (None, True) else c.augment or "none"
        run.train_data = partial(make, x, y, shuffle=True, augment=augment, cutout=c.cutout,
                                 drop_remainder=True)
        self.spe = len(y) // c.batch_size
        return len(y), len(vy)

    def agree(self, run, state, refused):
        return {"epoch": self.initial_epoch, "step": self.initial_epoch * run.spe} \
            if self.initial_epoch else None

    def restore(self, run, model, optimizer, state):
        if state is None:
            return super().restore(run, model, optimizer, state)
        optimizer.iterations.assign(state["step"])

    def callbacks(self, run):
        return super().callbacks(run) + list(self.extra)


def _label(arch):
    width = f" x{arch['width']:g}" if arch["width"] != 1 else ""
    unit = f" {arch['unit']}" if arch.get("unit") else ""
    return f"depth {arch['depth']} {arch['block']}{width}{unit}"
