"""The training recipe as data: `TrainConfig` (its defaults are the paper's CIFAR recipe,
He et al. 2016) and the learning-rate schedule it resolves to for a batch size."""

import dataclasses
import json
import math
import os
import re
from typing import get_args

from keras_preact.checks import check_choice, check_int, check_known_arguments, is_int
from keras_preact.file_io import user_path

#: "data_parallel": `keras.distribution.DataParallel` over every device JAX sees; the others
#: are tf.distribute strategies (TensorFlow).
STRATEGIES = ("default", "mirrored", "tpu", "multiworker", "data_parallel")
#: "auto": mixed_float16 on an accelerator; on a CPU mixed_bfloat16 where a few of the run's
#: own training steps, timed in turns at its start, are clearly faster than fp32's, else fp32.
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16", "auto")
SCHEDULE_UNITS = ("iterations", "epochs")
#: "step": the warm-up rate, then drops at `boundaries`; "cosine": a linear warm-up from the
#: warm-up rate, then a half cosine to 0 (Loshchilov & Hutter 2017), `boundaries` unused.
SCHEDULES = ("step", "cosine")
LR_SCALINGS = ("linear", "sqrt", "none")
#: Which variables get the coupled L2 term (see `keras_preact.training.optimizers`).
DECAY_VARIABLES = ("all", "kernels")

#: Fields that may change between a run and its resumption: none changes the weights (a run
#: checks its data by their class names and counts, wherever `data_path` finds them).
RUNTIME_FIELDS = ("data_dir", "data_path", "download", "eval_every", "keep_checkpoints",
                  "verbose", "intra_op_threads", "inter_op_threads")
#: The short names of some fields (``keras-preact train --lr``).
ALIASES = {"lr": "learning_rate", "warmup_lr": "warmup_learning_rate", "lr_scale": "lr_scaling"}


