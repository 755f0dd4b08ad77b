"""The package's import graph: no cycles, the core never imports the app, no private
names across modules, private APIs of other libraries in `private_api` only, no module
outside `layers` reaching into a layer's private attributes, argparse only in the command
line.

The core (`layers`, `models`, `weights` and the catalog data) builds, loads and converts
models; the app (`data`, `training`, `tuning`, `export`, `diagnostics`, `finetune`, `cli`)
uses it. Every import counts, also one inside a function: a lazy import still ties the
two modules together.
"""

import ast
import os

from tests.helpers import REPO

PACKAGE = "keras_preact"
CORE = ("layers", "models", "weights", "zoo_catalog", "private_api", "file_io", "checks",
        "architecture")
#: Private APIs of other libraries: only `keras_preact/private_api.py` may use them. Private
#: modules: these, and any ``*.src.*`` one (keras.src, keras_tuner.src, keras_hub.src, ...).
PRIVATE_MODULES = ("tensorflow.python", "tensorflow.compiler", "tsl.")
#: Private attributes: these, and every one private_api.py uses (collected from it).
PRIVATE_ATTRIBUTES = ("_init_seed",)
ATTRIBUTE_CALLS = ("getattr", "hasattr", "setattr", "delattr")


def _modules():
    out = {}
    root = os.path.join(REPO, PACKAGE)
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


def _imports(path, modules):
    """(imported module, imported name or None) for every import of the package."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == PACKAGE:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    yield (full, None) if full in modules else (node.module, alias.name)


def _graph():
    modules = _modules()
    return modules, {m: set(_imports(p, modules)) for m, p in modules.items()}


def _part(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(edges):
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    modules, imports = _graph()
    # The package's own __init__ re-exports lazily and is left out: importing a
    # submodule always runs it first, which is not a dependency of that submodule.
    edges = {m: {t for t, _ in imports[m] if t in modules and t != PACKAGE}
             for m in modules if m != PACKAGE}
    assert _cycles(edges) == []


def test_the_core_never_imports_the_app():
    modules, imports = _graph()
    bad = sorted({
        (m, t) for m in modules if _part(m) in CORE
        for t, _ in imports[m] if _part(t) is not None and _part(t) not in CORE
    })
    assert bad == []


def test_inside_the_core_layers_models_weights_point_down():
    """layers <- weights <- models (each imports only those to its left): a factory
    resolves `weights=`, builds the model, then asks `weights` to load into it; `weights`
    never builds a model itself and `layers` know neither."""
    modules, imports = _graph()
    above = {"layers": ("models", "weights"), "weights": ("models",)}
    bad = sorted({(m, t) for m in modules for t, _ in imports[m]
                  if _part(t) in above.get(_part(m), ())})
    assert bad == []


def test_no_private_names_across_modules():
    modules, imports = _graph()
    bad = sorted((m, t, name) for m in modules for t, name in imports[m]
                 if name and name.startswith("_") and t != m)
    assert bad == []


def test_argparse_only_in_the_command_line():
    modules, _ = _graph()
    bad = sorted(m for m, p in modules.items()
                 if _part(m) != "cli" and "argparse" in open(p, encoding="utf-8").read())
    assert bad == []


def test_the_checks_see_what_they_look_for():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    _, imports = _graph()
    assert ("keras_preact.layers.blocks", "PreActStage") in imports[
        "keras_preact.models.preact_resnet"]
    assert _part("keras_preact.weights.local") == "weights" and _part(PACKAGE) is None


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


def _private_module(name):
    return name.startswith(PRIVATE_MODULES) or "src" in name.split(".")[1:]


def _imported_modules(node):
    """The modules an import node names (``from keras import src``: also "keras.src")."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def _attribute_string(node):
    """The attribute name of ``getattr(x, "name", ...)`` (hasattr, setattr, delattr), or None."""
    if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ATTRIBUTE_CALLS
            and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def _private_names_used(tree):
    """Every private name a module reaches for: ``x._name``, ``getattr(x, "_name")`` and
    imported ``_name``s."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(a.name.split(".")[-1] for a in node.names)
        names.add(_attribute_string(node) or "")
    return {name for name in names if _is_private(name)}


def _layer_private_names(modules):
    """The private attributes (``self._x = ...``) and methods of the classes in `layers`."""
    names = set()
    for module, path in modules.items():
        if _part(module) != "layers":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                    and getattr(node.value, "id", None) == "self"):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                names.update(f.name for f in node.body if isinstance(f, ast.FunctionDef))
    return {name for name in names if _is_private(name)}


def test_private_apis_only_in_one_module():
    """No module but `private_api` imports a private module of another library or reaches
    for a private attribute by name (``getattr(x, "_name")``, or one `private_api` uses),
    and no module outside `layers` reaches into a layer's private attributes or methods."""
    modules, _ = _graph()
    private_api = f"{PACKAGE}.private_api"
    others = set(PRIVATE_ATTRIBUTES) | _private_names_used(
        ast.parse(open(modules[private_api], encoding="utf-8").read()))
    layers = _layer_private_names(modules)
    bad = []
    for module, path in modules.items():
        if module == private_api:
            continue
        # A layer's own private names are its module's (or, through `self`, its class's).
        names = others if _part(module) == "layers" else others | layers
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            bad += [(module, node.lineno, n) for n in _imported_modules(node) if _private_module(n)]
            if _is_private(attribute := _attribute_string(node) or ""):
                bad.append((module, node.lineno, f"getattr {attribute!r}"))
            if isinstance(node, ast.Attribute) and node.attr in names and not (
                    node.attr in layers - others and getattr(node.value, "id", None) == "self"):
                bad.append((module, node.lineno, node.attr))
            if isinstance(node, ast.Constant) and node.value in names:
                bad.append((module, node.lineno, node.value))  # e.g. attrgetter("_vars")
    assert bad == []


