"""The pretrained-weights catalog: manifests in ``zoo/weights/*.json``, merged.

Each manifest is ``{"_source": "...", "entries": {"<model>.<tag>": {...}}}`` and each
entry describes one published artifact: where it is (``url``, optional
``archive_member``), the publisher's hash of it, the converter that turns it into
keras-preact weights and the ``architecture`` (factory keyword arguments) those
weights load into, the dataset, classes and class names, the preprocessing, the
published metrics with their source, the license and the converter's measured
largest difference. Exactly one entry per model is its ``default``.

Keys follow timm's ``arch.tag`` convention (e.g. ``preact_resnet110.cifar10``).
"""

import functools
import json
from importlib import resources

from keras_preact.files import atomic_write_text
from keras_preact.zoo_catalog import load_json

MANIFEST_FOLDER = "weights"
HASH_ALGORITHMS = ("sha1", "md5", "sha256")
URL_SCHEMES = ("https://", "http://", "file://")
#: Fields every catalog entry must have (the loader rejects a manifest without them).
REQUIRED_FIELDS = (
    "model", "tag", "default", "url", "hash", "converter", "architecture", "dataset",
    "classes", "class_names", "preprocessing", "input_size", "metrics", "license",
    "params", "converter_max_abs_diff",
)
#: The fields `fetch_weights` needs; entry dicts passed to it directly (tests, a
#: private catalog) may leave the descriptive ones out.
FETCH_FIELDS = ("model", "tag", "url", "hash", "converter")


def validate_entry(entry, *, key=None, strict=True):
    """Checks one catalog entry and returns a normalised copy.

    Args:
        entry: dict, the entry.
        key: optional "model.tag" the entry is stored under (checked against it).
        strict: bool, default True: require every catalog field; False requires
            only what `fetch_weights` needs (`FETCH_FIELDS`).

    Returns:
        dict: a copy with ``key`` set and the hash algorithm and value lower-cased.

    Raises:
        ValueError: naming the entry, the field, the value received and what is valid.
    """
    label = key or (entry.get("model", "?") + "." + str(entry.get("tag", "?")) if isinstance(entry, dict) else "?")
    if not isinstance(entry, dict):
        raise ValueError(f"A weights entry must be a dict. Received: {entry!r}")
    required = REQUIRED_FIELDS if strict else FETCH_FIELDS
    missing = [f for f in required if f not in entry]
    if missing:
        raise ValueError(
            f"The weights entry {label!r} lacks the fields {missing}. "
            f"Required: {list(required)}"
        )
    # Further descriptive fields (e.g. "upstream_name", notes) are kept as they are.
    out = dict(entry)
    for name in ("model", "tag"):
        if not isinstance(out[name], str) or not out[name] or "." in out[name]:
            raise ValueError(
                f"The weights entry {label!r} needs a non-empty `{name}` without dots. "
                f"Received: {name}={out[name]!r}"
            )
    if key is not None and key != f"{out['model']}.{out['tag']}":
        raise ValueError(
            f"A weights entry is stored under {key!r} but says model={out['model']!r}, "
            f"tag={out['tag']!r}; the key must be 'model.tag'."
        )
    out["key"] = f"{out['model']}.{out['tag']}"
    url = out["url"]
    if not isinstance(url, str) or not url.startswith(URL_SCHEMES):
        raise ValueError(
            f"The weights entry {label!r} has an invalid `url`. Received: url={url!r}. "
            f"Valid: a URL starting with one of {list(URL_SCHEMES)}"
        )
    out["hash"] = parse_hash(out["hash"], what=f"the weights entry {label!r}")
    from keras_preact.weights.converters import CONVERTERS

    if out["converter"] not in CONVERTERS:
        raise ValueError(
            f"The weights entry {label!r} names an unknown converter. Received: "
            f"converter={out['converter']!r}. Valid: {sorted(CONVERTERS)}"
        )
    member = out.get("archive_member")
    if member is not None and (not isinstance(member, str) or not member):
        raise ValueError(
            f"`archive_member` of {label!r} must be a file name. Received: {member!r}"
        )
    for name in ("architecture", "converter_args"):
        if out.get(name) is not None and not isinstance(out[name], dict):
            raise ValueError(
                f"`{name}` of {label!r} must be a dict. Received: {name}={out[name]!r}"
            )
    out["architecture"] = dict(out.get("architecture") or {})
    classes = out.get("classes", out["architecture"].get("classes"))
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int) or classes < 1):
        raise ValueError(f"`classes` of {label!r} must be an int >= 1. Received: {classes!r}")
    arch_classes = out["architecture"].get("classes")
    if classes is not None and arch_classes is not None and arch_classes != classes:
        raise ValueError(
            f"The weights entry {label!r} says classes={classes} but its architecture "
            f"has classes={arch_classes}."
        )
    out["classes"] = classes
    if strict:
        if not isinstance(out["default"], bool):
            raise ValueError(f"`default` of {label!r} must be true or false. Received: {out['default']!r}")
        names = out["class_names"]
        if not isinstance(names, list) or len(names) != classes or not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"`class_names` of {label!r} must be a list of {classes} strings. "
                f"Received: {names!r}"
            )
        size = out["input_size"]
        if not isinstance(size, list) or len(size) != 3 or not all(isinstance(s, int) and s > 0 for s in size):
            raise ValueError(
                f"`input_size` of {label!r} must be [height, width, channels]. Received: {size!r}"
            )
        if not isinstance(out["metrics"], dict):
            raise ValueError(f"`metrics` of {label!r} must be a dict. Received: {out['metrics']!r}")
        diff = out["converter_max_abs_diff"]
        if diff is not None and (isinstance(diff, bool) or not isinstance(diff, (int, float))):
            raise ValueError(
                f"`converter_max_abs_diff` of {label!r} must be a number or null. Received: {diff!r}"
            )
    if out.get("preprocessing") is not None:
        from keras_preact.layers.preprocessing import resolve_preprocessing

        try:
            resolve_preprocessing(out["preprocessing"])
        except ValueError as err:
            raise ValueError(f"The weights entry {label!r} has bad `preprocessing`: {err}") from None
    return out


