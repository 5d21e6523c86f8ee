"""Starts moto's server with one fix for testing: requests to each emulated service run
one at a time.

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

from moto.server import main  # noqa: E402  (after the patch, so handlers pick it up)

if __name__ == "__main__":
    main()
