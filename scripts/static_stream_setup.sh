#!/usr/bin/env bash
# Creates the demo stream for static groups: stream foo, subjects foo.*, subject transform
# foo.* -> {{partition(10,1)}}.foo.{{wildcard(1)}} (the reference runs
#   nats stream add foo --subjects="foo.*" --transform-source="foo.*" \
#     --transform-destination="{{partition(10,1)}}.foo.{{wildcard(1)}}" --defaults).
# No nats CLI needed. Options: --stream NAME (subjects NAME.*), --partitions N, --replicas N,
# --memory, plus the cg connection options (--server URL, --context NAME, ...) and NATS_URL etc.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_cg.sh"
exec "${cg[@]}" tools stream-setup --static "$@"
