"""A column of numbers sent to PostgreSQL as one array in its binary format, made by numpy in one call.

The driver's own binary arrays dump each element in Python (a struct.pack and a type check each): with a big job's
~2,000 numbers a post in the chunks', tiers' and summaries' statements, that was a fifth of the ingest writer's
CPU on PostgreSQL (bench/big_job.py). A column holding a NULL, or a number no int8 holds, goes as the driver's list,
as before. Every connection of the app's engines knows the arrays (`register`, app.core.db.make_engine).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple


class _Int8Array(bytes):
    """An int8[] in PostgreSQL's binary format."""


class _Float8Array(bytes):
    """A float8[] in PostgreSQL's binary format."""


class _Array(NamedTuple):
    """How a SQL type's column goes: its class, how numpy writes an element, the oids of its element type and its
    array type, and the Python type of an element in the driver's list."""

    cls: type[bytes]
    dtype: str
    element_oid: int
    array_oid: int
    python: type


# int8 for every integer type: the statement casts it to its column's type, which checks the range as a cast of
# the driver's list did.
_INT8 = _Array(_Int8Array, ">i8", 20, 1016, int)
_ARRAYS = {"integer": _INT8, "bigint": _INT8, "float8": _Array(_Float8Array, ">f8", 701, 1022, float)}
_HEADER = struct.Struct(">iiIii")  # dimensions, has NULLs, element oid; then the one dimension's size, lower bound


def column(values: Sequence[Any], type_: str) -> Any:
    """`values`, a column of SQL type `type_`, as its array parameter (`%b::type_[]`)."""
    import numpy as np

    array = _ARRAYS.get(type_)
    if array is None:
        return list(values)
    if None in values:  # the driver's list: its elements of one Python type, as its binary format needs
        return [value if value is None else array.python(value) for value in values]
    records = np.empty(len(values), [("size", ">i4"), ("value", array.dtype)])
    records["size"] = 8
    try:
        records["value"] = values
    except (OverflowError, TypeError, ValueError):  # past int8, or not numbers: the driver says what is wrong
        return list(values)
    return array.cls(_HEADER.pack(1, 0, array.element_oid, len(values), 1) + records.tobytes())


def register(dbapi_connection: Any, _record: object = None) -> None:
    """Teaches a psycopg connection to send the arrays `column` makes (an engine's "connect" event)."""
    for cls, dumper in _dumpers():
        dbapi_connection.adapters.register_dumper(cls, dumper)


@functools.cache
def _dumpers() -> list[tuple[type, type]]:
    """Each array class's dumper: its bytes as they are, as its array type. psycopg is imported here, where
    PostgreSQL is used: it is an extra (`rankboard[postgres]`)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    def dumper(array_oid: int) -> type:
        class ArrayDumper(Dumper):
            format = Format.BINARY
            oid = array_oid

            def dump(self, obj: Any) -> bytes:
                return obj  # one of the array classes: bytes already

        return ArrayDumper

    return [(array.cls, dumper(array.array_oid)) for array in set(_ARRAYS.values())]
