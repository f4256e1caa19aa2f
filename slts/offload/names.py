"""The SLTS segment names of offloaded objects: Pulsar's object keys under ``offload/``.

A ledger offload (PIP-17) writes ``offload/<uid>-ledger-<ledger id>`` and its
``-index``; a streaming segment (PIP-76) ``offload/<managed ledger>/<uid>`` and its
``-index``. The uid in every name means two attempts never share an object.
"""

from __future__ import annotations

import uuid

#: The folder of the offloaded objects.
FOLDER = "offload"


def data_name(ledger_id: int, uid: uuid.UUID) -> str:
    """The SLTS segment of a ledger's data object (Pulsar's object key under ``offload/``)."""
    return f"{FOLDER}/{uid}-ledger-{ledger_id}"


def index_name(ledger_id: int, uid: uuid.UUID) -> str:
    """The SLTS segment of a ledger's index object."""
    return f"{data_name(ledger_id, uid)}-index"


def segment_name(managed_ledger: str, uid: uuid.UUID) -> str:
    """The SLTS segment of a streaming segment's data object."""
    return f"{FOLDER}/{managed_ledger}/{uid}"


def segment_index_name(managed_ledger: str, uid: uuid.UUID) -> str:
    """The SLTS segment of a streaming segment's index object."""
    return f"{segment_name(managed_ledger, uid)}-index"
