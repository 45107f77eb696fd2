#!/usr/bin/env bash
# Publishes synchronously to foo.<n>, n cycling through 0..99: each publish waits for the stream's
# ack, then 10ms, so about 90 messages a second, never 100 (the reference runs
#   nats bench js pub sync foo --multisubject --sleep 10ms --multisubjectmax 100 --stream foo),
# until Ctrl-C. Keeps going through a server restart (a failed publish is sent again, the stream
# keeps one copy), shows progress on stderr and ends with the count and the rate measured.
# No nats CLI needed. Options: --count N (stop after N), --sleep DURATION, --stream NAME,
# --subject PREFIX, --max-subjects N, --size BYTES, -q, plus the cg connection options
# (--server URL, --context NAME, ...) and NATS_URL etc.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_cg.sh"
exec "${cg[@]}" tools traffic "$@"
