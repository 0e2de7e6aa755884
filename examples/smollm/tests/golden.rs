//! The README's SmolLM2 run against its golden trace: 4 greedy tokens of "The capital of France
//! is", every layer's stages, attention and logits compared with `tests/golden/smollm-paris.ndjson`,
//! bit-exact on the machine that blessed it (by statistics on another). After a change that
//! moves the numbers on purpose: `MODEL_TRACE_BLESS=1 cargo test -p smollm --features trace
//! --test golden`, then review the file's diff and commit it. Missing weights fail the test
//! (never skip): run `scripts/fetch-models` first.
#![cfg(feature = "trace")]

use model_trace::golden;
use smollm::generate::{greedy, load};

const PROMPT: &str = "The capital of France is";

/// Where the golden file is, from the package's root (the working directory of its tests).
const GOLDEN: &str = "tests/golden/smollm-paris.ndjson";

#[test]
fn four_tokens_of_the_readme_prompt_match_their_golden_trace() {
    let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
    let (mut model, tokenizer) =
        load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
    let generation = golden::check(GOLDEN, || greedy(&mut model, &tokenizer, PROMPT, 4))
        .unwrap_or_else(|e| panic!("generation failed: {e}"));
    assert!(generation.text.contains("Paris"), "{:?}", generation.text);
    // Small enough to commit: 30 layers' stages, attention and logits over 4 passes.
    let size = std::fs::metadata(GOLDEN).map(|m| m.len()).unwrap_or(0);
    assert!(size <= 100_000, "{GOLDEN} is {size} bytes");
}
