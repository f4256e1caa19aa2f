"""What a container costs on an object store: its requests by kind and class, the bytes it
moved and the bytes it stores, priced at configurable rates (``slts cost``).

The inputs are the container's usage records (``slts.usage``: requests by kind, bytes sent,
received and copied, per traffic class, added up by every process that ran the container)
and its layout (the chunk records' stored lengths: the bytes its chunks hold on the storage,
which with transforms on differ from the segment bytes they hold, shown beside them; the
system segments of the journal and the metadata copy are not counted, nor chunks already
unlinked from a segment and waiting for GC, which are counted apart).

**Prices.** ``Prices`` (``slts.prices``) holds the rates; the defaults are the public list prices of Amazon
S3 Standard in US East (N. Virginia) (``PRICES_SOURCE``): storage per GB-month (GB of 2^30
bytes, as AWS bills), PUT, COPY, POST and LIST requests per 1,000 (multipart calls are
POSTs and PUTs), GET and HEAD (and every other request) per 1,000, DELETE free, and data
moved within the region free. They are set in ``slts.toml``'s ``[prices]`` table,
``SLTS_PRICES_<RATE>`` or ``--set prices.<rate>=...`` like any other setting
(``docs/config.md``). Request counts are exact for bindings that count their own requests
(S3); for the others they are the requests the same calls would make on an object store
(``slts.usage.CALL_KINDS``), which is what pricing a move to one needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slts.errors import InvalidArgument
from slts.limiter import TrafficClass
from slts.metadata.records import ChunkRecord
from slts.metadata.schema import CHUNKS, GC, SEGMENTS
from slts.metadata.store import MetadataStore
from slts.prices import PRICE_KEYS, PRICES_SOURCE, GiB, Prices, list_prices
from slts.storage.chunked import ChunkedSegmentStorage
from slts.usage import EMPTY_USAGE, UsageRecord, iter_kinds, read_usage, total_usage


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """What a container's layout holds on the chunk storage."""

    segments: int
    chunks: int
    #: What the chunks hold on the storage, and so what it bills: their stored bytes (with
    #: transforms on, the frames: compressed, with their tags; docs/security.md).
    bytes: int
    #: Chunks unlinked from their segments, waiting for GC (still stored until collected).
    gc_queued_chunks: int
    #: The segment bytes those chunks hold (what reads return): ``bytes`` without transforms.
    logical_bytes: int


@dataclass(frozen=True, slots=True)
class CostReport:
    """A container's usage and layout, priced."""

    container_id: int
    prices: Prices
    stored: StoredBytes
    usage: Mapping[TrafficClass, UsageRecord]
    #: True when the requests are the binding's own count (S3), False when they are the
    #: object store equivalent of its calls.
    exact_requests: bool
    #: Where the default rates come from (the store's service: ``slts.prices.list_prices``).
    prices_source: str = PRICES_SOURCE

    @property
    def total(self) -> UsageRecord:
        return total_usage(self.usage)

    @property
    def storage_per_month(self) -> float:
        return self.stored.bytes / GiB * self.prices.storage_gb_month

    def cost(self, kind: TrafficClass | None = None) -> float:
        """What the requests and transfers of class ``kind`` (None: all) cost so far."""
        record = self.total if kind is None else self.usage.get(kind, EMPTY_USAGE)
        return self.prices.requests(record.requests) + self.prices.transfer(
            record.bytes_sent, record.bytes_received
        )

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values."""

        def usage_json(record: UsageRecord, cost: float) -> dict[str, Any]:
            return {
                "requests": dict(record.requests),
                "bytes_sent": record.bytes_sent,
                "bytes_received": record.bytes_received,
                "bytes_copied": record.bytes_copied,
                "cost": cost,
            }

        return {
            "container": self.container_id,
            "exact_requests": self.exact_requests,
            "stored": dataclasses.asdict(self.stored),
            "storage_cost_per_month": self.storage_per_month,
            "classes": {
                kind.name.lower(): usage_json(record, self.cost(kind)) for kind, record in self.usage.items()
            },
            "total": usage_json(self.total, self.cost()),
            "prices": dataclasses.asdict(self.prices),
            "prices_source": self.prices_source,
        }

    def as_text(self) -> str:
        """The report as a table for people."""
        kinds = list(iter_kinds(self.usage)) or ["PUT", "GET"]
        header = ["class", *kinds, "sent", "received", "copied", "cost"]
        rows = [header]
        for kind in sorted(self.usage):
            rows.append(self._row(kind.name.lower(), self.usage[kind], kinds, self.cost(kind)))
        rows.append(self._row("total", self.total, kinds, self.cost()))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        table = [
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
            for row in rows
        ]
        s = self.stored
        lines = [
            f"container {self.container_id}: {s.segments} segments, {s.chunks} chunks,"
            f" {_size(s.bytes)} stored{_logical(s)} ({s.gc_queued_chunks} chunks awaiting GC):"
            f" {_money(self.storage_per_month)} per month",
            "requests since the container's first recorded use"
            + ("" if self.exact_requests else " (as an object store would count this binding's calls)")
            + ":",
            *table,
            f"prices: {self.prices_source} unless set in [prices] (docs/config.md)",
        ]
        return "\n".join(lines)

    @staticmethod
    def _row(label: str, record: UsageRecord, kinds: list[str], cost: float) -> list[str]:
        return [
            label,
            *(f"{record.requests.get(kind, 0):,}" for kind in kinds),
            _size(record.bytes_sent),
            _size(record.bytes_received),
            _size(record.bytes_copied),
            _money(cost),
        ]


def stored_bytes(store: MetadataStore) -> StoredBytes:
    """Segments, chunks and their bytes in ``store``, and the GC queue's length (read page
    by page: a large store is not read in one transaction)."""
    segments = sum(1 for _ in store.iterate(SEGMENTS))
    chunks = stored = logical = 0
    for _, versioned in store.iterate(CHUNKS):
        chunk = ChunkRecord.decode(versioned.value)
        chunks += 1
        stored += chunk.stored
        logical += chunk.length
    queued = sum(1 for _ in store.iterate(GC))
    return StoredBytes(segments, chunks, stored, queued, logical)


def cost_report(storage: ChunkedSegmentStorage, prices: Prices) -> CostReport:
    """The cost report of ``storage``'s container at ``prices`` (its recorded usage and its
    layout, read from its metadata store)."""
    if not isinstance(storage, ChunkedSegmentStorage):
        raise InvalidArgument(f"{storage!r} is not a ChunkedSegmentStorage")
    if not isinstance(prices, Prices):
        raise InvalidArgument(f"prices must be Prices, got {type(prices).__name__}")
    store, container_id = storage.context.store, storage.container_id
    exact_requests = storage.chunk_storage.counts_own_requests
    with store.snapshot() as view:
        usage = read_usage(view, container_id)
    source = list_prices(storage.chunk_storage.url)[1]
    return CostReport(container_id, prices, stored_bytes(store), usage, exact_requests, source)


def _logical(stored: StoredBytes) -> str:
    """Beside the stored size, the logical one where transforms made them differ."""
    if stored.logical_bytes == stored.bytes:
        return ""
    ratio = stored.bytes / max(stored.logical_bytes, 1)
    return f" for {_size(stored.logical_bytes)} of segment data ({ratio:.2f})"


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _money(amount: float) -> str:
    return f"${amount:.6f}" if amount < 1 else f"${amount:,.2f}"


__all__ = [
    "PRICES_SOURCE",
    "PRICE_KEYS",
    "CostReport",
    "GiB",
    "Prices",
    "StoredBytes",
    "cost_report",
    "stored_bytes",
]
