//! What the real-weight tests share: one model a test binary (loading it twice would double
//! the memory), and how far apart two logit vectors are. Missing weights fail the tests (never
//! skip): run `scripts/fetch-models`.

use candle_core::Tensor;
use gemma3::generate::load;
use gemma3::{GgufTokenizer, Model};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The model and its tokenizer, loaded once for the tests of this binary; a test holds the
/// guard for its whole run.
#[allow(dead_code)] // the relations use the dequantized one
pub fn model() -> MutexGuard<'static, (Model, GgufTokenizer)> {
    static MODEL: OnceLock<Mutex<(Model, GgufTokenizer)>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = gemma3::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
            let loaded =
                load(&path).unwrap_or_else(|e| panic!("cannot load {}: {e}", path.display()));
            Mutex::new(loaded)
        })
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// [`model`], but a model of its own with every matmul on its dequantized f32 weight
/// ([`Model::dequantize_matmuls`]), for the relations between passes.
#[allow(dead_code)] // not every test binary dequantizes
pub fn dequantized_model() -> MutexGuard<'static, (Model, GgufTokenizer)> {
    static MODEL: OnceLock<Mutex<(Model, GgufTokenizer)>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = gemma3::weights::find_gguf().unwrap_or_else(|e| panic!("{e}"));
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

/// `max |a - b| / max |b|`: how far `a` is from `b`, relative to `b`'s largest logit.
#[allow(dead_code)] // not every test binary compares logits
pub fn relative_error(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let b = b.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    worst / scale
}

/// The ids of the repository's LICENSE-APACHE (real English text), `<bos>` first, cut to `len`.
#[allow(dead_code)] // not every test binary runs long prompts
pub fn license_ids(tokenizer: &GgufTokenizer, len: usize) -> Vec<u32> {
    let text = std::fs::read_to_string("../../LICENSE-APACHE")
        .unwrap_or_else(|e| panic!("../../LICENSE-APACHE: {e}"));
    let mut ids = tokenizer.encode(&text).unwrap();
    assert!(ids.len() >= len, "LICENSE-APACHE has {} tokens", ids.len());
    ids.truncate(len);
    ids
}