def _field(default=None, help="", *, choices=None):
    """A `TrainConfig` field; its `help` and `choices` make the ``keras-preact train`` flags."""
    metadata = {"help": help, "choices": choices}
    if isinstance(default, dict):  # mutable: a fresh copy per instance
        return dataclasses.field(default_factory=default.copy, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass
class TrainConfig:
    """One training run, JSON-serialisable (stored as ``config.json``); each field's ``help``
    metadata describes it (``keras-preact train --help``). An explicit
    ``model_kwargs["preprocessing"]`` wins over `preprocessing_in_model`; `weights` are loaded
    at a fresh start only; frozen parts' BatchNorm runs in inference mode."""

    model: str = _field("preact_resnet110", "a model name from `keras-preact list`")
    model_kwargs: dict = _field({}, "JSON object of extra model arguments, e.g. "
                                """'{"bottleneck_stride": "first"}'; {"architecture": {...}} """
                                "builds a PreActResNet from that config")
    preprocessing_in_model: bool = _field(True, "the model normalises raw 0..255 pixels itself "
                                          "(else the data pipeline does)")
    weights: str | None = _field(None, "fine-tune from pretrained weights: a catalog tag (e.g. "
                                    "cifar10), a .weights.h5 or .keras file, or URL#sha256=<hex>")
    freeze: tuple = _field((), "comma-separated parts to freeze: stem, stage1, ..., head, backbone")
    dataset: str = _field("cifar10", "cifar10, cifar100, digits or folder")
    data_dir: str | None = _field(None, "CIFAR files or TFDS data folder")
    data_source: str = _field("auto", "auto, tfds or archive")
    data_path: str | None = _field(None, "an archive, extracted folder or image folder")
    download: bool = _field(False, "let TFDS download (else offline)")
    augment: object | None = _field(None, "training augmentation: pad_crop_flip, pad_crop or "
                                       "none (default: the dataset's own)")
    batch_size: int = _field(128, "global mini-batch, split across replicas")
    base_batch_size: int = _field(128, "the batch the rates and iteration counts are stated for")
    learning_rate: float = _field(0.1, "base learning rate at base_batch_size")
    warmup_learning_rate: float = _field(0.01, "learning rate during the warm-up")
    lr_scaling: str = _field("linear", "how the rates follow the batch size", choices=LR_SCALINGS)
    momentum: float = _field(0.9, "SGD momentum")
    nesterov: bool = _field(False, "Nesterov momentum")
    weight_decay: float = _field(1e-4, "coupled L2 (added to the gradient before momentum)")
    weight_decay_on: str = _field("all", "which variables get the L2 term", choices=DECAY_VARIABLES)
    schedule: str = _field("step", "step or cosine (see SCHEDULES)", choices=SCHEDULES)
    schedule_unit: str = _field("iterations", "the unit of warmup, boundaries and total",
                                choices=SCHEDULE_UNITS)
    warmup: float = _field(400, "warm-up length, in schedule units")
    boundaries: tuple = _field((32000, 48000), "comma-separated rate drops, e.g. 32000,48000")
    decay_factor: float = _field(0.1, "learning-rate factor at each boundary")
    total: float = _field(64000, "schedule length, in schedule units")
    epochs: int | None = _field(None, "run length in epochs (stretches the schedule)")
    label_smoothing: float = _field(0.0, "cross-entropy against targets smoothed by this much "
                                    "(Szegedy et al. 2016)")
    cutout: int = _field(0, "side of a square of pixels zeroed at a random place of each "
                         "training image (DeVries & Taylor 2017: 16 on CIFAR-10); 0: off")
    stochastic_depth: float = _field(0.0, "the last residual unit's drop rate, lower in "
                                     "proportion to depth (Huang et al. 2016); 0: off")
    ema_momentum: float | None = _field(None, "the final model is the moving average of "
                                           "the weights with this momentum, e.g. 0.999")
    steps: int | None = _field(None, "run length in updates (stretches the schedule)")
    seed: int = _field(0, "initialisation, data order and augmentation")
    deterministic: bool = _field(False, "TensorFlow op determinism (bit-exact reruns)")
    strategy: str = _field("default", "tf.distribute strategy", choices=STRATEGIES)
    cpu_devices: int | None = _field(None, "N logical CPU devices (mirrored on a CPU-only host)")
    synchronized_bn: bool = _field(False, "BatchNorm statistics over the global batch")
    precision: str = _field("fp32", "float precision policy; auto: mixed_bfloat16 where the "
                            "run's own steps, timed at its start, are faster (see PRECISIONS)",
                            choices=PRECISIONS)
    jit_compile: bool = _field(False, "TensorFlow's XLA (measure first: slower on CPU here); JAX "
                                      "always compiles the step")
    eval_every: int = _field(1, "epochs between test evaluations (0: end only)")
    keep_checkpoints: int = _field(2, "completed-epoch checkpoints kept")
    intra_op_threads: int | None = _field(None, "TensorFlow intra-op thread count")
    inter_op_threads: int | None = _field(None, "TensorFlow inter-op thread count")
    verbose: object = _field("auto", "auto (a bar on a terminal, else a line per epoch), 0, 1, 2")

    def __post_init__(self):
        # Lists become tuples; another type stays for `validate` to name.
        if isinstance(self.freeze, str):
            self.freeze = [p.strip() for p in self.freeze.split(",") if p.strip()]
        self.freeze = () if self.freeze is None else self.freeze
        self.boundaries, self.freeze = (tuple(v) if isinstance(v, (list, tuple)) else v
                                        for v in (self.boundaries, self.freeze))
        self.model_kwargs = {} if self.model_kwargs is None else self.model_kwargs

    def validate(self):
        """Checks every field that can be checked without data or TensorFlow; returns self.
        ValueError names the field, the value received and what is valid."""
        import keras_preact
        from keras_preact.data.registry import check_dataset_name
        for names, test, what in _CHECKS:
            for name in names.split():
                value = getattr(self, name)
                if not (value is None and name in _OPTIONAL) and not _passes(test, value):
                    raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r}")
        models = keras_preact.list_models()
        if "architecture" not in self.model_kwargs and self.model not in models:
            raise ValueError(f"Unknown model. Received: model={self.model!r}. Valid: {models}")
        if not isinstance(self.model_kwargs.get("architecture", {}), dict):
            raise ValueError("`architecture` of `model_kwargs` must be a dict of PreActResNet "
                             "arguments. Received: "
                             f"architecture={self.model_kwargs['architecture']!r}")
        check_dataset_name(self.dataset, "dataset")
        if self.model_kwargs.get("data_format") == "channels_first":
            raise ValueError("Training takes channels_last models: the data pipelines yield "
                             "channels_last images. Received: model_kwargs data_format="
                             "'channels_first'. A trained model converts with "
                             "`PreActResNet.from_config({**config, 'data_format': ...})`.")
        if self.data_dir is not None and os.path.isfile(user_path(self.data_dir)):
            raise ValueError("`data_dir` must be a folder (TFDS data or CIFAR files); "
                             f"{self.data_dir} is a file. Received: data_dir={self.data_dir!r}")
        bounds = [float(b) for b in self.boundaries]
        if any(b <= 0 for b in bounds) or any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])):
            raise ValueError(f"`boundaries` must be strictly increasing and > 0. Received: "
                             f"boundaries={self.boundaries!r}")
        if self.schedule == "step" and bounds and (
                bounds[-1] >= float(self.total) or float(self.warmup) > bounds[0]):
            raise ValueError("Need warmup <= boundaries[0] and every boundary < total. "
                             f"Received: warmup={self.warmup}, boundaries={self.boundaries}, "
                             f"total={self.total}")
        if self.epochs is not None and self.steps is not None:
            raise ValueError("Give at most one of `epochs` and `steps`. Received: "
                             f"epochs={self.epochs}, steps={self.steps}")
        if self.weights is not None:
            from keras_preact.weights import catalog
            if catalog.looks_like_tag(self.weights):
                catalog.resolve_tag(self.model, self.weights)
            elif not (self.weights.startswith(catalog.URL_SCHEMES)
                      or os.path.exists(user_path(self.weights))):
                raise ValueError("The weights file does not exist. "
                                 f"Received: weights={self.weights!r}")
        for part in self.freeze:
            if not (isinstance(part, str)
                    and re.fullmatch(r"stem|head|backbone|stage[1-9][0-9]*", part)):
                raise ValueError(f"Unknown part to freeze. Received: freeze={list(self.freeze)!r}. "
                                 "Valid: 'stem', 'stage1', 'stage2', ..., 'head', or 'backbone'")
        if self.weights is None and set(self.freeze) - {"head"}:
            raise ValueError("Freezing the stem or stages (--freeze) needs pretrained `weights` "
                             "(--weights): else they stay as randomly initialised. Received: "
                             f"freeze={list(self.freeze)!r}, weights=None")
        return self

    def model_normalizes(self):
        """Whether the model (not the data pipeline) normalises the pixels."""
        kwargs = {**self.model_kwargs.get("architecture", {}), **self.model_kwargs}
        if "preprocessing" in kwargs:  # as the model is built: model_kwargs win
            return kwargs["preprocessing"] is not None
        return bool(self.preprocessing_in_model)

    def data_arguments(self):
        """The dataset's arguments beside its name (`keras_preact.data.make_dataset`): its
        ``path`` and, for a folder, the ``image_size`` of a model_kwargs ``input_shape`` (the
        images are resized to it; 32x32 by default)."""
        shape = {**self.model_kwargs.get("architecture", {}), **self.model_kwargs}.get(
            "input_shape") if self.dataset == "folder" else None
        return {"path": self.data_path, "image_size": tuple(shape[:2]) if shape else None}

    def to_dict(self):
        """A JSON-ready dict of every field (tuples become lists)."""
        return {**dataclasses.asdict(self), "boundaries": list(self.boundaries),
                "freeze": list(self.freeze)}

    def to_json(self):
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values):
        """Builds a config from `to_dict` output; ValueError for keys that are not fields."""
        if unknown := sorted(set(values) - set(_FIELDS)):
            raise ValueError(f"Unknown training config keys: {unknown}. Valid: {sorted(_FIELDS)}")
        return cls(**values)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def differences(self, other, *, ignore=RUNTIME_FIELDS):
        """Fields whose values differ from `other`'s, as {name: (self, other)}."""
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b.get(k)) for k in sorted(a)
                if k not in ignore and _normal(a[k]) != _normal(b.get(k))}

    def resolve_schedule(self, steps_per_epoch):
        """The recipe in steps and rates for `steps_per_epoch` updates per pass over the data.

        `warmup`, `boundaries` and `total` count updates at `base_batch_size` ("iterations")
        or passes over the data ("epochs"). With ``k = batch_size / base_batch_size`` the rates
        are multiplied by ``k`` (the linear scaling rule; "sqrt": ``sqrt(k)``; "none": 1) and
        iteration counts divided by ``k``. `epochs` or `steps` stretch the whole schedule.

        Returns:
            dict: ``total_steps``, ``warmup_steps``, ``boundaries`` (steps), ``values`` (a rate
            per phase), ``warmup_learning_rate``, ``epochs`` and ``steps_per_epoch``."""
        check_int("steps_per_epoch", steps_per_epoch, minimum=1)
        per_step = (self.base_batch_size / self.batch_size  # steps per schedule unit
                    if self.schedule_unit == "iterations" else float(steps_per_epoch))
        warmup = float(self.warmup) * per_step
        bounds = [float(b) * per_step for b in self.boundaries if self.schedule == "step"]
        total = float(self.total) * per_step
        if self.epochs is not None or self.steps is not None:
            new_total = self.steps if self.steps is not None else self.epochs * steps_per_epoch
            stretch = new_total / total
            warmup, total = warmup * stretch, float(new_total)
            bounds = [b * stretch for b in bounds]
        total_steps, boundaries = max(1, round(total)), []
        for b in map(round, bounds):
            # Very short runs may merge phases: keep a boundary only if it means a change.
            if b >= 1 and (not boundaries or b > boundaries[-1]) and b < total_steps:
                boundaries.append(b)
        k = self.batch_size / self.base_batch_size
        scale = {"linear": k, "sqrt": math.sqrt(k), "none": 1.0}[self.lr_scaling]
        # Rounded to 12 significant digits: 0.0025, not 0.0025000000000000005.
        values = [_round(float(self.learning_rate) * scale * float(self.decay_factor) ** i)
                  for i in range(len(boundaries) + 1)]
        warmup_steps = min([round(warmup)] + boundaries[:1])
        return {"total_steps": total_steps, "warmup_steps": warmup_steps,
                "warmup_learning_rate": _round(float(self.warmup_learning_rate) * scale),
                "boundaries": boundaries, "values": values, "steps_per_epoch": int(steps_per_epoch),
                "epochs": int(math.ceil(total_steps / steps_per_epoch))}

    def make_schedule(self, steps_per_epoch):
        """The `WarmupPiecewiseConstant` (or Keras' `CosineDecay`) of `resolve_schedule`."""
        import keras
        from keras_preact.training.schedules import WarmupPiecewiseConstant
        s = self.resolve_schedule(steps_per_epoch)
        warmup, lr = s["warmup_steps"], s["values"][0]
        warmup_lr = s["warmup_learning_rate"] if warmup else None
        if self.schedule == "cosine":
            return keras.optimizers.schedules.CosineDecay(
                lr if warmup_lr is None else warmup_lr, max(1, s["total_steps"] - warmup),
                warmup_target=None if warmup_lr is None else lr, warmup_steps=warmup)
        return WarmupPiecewiseConstant(s["boundaries"], s["values"], warmup_steps=s["warmup_steps"],
                                       warmup_learning_rate=warmup_lr)


