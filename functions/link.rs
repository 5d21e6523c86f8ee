//! The build script of the four Lambda functions: links each as a position-dependent
//! executable on Linux.
//!
//! A position-independent executable (the default) is relocated by the dynamic loader
//! every time it starts: about 52,000 relative relocations for a function, each a write
//! into a page that must first be faulted in and copied. That was the largest single
//! part of a function's init beside a hello-world binary (`pulse bench coldstart`:
//! 1.96 × hello before, 1.63 × after, for the sweeper). Linked at a fixed address, the
//! binary needs none, and its read-only data stays shared with the page cache.
//!
//! The cost is that the executable's own code and data load at the same address every
//! time (the heap, the stack and the shared libraries are still placed at random). The
//! functions are memory-safe Rust that parse only JSON and signed payloads; see the
//! Security chapter of the book.
//!
//! `-no-pie` comes after the `-pie` rustc passes, and both `cc` and `zig cc` (which
//! cargo-lambda links with) take the last one. Other systems' linkers (macOS) are left
//! alone.

fn main() {
    println!("cargo::rerun-if-changed=../link.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if os == "linux" {
        println!("cargo::rustc-link-arg-bins=-no-pie");
    }
}
