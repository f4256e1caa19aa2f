"""The rates ``slts cost`` prices a container's usage with (``slts.cost``): configurable
like any setting (``[prices]`` in ``slts.toml``, ``SLTS_PRICES_<RATE>``, ``--set
prices.<rate>=N``; ``docs/config.md``), defaulting to public S3 Standard list prices."""

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
    def from_settings(cls, settings: Mapping[str, float]) -> Prices:
        """The prices of the dotted ``prices.<rate>`` settings (``PRICE_KEYS``); the rest default."""
        return cls(**{key.removeprefix("prices."): value for key, value in settings.items()})

    @classmethod
    def list_prices(cls, url: str | None) -> tuple[Prices, str]:
        """The default rates for a chunk storage URL and where they come from: Google Cloud
        Storage's for ``gs://`` (``GCS_PRICES``), S3's for everything else."""
        if isinstance(url, str) and url.startswith("gs://"):
            return GCS_PRICES, GCS_PRICES_SOURCE
        return cls(), PRICES_SOURCE

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
