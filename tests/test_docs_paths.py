"""Every repository file the README, the documentation site's pages, the changelog, the zoo
table and the docstrings name exists."""

import ast
import fnmatch
import functools
import os
import re
import subprocess

from tests.helpers import DOC_PAGES, REPO

#: The repository's top-level folders: a path that starts with one is a repository path.
TOP = ("keras_preact", "zoo", "examples", "tests", "benchmarks", "docs", ".ci")
#: `keras_preact/layers/blocks.py`, `zoo/weights/*.json`, `examples/multiworker/`, ...
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(re.escape(t) for t in TOP)
                  + r")/[\w./*-]*[\w*/])")
#: Bare names of documents: `NOTES.md`, `CHANGELOG.md`, `pyproject.toml`.
DOCUMENT = re.compile(r"(?<![\w./-])([A-Za-z_][\w-]*\.(?:md|toml|cfg))\b")
#: What the package's commands write (a run's model, an export's card, the benchmark
#: reports): named by the docs, not kept in the repository.
WRITTEN = ("benchmarks/results/", "model_card.md")


@functools.cache
def _repository_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=REPO, capture_output=True, text=True, check=True).stdout
    # A tracked file deleted in the working tree is gone: it neither counts nor is read.
    files = {f for f in out.split() if os.path.exists(os.path.join(REPO, f))}
    return files | {os.path.dirname(f) + "/" for f in files} | {
        "/".join(f.split("/")[:i]) + "/" for f in files for i in range(1, f.count("/") + 1)
    }


def _docstrings(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc


def _texts():
    for name in DOC_PAGES + ["CHANGELOG.md", "zoo/README.md", "mkdocs.yml"]:
        yield name, open(os.path.join(REPO, name), encoding="utf-8").read()
    for folder in ("keras_preact", "examples", "benchmarks", "docs"):
        for path in sorted(_repository_files()):
            if path.startswith(folder + "/") and path.endswith(".py"):
                yield path, "\n".join(_docstrings(os.path.join(REPO, path)))


def _exists(reference):
    if reference.startswith(WRITTEN) or reference.endswith(".keras") or "<" in reference:
        return True
    pattern = reference.replace("...", "*").rstrip(".")
    if pattern.endswith("/") or "*" not in pattern:
        return pattern in _repository_files() or pattern + "/" in _repository_files()
    return bool(fnmatch.filter(_repository_files(), pattern))


def _references():
    names = {os.path.basename(f) for f in _repository_files()}
    found = []
    for source, text in _texts():
        found += [(source, m.group(1)) for m in PATH.finditer(text)]
        found += [(source, m.group(1)) for m in DOCUMENT.finditer(text)
                  if m.group(1) not in names and m.group(1) not in WRITTEN]
    return found


def test_the_checker_sees_paths_and_documents():
    text = "see keras_preact/layers/blocks.py, zoo/weights/*.json and NOTES.md"
    assert [m.group(1) for m in PATH.finditer(text)] == ["keras_preact/layers/blocks.py",
                                                         "zoo/weights/*.json"]
    assert [m.group(1) for m in DOCUMENT.finditer(text)] == ["NOTES.md"]
    assert _exists("keras_preact/layers/") and _exists("zoo/weights/*.json")
    assert not _exists("keras_preact/no_such_module.py")


def test_every_named_file_exists():
    missing = [f"{source} names {reference!r}" for source, reference in _references()
               if not _exists(reference)]
    assert not missing, "files the repository does not have:\n" + "\n".join(missing)
