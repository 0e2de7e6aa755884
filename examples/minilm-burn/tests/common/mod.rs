//! What the burn MiniLM's test crates share: the real weights (fail, never skip, when missing),
//! the sentence and its published embedding, both ports loaded, and tensor comparisons.
// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

use burn_tensor::{Device, Int, Tensor};
use minilm::tokenizer::{self, Encoded};
use minilm::{weights, ModelFiles};
use minilm_burn::{model, Backend, Model};

pub const SENTENCE: &str = "This is an example sentence";
pub const SENTENCE_IDS: [u32; 7] = [101, 2023, 2003, 2019, 2742, 6251, 102];
/// sentence-transformers' all-MiniLM-L6-v2 embedding of `SENTENCE`, first four dimensions.
pub const SENTENCE_EMBEDDING_START: [f32; 4] = [0.06765684, 0.06349595, 0.04871314, 0.07930497];
/// What the candle port meets against the same published embedding (`minilm`'s tests).
pub const TOLERANCE: f32 = 1e-4;

pub fn model_files() -> ModelFiles {
    match weights::locate() {
        Ok(files) => files,
        Err(error) => panic!(
            "the MiniLM tests run on the real weights and could not find them; \
             run scripts/fetch-models first.\n{error}"
        ),
    }
}

/// The burn port on `backend`, the sentence's tensors on its device, and the sentence.
pub struct Fixture {
    pub backend: Backend,
    pub device: Device,
    pub model: Model,
    pub encoded: Encoded,
}

impl Fixture {
    pub fn tensors(&self) -> (Tensor<2, Int>, Tensor<2, Int>) {
        model::sentence_tensors(&self.encoded, &self.device)
    }
}

pub fn fixture(backend: Backend) -> Fixture {
    let files = model_files();
    let device = backend.device();
    let model = Model::load(&files, &device).unwrap_or_else(|e| panic!("load the model: {e}"));
    let tokenizer = tokenizer::load(&files.tokenizer).expect("load the tokenizer");
    let encoded = tokenizer::encode(&tokenizer, SENTENCE).expect("tokenize");
    Fixture {
        backend,
        device,
        model,
        encoded,
    }
}

/// The candle port (`minilm`), the reference the burn port is held to layer by layer.
pub fn candle_port() -> (minilm::Model, candle_core::Tensor, candle_core::Tensor) {
    let files = model_files();
    let model = minilm::Model::load(&files, &candle_core::Device::Cpu).expect("load candle port");
    let tokenizer = tokenizer::load(&files.tokenizer).expect("load the tokenizer");
    let encoded = tokenizer::encode(&tokenizer, SENTENCE).expect("tokenize");
    let (ids, mask) = encoded
        .to_tensors(&candle_core::Device::Cpu)
        .expect("candle tensors");
    (model, ids, mask)
}

pub fn burn_values<const D: usize>(tensor: Tensor<D>) -> Vec<f32> {
    tensor.into_data().try_into_vec().expect("f32 values")
}

pub fn candle_values(tensor: &candle_core::Tensor) -> Vec<f32> {
    tensor.flatten_all().unwrap().to_vec1().unwrap()
}

/// max |ours - reference| / max |reference|: relative to the tensor's scale, so that entries
/// near zero do not turn float noise into a failure.
pub fn relative_error(ours: &[f32], reference: &[f32]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = ours
        .iter()
        .zip(reference)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 0.0 && worst.is_finite());
    worst / scale
}
