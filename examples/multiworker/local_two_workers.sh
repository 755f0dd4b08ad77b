#!/usr/bin/env bash
# Two workers on this machine (127.0.0.1), on scikit-learn's digits: a try-out of
# the multi-worker path without a cluster. Logs go to runs/mw-local/worker{0,1}.log.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
PORTS=$(python3 -c 'import socket
s = [socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(",".join(f"127.0.0.1:{x.getsockname()[1]}" for x in s))')
mkdir -p runs/mw-local
for i in 0 1; do
  HOSTS=$PORTS MODEL=preact_resnet20 DATASET=digits BATCH_SIZE=64 \
  WORKDIR=runs/mw-local/worker$i \
    bash "$HERE/launch_worker.sh" $i --epochs 2 --verbose 2 "$@" \
    > runs/mw-local/worker$i.log 2>&1 &
done
wait
tail -n 3 runs/mw-local/worker0.log runs/mw-local/worker1.log
