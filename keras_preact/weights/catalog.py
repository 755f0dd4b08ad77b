"""The pretrained-weights catalog: typed entries parsed from ``zoo/weights/*.json``, each
``{"_source": str, "defaults": {...}, "entries": {"<model>.<tag>": {...}}}``: an entry is the
manifest's ``defaults`` updated by its own fields; one entry per model is its ``default``."""

import dataclasses
import functools
import json
import os
from importlib import resources

from keras_preact.checks import is_int, is_number, pop_deprecated, warn_deprecated
from keras_preact.file_io import atomic_write_text
from keras_preact.layers.preprocessing import resolve_preprocessing
from keras_preact.weights.converters import CONVERTERS
from keras_preact.zoo_catalog import load_json

HASH_LENGTHS = {"sha1": 40, "md5": 32, "sha256": 64}
URL_SCHEMES = ("https://", "http://", "file://")
#: The fields of every catalog entry (`classes` may come from `architecture`).
REQUIRED_FIELDS = ("model", "tag", "default", "url", "hash", "converter", "architecture",
                   "dataset", "classes", "class_names", "preprocessing", "input_shape",
                   "metrics", "license", "params", "converter_max_abs_diff")
#: The fields `fetch_weights` needs of an entry dict.
FETCH_FIELDS = ("model", "tag", "url", "hash", "converter")


@dataclasses.dataclass(frozen=True)
class Hash:
    """A publisher's hash: ``algorithm`` (sha1, md5 or sha256) and lower-case hex."""

    algorithm: str
    value: str


@dataclasses.dataclass(frozen=True)
class Metrics:
    """Published errors (%) and where they are stated."""

    top1_error: float | None = None
    top5_error: float | None = None
    source: str | None = None
    source_file: str | None = None


_METRIC_FIELDS = [f.name for f in dataclasses.fields(Metrics)]


@dataclasses.dataclass(frozen=True)
class WeightsEntry:
    """One published artifact of the catalog: where the file is (``url``, optional
    ``archive_member``), its publisher's hash, the converter and the ``architecture``
    (factory arguments) the weights load into, and what describes them."""

    model: str
    tag: str
    url: str
    hash: Hash
    converter: str
    converter_args: dict = dataclasses.field(default_factory=dict)
    archive_member: str | None = None
    architecture: dict = dataclasses.field(default_factory=dict)
    classes: int | None = None
    default: bool = False
    dataset: str | None = None
    class_names: tuple | None = None
    preprocessing: str | None = None
    input_shape: tuple | None = None
    metrics: Metrics = Metrics()
    license: str | None = None
    params: int | None = None
    params_keras_count_params: int | None = None
    converter_max_abs_diff: float | None = None
    upstream_name: str | None = None
    notes: dict = dataclasses.field(default_factory=dict)
    manifest: str | None = None
    manifest_source: str | None = None

    @property
    def input_size(self):
        """Deprecated alias of `input_shape`."""
        warn_deprecated("input_size", "input_shape", "WeightsEntry")
        return self.input_shape

    @property
    def key(self):
        return f"{self.model}.{self.tag}"

    def source_record(self):
        """What a cached file is made from: another one makes the cached file stale."""
        return {"url": self.url, "hash": dataclasses.asdict(self.hash),
                "archive_member": self.archive_member, "converter": self.converter,
                "converter_args": self.converter_args, "architecture": self.architecture}


def _is_name(value):
    return isinstance(value, str) and bool(value) and "." not in value


def _class_list(value):
    """The names a list or a ``zoo/classes/`` name gives; None for a bad value."""
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return tuple(value)
    try:
        return tuple(load_json(f"classes/{value}.json")) if _is_name(value) else None
    except ValueError:
        return None


def _preprocessing(value):
    try:
        return resolve_preprocessing(value) is not None
    except ValueError:
        return False


