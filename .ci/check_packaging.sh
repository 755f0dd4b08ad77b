#!/usr/bin/env bash
# Packaging check: the catalog (zoo/, shipped as the package keras_preact.zoo) must
# be found from a built wheel and after an editable install done twice, both run
# from outside the checkout. Runs in the activated test venv, which lends the
# dependencies (and setuptools and wheel, as --no-build-isolation needs).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "packaging check FAILED: $*" >&2; exit 1; }
purelib() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

python -m pip wheel --quiet --no-deps --no-build-isolation -w "$tmp" .
whl=$(echo "$tmp"/keras_preact-*.whl)
listing=$(python -m zipfile -l "$whl")
for f in zoo/*.json zoo/*/*.json; do
  grep -q "^keras_preact/$f " <<<"$listing" || fail "the wheel lacks $f"
done
grep -q "^keras_preact/py.typed " <<<"$listing" || fail "the wheel lacks keras_preact/py.typed"

# A fresh venv keeps the pip its Python bundles: pips before 25.3 still fall back to
# `setup.py develop`, which drops the zoo mapping, where pyproject.toml is missing.
python -m venv "$tmp/venv"
bin=$tmp/venv/bin
"$bin/pip" install --quiet --no-deps "$whl"
purelib python >"$(purelib "$bin/python")/test-venv.pth"
catalog() {
  local out
  out=$(cd "$tmp" && "$bin/keras-preact" weights list 2>&1) || true
  grep -q 'preact_resnet110\.cifar10 ' <<<"$out" || fail "$1: $(tail -n 1 <<<"$out")"
}
catalog "the installed wheel finds no catalog"
for _ in 1 2; do "$bin/pip" install --quiet --no-deps --no-build-isolation -e "$src"; done
catalog "a second editable install finds no catalog ($("$bin/pip" --version | cut -d' ' -f1,2))"
echo "packaging check passed"