#: Every way to train a `TrainConfig`: (backend, the strategies it takes) by the path's name.
#: All paths share `keras_preact.training.run`: the pipeline, the compiled loss and optimizer
#: (label smoothing, moving average, loss scaling), the evaluation, checkpoints and reports.
PATHS = {"TensorFlow fit": ("tensorflow", ("default", "mirrored", "tpu")),
         "TensorFlow multi-worker loop": ("tensorflow", ("multiworker",)),
         "JAX fit": ("jax", ("default", "data_parallel")), "PyTorch fit": ("torch", ("default",))}
#: The one declaration of what a path cannot honour: {path: {field: why, and what instead}}.
#: A field set to other than its default there is refused before anything is written; every
#: field not listed trains the same on every path. docs/training.md's table is made from it.
LIMITS = {
    "TensorFlow multi-worker loop": {
        "jit_compile": "XLA does not compile the step's all-reduce across workers "
                       "(tensorflow/tensorflow#45940; here: UnimplementedError); leave it off",
        "cpu_devices": "each worker uses its own devices; cpu_devices is for "
                       "strategy='mirrored' on one host"},
    "JAX fit": {
        "cpu_devices": "JAX makes its CPU devices at start: set XLA_FLAGS="
                       "--xla_force_host_platform_device_count=N before Python starts",
        **dict.fromkeys(("intra_op_threads", "inter_op_threads"), "XLA sizes its CPU thread "
                        "pool at start (jax-ml/jax#1539); limit the process instead (taskset)")},
    "PyTorch fit": {"cpu_devices": "the PyTorch backend trains on one device"}}


