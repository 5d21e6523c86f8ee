#!/usr/bin/env bash
# Runs Pulse's whole test suite on a fresh machine, installing what it needs:
#   1. moto (the local AWS emulator) and cfn-lint into ./.venv, once;
#   2. a moto server on a free loopback port, stopped when this script exits;
#   3. cargo fmt --check, cargo clippy -D warnings, and every Rust test (unit, the
#      conformance suite and end-to-end flows on SQLite and on moto, the scale tests);
#   4. a short fuzzing run of the signature header parsers (installs cargo-fuzz once);
#   5. cfn-lint on infra/template.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0

VENV=.venv
PY_PACKAGES=("moto[server]==5.2.5" "cfn-lint==1.58.0")
if ! "$VENV/bin/python" -c "import moto, cfnlint" 2>/dev/null; then
    echo "==> installing ${PY_PACKAGES[*]} into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
fi

mkdir -p target
PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$VENV/bin/python" scripts/moto_server.py -H 127.0.0.1 -p "$PORT" > target/moto.log 2>&1 &
MOTO_PID=$!
trap 'kill "$MOTO_PID" 2>/dev/null || true' EXIT
export PULSE_TEST_MOTO_URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 100); do
    if "$VENV/bin/python" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/moto-api/')" "$PULSE_TEST_MOTO_URL" 2>/dev/null; then
        break
    fi
    if ! kill -0 "$MOTO_PID" 2>/dev/null; then
        echo "moto failed to start; its log:" >&2
        cat target/moto.log >&2
        exit 1
    fi
    sleep 0.2
done
echo "==> moto listening on $PULSE_TEST_MOTO_URL"

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo test"
cargo test --workspace --locked
echo "==> fuzzing the signature header parsers"
PULSE_FUZZ_SECONDS="${PULSE_FUZZ_SECONDS:-15}" ./scripts/fuzz.sh
echo "==> cfn-lint infra/template.yaml"
"$VENV/bin/cfn-lint" infra/template.yaml
echo "==> all tests passed"
