"""Spark integration: a PySpark data source named ``pcgroups`` for partitioned streams (extra ``spark``).

    from pcgroups.spark import register
    register(spark)                                   # once per SparkSession
    df = (spark.readStream.format("pcgroups")
          .option("servers", "nats://127.0.0.1:4222")
          .option("stream", "ORDERS").option("group", "cg")   # or .option("partitionCount", 3)
          .load())

Rows: ``partition INT, subject STRING, data BINARY, headers MAP<STRING,STRING>, sequence LONG,
timestamp TIMESTAMP``; one Spark input partition per group partition, in stream order. The same
format writes: ``df.write.format("pcgroups")`` / ``df.writeStream.format("pcgroups")`` publish the
``subject``, ``data`` (and ``headers``) columns with a stable ``Nats-Msg-Id``. See docs/SPARK.md.

pyspark is imported only when the data source is used, so ``import pcgroups`` (and this package) works
without it.
"""

from __future__ import annotations

from typing import Any

FORMAT = "pcgroups"

__all__ = ["FORMAT", "SCHEMA", "PcgroupsDataSource", "register"]


def register(spark: Any) -> None:
    """Register the ``pcgroups`` format with ``spark`` (a SparkSession)."""
    from .source import PcgroupsDataSource

    spark.dataSource.register(PcgroupsDataSource)


def __getattr__(name: str) -> Any:
    if name in ("PcgroupsDataSource", "SCHEMA", "PublishStats", "NatsRange"):
        from . import source

        return getattr(source, name)
    raise AttributeError(f"module 'pcgroups.spark' has no attribute {name!r}")
