#!/usr/bin/env bash
# Start one worker of a multi-worker run: run this on every host, with that host's
# index. Every host runs the same training command; only TF_CONFIG's task differs.
#
#   HOSTS="10.0.0.1:12345,10.0.0.2:12345" bash launch_worker.sh 0   # on 10.0.0.1
#   HOSTS="10.0.0.1:12345,10.0.0.2:12345" bash launch_worker.sh 1   # on 10.0.0.2
#
# Worker 0 is the chief: it writes the workdir (checkpoints, metrics, model.keras)
# and broadcasts its state, so the workdir need not be on a shared filesystem. Run
# the same command again on every host after a crash: training resumes from the
# chief's last completed epoch.
set -euo pipefail
INDEX=${1:?usage: HOSTS=host0:port,host1:port,... launch_worker.sh INDEX [extra train args]}
shift
: "${HOSTS:?set HOSTS to the comma-separated host:port list, the same on every host}"
WORKDIR=${WORKDIR:-runs/multiworker}

WORKERS=$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1].split(",")))' "$HOSTS")
export TF_CONFIG="{\"cluster\": {\"worker\": $WORKERS}, \"task\": {\"type\": \"worker\", \"index\": $INDEX}}"
# How long the chief waits for the others to start, and for any collective (s).
export KERAS_PREACT_CONNECT_TIMEOUT_S=${KERAS_PREACT_CONNECT_TIMEOUT_S:-300}
export KERAS_PREACT_COLLECTIVE_TIMEOUT_S=${KERAS_PREACT_COLLECTIVE_TIMEOUT_S:-600}

# The global batch is split over the workers: N workers of one GPU each and
# --batch-size 128 give 128 / N images per GPU (see README.md, "Batch and
# learning-rate scaling").
exec keras-preact train --strategy multiworker \
    --model "${MODEL:-preact_resnet110}" --dataset "${DATASET:-cifar10}" \
    --batch-size "${BATCH_SIZE:-128}" --workdir "$WORKDIR" "$@"
