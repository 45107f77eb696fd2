#!/usr/bin/env bash
# Creates the demo stream for elastic groups: stream foo, subjects foo.* (the reference runs
#   nats stream add foo --subjects="foo.*" --defaults).
# No nats CLI needed. Options: --stream NAME (subjects NAME.*), --replicas N, --memory, plus the
# cg connection options (--server URL, --context NAME, ...) and NATS_URL etc.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_cg.sh"
exec "${cg[@]}" tools stream-setup "$@"
