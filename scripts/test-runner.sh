#!/usr/bin/env bash
# Cargo's runner for test binaries under scripts/test.sh: asks libtest for each test's
# time (`ok <1.234s>`), so the script can print the slowest tests at the end.
# `--report-time` is a libtest option that stable Rust unlocks with RUSTC_BOOTSTRAP=1 in
# the test process only; the build never sees it, so nothing is compiled twice. Binaries
# that are not test harnesses (a `cargo run` under the same environment) run untouched.
set -euo pipefail
case "$1" in
*/deps/*) exec env RUSTC_BOOTSTRAP=1 "$@" -Zunstable-options --report-time ;;
*) exec "$@" ;;
esac
