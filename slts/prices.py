"""The rates ``slts cost`` prices a container's usage with (``slts.cost``): configurable
like any setting (``[prices]`` in ``slts.toml``, ``SLTS_PRICES_<RATE>``, ``--set
prices.<rate>=N``; ``docs/config.md``), defaulting to public list prices of the store's
service (``list_prices``): S3 Standard, Google Cloud Storage for a ``gs://`` store, Azure
Blob Storage for an ``azure://`` store."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

from slts.errors import InvalidArgument

GiB = 1 << 30
#: Where the default rates come from, and when.
PRICES_SOURCE = "Amazon S3 Standard list prices, US East (N. Virginia), as published in 2025"


@dataclass(frozen=True, slots=True)
class Prices:
    """Rates in one currency (the defaults: US dollars, see ``PRICES_SOURCE``)."""

    #: Storage, per GB-month (GB = 2^30 bytes).
    storage_gb_month: float = 0.023
    #: PUT, COPY, POST (multipart) and LIST requests, per 1,000.
    put_per_1000: float = 0.005
    #: GET, HEAD and every other request, per 1,000.
    get_per_1000: float = 0.0004
    #: DELETE requests, per 1,000.
    delete_per_1000: float = 0.0
    #: Bytes sent to the storage, per GB (free into a region).
    upload_gb: float = 0.0
    #: Bytes received from the storage, per GB (free within a region).
    download_gb: float = 0.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise InvalidArgument(f"price {field.name} must be a number >= 0, got {value!r}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, float], defaults: Prices | None = None) -> Prices:
        """The prices of the dotted ``prices.<rate>`` settings (``PRICE_KEYS``); the rest as
        in ``defaults`` (S3's list prices if None)."""
        base = dataclasses.asdict(defaults) if defaults is not None else {}
        return cls(**{**base, **{key.removeprefix("prices."): value for key, value in settings.items()}})

    def per_request(self, kind: str) -> float:
        """The price of one request of ``kind``."""
        if kind in ("PUT", "COPY", "MULTIPART", "LIST"):
            return self.put_per_1000 / 1000
        if kind == "DELETE":
            return self.delete_per_1000 / 1000
        return self.get_per_1000 / 1000

    def requests(self, counts: Mapping[str, int]) -> float:
        """What ``counts`` requests (by kind) cost."""
        return sum(count * self.per_request(kind) for kind, count in counts.items())

    def transfer(self, sent: int, received: int) -> float:
        """What bytes sent to and received from the storage cost (copies inside it are free)."""
        return sent / GiB * self.upload_gb + received / GiB * self.download_gb


#: Where the GCS rates come from, and when: Standard storage in one region (us-central1;
#: $0.000027397 per GiB-hour, 0.020 a GiB-month), Class A operations (objects.insert, compose,
#: list: the binding's PUT, COPY and LIST) and Class B operations (objects.get, media and
#: metadata: GET and HEAD) per 1,000, objects.delete free, traffic within the region free.
GCS_PRICES_SOURCE = (
    "Google Cloud Storage Standard list prices, region us-central1, from cloud.google.com/storage/pricing"
    " as read on 2026-09-20"
)
GCS_PRICES = Prices(storage_gb_month=0.020, put_per_1000=0.005, get_per_1000=0.0004, delete_per_1000=0.0)

#: The price settings, as dotted keys (``[prices]`` in ``slts.toml``).
PRICE_KEYS: tuple[str, ...] = tuple(f"prices.{field.name}" for field in dataclasses.fields(Prices))


#: Azure Blob Storage's list prices (``list_prices`` for ``azure://`` stores), in the same
#: request classes: write operations (Put Blob, Append Block, Put Block, Put Block List, Put
#: Block From URL) and List Blobs at ``put_per_1000``; reads (Get Blob) and all other
#: operations (Get Blob Properties, Get Block List) at ``get_per_1000``; Delete Blob free;
#: no retrieval charge on the Hot tier; transfers within the region free.
AZURE_PRICES = Prices(
    storage_gb_month=0.018,  # Hot, LRS, first 50 TB
    put_per_1000=0.0065,  # $0.065 per 10,000 write or list operations
    get_per_1000=0.0005,  # $0.005 per 10,000 read or other operations
    delete_per_1000=0.0,
)
AZURE_PRICES_SOURCE = (
    "Azure Blob Storage list prices, Hot tier, LRS, East US, pay-as-you-go, as published in 2025"
    " (Microsoft's page was not reachable from here: checked against public calculators' tables)"
)


#: The list prices of each service with its own, by URL scheme; S3's for every other store.
_SERVICE_PRICES: dict[str, tuple[Prices, str]] = {
    "gs": (GCS_PRICES, GCS_PRICES_SOURCE),
    "azure": (AZURE_PRICES, AZURE_PRICES_SOURCE),
}


def list_prices(store_url: str | None) -> tuple[Prices, str]:
    """The default rates for a store (by its URL's scheme) and where they come from."""
    scheme = store_url.partition("://")[0] if isinstance(store_url, str) and "://" in store_url else ""
    return _SERVICE_PRICES.get(scheme, (Prices(), PRICES_SOURCE))
