#!/usr/bin/env bash
# The test command: the whole suite on TensorFlow, then the multibackend tests on
# JAX and PyTorch. Extra arguments go to every pytest run.
set -u
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

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

KERAS_BACKEND=tensorflow run "tensorflow" -q --durations=25 "$@"
# JAX compiles every new shape; a persistent cache makes reruns and subprocesses cheap.
export JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-$PWD/.cache/jax}
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
KERAS_BACKEND=jax run "jax" -q -m multibackend --durations=10 "$@"
KERAS_BACKEND=torch run "torch" -q -m multibackend --durations=10 "$@"
exit $status
