"""Starts moto's server with four fixes for testing and two bounds: requests to each
emulated service run one at a time, a DynamoDB transaction or query no longer reads
whole tables, and, with IAM switched on, requests are authorised against the resources
they name, as AWS authorises them (below); its memory is bounded, and it ends when told
to or when the process that started it ends (at the end).

moto's DynamoDB TransactWriteItems deep-copies the table for rollback without a lock, so a
concurrent write to the same table crashes it ("dictionary changed size during
iteration"). Real DynamoDB has no such limit, and Pulse's worker runs sessions
concurrently, so the tests would trip over it. moto is bound by Python's GIL anyway, so
serialising its request handlers costs little.

Usage: python scripts/moto_server.py -H 127.0.0.1 -p PORT
(PULSE_MOTO_DENIALS=FILE: append each IAM refusal to FILE, as `user<TAB>action<TAB>resource`;
PULSE_MOTO_MAX_RSS_MB=N: the memory bound, default 2048; PULSE_MOTO_DETACHED=1: keep
running after the process that started it ends.)
"""

import os
import threading


def _end_with_parent():
    """The kernel sends this process SIGKILL when the one that started it ends (Linux's
    PR_SET_PDEATHSIG), set first, before moto's imports take their seconds. Returns the
    parent's id, which the watchdog at the end also keeps an eye on."""
    parent = os.getppid()
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog still sees the parent go
    if os.getppid() != parent:
        os._exit(0)  # it ended before this was set
    return parent


# PULSE_MOTO_DETACHED=1 leaves it running after the process that started it (a server
# started by hand from a script that ends): its memory bound still holds.
_DETACHED = os.environ.get("PULSE_MOTO_DETACHED") == "1"
_PARENT = _end_with_parent() if __name__ == "__main__" and not _DETACHED else None

from moto.core import responses  # noqa: E402

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

# A fourth, for IAM: with authorisation on (`INITIAL_NO_AUTH_ACTION_COUNT`, or
# `POST /moto-api/reset-auth`), moto checks DynamoDB, SSM and EventBridge requests
# against the resource "*" only, so a policy naming the table (as a least-privilege role
# does) would deny everything, and one naming the wrong table would pass. Here each such
# request is checked as AWS checks it: against the ARN of the table or index it names
# (every table of a batch), the parameter path, the event bus; and a transaction as the
# actions of its items (a TransactWriteItems needs PutItem, UpdateItem, DeleteItem or
# ConditionCheckItem on each item's table; there is no IAM action of its own).
from moto import settings as _settings  # noqa: E402
from moto.core.exceptions import AccessDeniedError as _AccessDenied  # noqa: E402
from moto.core.exceptions import JsonRESTError as _JsonError  # noqa: E402
from moto.core.authorization import ActionAuthenticatorMixin as _Auth  # noqa: E402
from moto.dynamodb.responses import DynamoHandler as _DynamoHandler  # noqa: E402
from moto.events.responses import EventsHandler as _EventsHandler  # noqa: E402
from moto.iam.access_control import IAMRequest as _IAMRequest  # noqa: E402
from moto.sqs.responses import SQSResponse as _SqsHandler  # noqa: E402
from moto.ssm.responses import SimpleSystemManagerResponse as _SsmHandler  # noqa: E402

_TRANSACT_ACTIONS = {"Put": "PutItem", "Update": "UpdateItem", "Delete": "DeleteItem", "ConditionCheck": "ConditionCheckItem"}


def _dynamodb_targets(handler):
    """(action, resource ARN) pairs a DynamoDB request needs."""
    body = handler.body if isinstance(handler.body, dict) else {}
    action = handler._get_action()
    prefix = f"arn:aws:dynamodb:{handler.region}:{handler.current_account}:table/"
    if action in ("BatchGetItem", "BatchWriteItem"):
        return [(action, prefix + t) for t in body.get("RequestItems", {})]
    if action == "TransactWriteItems":
        return [
            (_TRANSACT_ACTIONS[kind], prefix + op["TableName"])
            for item in body.get("TransactItems", [])
            for kind, op in item.items()
        ]
    if action == "TransactGetItems":
        return [("GetItem", prefix + item["Get"]["TableName"]) for item in body.get("TransactItems", [])]
    if "TableName" in body:
        arn = prefix + body["TableName"]
        if body.get("IndexName"):
            arn += "/index/" + body["IndexName"]
        return [(action, arn)]
    return [(action, "*")]


def _ssm_targets(handler):
    action = handler._get_action()
    prefix = f"arn:aws:ssm:{handler.region}:{handler.current_account}:parameter"
    params = handler._get_param
    if action == "GetParametersByPath":
        return [(action, prefix + params("Path"))]
    if action in ("GetParameter", "PutParameter", "DeleteParameter"):
        name = params("Name")
        return [(action, prefix + (name if name.startswith("/") else "/" + name))]
    return [(action, "*")]


