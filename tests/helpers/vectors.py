"""The configs a `cg ... create` command line asks for (what the wire vectors record), and the vectors."""

from __future__ import annotations

from pcgroups.config import ElasticConfig, PartitioningFilter, StaticConfig, parse_mapping
from tests.helpers.support import WIRE_VECTORS

VECTORS = WIRE_VECTORS  # observed from the Go reference (tests/data/wire-vectors.json)


ADDED = ["m2", "m1", "m3"]  # the member order of every `kv_after_add`


def static_from_cli(cli: list[str]) -> tuple[str, StaticConfig]:
    """The group and config `cg static create balanced|mapped <stream> <group> <N> ... [--filter F]...` asks for."""
    mode, group, max_members = cli[2], cli[4], int(cli[5])
    filters: list[str] = []
    items: list[str] = []
    args = iter(cli[6:])
    for arg in args:
        if arg == "--filter":
            filters.append(next(args))
        else:
            items.append(arg)
    if mode == "balanced":
        return group, StaticConfig(max_members, filters=filters, members=items)
    return group, StaticConfig(max_members, filters=filters, member_mappings=[parse_mapping(m) for m in items])


def elastic_from_cli(cli: list[str], stdin: str) -> tuple[str, ElasticConfig]:
    """The group and config `cg elastic create` asks for, wildcard indexes answered one stdin line per filter."""
    group, max_members = cli[3], int(cli[4])
    options: dict[str, list[str]] = {}
    args = iter(cli[5:])
    for arg in args:
        name, eq, value = arg.partition("=")
        options.setdefault(name, []).append(value if eq else next(args))
    lines = stdin.splitlines()
    pfs = [
        PartitioningFilter(f, [int(x) for x in lines[i].split(" ")]) for i, f in enumerate(options.get("--filter", []))
    ]
    return group, ElasticConfig(
        max_members,
        partitioning_filters=pfs or None,
        max_buffered_msgs=int(options.get("--max-buffered-msgs", ["0"])[0]),
        max_buffered_bytes=int(options.get("--max-buffered-bytes", ["0"])[0]),
    )