#: field -> (check, what is valid); a check is false for a bad value. Fields that default
#: to None may be None.
_CHECKS = {
    **dict.fromkeys(("model", "tag"), (_is_name, "a non-empty name without dots")),
    **dict.fromkeys(("archive_member", "dataset", "license", "upstream_name"),
                    (lambda v: isinstance(v, str) and bool(v), "a non-empty string or null")),
    **dict.fromkeys(("classes", "params", "params_keras_count_params"),
                    (functools.partial(is_int, minimum=1), "an int >= 1")),
    "url": (lambda v: isinstance(v, str) and v.startswith(URL_SCHEMES),
            f"a URL starting with one of {list(URL_SCHEMES)}"),
    "converter": (lambda v: v in CONVERTERS, f"one of {sorted(CONVERTERS)}"),
    **dict.fromkeys(("converter_args", "architecture"), (lambda v: isinstance(v, dict), "a dict")),
    "default": (lambda v: isinstance(v, bool), "true or false"),
    "class_names": (_class_list, "the name of a list in zoo/classes/"),
    "preprocessing": (_preprocessing, "a preprocessing name"),
    "input_shape": (lambda v: isinstance(v, list) and len(v) == 3 and all(is_int(s, 1) for s in v),
                    "[height, width, channels]"),
    "metrics": (lambda v: isinstance(v, dict) and set(v) <= set(_METRIC_FIELDS),
                f"a dict with the keys {_METRIC_FIELDS}"),
    "converter_max_abs_diff": (is_number, "a number or null"),
    "notes": (lambda v: isinstance(v, dict) and all(isinstance(n, str) for n in v.values()),
              "a dict of strings")}
_NULLABLE = {f.name for f in dataclasses.fields(WeightsEntry) if f.default is None}


def validate_entry(entry, *, key=None, strict=True, manifest=None, manifest_source=None):
    """Parses one catalog entry dict (its manifest's defaults merged in) into a `WeightsEntry`;
    `key` ("model.tag") must agree with it. `strict` requires all `REQUIRED_FIELDS`, else
    only `FETCH_FIELDS`. ValueError for the first bad field."""
    if not isinstance(entry, dict):
        raise ValueError(f"A weights entry must be a dict. Received: {entry!r}")
    fields = dict(entry)
    entry_key = key or f"{fields.get('model')}.{fields.get('tag')}"
    label = f"The weights entry {entry_key!r}" + (f" of {manifest}" if manifest else "")
    if "input_size" in fields:
        fields.setdefault("input_shape", pop_deprecated(fields, "input_size", "input_shape", label))
    arch = fields.get("architecture")
    if isinstance(arch, dict) and "classes" not in fields and "classes" in arch:
        fields["classes"] = arch["classes"]
    required = REQUIRED_FIELDS if strict else FETCH_FIELDS
    if missing := [f for f in required if f not in fields]:
        raise ValueError(f"{label} lacks the fields {missing}. Required: {list(required)}")
    if unknown := sorted(set(fields) - set(_CHECKS) - {"hash"}):
        raise ValueError(f"{label} has unknown fields {unknown}. Valid: {sorted(_CHECKS)}")
    fields["hash"] = parse_hash(fields["hash"], what=label)
    for name, (check, valid) in _CHECKS.items():
        value = fields.get(name)
        if name in fields and not (value is None and name in _NULLABLE or check(value)):
            raise ValueError(f"{label}: `{name}` must be {valid}. Received: {name}={value!r}")
    out = WeightsEntry(**{
        **fields, "manifest": manifest, "manifest_source": manifest_source,
        "metrics": Metrics(**fields.get("metrics", {})),
        "class_names": _class_list(fields["class_names"]) if fields.get("class_names") else None,
        "input_shape": tuple(fields["input_shape"]) if fields.get("input_shape") else None})
    if key is not None and key != out.key:
        raise ValueError(f"{label} says model={out.model!r}, tag={out.tag!r}; "
                         "the key must be 'model.tag'.")
    arch_classes = out.architecture.get("classes")
    if None not in (out.classes, arch_classes) and arch_classes != out.classes:
        raise ValueError(f"{label} says classes={out.classes} but its architecture has "
                         f"classes={arch_classes}.")
    if out.class_names is not None and len(out.class_names) != out.classes:
        raise ValueError(f"{label}: `class_names` must name a list of {out.classes} names. "
                         f"Received: class_names={fields['class_names']!r} "
                         f"({len(out.class_names)} names)")
    return out


