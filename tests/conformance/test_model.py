"""Every binding against a plain model: a dict of bytearrays and a set of read-only names.

A Hypothesis state machine runs random programs of create / write / read / delete /
truncate / concat / set_readonly / reopen and, after every step, checks the listing and
every chunk's bytes (through the binding and through the raw hook) against the model. A
failure shrinks to a short program that can be pasted into a regression test.

Rules mostly act on chunks that exist (drawn from the model), so that programs reach
deep states; ``missing`` covers names that do not. When several errors apply to one call
the model accepts any of them: the contract fixes the error types, not the order in
which a binding checks its arguments.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from slts.bindings import ChunkHandle, ConcatSource

from slts.errors import (
    ChunkExists,
    ChunkInvalidOffset,
    ChunkNotFound,
    ChunkReadOnly,
    UnsupportedOperation,
)
from tests.support.conformance import BindingUnderTest, content

# Few names, so that programs collide on them; hostile on purpose.
NAMES = st.sampled_from(["a", "a/b", "a/", "..", "%", "é/x"])
DATA = st.binary(max_size=40)
SMALL = st.integers(min_value=0, max_value=60)
#: 0-2: a position inside the chunk; 3: just past its end.
PLACE = st.integers(min_value=0, max_value=3)


def position(length: int, draw: int, place: int) -> int:
    """Mostly a position in ``[0, length]``; for ``place == 3`` one just past the end."""
    return draw % (length + 1) if place < 3 else length + 1 + draw % 3


class ChunkStorageModel(RuleBasedStateMachine):
    make_binding: Callable[[], BindingUnderTest]

    def __init__(self) -> None:
        super().__init__()
        self.binding = type(self).make_binding()
        self.storage = self.binding.storage
        self.model: dict[str, bytearray] = {}
        self.readonly: set[str] = set()

    def expect(self, errors: set[type[Exception]], call: Callable[[], object]) -> object:
        """Run ``call``: it must raise one of ``errors`` if any apply, else succeed."""
        if not errors:
            return call()
        with pytest.raises(tuple(errors)):
            call()
        return None

    def existing(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(sorted(self.model)), label="name")

    def has_chunks(self) -> bool:
        return bool(self.model)

    # -- rules --------------------------------------------------------------------------------

    @rule(name=NAMES, data=DATA)
    def create(self, name: str, data: bytes) -> None:
        errors = {ChunkExists} if name in self.model else set()
        if self.expect(errors, lambda: self.storage.create(name, data)) is not None:
            self.model[name] = bytearray(data)

    @rule(name=NAMES)
    def missing(self, name: str) -> None:
        if name in self.model:
            return
        for operation in (self.storage.open_read, self.storage.open_write, self.storage.get_info):
            self.expect({ChunkNotFound}, lambda op=operation: op(name))
        handle = ChunkHandle(name, readonly=False)
        self.expect({ChunkNotFound}, lambda: self.storage.delete(handle))
        assert not self.storage.exists(name)

    @precondition(has_chunks)
    @rule(data=st.data(), payload=DATA, skew=st.sampled_from([0, 0, 0, 0, 1, -1]))
    def write(self, data: st.DataObject, payload: bytes, skew: int) -> None:
        name = self.existing(data)
        if name in self.readonly:
            self.expect({ChunkReadOnly}, lambda: self.storage.open_write(name))
            return
        handle = self.storage.open_write(name)
        chunk = self.model[name]
        offset = len(chunk) + skew
        errors: set[type[Exception]] = set()
        if skew != 0 or (chunk and not self.storage.supports_append):
            errors.add(ChunkInvalidOffset)
        if self.expect(errors, lambda: self.storage.write(handle, offset, payload)) is not None:
            chunk += payload

    @precondition(has_chunks)
    @rule(data=st.data(), start=SMALL, length=SMALL, place=PLACE)
    def read(self, data: st.DataObject, start: int, length: int, place: int) -> None:
        name = self.existing(data)
        handle = self.storage.open_read(name)
        chunk = self.model[name]
        offset = position(len(chunk), start, place)
        if offset > len(chunk):
            self.expect({ChunkInvalidOffset}, lambda: self.storage.read(handle, offset, length))
        else:
            assert self.storage.read(handle, offset, length) == chunk[offset : offset + length]

    @precondition(has_chunks)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        name = self.existing(data)
        self.storage.delete(ChunkHandle(name, readonly=False))
        del self.model[name]
        self.readonly.discard(name)

    @precondition(has_chunks)
    @rule(data=st.data(), keep=SMALL, place=PLACE)
    def truncate(self, data: st.DataObject, keep: int, place: int) -> None:
        name = self.existing(data)
        chunk = self.model[name]
        length = position(len(chunk), keep, place)
        handle = ChunkHandle(name, readonly=False)  # as open_write gave it before any seal
        errors: set[type[Exception]] = set()
        if not self.storage.supports_truncate:
            errors.add(UnsupportedOperation)
        else:
            if name in self.readonly:
                errors.add(ChunkReadOnly)
            if length > len(chunk):
                errors.add(ChunkInvalidOffset)
        if not errors:
            self.storage.truncate(handle, length)
            del chunk[length:]
        else:
            self.expect(errors, lambda: self.storage.truncate(handle, length))

    @precondition(has_chunks)
    @rule(
        data=st.data(),
        into=NAMES,
        count=st.integers(min_value=1, max_value=3),
        stray=st.sampled_from([False, False, False, True]),
    )
    def concat(self, data: st.DataObject, into: str, count: int, stray: bool) -> None:
        target = into
        sources = []
        for _ in range(count):
            # A stray source may be a missing chunk; the others exist.
            name = data.draw(NAMES) if stray else self.existing(data)
            size = len(self.model.get(name, b""))
            offset = position(size, data.draw(SMALL), data.draw(PLACE))
            length = data.draw(st.integers(min_value=0, max_value=max(0, size - offset) + 1))
            sources.append(ConcatSource(name, offset, length))
        errors: set[type[Exception]] = set()
        if not self.storage.supports_concat:
            errors.add(UnsupportedOperation)
        else:
            if target in self.model:
                errors.add(ChunkExists)
            for source in sources:
                if source.name not in self.model:
                    errors.add(ChunkNotFound)
                elif source.offset + source.length > len(self.model[source.name]):
                    errors.add(ChunkInvalidOffset)
        if errors:
            self.expect(errors, lambda: self.storage.concat(target, sources))
            return
        expected = b"".join(self.model[s.name][s.offset : s.offset + s.length] for s in sources)
        assert self.storage.concat(target, sources).length == len(expected)
        self.model[target] = bytearray(expected)

    @precondition(has_chunks)
    @rule(data=st.data(), readonly=st.booleans())
    def set_readonly(self, data: st.DataObject, readonly: bool) -> None:
        name = self.existing(data)
        handle = ChunkHandle(name, readonly=False)
        if not self.storage.supports_readonly:
            self.expect({UnsupportedOperation}, lambda: self.storage.set_readonly(handle, readonly))
            return
        self.storage.set_readonly(handle, readonly)
        if readonly:
            self.readonly.add(name)
        else:
            self.readonly.discard(name)

    @rule()
    def reopen(self) -> None:
        self.storage = self.binding.reopen()

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def storage_matches_model(self) -> None:
        assert list(self.storage.list()) == sorted(self.model)
        for name, chunk in self.model.items():
            assert self.storage.get_info(name).length == len(chunk)
            assert content(self.storage, name) == chunk
            assert self.binding.raw.read(name) == chunk


def test_binding_matches_the_model(make_binding):
    class Machine(ChunkStorageModel):
        pass

    Machine.make_binding = staticmethod(make_binding)
    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=make_binding().model_examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
