"""Chunk storage bindings, imported as ``slts.bindings``.

``from_url(url)`` builds a binding from its URL; each scheme's module is imported only
when used, so a missing optional SDK only matters to those who use its scheme:

=============================== ==========================================
``memory://NAME``               ``MemoryChunkStorage`` (one per NAME in a process until ``discard_memory``)
``file:///path``                ``FileSystemChunkStorage``
``s3://bucket/prefix?...``      S3 binding (boto3, extra ``s3``)
``hdfs://host:port/path``       HDFS binding (pyhdfs, extra ``hdfs``)
``gs://bucket/prefix?...``      GCS binding (google-cloud-storage, extra ``gcs``)
``azure://container/prefix``    Azure Blob binding (azure-storage-blob, extra ``azure``)
=============================== ==========================================

This package imports nothing from the SLTS core but ``slts.errors``.
"""

from __future__ import annotations

import importlib
import threading
from urllib.parse import urlparse

from slts.errors import InvalidArgument, InvalidConfig

from .base import ChunkHandle, ChunkInfo, ChunkStorage, ConcatSource

__all__ = [
    "ChunkHandle",
    "ChunkInfo",
    "ChunkStorage",
    "ConcatSource",
    "discard_memory",
    "from_url",
    "memory_urls",
]

#: scheme -> (module, class, pip extra that provides its SDK or None)
_REGISTRY: dict[str, tuple[str, str, str | None]] = {
    "memory": ("slts.bindings.memory", "MemoryChunkStorage", None),
    "file": ("slts.bindings.filesystem", "FileSystemChunkStorage", None),
    "s3": ("slts.bindings.s3", "S3ChunkStorage", "s3"),
    "hdfs": ("slts.bindings.hdfs", "HdfsChunkStorage", "hdfs"),
    "gs": ("slts.bindings.gcs", "GcsChunkStorage", "gcs"),
    "azure": ("slts.bindings.azure", "AzureChunkStorage", "azure"),
}

_memory_lock = threading.Lock()
_memory_instances: dict[str, ChunkStorage] = {}


def from_url(url: str) -> ChunkStorage:
    """Build the binding for ``url``.

    Raises ``InvalidConfig`` for an unknown scheme, a malformed URL, or a scheme whose
    SDK is not installed (the message names the pip extra to install).
    """
    if not isinstance(url, str) or "://" not in url:
        raise InvalidConfig(f"not a chunk storage URL (scheme://...): {url!r}")
    scheme = urlparse(url).scheme
    if scheme not in _REGISTRY:
        known = ", ".join(sorted(_REGISTRY))
        raise InvalidConfig(f"unknown chunk storage scheme {scheme!r} in {url!r}; known: {known}")
    module_name, class_name, extra = _REGISTRY[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        hint = f" (pip install 'slts[{extra}]')" if extra else ""
        raise InvalidConfig(f"the {scheme}:// binding is not available{hint}: {exc}") from exc
    cls = getattr(module, class_name)
    if scheme == "memory":
        with _memory_lock:
            if url not in _memory_instances:
                _memory_instances[url] = cls(url)
            return _memory_instances[url]
    return cls.from_url(url)


def memory_urls() -> list[str]:
    """The ``memory://`` URLs whose shared store this process holds (built by ``from_url``
    and not discarded), sorted."""
    with _memory_lock:
        return sorted(_memory_instances)


def discard_memory(url: str) -> None:
    """Forget the process's shared store of the ``memory://`` URL ``url``: its chunks are
    gone once nobody else holds the binding, and the next ``from_url(url)`` builds an empty
    one. A URL with no store is left as it is (nothing to forget). A binding still held
    keeps working on its own chunks; it is no longer shared.

    Raises ``InvalidArgument`` for anything but a ``memory://`` URL (nothing is changed).
    """
    if not isinstance(url, str) or not url.startswith("memory://"):
        raise InvalidArgument(f"not a memory:// chunk storage URL: {url!r}")
    with _memory_lock:
        _memory_instances.pop(url, None)
