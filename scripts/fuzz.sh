#!/usr/bin/env bash
# Fuzzes pulse-signatures' header parsers (the code that faces the open internet):
#   1. installs cargo-fuzz into the default cargo bin if it is missing;
#   2. builds signatures/fuzz's `header_parsers` target against the committed Cargo.lock;
#   3. runs it for ${PULSE_FUZZ_SECONDS:-20} seconds; a crash fails the script and leaves
#      the input under signatures/fuzz/artifacts/header_parsers/.
# cargo-fuzz needs nightly flags (-Zsanitizer); RUSTC_BOOTSTRAP=1 lets stable accept them,
# so CI needs no second toolchain.
set -euo pipefail
cd "$(dirname "$0")/../signatures"
export RUSTC_BOOTSTRAP=1
SECONDS_TO_RUN=${PULSE_FUZZ_SECONDS:-20}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# cargo fuzz has no --locked: fail here if Cargo.lock would have to change.
cargo metadata --locked --format-version 1 --manifest-path fuzz/Cargo.toml >/dev/null

echo "==> cargo fuzz build header_parsers"
cargo fuzz build header_parsers

echo "==> fuzzing header_parsers for ${SECONDS_TO_RUN}s"
mkdir -p fuzz/corpus/header_parsers
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
# Committed seeds (valid signed requests) start the search near the interesting paths;
# new finds go to the first, git-ignored, corpus directory.
if ! cargo fuzz run header_parsers fuzz/corpus/header_parsers fuzz/seeds \
    -- -max_total_time="$SECONDS_TO_RUN" -print_final_stats=1 2>&1 | tee "$LOG"; then
    echo "fuzzing found a crash: see the input under signatures/fuzz/artifacts/header_parsers/" >&2
    exit 1
fi
echo "==> $(grep -E '^Done [0-9]+ runs' "$LOG" | tail -1)"
