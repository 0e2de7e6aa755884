//! Compile-time behaviour of the macros: every supported function shape compiles and runs
//! (`tests/ui/pass`), every misuse is one error on the offending token (`tests/ui/fail`).
//!
//! trybuild builds the cases with the features of this test run, so run it twice:
//! `cargo test --test ui` and `cargo test --test ui --features enabled`. The expected stderr
//! is the same for both, because the macros validate before they decide what to emit.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
