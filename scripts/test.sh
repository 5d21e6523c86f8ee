#!/usr/bin/env bash
# Runs Pulse's whole test suite on a fresh machine, installing what it needs:
#   1. moto (the local AWS emulator), cargo-lambda (a local Lambda runtime API), the SAM
#      CLI and cfn-lint into ./.venv, once;
#   2. Debian's chromium and chromium-driver (the dashboard's browser test), when missing;
#      a moto server on a free loopback port, stopped when this script exits;
#   3. cargo fmt --check, cargo clippy -D warnings, the four function binaries, and every
#      Rust test (unit, the conformance suite and end-to-end flows on SQLite and on moto,
#      the functions under `cargo lambda watch`, `pulse demo` with its transcript checked,
#      the scale tests, the fault run over the AWS adapters);
#   4. three seeded whole-system simulations with injected faults (random seeds, printed),
#      and one on the AWS adapters over the moto server;
#   5. sam validate --lint, cfn-lint and the template check on infra/template.yaml;
#   6. the book in docs/ built with mdBook (installed into ./.tools once).
# It ends with the time each stage took, the slowest test binaries and the slowest tests.
#
# `--long` (for a nightly or weekly job; about 12 minutes more on 2 cores) adds what is
# too slow for every change: the scale tests at full size on the emulator, a simulated
# day of 10,000 agents, and five minutes of fuzzing the signature header parsers
# (installs cargo-fuzz once). The property tests of the same parsers run every time.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0

LONG=0
for arg in "$@"; do
    case "$arg" in
    --long) LONG=1 ;;
    *)
        echo "usage: $0 [--long]   (--long adds the scale tests at full size, a 10,000-agent day and fuzzing)" >&2
        exit 2
        ;;
    esac
done
# Read by the tests that have a larger size for the long run.
export PULSE_TEST_LONG=$LONG

T0=$(date +%s)
STAGE="" STAGE_T=$T0 STAGE_TIMES=()
# Starts a stage: prints its name with the time since the start, and closes the last one.
stage() {
    local now
    now=$(date +%s)
    if [ -n "$STAGE" ]; then
        STAGE_TIMES+=("$(printf '%6d s  %s' $((now - STAGE_T)) "$STAGE")")
    fi
    STAGE=$1 STAGE_T=$now
    printf '==> [%dm%02ds] %s\n' $(((now - T0) / 60)) $(((now - T0) % 60)) "$1"
}

mkdir -p target
# A clean build gains nothing from incremental state and pays to write it.
export CARGO_INCREMENTAL=0

VENV=.venv
PY_PACKAGES=("moto[server]==5.2.5" "cfn-lint==1.58.0" "aws-sam-cli==1.170.0" "cargo-lambda==1.9.2")
if ! "$VENV/bin/python" -c "import moto, cfnlint, samcli" 2>/dev/null || [ ! -x "$VENV/bin/cargo-lambda" ]; then
    stage "installing ${PY_PACKAGES[*]} into $VENV"
    python3 -m venv "$VENV"
    # uv installs the same pinned packages in about a fifth of pip's time (18 s against
    # 110 s on 2 cores: pip resolves in Python and compiles every module). It reads pip's
    # index and CA settings from the environment here; pip is the fallback.
    "$VENV/bin/pip" install --quiet --disable-pip-version-check uv
    if ! env ${PIP_INDEX_URL:+UV_INDEX_URL="$PIP_INDEX_URL"} ${PIP_FIND_LINKS:+UV_FIND_LINKS="$PIP_FIND_LINKS"} \
        UV_NATIVE_TLS=1 "$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" "${PY_PACKAGES[@]}"; then
        echo "==> uv could not install them; pip instead"
        "$VENV/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
    fi
fi

# openssl and curl: the book's transcripts sign and send a webhook request as a reader would.
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] || ! command -v openssl > /dev/null || ! command -v curl > /dev/null; then
    stage "installing chromium and chromium-driver (the dashboard's browser test), openssl and curl (the book's transcripts)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver openssl curl > /dev/null
fi

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

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
stage "cargo build (the function binaries, for cargo lambda watch)"
cargo build --workspace --bins --locked
stage "cargo test"
export PULSE_TEST_CARGO_LAMBDA="$PWD/$VENV/bin/cargo-lambda"
# Every test binary runs through scripts/test-runner.sh, which asks for each test's time.
TEST_LOG=target/test-output.log
# (The runner variable is named after the host, e.g. CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER.)
HOST=$(rustc -vV | sed -n 's/^host: //p')
RUNNER_VAR="CARGO_TARGET_$(echo "$HOST" | tr 'a-z-' 'A-Z_')_RUNNER"
env "$RUNNER_VAR=$PWD/scripts/test-runner.sh" \
    cargo test --workspace --locked 2>&1 | tee "$TEST_LOG"
stage "pulse simulate: three random seeds, 1,000 agents through 6 simulated hours each"
# Each prints its seed first; a violation exits 1 with the command that replays it.
for _ in 1 2 3; do
    ./target/debug/pulse simulate --agents 1000 --duration 6h
done
stage "pulse simulate --backend aws: a random seed, 30 agents through a simulated hour on moto"
./target/debug/pulse simulate --backend aws --endpoint "$PULSE_TEST_MOTO_URL" --agents 30 --duration 1h
if [ "$LONG" = 1 ]; then
    stage "pulse simulate: 10,000 agents through a simulated day"
    ./target/debug/pulse simulate --agents 10000 --duration 24h
    stage "fuzzing the signature header parsers"
    PULSE_FUZZ_SECONDS="${PULSE_FUZZ_SECONDS:-300}" ./scripts/fuzz.sh
fi
stage "sam validate --lint, cfn-lint and the template check"
(cd infra && SAM_CLI_TELEMETRY=0 "../$VENV/bin/sam" validate --lint)
"$VENV/bin/cfn-lint" infra/template.yaml
"$VENV/bin/python" scripts/check_template.py --self-test infra/template.yaml
stage "the book: mdbook build docs (installs mdbook into ./.tools once)"
# The links inside it, the reference pages and the documented commands are checked by
# the tests above (cli/tests/book); this checks that mdBook builds it.
MDBOOK_VERSION=0.5.4
if ! .tools/bin/mdbook --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
    # Unoptimised: half the build's wall time (70 s against 144 s on 2 cores, 40 % of the
    # CPU), and it still builds this book in a quarter of a second, byte for byte the same.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
        cargo install --quiet --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --root .tools
fi
.tools/bin/mdbook build docs 2>&1 | tee target/mdbook.log
if grep -qE "ERROR|WARN" target/mdbook.log; then
    echo "mdbook reported problems (above)" >&2
    exit 1
fi
stage "summary"
echo "==> the slowest test binaries (seconds, from libtest's own count)"
# (`|| true`: head closing the pipe early is no failure.)
awk '/^ *Running /{sub(/^ *Running /, ""); bin=$0} /^test result:/{t=$NF; sub(/s$/, "", t); printf "%8.1f  %s\n", t, bin}' "$TEST_LOG" |
    sort -rn | head -8 || true
echo "==> the slowest tests (seconds)"
sed -nE 's/^test (.*) \.\.\. ok <([0-9.]+)s>$/\2  \1/p' "$TEST_LOG" | sort -rn | head -15 |
    awk '{printf "%8.1f  %s\n", $1, $2}' || true
echo "==> time per stage"
printf '%s\n' "${STAGE_TIMES[@]}"
echo "==> all tests passed in $(($(date +%s) - T0)) s"
