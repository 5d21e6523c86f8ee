"""Checks Slack request signatures with slack_sdk's own SignatureVerifier.

Usage: check_slack.py FILE, where FILE holds a JSON array of cases, each with the app's
`secret`, the request's `timestamp`, its `signature` header and its raw `body`. Prints
`valid` or `invalid` for each, a line each, as the SDK judges it.
"""

import json
import sys

from slack_sdk.signature import SignatureVerifier


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        verifier = SignatureVerifier(case["secret"])
        ok = verifier.is_valid(case["body"], case["timestamp"], case["signature"])
        print("valid" if ok else "invalid")


if __name__ == "__main__":
    main()
