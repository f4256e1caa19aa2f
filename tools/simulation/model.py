"""The plain reference model: what every segment must hold."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

#: What the store is observed to hold, and what the model expects, per segment:
#: (start offset, length, sealed, readable bytes).
State = dict[str, tuple[int, int, bool, bytes]]


@dataclass
class Segment:
    """One segment: all bytes from offset 0, the start offset, sealed."""

    data: bytearray = field(default_factory=bytearray)
    start: int = 0
    sealed: bool = False


@dataclass
class Model:
    """Every live segment by name, and which segments were concat targets (chains)."""

    segments: dict[str, Segment] = field(default_factory=dict)
    targets: set[str] = field(default_factory=set)

    def copy(self) -> Model:
        return copy.deepcopy(self)

    def state(self) -> State:
        return {
            name: (s.start, len(s.data), s.sealed, bytes(s.data[s.start :]))
            for name, s in sorted(self.segments.items())
        }


def summary(state: State) -> dict[str, tuple[int, int, bool]]:
    """A state without its bytes (for messages)."""
    return {name: value[:3] for name, value in state.items()}
