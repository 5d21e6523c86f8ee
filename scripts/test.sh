#!/usr/bin/env bash
# Runs Pulse's whole test suite on a fresh machine, installing what it needs:
#   1. moto (the local AWS emulator), cargo-lambda (a local Lambda runtime API), the SAM
#      CLI and cfn-lint into ./.venv, once;
#   2. Debian's chromium and chromium-driver (the dashboard's browser test), when missing;
#      a moto server on a free loopback port, stopped when this script exits;
#   3. cargo fmt --check, cargo clippy -D warnings, the four function binaries, and every
#      Rust test (unit, the conformance suite and end-to-end flows on SQLite and on moto,
#      the functions under `cargo lambda watch`, `pulse demo` with its transcript checked,
#      the scale tests);
#   4. three seeded whole-system simulations with injected faults (random seeds, printed);
#   5. a short fuzzing run of the signature header parsers (installs cargo-fuzz once);
#   6. sam validate --lint, cfn-lint and the template check on infra/template.yaml.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0

VENV=.venv
PY_PACKAGES=("moto[server]==5.2.5" "cfn-lint==1.58.0" "aws-sam-cli==1.170.0" "cargo-lambda==1.9.2")
if ! "$VENV/bin/python" -c "import moto, cfnlint, samcli" 2>/dev/null || [ ! -x "$VENV/bin/cargo-lambda" ]; then
    echo "==> installing ${PY_PACKAGES[*]} into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
fi

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    echo "==> installing chromium and chromium-driver (the dashboard's browser test)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver > /dev/null
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
echo "==> cargo build (the function binaries, for cargo lambda watch)"
cargo build --workspace --bins --locked
echo "==> cargo test"
export PULSE_TEST_CARGO_LAMBDA="$PWD/$VENV/bin/cargo-lambda"
cargo test --workspace --locked
echo "==> pulse simulate: three random seeds, 1,000 agents through 6 simulated hours each"
# Each prints its seed first; a violation exits 1 with the command that replays it.
for _ in 1 2 3; do
    ./target/debug/pulse simulate --agents 1000 --duration 6h
done
echo "==> fuzzing the signature header parsers"
PULSE_FUZZ_SECONDS="${PULSE_FUZZ_SECONDS:-15}" ./scripts/fuzz.sh
echo "==> sam validate --lint, cfn-lint and the template check"
(cd infra && SAM_CLI_TELEMETRY=0 "../$VENV/bin/sam" validate --lint)
"$VENV/bin/cfn-lint" infra/template.yaml
"$VENV/bin/python" scripts/check_template.py --self-test infra/template.yaml
echo "==> all tests passed"