def test_the_private_api_checks_see_what_they_look_for():
    modules, _ = _graph()
    layers = _layer_private_names(modules)
    assert {"_vars", "_stacked", "_repeat_spec"} <= layers and "get_variable" not in layers
    assert {"_flatten_layers", "_operations", "_pywrap_util_port"} <= _private_names_used(
        ast.parse(open(modules[f"{PACKAGE}.private_api"], encoding="utf-8").read()))
    assert all(map(_private_module, ("keras.src.saving", "keras_tuner.src", "keras_hub.src.x",
                                     "tensorflow.python.eager", "tsl.protobuf")))
    assert not any(map(_private_module, ("keras", "keras_tuner", "src", "tensorflow.io")))
    tree = ast.parse('from keras import src\ngetattr(m, "_called", True)\nhasattr(m, "__len__")')
    assert [m for n in ast.walk(tree) for m in _imported_modules(n)] == ["keras", "keras.src"]
    assert _private_names_used(tree) == {"_called"}


def test_no_package_cycles():
    """The same between the package's parts (`training`, `export`, ...) as between modules."""
    modules, imports = _graph()
    edges = {}
    for m in modules:
        for t, _ in imports[m]:
            if None not in (_part(m), _part(t)) and _part(m) != _part(t):
                edges.setdefault(_part(m), set()).add(_part(t))
    assert _cycles(edges) == []


def test_defaults_and_layer_names_only_in_the_architecture_record():
    """`keras_preact.architecture` holds the model's defaults and the layer names other
    modules look up: no module writes one again (`kwargs.get("stem_filters", 16)`,
    `get_layer("logits")`, `stem_filters=16` in a call, an HDF5 path of a layer)."""
    from keras_preact import architecture as arch

    names = {arch.STEM_CONV_LAYER, arch.POOL_LAYER, arch.HEAD_LAYER}
    looked_up = names | {arch.PREPROCESSING_LAYER, arch.INPUT_NAME, arch.PREDICTIONS_LAYER}
    modules, _ = _graph()
    bad = []
    for module, path in modules.items():
        if module == f"{PACKAGE}.architecture":
            continue
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value in names or node.value.startswith("layers/"):
                    bad.append((module, node.lineno, node.value))
            if not isinstance(node, ast.Call):
                continue
            func = getattr(node.func, "attr", getattr(node.func, "id", None))
            args = [a.value for a in node.args if isinstance(a, ast.Constant)]
            if func == "get_layer" and set(args) & looked_up:
                bad.append((module, node.lineno, args))
            if func == "get" and len(args) == 2 and args[0] in arch.DEFAULTS and (
                    args[1] == arch.DEFAULTS[args[0]]):
                bad.append((module, node.lineno, args))
            if _part(module) != "layers":  # a layer's own signature keeps its defaults
                bad += [(module, node.lineno, k.arg) for k in node.keywords
                        if k.arg in arch.DEFAULTS and isinstance(k.value, ast.Constant)
                        and not isinstance(k.value.value, (bool, type(None)))
                        and k.value.value == arch.DEFAULTS[k.arg]]
    assert bad == []
