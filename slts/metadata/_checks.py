"""Argument checks shared by every metadata store, so that all of them refuse the same input.

Each check raises ``InvalidArgument`` naming what was wrong; none touches a store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter

from slts.errors import InvalidArgument, VersionConflict
from slts.metadata.store import (
    KEY_BYTES_MAX,
    SEQUENCE_MAX,
    CommitOp,
    Delete,
    DeleteKeys,
    DeleteRange,
    Expect,
    Operation,
    Put,
    Row,
)

#: Table names starting with this are reserved for a store's own bookkeeping.
RESERVED_TABLE_PREFIX = "__slts"

#: The most tables one store may hold (LMDB sizes its table of sub-databases up front).
TABLES_MAX = 120

#: The most operations plus expectations in one commit (one LMDB write transaction).
COMMIT_ITEMS_MAX = 100_000


def check_tables(tables: Iterable[str]) -> tuple[str, ...]:
    """The table names as a tuple, after checking they are distinct, non-empty and not reserved."""
    if isinstance(tables, str):
        raise InvalidArgument("tables must be a sequence of names, not one string", tables=tables)
    names = tuple(tables)
    if not names:
        raise InvalidArgument("a store needs at least one table")
    if len(names) > TABLES_MAX:
        raise InvalidArgument(f"at most {TABLES_MAX} tables", count=len(names))
    if len(set(names)) != len(names):
        raise InvalidArgument("table names must be distinct", tables=names)
    for name in names:
        if not isinstance(name, str) or not name:
            raise InvalidArgument("a table name must be a non-empty str", table=name)
        if name.startswith(RESERVED_TABLE_PREFIX):
            raise InvalidArgument(
                f"table names starting with {RESERVED_TABLE_PREFIX!r} are reserved", table=name
            )
        if len(name.encode("utf-8")) > KEY_BYTES_MAX:
            raise InvalidArgument("table name too long", table=name)
    return names


def check_table(tables: Iterable[str], table: object) -> str:
    """``table`` if it is one of ``tables``."""
    if not isinstance(table, str) or table not in tables:
        raise InvalidArgument(f"unknown table {table!r}", table=table)
    assert isinstance(table, str)
    return table


def check_bound(name: str, value: object) -> bytes:
    """A read bound (any ``bytes``, including empty or longer than a key may be)."""
    if not isinstance(value, bytes):
        raise InvalidArgument(f"{name} must be bytes, not {type(value).__name__}", **{name: value})
    return value


def check_key(table: str, key: object) -> bytes:
    """A key that may be written: ``bytes`` of 1 to ``KEY_BYTES_MAX`` bytes."""
    if not isinstance(key, bytes):
        raise InvalidArgument(f"key must be bytes, not {type(key).__name__}", table=table, key=key)
    if not 1 <= len(key) <= KEY_BYTES_MAX:
        raise InvalidArgument(f"key must be 1 to {KEY_BYTES_MAX} bytes", table=table, key=key[:64])
    return key


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_limit(limit: object, what: str = "scan") -> int:
    """A scan (or ``changes``) limit: an int >= 1."""
    if not _is_int(limit) or limit < 1:  # type: ignore[operator]
        raise InvalidArgument(f"{what} limit must be an int >= 1", limit=limit)
    assert isinstance(limit, int)
    return limit


def check_sequence_bound(name: str, value: object) -> int:
    """A sequence used as a bound (``changes``' after, ``discard_changes``' through): an int
    >= 0 (any size; stores clamp it to ``SEQUENCE_MAX``)."""
    if not _is_int(value) or value < 0:  # type: ignore[operator]
        raise InvalidArgument(f"{name} must be an int >= 0", **{name: value})
    assert isinstance(value, int)
    return value


def check_scan(start: object, stop: object, limit: object) -> None:
    """The arguments of ``scan``: bytes bounds (``stop`` may be None) and a limit >= 1."""
    check_bound("start", start)
    if stop is not None:
        check_bound("stop", stop)
    check_limit(limit)


def check_commit(tables: Iterable[str], ops: Sequence[CommitOp], expect: Sequence[Expect]) -> None:
    """Everything ``commit`` checks before it looks at the store."""
    if isinstance(ops, (Put, Delete, DeleteRange, DeleteKeys)) or isinstance(expect, Expect):
        raise InvalidArgument("ops and expect must be sequences, not a single item")
    items = len(ops) + len(expect)
    if items > COMMIT_ITEMS_MAX:
        raise InvalidArgument(f"at most {COMMIT_ITEMS_MAX} operations and expectations per commit")
    for op in ops:
        if type(op) is Put or type(op) is Delete:  # the common case, checked inline (no calls)
            table, key = op.table, op.key
            if (
                type(table) is str
                and table in tables
                and type(key) is bytes
                and 0 < len(key) <= KEY_BYTES_MAX
                and (not isinstance(op, Put) or type(op.value) is bytes)
            ):
                continue
        if isinstance(op, Put):
            check_key(check_table(tables, op.table), op.key)
            if not isinstance(op.value, bytes):
                raise InvalidArgument("value must be bytes", table=op.table, key=op.key)
        elif isinstance(op, Delete):
            check_key(check_table(tables, op.table), op.key)
        elif isinstance(op, DeleteRange):
            check_range(tables, op)
        elif isinstance(op, DeleteKeys):
            items += check_keys(tables, op) - 1
            if items > COMMIT_ITEMS_MAX:
                raise InvalidArgument(
                    f"at most {COMMIT_ITEMS_MAX} operations and expectations per commit "
                    "(a DeleteKeys counts its keys)"
                )
        else:
            raise InvalidArgument(f"not an operation: {op!r}")
    for condition in expect:
        if type(condition) is Expect:  # the common case, checked inline (no calls)
            table, key, version = condition.table, condition.key, condition.version
            if (
                type(table) is str
                and table in tables
                and type(key) is bytes
                and 0 < len(key) <= KEY_BYTES_MAX
                and type(version) is int
                and version >= 0
            ):
                continue
        if not isinstance(condition, Expect):
            raise InvalidArgument(f"not an expectation: {condition!r}")
        check_key(check_table(tables, condition.table), condition.key)
        version = condition.version
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidArgument(
                "expected version must be an int >= 0", table=condition.table, key=condition.key
            )


def check_keys(tables: Iterable[str], op: DeleteKeys) -> int:
    """A ``DeleteKeys``: a known table, a tuple of keys each valid as ``check_key``'s; how
    many keys it names. (One loop over the keys: this is the bulk path.)"""
    table = check_table(tables, op.table)
    keys = op.keys
    if not isinstance(keys, tuple):
        raise InvalidArgument(f"DeleteKeys.keys must be a tuple, not {type(keys).__name__}", table=table)
    for key in keys:
        if type(key) is not bytes or not 1 <= len(key) <= KEY_BYTES_MAX:
            check_key(table, key)  # raises, saying what is wrong (a bytes subclass passes)
    return len(keys)


def check_range(tables: Iterable[str], op: DeleteRange) -> None:
    """A ``DeleteRange``: a known table, bytes bounds, ``start < stop``."""
    check_table(tables, op.table)
    check_bound("start", op.start)
    check_bound("stop", op.stop)
    if not op.start < op.stop:
        raise InvalidArgument(
            "a DeleteRange needs start < stop", table=op.table, start=op.start[:64], stop=op.stop[:64]
        )


def check_replicate(
    tables: Iterable[str],
    sequence: object,
    ops: Sequence[Operation],
    versions: Sequence[int] | None,
) -> tuple[int, ...]:
    """Everything ``replicate`` checks before it looks at the store (all but ``sequence >=
    last_sequence``); the version each op writes (``sequence`` where none was given).
    Replication applies captured changes, which hold per-key operations only: a
    ``DeleteRange`` or ``DeleteKeys`` is refused."""
    check_commit(tables, ops, ())
    if any(isinstance(op, (DeleteRange, DeleteKeys)) for op in ops):
        raise InvalidArgument(
            "replicate applies per-key operations (a captured change), not a DeleteRange or DeleteKeys"
        )
    if not _is_int(sequence) or not 1 <= sequence <= SEQUENCE_MAX:  # type: ignore[operator]
        raise InvalidArgument(f"replicated sequence must be an int in [1, {SEQUENCE_MAX}]", sequence=sequence)
    assert isinstance(sequence, int)
    if versions is None:
        return (sequence,) * len(ops)
    if isinstance(versions, (bytes, str)) or not isinstance(versions, Sequence):
        raise InvalidArgument("versions must be a sequence of ints (one per op) or None")
    if len(versions) != len(ops):
        raise InvalidArgument(
            f"versions has {len(versions)} entries for {len(ops)} ops (one per op)",
            versions=len(versions),
            ops=len(ops),
        )
    for index, (op, version) in enumerate(zip(ops, versions, strict=True)):
        if not _is_int(version):
            raise InvalidArgument(f"versions[{index}] is not an int", version=version)
        if isinstance(op, Put) and not 1 <= version <= sequence:
            raise InvalidArgument(
                f"versions[{index}] = {version} is outside [1, sequence={sequence}]",
                table=op.table,
                key=op.key,
                version=version,
                sequence=sequence,
            )
    return tuple(versions)


def check_replicate_sequence(sequence: object) -> int:
    """A replicated sequence: an int in [1, ``SEQUENCE_MAX``]."""
    if not _is_int(sequence) or not 1 <= sequence <= SEQUENCE_MAX:  # type: ignore[operator]
        raise InvalidArgument(f"replicated sequence must be an int in [1, {SEQUENCE_MAX}]", sequence=sequence)
    assert isinstance(sequence, int)
    return sequence


def sorted_rows(tables: Iterable[str], rows: object) -> list[tuple[str, list[Row]]]:
    """The rows of ``replicate_rows`` checked (all but the versions' upper bound, the
    sequence), each table's sorted by key: (table, rows) for each table, in ``rows``'
    order. Raises ``InvalidArgument`` for what ``replicate`` refuses of the operations the
    rows stand for, for a row that is not a 3-item tuple or list, and for a key given
    twice in a table. One tight pass per table: restore loads every entry through it."""
    if not isinstance(rows, Mapping):
        raise InvalidArgument(f"rows must map table names to rows, not {type(rows).__name__}")
    checked: list[tuple[str, list[Row]]] = []
    total = 0
    for table, table_rows in rows.items():
        check_table(tables, table)
        if isinstance(table_rows, (bytes, str)) or not isinstance(table_rows, Sequence):
            raise InvalidArgument(
                f"rows of {table!r} must be a sequence of (key, version, value)", table=table
            )
        total += len(table_rows)
        if total > COMMIT_ITEMS_MAX:
            raise InvalidArgument(f"at most {COMMIT_ITEMS_MAX} rows per replicate_rows")
        ordered = sorted_by_key(table_rows)
        if ordered is None:
            ordered = sorted(table_rows, key=_row_key)  # raises what is wrong
        previous = None
        for row in ordered:
            key, version, value = row
            if type(key) is not bytes or not 0 < len(key) <= KEY_BYTES_MAX or key == previous:
                _refuse_row(table, row, previous)
            if (value is not None and type(value) is not bytes) or type(version) is not int:
                _refuse_row(table, row, previous)
            previous = key
        checked.append((table, ordered))
    return checked


def sorted_by_key(rows: Sequence[Row]) -> list[Row] | None:
    """``rows`` sorted by key if each is a 3-item tuple or list and the keys sort (all
    bytes, say); None otherwise (``sorted_rows`` then says what is wrong). C-speed passes:
    restore sorts every row it loads."""
    if not rows:
        return []
    if not _ROW_TYPES.issuperset(map(type, rows)) or set(map(len, rows)) != {3}:
        return None
    try:
        return sorted(rows, key=_FIRST)
    except TypeError:
        return None


_ROW_TYPES = frozenset((tuple, list))
_FIRST = itemgetter(0)


def _row_key(row: object) -> bytes:
    """The sort key of a row; ``InvalidArgument`` for what is not a 3-item row with a
    bytes key (sorting must not compare keys of other types)."""
    if type(row) not in (tuple, list) or len(row) != 3:  # type: ignore[arg-type]
        raise InvalidArgument(f"a row is a (key, version, value) tuple or list, not {row!r}"[:200])
    key = row[0]  # type: ignore[index]
    if not isinstance(key, bytes):
        raise InvalidArgument(f"key must be bytes, not {type(key).__name__}", key=key)
    return bytes(key)


def _refuse_row(table: str, row: Row, previous: bytes | None) -> None:
    """Raise the ``InvalidArgument`` that says what is wrong with ``row`` (module doc)."""
    key, version, value = row
    check_key(table, key)
    if key == previous:
        raise InvalidArgument(f"key {key!r} given twice in the rows of {table!r}", table=table, key=key)
    if value is not None and not isinstance(value, bytes):
        raise InvalidArgument("value must be bytes", table=table, key=key)
    if not _is_int(version):
        raise InvalidArgument(
            f"the version of row {key!r} is not an int", table=table, key=key, version=version
        )
    # a bytes subclass as key or value: accepted as replicate accepts it (sorted_rows is strict)


def check_replicate_rows(
    tables: Iterable[str], sequence: object, rows: object
) -> tuple[int, list[tuple[str, list[Row]]]]:
    """Everything ``replicate_rows`` checks before it looks at the store (all but
    ``sequence >= last_sequence``): the sequence, and the rows (``sorted_rows``) with each
    put's version in [1, sequence]."""
    checked_sequence = check_replicate_sequence(sequence)
    checked = sorted_rows(tables, rows)
    for table, table_rows in checked:
        for key, version, value in table_rows:
            if value is not None and not 1 <= version <= checked_sequence:
                raise InvalidArgument(
                    f"the version {version} of row {key!r} is outside [1, sequence={checked_sequence}]",
                    table=table,
                    key=key,
                    version=version,
                    sequence=checked_sequence,
                )
    return checked_sequence, checked


def rows_as_ops(tables: Iterable[str], rows: object) -> tuple[list[Operation], list[int]]:
    """The operations and versions ``replicate_rows``' rows stand for (after
    ``sorted_rows``); ``replicate`` checks the rest."""
    ops: list[Operation] = []
    versions: list[int] = []
    for table, table_rows in sorted_rows(tables, rows):
        for key, version, value in table_rows:
            ops.append(Put(table, key, value) if value is not None else Delete(table, key))
            versions.append(version)
    return ops, versions


def check_replicate_order(sequence: int, last: int) -> None:
    """A replicated ``sequence`` may not go below the store's ``last_sequence``."""
    if sequence < last:
        raise InvalidArgument(
            f"replicated sequence {sequence} is lower than the store's last sequence {last}",
            sequence=sequence,
            last_sequence=last,
        )


def conflict(condition: Expect, actual: int) -> VersionConflict:
    """The error for an expectation that did not hold (``actual`` 0: the key is absent)."""
    return VersionConflict(
        f"{condition.table}/{condition.key!r}: expected version {condition.version}, found {actual}",
        table=condition.table,
        key=condition.key,
        expected=condition.version,
        actual=actual,
    )