def parse_hash(value, *, what="the weights"):
    """A `Hash` from ``{"algorithm", "value"}``, ``"algorithm:hex"`` or a `Hash`; ValueError
    for an unknown algorithm or a value that is not hex of its length."""
    if isinstance(value, Hash):
        return value
    if isinstance(value, str) and ":" in value:
        value = dict(zip(("algorithm", "value"), value.split(":", 1)))
    if not isinstance(value, dict) or set(value) != {"algorithm", "value"}:
        raise ValueError(f"The hash of {what} must be {{'algorithm': ..., 'value': ...}} or "
                         f"'algorithm:hex'. Received: hash={value!r}")
    algorithm, hexvalue = str(value["algorithm"]).lower(), str(value["value"]).lower()
    if algorithm not in HASH_LENGTHS:
        raise ValueError(f"Unknown hash algorithm for {what}. "
                         f"Received: algorithm={value['algorithm']!r}. Valid: {list(HASH_LENGTHS)}")
    length = HASH_LENGTHS[algorithm]
    if len(hexvalue) != length or any(c not in "0123456789abcdef" for c in hexvalue):
        raise ValueError(f"The {algorithm} hash of {what} must be {length} hex digits. "
                         f"Received: value={value['value']!r}")
    return Hash(algorithm, hexvalue)


def record_max_diffs(manifest_path, doc, diffs):
    """Writes measured converter differences (key -> float) into `doc`, saved to the path."""
    for key, diff in diffs.items():
        doc["entries"][key]["converter_max_abs_diff"] = float(f"{diff:.2g}")
    atomic_write_text(manifest_path, json.dumps(doc, indent=1) + "\n")