def parse_hash(value, *, what="the weights"):
    """Normalises a hash given as ``{"algorithm", "value"}`` or ``"algorithm:hex"``.

    Returns:
        ``{"algorithm": str, "value": lower-case hex str}``.

    Raises:
        ValueError: for an unknown algorithm or a value that is not hex of its length.
    """
    if isinstance(value, str) and ":" in value:
        algorithm, _, hexvalue = value.partition(":")
        value = {"algorithm": algorithm, "value": hexvalue}
    if not isinstance(value, dict) or set(value) != {"algorithm", "value"}:
        raise ValueError(
            f"The hash of {what} must be {{'algorithm': ..., 'value': ...}} or "
            f"'algorithm:hex'. Received: hash={value!r}"
        )
    algorithm = str(value["algorithm"]).lower()
    if algorithm not in HASH_ALGORITHMS:
        raise ValueError(
            f"Unknown hash algorithm for {what}. Received: algorithm={value['algorithm']!r}. "
            f"Valid: {list(HASH_ALGORITHMS)}"
        )
    hexvalue = str(value["value"]).lower()
    length = {"sha1": 40, "md5": 32, "sha256": 64}[algorithm]
    if len(hexvalue) != length or any(c not in "0123456789abcdef" for c in hexvalue):
        raise ValueError(
            f"The {algorithm} hash of {what} must be {length} hex digits. "
            f"Received: value={value['value']!r}"
        )
    return {"algorithm": algorithm, "value": hexvalue}


def _manifest_files():
    folder = resources.files("keras_preact.zoo").joinpath(MANIFEST_FOLDER)
    if not folder.is_dir():
        return []
    return sorted((f for f in folder.iterdir() if f.name.endswith(".json")), key=lambda f: f.name)


def record_max_diffs(manifest_path, doc, diffs):
    """Writes the converters' measured max differences into a manifest.

    Args:
        manifest_path: the manifest's JSON file (written to a temporary file and
            renamed into place).
        doc: the manifest as loaded (a dict with "entries").
        diffs: dict catalog key -> measured max abs difference; stored with two
            significant digits (the figure is a bound, not a fingerprint).
    """
    for key, diff in diffs.items():
        doc["entries"][key]["converter_max_abs_diff"] = float(f"{diff:.2g}")
    atomic_write_text(manifest_path, json.dumps(doc, indent=1) + "\n")