def training_path(config, backend):
    """The name in `PATHS` of the path that trains `config` on `backend`; ValueError, before
    anything is written, for a strategy the backend lacks or a field the path cannot honour."""
    path = next((p for p, (name, strategies) in PATHS.items()
                 if name == backend and config.strategy in strategies), None)
    if path is None:
        valid = [s for b, ss in PATHS.values() if b == backend for s in ss]
        raise ValueError(f"strategy={config.strategy!r} does not run on the {backend} backend. "
                         f"Valid there: {valid}" + (" (or set KERAS_BACKEND=tensorflow)"
                                                    if backend != "tensorflow" else ""))
    if config.precision == "auto" and path == "TensorFlow multi-worker loop":
        raise ValueError(f"The {path} cannot honour precision='auto': each worker would time its "
                         "own steps. Choose with a one-process run, then give its choice.")
    defaults = TrainConfig()
    for name, why in LIMITS.get(path, {}).items():
        if (value := getattr(config, name)) not in (getattr(defaults, name), None, False):
            raise ValueError(f"The {path} cannot honour {name}={value!r}: {why}.")
    return path


#: Named recipes, as `TrainConfig` fields over its defaults (the paper's CIFAR recipe).
RECIPES = {"paper": {}, "fast": dict(
    schedule="cosine", schedule_unit="epochs", warmup=1, boundaries=(), total=30,
    warmup_learning_rate=0.0, learning_rate=0.2, nesterov=True, weight_decay=5e-4,
    weight_decay_on="kernels", label_smoothing=0.1)}


