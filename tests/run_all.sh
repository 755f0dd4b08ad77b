#!/usr/bin/env bash
# The test command: the whole suite on TensorFlow, then the multibackend tests on
# JAX and PyTorch. Extra arguments go to every pytest run.
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

# Test files run in parallel: one pytest worker per core, at most 4 (a worker can hold a
# few GB while a test builds ResNet-1001); PYTEST_WORKERS=N overrides, 1 runs serially.
# Much of a test's time is single-threaded tracing, so two workers on two cores finish
# sooner than one; "loadfile" keeps a file's tests, and its module fixtures, on one worker.
workers=${PYTEST_WORKERS:-$(python -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count(); print(max(1, min(4, n or 1)))")}
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "PYTEST_WORKERS must be a whole number >= 1. Received: '${workers}'" >&2
  exit 2
fi
parallel=()
if [ "$workers" -gt 1 ]; then
  parallel=(-n "$workers" --dist loadfile)
fi

status=0
run() {
  local label=$1; shift
  echo "=== ${label}: pytest $*"
  pytest "$@"
  local rc=$?
  if [ "$rc" -eq 5 ]; then
    # pytest exits 5 when it collected nothing: for us that is a broken suite.
    echo "!!! ${label}: no tests were collected (pytest exit 5)" >&2
    status=1
  elif [ "$rc" -ne 0 ]; then
    echo "!!! ${label}: pytest failed (exit ${rc})" >&2
    status=1
  fi
}

# XLA's forced CPU host devices (tests/test_jax_parallel.py) have stalled at an all-reduce
# when other test processes shared the two cores: that file runs last, alone.
KERAS_BACKEND=tensorflow run "tensorflow" -q --durations=25 "${parallel[@]}" \
  --ignore=tests/test_jax_parallel.py "$@"
# The `>>>` examples of the package's docstrings (about 20 s).
KERAS_BACKEND=tensorflow run "doctests" -q --doctest-modules keras_preact "$@"
# JAX compiles every new shape; a persistent cache makes reruns and subprocesses cheap.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
# One process: with two, XLA's CPU results of the remat-against-plain fit comparison
# once differed by 2e-4 (never in one process); the pass takes about two minutes.
KERAS_BACKEND=jax run "jax" -q -m multibackend --durations=10 "$@"
KERAS_BACKEND=torch run "torch" -q -m multibackend --durations=10 "${parallel[@]}" "$@"
KERAS_BACKEND=tensorflow run "jax data parallel, alone" -q tests/test_jax_parallel.py "$@"
exit $status