@functools.lru_cache(maxsize=1)
def load_catalog():
    """All catalog entries: dict "model.tag" -> `WeightsEntry`. ValueError for a
    malformed manifest or entry, a key defined twice, or a model without one default."""
    refs = [f for f in resources.files("keras_preact.zoo").joinpath("weights").iterdir()
            if f.name.endswith(".json")]
    catalog = {}
    for ref in sorted(refs, key=lambda f: f.name):
        try:
            doc = json.loads(ref.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"The weights manifest {ref.name} is not valid JSON: {err}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
            raise ValueError(f"The weights manifest {ref.name} must be an object with an "
                             "'entries' object.")
        for key, entry in doc["entries"].items():
            if key in catalog:
                raise ValueError(f"The weights entry {key!r} is defined in both "
                                 f"{catalog[key].manifest} and {ref.name}.")
            catalog[key] = validate_entry({**doc.get("defaults", {}), **entry}, key=key,
                                          manifest=ref.name, manifest_source=doc.get("_source"))
    for model in {e.model for e in catalog.values()}:
        defaults = [k for k, e in catalog.items() if e.model == model and e.default]
        if len(defaults) != 1:
            raise ValueError(f"The model {model!r} must have exactly one default weights entry; "
                             f"it has {len(defaults)}: {defaults}")
    return catalog


def list_entries(model=None):
    """The catalog's `WeightsEntry`s (of `model`, default all), in the registry's
    model order (``zoo/models.json``), then by tag.

    Args:
        model: str or None, a model name; None: every model's entries. Defaults to `None`.

    Returns:
        list of `WeightsEntry`."""
    order = {name: i for i, name in enumerate(load_json("models.json")["models"])}
    return sorted((e for e in load_catalog().values() if model is None or e.model == model),
                  key=lambda e: (order.get(e.model, len(order)), e.model, e.tag))


def get_entry(key):
    """The `WeightsEntry` stored as `key` ("model.tag").

    Args:
        key: str, a catalog key, e.g. "preact_resnet110.cifar10".

    Returns:
        The `WeightsEntry`.

    Raises:
        ValueError: for an unknown key, listing the valid keys."""
    catalog = load_catalog()
    if not isinstance(key, str) or key not in catalog:
        valid = sorted(catalog) or "none (the catalog is empty)"
        raise ValueError(f"Unknown weights. Received: weights={key!r}. Valid: {valid}")
    return catalog[key]


def looks_like_tag(weights):
    """Whether a `weights` string names a catalog entry rather than a file, URL or folder of
    keras-preact's (a preset or a training run: it holds a config.json)."""
    return (isinstance(weights, str) and "/" not in weights and "\\" not in weights
            and not weights.endswith((".h5", ".keras")) and not weights.startswith(URL_SCHEMES)
            and not os.path.isfile(os.path.join(weights, "config.json")))


def resolve_tag(model, weights):
    """The `WeightsEntry` that `weights` (a tag, "DEFAULT" or a "model.tag" key) names for
    `model`; ValueError for an unknown tag (listing the valid ones) or another model's key."""
    entries = list_entries(model)
    tags = [e.tag for e in entries] + ["DEFAULT"] if entries else []  # the valid ones
    entry_model, dot, tag = weights.rpartition(".")
    if dot and entry_model != model:
        raise ValueError(f"The weights {weights!r} are for {entry_model!r}, not {model!r}. "
                         f"Valid for {model}: {tags or 'none'}")
    chosen = [e for e in entries if (e.default if tag in ("DEFAULT", "default") else e.tag == tag)]
    if not chosen:
        raise ValueError(f"Unknown weights tag for {model}. Received: weights={weights!r}. "
                         "Valid: None, a path ending in '.weights.h5' or '.keras', a URL with "
                         f"its hash, or one of {tags or '(no pretrained weights for this model)'}")
    return chosen[0]


README_HEADER = """# The keras-preact zoo

This file is generated from the manifests in `zoo/weights/*.json` by
`keras-preact weights readme --output zoo/README.md`; edit the manifests, not this table.

Paper error: test error (%) of the pre-activation network in He et al. 2016, "Identity
Mappings in Deep Residual Networks" (Tables 2-4, median of 5 runs); "-" where the paper
reports none. Published error: the error the weights' publisher reports for them.
Max diff: the largest absolute difference between our converted model's outputs and the
publisher's model, measured by the converter tests ("-" when not measured).
"""


def render_zoo_readme(entries=None):
    """The Markdown of `zoo/README.md`: one table row per entry (default: the catalog).

    Args:
        entries: list of `WeightsEntry` or None; None: every catalog entry
            (`list_entries`). Defaults to `None`.

    Returns:
        str: the Markdown text."""
    entries = list_entries() if entries is None else entries
    models = load_json("models.json")["models"]
    lines = [README_HEADER, "| weights (`model.tag`) | default | params | paper error % "
             "| published error % | max diff | source | license |", "|" + "---|" * 8]
    for e in entries:
        diff = e.converter_max_abs_diff
        cells = (f"`{e.key}`", "yes" if e.default else "",
                 "-" if e.params is None else f"{e.params:,}",
                 models.get(e.model, {}).get(f"paper_error_{e.dataset}"), e.metrics.top1_error,
                 None if diff is None else f"{diff:.1e}",
                 (e.metrics.source or e.manifest_source or "-").replace("|", "/"), e.license)
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    if not entries:
        lines.append("| (no weights in the catalog yet) | | | | | | | |")
    return "\n".join(lines) + "\n"