def recipe(name="paper", **overrides):
    """The `TrainConfig` of a recipe of `RECIPES` ("paper" or "fast"), with `overrides`;
    ValueError for an unknown field (naming the closest, also for the `ALIASES`) and for a
    schedule the recipe's or given `boundaries` do not fit."""
    check_known_arguments(overrides, _FIELDS, where="TrainConfig", aliases=ALIASES)
    config = TrainConfig(**{**RECIPES[check_choice("recipe", name, RECIPES)], **overrides})
    if config.schedule == "cosine" and config.boundaries and "boundaries" in overrides:
        raise ValueError("The cosine schedule has no rate drops (`boundaries`). Received: "
                         f"schedule='cosine', boundaries={list(config.boundaries)}. Leave "
                         "--boundaries out, or use --schedule step.")
    if config.schedule == "step" and not config.boundaries and "boundaries" not in overrides:
        raise ValueError("schedule='step' needs `boundaries` (--boundaries, e.g. 15,25): the "
                         f"{name!r} recipe has none, so the rate would never drop. Received: "
                         f"recipe={name!r}, schedule='step'")
    return config


def paper_cifar_recipe(**overrides):
    """The paper's CIFAR recipe as a `TrainConfig` (all defaults), with `overrides`."""
    return recipe("paper", **overrides)


