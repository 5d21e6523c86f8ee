#!/usr/bin/env bash
# Cargo's compiler wrapper for this workspace's own crates under scripts/test.sh
# (RUSTC_WORKSPACE_WRAPPER): compiles each through clippy-driver, which is rustc with
# Clippy's lints added, and denies every warning, as `cargo clippy --all-targets -- -D
# warnings` does. The build and the tests then lint as they compile, and the dependencies
# are compiled once, for real, rather than once more in check mode for a separate
# `cargo clippy` (about 450 s of a clean run on 2 cores). Dependencies never pass through
# here: cargo hands this wrapper only the workspace's members.
set -euo pipefail
case " $* " in
*" --crate-name "*) exec clippy-driver "$@" -D warnings ;;
*) exec clippy-driver "$@" ;; # a query (`-vV`, `--print`), not a compilation
esac
