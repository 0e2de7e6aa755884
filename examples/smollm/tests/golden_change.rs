//! The smallest change a refactor makes, and the golden check naming it: layer 12's RMS norms
//! with their sum of squares taken as two half sums (a reassociated sum, the same value rounded
//! differently), checked against the README run's golden trace (`tests/golden.rs`).
//!
//! A test file of its own: the change is injected for the whole process.
#![cfg(feature = "trace")]

use model_trace::golden::{Golden, GoldenError};
use smollm::generate::{greedy, load};

const PROMPT: &str = "The capital of France is";
const GOLDEN: &str = "tests/golden/smollm-paris.ndjson";

#[test]
fn a_reassociated_sum_in_layer_12_rms_norm_is_named_by_the_golden_check() {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) =
        load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    // A copy, so that this run's trace is written beside it, not into the source tree.
    let dir = std::env::temp_dir().join(format!("smollm-golden-change-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let golden_copy = dir.join("smollm-paris.ndjson");
    std::fs::copy(GOLDEN, &golden_copy).unwrap_or_else(|e| panic!("{GOLDEN}: {e}"));
    smollm::bugs::inject_list("rms-sum-halves@12").unwrap();
    let check = Golden::new(&golden_copy).bless(false).in_ci(false);
    let (generation, outcome) = check.compare(|| greedy(&mut model, &tokenizer, PROMPT, 4));
    // The text is the same: the change is a rounding's.
    assert!(generation.unwrap().text.contains("Paris"));
    let Err(GoldenError::Mismatch(mismatch)) = outcome else {
        panic!("the reassociated sum must fail the check: {outcome:?}");
    };
    let message = mismatch.to_string();
    eprintln!("{message}");
    let first = mismatch.first.as_ref().expect("a first difference");
    assert_eq!(
        (first.pass, first.layer, first.name.as_str()),
        (0, 12, "attn_in"),
        "{message}"
    );
    // Every tensor before it is bit-identical: layers 0 to 11 of the prompt pass, and layer
    // 12's input.
    assert!(mismatch.bit_identical > 12 * 8, "{message}");
    assert!(dir.join("smollm-paris.new.ndjson").exists(), "{message}");
    // By statistics, within a tolerance a port would use, the change is no divergence.
    let (_, outcome) = Golden::new(&golden_copy)
        .bless(false)
        .in_ci(false)
        .rtol(1e-3)
        .compare(|| greedy(&mut model, &tokenizer, PROMPT, 4));
    let matched = outcome.unwrap_or_else(|e| panic!("{e}"));
    assert!(matched.bit_identical < matched.tensors);
    let _ = std::fs::remove_dir_all(&dir);
}