def paper_imagenet_recipe(**overrides):
    """The paper's ImageNet recipe (Section 5: lr 0.1 divided by 10 at epochs 30 and 60, 90
    epochs) as a `TrainConfig`, with `overrides`; its input pipeline is
    `keras_preact.data.imagenet.make_imagenet_dataset`."""
    return TrainConfig(**{**dict(model="preact_resnet50", batch_size=256, base_batch_size=256,
                                 learning_rate=0.1, schedule_unit="epochs", warmup=0,
                                 boundaries=(30, 60), total=90), **overrides})


#: `TrainConfig.validate`'s per-field checks: (field names, test, what is valid).
_CHECKS = (
    *((f.name, lambda v, valid=f.metadata["choices"]: v in valid,
       f"one of {list(f.metadata['choices'])}")
      for f in dataclasses.fields(TrainConfig) if f.metadata["choices"]),
    ("batch_size base_batch_size epochs steps cpu_devices intra_op_threads inter_op_threads "
     "keep_checkpoints", lambda v: is_int(v, 1), "a positive integer"),
    ("label_smoothing stochastic_depth ema_momentum", lambda v: 0 <= v < 1, "in [0, 1)"),
    ("cutout", lambda v: is_int(v, 0), "an int >= 0"),
    ("learning_rate warmup_learning_rate weight_decay",
     lambda v: not isinstance(v, (bool, str)) and 0 <= v < math.inf, "a finite number >= 0"),
    ("momentum", lambda v: 0.0 <= float(v) <= 1.0, "in [0, 1]"),
    ("decay_factor", lambda v: 0.0 < float(v) <= 1.0, "in (0, 1]"),
    ("total", lambda v: 0 < float(v) < math.inf, "a finite number > 0"),
    ("warmup", lambda v: 0 <= float(v) < math.inf, "a finite number >= 0"),
    ("boundaries", lambda v: all(0 < float(b) < math.inf for b in v), "a list of numbers > 0"),
    ("freeze", lambda v: isinstance(v, tuple), "a list of part names"),
    ("model_kwargs", lambda v: isinstance(v, dict), "a dict of model arguments"),
    ("eval_every seed", lambda v: is_int(v, 0), "an int >= 0"),
    ("verbose", lambda v: v in ("auto", 0, 1, 2), "'auto', 0, 1 or 2"),
    ("weights", lambda v: isinstance(v, str) and v,
     "None, a catalog tag, a .weights.h5 / .keras path or a URL with its hash"))
_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]
#: The fields that may be None.
_OPTIONAL = [f.name for f in dataclasses.fields(TrainConfig) if type(None) in get_args(f.type)]


def _passes(test, value):
    try:
        return bool(test(value))
    except (TypeError, ValueError):  # float("x"), a number that is not iterable
        return False


def _round(value):
    return float(f"{value:.12g}")


def _normal(value):
    """JSON round trip, so tuples and lists (and int/float spellings) compare equal."""
    return json.loads(json.dumps(value))