def _events_targets(handler):
    action = handler._get_action()
    if action == "PutEvents":
        prefix = f"arn:aws:events:{handler.region}:{handler.current_account}:event-bus/"
        buses = {e.get("EventBusName") or "default" for e in handler._get_param("Entries") or []}
        return [(action, b if b.startswith("arn:") else prefix + b) for b in sorted(buses)] or [(action, prefix + "default")]
    return [(action, "*")]


def _sqs_targets(handler):
    # A batch needs the action of its entries: SendMessageBatch needs sqs:SendMessage.
    return [(handler._get_action().removesuffix("Batch"), handler._determine_resource())]


def _authorising_each(targets):
    def authorise(self, resource="*"):
        if _Auth.request_count < _settings.INITIAL_NO_AUTH_ACTION_COUNT:
            _Auth.request_count += 1
            return
        path = self.raw_path
        if self.parsed_url.query:
            path += "?" + self.parsed_url.query
        for action, arn in targets(self):
            request = _IAMRequest(
                account_id=self.current_account,
                method=self.method,
                path=path,
                data=self.data,
                body=self.raw_body,
                headers=self.headers,
                action=action,
            )
            request.check_signature()
            try:
                request.check_action_permitted(arn)
            except _AccessDenied:
                user = request._access_key.arn
                _record_denial(user, request._action, arn)
                # As AWS answers these JSON services: the action and the resource named.
                raise _JsonError(
                    "AccessDeniedException",
                    f"User: {user} is not authorized to perform: {request._action} on resource: {arn}",
                )

    return authorise


def _record_denial(user, action, arn):
    """Appends the denial to the file PULSE_MOTO_DENIALS names (if set), so a test can
    tell a refusal its code swallowed (a warning in a log) from none at all."""
    path = os.environ.get("PULSE_MOTO_DENIALS")
    if path:
        with _lock_denials, open(path, "a") as f:
            f.write(f"{user}\t{action}\t{arn}\n")


_lock_denials = threading.Lock()


_DynamoHandler._authenticate_and_authorize_normal_action = _authorising_each(_dynamodb_targets)
_SsmHandler._authenticate_and_authorize_normal_action = _authorising_each(_ssm_targets)
_EventsHandler._authenticate_and_authorize_normal_action = _authorising_each(_events_targets)
_SqsHandler._authenticate_and_authorize_normal_action = _authorising_each(_sqs_targets)

# The last two are bounds, so that no run can take the machine down with the emulator.
#
# Memory: moto keeps everything in memory and never frees a deleted table's items
# promptly, so a long run grows it without end (a 200-agent simulation grew it by about
# 1.3 GB a minute, to 15 GB). A watchdog thread reads the server's resident size four
# times a second; past the bound (PULSE_MOTO_MAX_RSS_MB, default 2048) it says so on
# stderr, in one line naming the figure and the bound, and ends the process at once
# (exit code 70): the requests in flight fail, and the run that started it says why.
#
# Ending: moto's own SIGTERM handler raises SystemExit in the main thread, which then
# waits for every request thread, so a loaded server outlives a SIGTERM (seen: a 15 GB
# server still running after its run was stopped). Here SIGTERM and SIGINT end the
# process at once, and so does its parent's end: the kernel sends it SIGKILL when the
# process that started it dies (PR_SET_PDEATHSIG, set at the top), and the watchdog
# also sees the parent change.
import sys as _sys  # noqa: E402
import time as _time  # noqa: E402

import moto.server as _server  # noqa: E402

MAX_RSS_MB = int(os.environ.get("PULSE_MOTO_MAX_RSS_MB", "2048"))
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / (1 << 20)


def _end_now(signum, _frame):
    os._exit(128 + signum)


def _watch(parent):
    while True:
        rss = _rss_mb()
        if rss > MAX_RSS_MB:
            print(
                f"moto_server: stopped: its resident memory reached {rss:.0f} MB, past its bound of "
                f"{MAX_RSS_MB} MB (PULSE_MOTO_MAX_RSS_MB); the run that uses it is too large for "
                "the emulator, not for Pulse: make it smaller",
                file=_sys.stderr,
                flush=True,
            )
            os._exit(70)
        if parent is not None and os.getppid() != parent:
            os._exit(0)
        _time.sleep(0.25)


def _bounded():
    threading.Thread(target=_watch, args=(_PARENT,), name="bounds", daemon=True).start()
    # moto's main() installs its handler by this name.
    _server.signal_handler = _end_now


from moto.server import main  # noqa: E402  (after the patch, so handlers pick it up)

if __name__ == "__main__":
    _bounded()
    main()
