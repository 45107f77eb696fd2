#!/usr/bin/env bash
# Publishes synchronously (waiting for each ack) to foo.<n>, n cycling through 0..99, one message
# every 10ms, until Ctrl-C (the reference runs
#   nats bench js pub sync foo --multisubject --sleep 10ms --multisubjectmax 100 --stream foo).
# No nats CLI needed. Options: --count N (stop after N), --sleep DURATION, --stream NAME,
# --subject PREFIX, --max-subjects N, --size BYTES, -q, plus the cg connection options
# (--server URL, --context NAME, ...) and NATS_URL etc.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_cg.sh"
exec "${cg[@]}" tools traffic "$@"
