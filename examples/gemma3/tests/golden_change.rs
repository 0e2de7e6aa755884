//! What no reference can name and a golden trace does: layer 14's MLP with exact (erf) GELU in
//! place of the tanh form. Against transformers or llama.cpp the change (0.20% of `mlp_out`)
//! hides under the port's own error (1.2-1.8% a layer, README); against the port's own golden
//! trace (`tests/greedy.rs`), which it must match bit for bit, it is named at its layer.
//!
//! A test file of its own: the change is injected for the whole process.
#![cfg(feature = "trace")]

use gemma3::generate::{greedy, load};
use model_trace::golden::{Golden, GoldenError};

const PROMPT: &str = "The capital of France is";
const GOLDEN: &str = "tests/golden/gemma3-paris.ndjson";

#[test]
fn exact_gelu_in_layer_14_is_named_by_the_golden_check() {
    let path = gemma3::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) =
        load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    // A copy, so that this run's trace is written beside it, not into the source tree.
    let dir = std::env::temp_dir().join(format!("gemma3-golden-change-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let golden_copy = dir.join("gemma3-paris.ndjson");
    std::fs::copy(GOLDEN, &golden_copy).unwrap_or_else(|e| panic!("{GOLDEN}: {e}"));
    gemma3::bugs::inject_list("gelu-exact@14").unwrap();
    let check = Golden::new(&golden_copy).bless(false).in_ci(false);
    let (generation, outcome) = check.compare(|| greedy(&mut model, &tokenizer, PROMPT, 4));
    generation.unwrap();
    let Err(GoldenError::Mismatch(mismatch)) = outcome else {
        panic!("exact GELU must fail the check: {outcome:?}");
    };
    let message = mismatch.to_string();
    eprintln!("{message}");
    let first = mismatch.first.as_ref().expect("a first difference");
    assert_eq!(
        (first.pass, first.layer, first.name.as_str()),
        (0, 14, "mlp_out"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
