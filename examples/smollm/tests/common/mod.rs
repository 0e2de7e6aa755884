//! What the relations' tests share: the model with its matmuls on the dequantized f32 weights,
//! loaded once a test binary, and the ids of real English text. Missing weights fail the tests
//! (never skip): run `scripts/fetch-models` first.

use smollm::generate::load;
use smollm::{GgufTokenizer, Model};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The model ([`Model::dequantize_matmuls`]) and its tokenizer; a test holds the guard for its
/// whole run.
pub fn dequantized_model() -> MutexGuard<'static, (Model, GgufTokenizer)> {
    static MODEL: OnceLock<Mutex<(Model, GgufTokenizer)>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = smollm::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
            let (mut model, tokenizer) =
                load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
            model
                .dequantize_matmuls()
                .unwrap_or_else(|e| panic!("cannot dequantize: {e}"));
            Mutex::new((model, tokenizer))
        })
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The first `len` ids of the repository's LICENSE-APACHE (the package's tests run in its root).
pub fn license_ids(tokenizer: &GgufTokenizer, len: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("../../LICENSE-APACHE")
        .unwrap_or_else(|e| panic!("../../LICENSE-APACHE: {e}"));
    let mut ids = tokenizer.encode(&text).unwrap();
    assert!(ids.len() >= len, "LICENSE-APACHE has {} tokens", ids.len());
    ids.truncate(len);
    ids
}
