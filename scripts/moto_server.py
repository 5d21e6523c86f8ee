"""Starts moto's server with three fixes for testing: requests to each emulated service
run one at a time, and a DynamoDB transaction or query no longer reads whole tables
(below).

moto's DynamoDB TransactWriteItems deep-copies the table for rollback without a lock, so a
concurrent write to the same table crashes it ("dictionary changed size during
iteration"). Real DynamoDB has no such limit, and Pulse's worker runs sessions
concurrently, so the tests would trip over it. moto is bound by Python's GIL anyway, so
serialising its request handlers costs little.

Usage: python scripts/moto_server.py -H 127.0.0.1 -p PORT
"""

import threading

from moto.core import responses

_lock = threading.Lock()
_call_action = responses.BaseResponse.call_action


def _serialised(self):
    with _lock:
        return _call_action(self)


responses.BaseResponse.call_action = _serialised


# A second fix, for speed: moto's TransactWriteItems deep-copies every table it names,
# once per item of the transaction, to roll back on a failed condition; a transaction
# then costs time in proportion to the whole table, and a long test's table grows to
# thousands of items. A transaction writes only the items it names, so those are what
# is kept here (their attributes, or that they were absent) and put back if it fails,
# while the whole-table copy is skipped. Anything this cannot read falls back to
# moto's own copy.
import copy as _copy  # noqa: E402
import types as _types  # noqa: E402

from moto.dynamodb import models as _dynamodb  # noqa: E402
from moto.dynamodb.models.table import Table as _Table  # noqa: E402

_skip_table_copy = threading.local()


def _deepcopy(value, memo=None):
    if getattr(_skip_table_copy, "on", False) and isinstance(value, _Table):
        return value
    return _copy.deepcopy(value, memo)


_dynamodb.copy = _types.SimpleNamespace(
    **{name: getattr(_copy, name) for name in dir(_copy) if not name.startswith("__")}
)
_dynamodb.copy.deepcopy = _deepcopy
_transact = _dynamodb.DynamoDBBackend.transact_write_items


def _named_items(backend, transact_items):
    """(table, key, attributes or None) of each item a transaction names, before it."""
    kept = []
    for entry in transact_items:
        op_type, op = next(iter(entry.items()))
        name = op["TableName"]
        table = backend.get_table(name)
        if op_type == "Put":
            attrs = op["Item"]
            key = {table.hash_key_attr: attrs[table.hash_key_attr]}
            if table.range_key_attr is not None:
                key[table.range_key_attr] = attrs[table.range_key_attr]
        else:
            key = op["Key"]
        current = backend.get_item(name, key)
        kept.append((name, key, None if current is None else current.to_json()["Attributes"]))
    return kept


def _transact_keeping_named_items(self, transact_items):
    try:
        kept = _named_items(self, transact_items)
    except Exception:  # noqa: BLE001  (moto's own path says what is wrong)
        return _transact(self, transact_items)
    _skip_table_copy.on = True
    try:
        return _transact(self, transact_items)
    except Exception:
        for name, key, attrs in reversed(kept):
            if attrs is None:
                if self.get_item(name, key) is not None:
                    self.delete_item(name, key)
            else:
                self.put_item(name, attrs, overwrite=True)
        raise
    finally:
        _skip_table_copy.on = False


_dynamodb.DynamoDBBackend.transact_write_items = _transact_keeping_named_items


# A third, for speed too: moto's Query reads the whole table, sorted, to find one
# partition's items (or an index's), so every query costs time in proportion to the
# table. Inside a query, the table's items are listed as the query needs them: only
# the partition's for a query on the table's key, every item unsorted for a query on
# an index (which sorts what it keeps). What it keeps and returns is unchanged.
_query_scope = threading.local()
_all_items = _Table.all_items
_query = _Table.query


def _items_for_query(self):
    if getattr(_query_scope, "table", None) is not self:
        return _all_items(self)
    rows = self.items.values()
    hash_key = _query_scope.hash_key
    if hash_key is not None:
        partition = self.items.get(hash_key)
        rows = [] if partition is None else [partition]
    if self.range_key_attr:
        return [item for partition in rows for item in partition.values()]
    return list(rows)


def _query_reading_what_it_needs(self, hash_key, *args, **kwargs):
    index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
    _query_scope.table = self
    _query_scope.hash_key = None if index_name else hash_key
    try:
        return _query(self, hash_key, *args, **kwargs)
    finally:
        _query_scope.table = None


_Table.all_items = _items_for_query
_Table.query = _query_reading_what_it_needs

from moto.server import main  # noqa: E402  (after the patch, so handlers pick it up)

if __name__ == "__main__":
    main()
