//! Compile-time behaviour of the macros: every supported function shape compiles and runs
//! (`tests/ui/pass`), every misuse is one error on the offending token (`tests/ui/fail`).
//!
//! trybuild builds the cases with the features of this test run, so run it twice:
//! `cargo test --test ui` and `cargo test --test ui --features enabled`. The expected stderr
//! of `tests/ui/fail` is the same for both, because the macros validate before they decide
//! what to emit, and both builds convert the arguments alike. A mistake inside a function body
//! is the compiler's own error, whose notes tell the two expansions apart: those cases keep one
//! snapshot per build, in `tests/ui/fail-untraced` and `tests/ui/fail-traced`.

#[test]
fn ui() {
    // trybuild builds the cases as a project of its own, in `target/tests/trybuild`, without
    // our `[profile]`: every dependency (candle, tokenizers) at full debug info made each of
    // the 32 pass cases a 107 MB binary, once per feature set, and the directory 17 GB, which
    // filled a CI machine's disk. The cases are compiled to see that they compile and run;
    // nothing reads their debug info. (Cargo reads this from the environment it inherits.)
    std::env::set_var("CARGO_PROFILE_DEV_DEBUG", "false");
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
    if cfg!(feature = "enabled") {
        t.compile_fail("tests/ui/fail-traced/*.rs");
    } else {
        t.compile_fail("tests/ui/fail-untraced/*.rs");
    }
}
