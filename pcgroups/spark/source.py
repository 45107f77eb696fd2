"""The ``pcgroups`` PySpark data source: batch and streaming reads of a partitioned stream, and a sink.

Importing this module imports pyspark (4.2 or later: the streaming reader uses admission control and
``Trigger.AvailableNow``, which arrived in 4.2) and pyarrow. ``import pcgroups`` does not.

Process model (measured, see docs/SPARK.md): Spark builds a reader in several Python processes and
pickles it to ship ``read()`` to executors, so every reader and writer here holds only parsed
options; connections are opened lazily, by the driver-side planner (one per stream reader, kept for
the query's life) and by each task (its own connection and event loop, closed when the task ends).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        DataSourceStreamArrowWriter,
        DataSourceStreamReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
    from pyspark.sql.types import BinaryType, MapType, StringType, StructType
except ImportError as e:  # pragma: no cover - depends on the installed pyspark
    raise ImportError(f"pcgroups.spark needs pyspark>=4.2 with pyarrow (pip install 'pcgroups[spark]'): {e}") from e

from ..errors import ConfigError, JetStreamAPIError, NotFoundError, PCGroupsError
from . import _nats, _offsets
from ._offsets import DataLossError, Layout, StreamState
from ._options import SinkOptions, SourceOptions

if TYPE_CHECKING:
    from nats.aio.client import Client

log = logging.getLogger("pcgroups.spark")
T = TypeVar("T")

FORMAT = "pcgroups"
SCHEMA = "partition INT, subject STRING, data BINARY, headers MAP<STRING,STRING>, sequence LONG, timestamp TIMESTAMP"
_COLUMNS = ("partition", "subject", "data", "headers", "sequence", "timestamp")


class PcgroupsDataSource(DataSource):
    """``spark.read.format("pcgroups")`` / ``readStream`` / ``df.write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> PcgroupsBatchReader:
        return PcgroupsBatchReader(SourceOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> PcgroupsStreamReader:
        return PcgroupsStreamReader(SourceOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> PcgroupsBatchWriter:
        return PcgroupsBatchWriter(SinkOptions.parse(self.options), schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PcgroupsStreamWriter:
        return PcgroupsStreamWriter(SinkOptions.parse(self.options), schema, overwrite)


# ---------------------------------------------------------------------------------------------
# reading


@dataclass
class NatsRange(InputPartition):
    """One Spark input partition: group partition ``partition``, stream sequences ``[start, end)``."""

    stream: str
    partition: int
    start: int
    end: int
    filter_subjects: tuple[str, ...]
    mode: str

    def __repr__(self) -> str:
        return f"NatsRange({self.stream} p{self.partition} [{self.start}, {self.end}) {self.mode})"


def _check_schema(schema: StructType) -> None:
    if tuple(f.name for f in schema.fields) != _COLUMNS:
        raise ConfigError(f"the pcgroups source has a fixed schema ({SCHEMA}); do not pass another one")


class _Driver:
    """A driver-side event loop and connection, opened lazily and never pickled."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.loop: asyncio.AbstractEventLoop | None = None
        self.nc: Client | None = None

    def run(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        """Run ``fn(nc)`` (a coroutine function); reconnect once if the connection went stale."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
        for attempt in (1, 2):
            if self.nc is None or self.nc.is_closed:
                self.nc = self.loop.run_until_complete(_nats.connect(self.opts.conn, name="pcgroups-spark-driver"))
            try:
                return self.loop.run_until_complete(fn(self.nc))
            except (ConfigError, NotFoundError, JetStreamAPIError, DataLossError):
                raise
            except Exception:
                if attempt == 2:
                    raise
                self.close_nc()  # e.g. the server dropped an idle connection: once more on a new one
        raise AssertionError("unreachable: the second attempt returns or raises")

    def close_nc(self) -> None:
        if self.nc is not None and self.loop is not None:
            try:
                self.loop.run_until_complete(asyncio.wait_for(self.nc.close(), 5))
            except Exception:
                pass
        self.nc = None

    def close(self) -> None:
        self.close_nc()
        if self.loop is not None:
            self.loop.close()
            self.loop = None


def _once(opts: SourceOptions, fn: Callable[[Client], Awaitable[T]]) -> T:
    """Run ``fn(nc)`` on a short-lived connection (batch planning)."""
    d = _Driver(opts)
    try:
        return d.run(fn)
    finally:
        d.close()


async def _plan_and_state(nc: Client, opts: SourceOptions) -> tuple[_nats.ReadPlan, int | None]:
    plan = await _nats.resolve(nc, opts)
    ts_seq = None
    if opts.starting_timestamp_ms is not None:
        ts_seq = await _nats.seq_at_time(
            nc, opts.conn, plan.layout.stream, opts.starting_timestamp_ms, plan.state.allow_direct
        )
    return plan, ts_seq


def _loss_checked(start: dict[int, int], state: StreamState, opts: SourceOptions) -> dict[int, int]:
    if state.retention != "limits":  # messages vanish on ack there: only a recreated stream is noticed
        return {p: (state.earliest if s > state.latest else s) for p, s in start.items()}
    return _offsets.check_data_loss(start, state, opts.fail_on_data_loss)


def _read_range(opts: SourceOptions, schema: StructType, part: NatsRange) -> Iterator[Any]:
    """Executor side: read one range with the task's own connection and event loop."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    if part.end <= part.start:
        return
    pa_schema = to_arrow_schema(schema, timezone="UTC")
    types = [f.type for f in pa_schema]
    loop = asyncio.new_event_loop()
    nc = reader = None
    try:
        nc = loop.run_until_complete(_nats.connect(opts.conn, name="pcgroups-spark-task", reconnect=False))
        if opts.fail_on_data_loss:
            info = loop.run_until_complete(_nats.stream_info(nc, opts.conn, part.stream))
            state = StreamState.from_info(info)
            if state.retention == "limits":
                _offsets.check_data_loss({part.partition: part.start}, state, True)
        cls = _nats.DirectRangeReader if part.mode == "direct" else _nats.ConsumerRangeReader
        reader = cls(
            nc,
            opts.conn,
            part.stream,
            part.partition,
            part.start,
            part.end,
            tuple(part.filter_subjects),
            batch=opts.fetch_batch,
            include_headers=opts.include_headers,
        )
        loop.run_until_complete(reader.open())
        while True:
            cols = loop.run_until_complete(reader.next_batch())
            if cols is None:
                break
            n = len(cols)
            if not n:
                continue
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([part.partition] * n, type=types[0]),
                    pa.array(cols.subject, type=types[1]),
                    pa.array(cols.data, type=types[2]),
                    pa.array(cols.headers, type=types[3]),
                    pa.array(cols.sequence, type=types[4]),
                    pa.array(cols.timestamp, type=types[5]),
                ],
                schema=pa_schema,
            )
    finally:
        try:
            if reader is not None:
                loop.run_until_complete(reader.close())
            if nc is not None:
                loop.run_until_complete(asyncio.wait_for(nc.close(), 5))
        except Exception:
            pass
        loop.close()


def _to_partitions(layout: Layout, mode: str, spans: Iterable[tuple[int, int, int]]) -> list[NatsRange]:
    return [NatsRange(layout.stream, p, s, e, layout.filter_subjects(p), mode) for p, s, e in spans]


class PcgroupsBatchReader(DataSourceReader):
    """A batch read: one input partition per group partition, ``[startingOffsets, endingOffsets)``."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        _check_schema(schema)
        if opts.starting == "latest":
            raise ConfigError("startingOffsets=latest is not valid for a batch read (it would read nothing)")
        self.opts, self.schema = opts, schema

    def partitions(self) -> list[NatsRange]:
        opts = self.opts
        plan, ts_seq = _once(opts, lambda nc: _plan_and_state(nc, opts))
        layout, state = plan.layout, plan.state
        start = _offsets.resolve_start(
            opts.starting, state, layout.partitions, timestamp_seq=ts_seq, default="earliest"
        )
        start = _loss_checked(start, state, opts)
        end = _offsets.resolve_end(opts.ending, state, layout.partitions)
        parts = _to_partitions(layout, plan.mode, _offsets.ranges(start, end))
        if not parts:  # Spark wants at least one partition; an empty range reads nothing
            p = layout.partitions[0]
            parts = _to_partitions(layout, plan.mode, [(p, 0, 0)])
        return parts

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NatsRange), partition  # what partitions() planned
        return _read_range(self.opts, self.schema, partition)


class PcgroupsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read with admission control (``maxOffsetsPerTrigger``) and ``Trigger.AvailableNow``.

    Offsets live in Spark's checkpoint only: the reader creates no consumer and acks nothing."""

    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        _check_schema(schema)
        if opts.ending_given:
            raise ConfigError("endingOffsets is for batch reads only")
        self.opts, self.schema = opts, schema
        self._target: int | None = None
        self._plan: _nats.ReadPlan | None = None
        self._latest: int | None = None
        self._driver: _Driver | None = None

    def __getstate__(self) -> dict[str, Any]:  # shipped to executors for read(): options only
        d = dict(self.__dict__)
        d["_driver"] = None
        return d

    def _run(self, fn: Callable[[Client], Awaitable[T]]) -> T:
        if self._driver is None:
            self._driver = _Driver(self.opts)
        return self._driver.run(fn)

    def _state(self) -> StreamState:
        """The stream's state now (one STREAM.INFO); resolves the layout on first use."""
        if self._plan is None:
            return self._resolved().state
        stream = self._plan.layout.stream
        info = self._run(lambda nc: _nats.stream_info(nc, self.opts.conn, stream))
        return StreamState.from_info(info)

    def _resolved(self) -> _nats.ReadPlan:
        """The read plan (layout, read mode), resolved on first use."""
        if self._plan is None:
            self._plan = self._run(lambda nc: _nats.resolve(nc, self.opts))
        return self._plan

    def initialOffset(self) -> dict[str, Any]:
        state = self._state()
        layout = self._resolved().layout
        ts_seq = None
        at = self.opts.starting_timestamp_ms
        if at is not None:
            ts_seq = self._run(lambda nc: _nats.seq_at_time(nc, self.opts.conn, layout.stream, at, state.allow_direct))
        start = _offsets.resolve_start(
            self.opts.starting, state, layout.partitions, timestamp_seq=ts_seq, default="latest"
        )
        return _offsets.to_json(layout.stream, start)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._state().latest

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        state = self._state()
        layout = self._resolved().layout
        s = _loss_checked(_offsets.from_json(layout, start), state, self.opts)
        self._latest = state.latest
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = _offsets.next_end(s, state.latest, max_rows, self._target)
        return _offsets.to_json(layout.stream, end)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if self._plan is None or self._latest is None:
            return None
        return _offsets.to_json(self._plan.layout.stream, dict.fromkeys(self._plan.layout.partitions, self._latest))

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[NatsRange]:
        plan = self._resolved()
        layout = plan.layout
        s, e = _offsets.from_json(layout, start), _offsets.from_json(layout, end)
        # a partition whose end is below its start was reset (failOnDataLoss=false on a recreated stream)
        s = {p: (v if v <= e[p] else 1) for p, v in s.items()}
        return _to_partitions(layout, plan.mode, _offsets.ranges(s, e))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NatsRange), partition  # what partitions() planned
        return _read_range(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # nothing to do: JetStream keeps no state for Spark

    def stop(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None


# ---------------------------------------------------------------------------------------------
# writing


@dataclass
class PublishStats(WriterCommitMessage):
    partition: int
    published: int
    duplicates: int


def _check_sink_schema(opts: SinkOptions, schema: StructType) -> None:
    fields = {f.name: f.dataType for f in schema.fields}
    if "data" not in fields or not isinstance(fields["data"], (BinaryType, StringType)):
        raise ConfigError("the pcgroups sink needs a column data (binary or string)")
    if opts.subject is None and not isinstance(fields.get("subject"), StringType):
        raise ConfigError("the pcgroups sink needs a string column subject, or the option subject")
    h = fields.get("headers")
    if h is not None and not (
        isinstance(h, MapType) and isinstance(h.keyType, StringType) and isinstance(h.valueType, StringType)
    ):
        raise ConfigError("the column headers must be a map<string,string>")
    m = fields.get("msg_id")
    if m is not None and not isinstance(m, StringType):
        raise ConfigError("the column msg_id must be a string")


class _Publisher:
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        _check_sink_schema(opts, schema)
        self.opts = opts
        names = set(schema.names)
        self.has_subject = "subject" in names and opts.subject is None
        self.has_headers = "headers" in names and opts.include_headers
        self.has_msg_id = "msg_id" in names

    def _rows(self, batches: Iterable[Any], id_base: str) -> Iterator[tuple[str, bytes, dict[str, str] | None]]:
        i = 0
        fixed = self.opts.subject
        for rb in batches:
            cols = {
                name: rb.column(name).to_pylist()
                for name in rb.schema.names
                if name in ("subject", "data", "headers", "msg_id")
            }
            data = cols["data"]
            subjects = cols.get("subject") if self.has_subject else None
            headers = cols.get("headers") if self.has_headers else None
            ids = cols.get("msg_id") if self.has_msg_id else None
            for j in range(len(data)):
                subject = fixed or (subjects[j] if subjects is not None else None)
                if not subject:
                    raise PCGroupsError(f"row {i} has no subject")
                payload = data[j]
                if payload is None:
                    payload = b""
                elif isinstance(payload, str):
                    payload = payload.encode()
                hdrs = dict(headers[j]) if headers is not None and headers[j] else {}
                mid = ids[j] if ids is not None and ids[j] is not None else f"{id_base}:{i}"
                hdrs["Nats-Msg-Id"] = mid
                yield subject, payload, hdrs
                i += 1

    def publish(self, batches: Iterable[Any], id_base: str, partition: int) -> PublishStats:
        opts = self.opts
        loop = asyncio.new_event_loop()
        nc = None
        try:
            nc = loop.run_until_complete(_nats.connect(opts.conn, name="pcgroups-spark-sink", reconnect=False))
            js = nc.jetstream(timeout=opts.conn.timeout, publish_async_max_pending=max(opts.max_pending_acks, 1))
            sent, dups = loop.run_until_complete(
                _nats.publish_all(
                    js,
                    self._rows(batches, id_base),
                    window=opts.max_pending_acks,
                    timeout=opts.conn.timeout,
                    expected_stream=opts.expected_stream,
                )
            )
            return PublishStats(partition, sent, dups)
        finally:
            if nc is not None:
                try:
                    loop.run_until_complete(asyncio.wait_for(nc.close(), 5))
                except Exception:
                    pass
            loop.close()


def _task_context() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # pragma: no cover - write() always runs in a task
        raise PCGroupsError("the pcgroups sink must run inside a Spark task")
    return ctx


class PcgroupsBatchWriter(DataSourceArrowWriter):
    """``df.write.format("pcgroups").mode("append")``: message ids ``<prefix>:<task partition>:<row>``.

    ``prefix`` is the ``msgIdPrefix`` option, or a random id per write job: retried tasks of one job
    write no duplicates; re-running the whole job does only with the same ``msgIdPrefix``."""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("the pcgroups sink only appends (publishing cannot overwrite a stream); use mode append")
        self.pub = _Publisher(opts, schema)
        self.prefix = opts.msg_id_prefix or uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> PublishStats:
        pid = _task_context().partitionId()
        return self.pub.publish(iterator, f"{self.prefix}:{pid}", pid)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_stats(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("pcgroups sink: write aborted; messages already published stay in the stream")


class PcgroupsStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("pcgroups")``: message ids ``<prefix>:<batch id>:<task partition>:<row>``.

    ``prefix`` is the ``msgIdPrefix`` option or the query id (stable across restarts from the same
    checkpoint), so a micro-batch replayed after a failure publishes the same ids and the stream drops
    them as duplicates (within its duplicate window).

    Output modes: append, and complete (``overwrite``): a stream cannot be truncated, so complete mode
    publishes the whole result table every micro-batch, as Spark's Kafka sink does; with a ``msg_id``
    derived from the row's values, unchanged rows are dropped by the stream as duplicates. (Spark
    offers update mode to no Python sink.)"""

    def __init__(self, opts: SinkOptions, schema: StructType, overwrite: bool) -> None:
        self.pub = _Publisher(opts, schema)
        self.prefix = opts.msg_id_prefix

    def write(self, iterator: Iterator[Any]) -> PublishStats:
        ctx = _task_context()
        pid = ctx.partitionId()
        batch_id = ctx.getLocalProperty("streaming.sql.batchId")
        prefix = self.prefix or ctx.getLocalProperty("sql.streaming.queryId")
        if batch_id is None or prefix is None:
            raise PCGroupsError("the pcgroups stream sink cannot see the micro-batch id (streaming.sql.batchId)")
        return self.pub.publish(iterator, f"{prefix}:{batch_id}:{pid}", pid)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_stats(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "pcgroups sink: batch %s aborted; messages already published stay in the stream (a replay "
            "publishes the same message ids, which the stream drops as duplicates)",
            batchId,
        )


def _log_stats(messages: Iterable[WriterCommitMessage | None], batch_id: int | None) -> None:
    stats = [m for m in messages if isinstance(m, PublishStats)]
    log.info(
        "pcgroups sink%s: published %d messages (%d duplicates dropped by the stream)",
        "" if batch_id is None else f" batch {batch_id}",
        sum(s.published for s in stats),
        sum(s.duplicates for s in stats),
    )