@functools.lru_cache(maxsize=1)
def load_catalog():
    """All catalog entries, merged from every manifest and validated.

    Returns:
        dict: "model.tag" -> entry (each with its ``key`` and ``manifest``).

    Raises:
        ValueError: for a malformed manifest, a key defined twice, or a model without
            exactly one default entry.
    """
    catalog = {}
    for ref in _manifest_files():
        try:
            doc = json.loads(ref.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"The weights manifest {ref.name} is not valid JSON: {err}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), dict):
            raise ValueError(
                f"The weights manifest {ref.name} must be an object with an 'entries' object."
            )
        for key, entry in doc["entries"].items():
            if key in catalog:
                raise ValueError(
                    f"The weights entry {key!r} is defined in both "
                    f"{catalog[key]['manifest']} and {ref.name}."
                )
            checked = validate_entry(entry, key=key)
            checked["manifest"] = ref.name
            checked["manifest_source"] = doc.get("_source")
            catalog[key] = checked
    defaults = {}
    for key, entry in catalog.items():
        defaults.setdefault(entry["model"], [])
        if entry["default"]:
            defaults[entry["model"]].append(key)
    for model, keys in defaults.items():
        if len(keys) != 1:
            raise ValueError(
                f"The model {model!r} must have exactly one default weights entry; it "
                f"has {len(keys)}: {keys}"
            )
    return catalog


def list_entries(model=None):
    """The catalog's entries, shallowest model first, then by tag.

    Args:
        model: optional registered model name to filter by.

    Returns:
        list of entry dicts.
    """
    catalog = load_catalog()
    # models.json lists the models as the registry does (a test checks it): the
    # catalog describes models without importing them.
    order = {name: i for i, name in enumerate(load_json("models.json")["models"])}
    keys = sorted(catalog, key=lambda k: (order.get(catalog[k]["model"], len(order)), catalog[k]["model"], catalog[k]["tag"]))
    return [catalog[k] for k in keys if model is None or catalog[k]["model"] == model]


def get_entry(key):
    """The catalog entry stored as `key` ("model.tag").

    Raises:
        ValueError: for an unknown key (the message lists the valid ones).
    """
    catalog = load_catalog()
    if not isinstance(key, str) or key not in catalog:
        raise ValueError(
            f"Unknown weights. Received: weights={key!r}. Valid: {sorted(catalog) or 'none (the catalog is empty)'}"
        )
    return dict(catalog[key])


def tags_for(model):
    """The tags the catalog holds for `model` (plus "DEFAULT" when it has any)."""
    tags = [e["tag"] for e in list_entries(model)]
    return tags + ["DEFAULT"] if tags else []


def looks_like_tag(weights):
    """Whether a `weights` string names a catalog entry rather than a file or URL."""
    return (
        isinstance(weights, str)
        and "/" not in weights
        and "\\" not in weights
        and not weights.endswith((".h5", ".keras"))
        and not weights.startswith(URL_SCHEMES)
    )


def resolve_tag(model, weights):
    """The entry that `weights` names for the factory of `model`.

    Args:
        model: the registered model name, e.g. "preact_resnet110".
        weights: a tag ("cifar10"), "DEFAULT", or a key ("preact_resnet110.cifar10").

    Raises:
        ValueError: for an unknown tag (listing the valid ones) or a key of another
            model.
    """
    if "." in weights:
        entry_model, _, tag = weights.partition(".")
        if entry_model != model:
            raise ValueError(
                f"The weights {weights!r} are for {entry_model!r}, not {model!r}. "
                f"Valid for {model}: {tags_for(model) or 'none'}"
            )
    else:
        tag = weights
    entries = list_entries(model)
    if tag in ("DEFAULT", "default"):
        chosen = [e for e in entries if e["default"]]
    else:
        chosen = [e for e in entries if e["tag"] == tag]
    if not chosen:
        raise ValueError(
            f"Unknown weights tag for {model}. Received: weights={weights!r}. Valid: "
            f"None, a path ending in '.weights.h5' or '.keras', a URL with its hash, or "
            f"one of {tags_for(model) or '(no pretrained weights for this model)'}"
        )
    return dict(chosen[0])


# --- zoo/README.md --------------------------------------------------------------------

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
    """The Markdown of `zoo/README.md`: one table row per weights entry.

    Args:
        entries: optional list of entries; default the whole catalog.

    Returns:
        str.
    """
    entries = list_entries() if entries is None else entries
    models = load_json("models.json").get("models", {})
    lines = [
        README_HEADER,
        "| weights (`model.tag`) | default | params | paper error % | published error % | max diff | source | license |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in entries:
        info = models.get(e["model"], {})
        paper = info.get(f"paper_error_{e.get('dataset')}")
        metrics = e.get("metrics") or {}
        err = metrics.get("top1_error")
        diff = e.get("converter_max_abs_diff")
        params = e.get("params")
        lines.append(
            "| `{key}` | {default} | {params} | {paper} | {err} | {diff} | {source} | {license} |".format(
                key=e["key"],
                default="yes" if e.get("default") else "",
                params=f"{params:,}" if isinstance(params, int) else "-",
                paper="-" if paper is None else paper,
                err="-" if err is None else err,
                diff="-" if diff is None else f"{diff:.1e}",
                source=str(metrics.get("source", e.get("manifest_source") or "-")).replace("|", "/"),
                license=e.get("license", "-"),
            )
        )
    if not entries:
        lines.append("| (no weights in the catalog yet) | | | | | | | |")
    return "\n".join(lines) + "\n"
