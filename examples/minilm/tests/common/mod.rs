//! What both test crates need: the real weights (fail, never skip, when missing), the
//! sentence and its published embedding, and candle-transformers' BERT as the reference.
// Each test crate that includes this module uses a different part of it.
#![allow(dead_code)]

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert as reference;
use minilm::tokenizer::{self, Encoded};
use minilm::{weights, Model, ModelFiles};

pub const SENTENCE: &str = "This is an example sentence";
pub const SENTENCE_IDS: [u32; 7] = [101, 2023, 2003, 2019, 2742, 6251, 102];
/// sentence-transformers' all-MiniLM-L6-v2 embedding of `SENTENCE`, first four dimensions.
pub const SENTENCE_EMBEDDING_START: [f32; 4] = [0.06765684, 0.06349595, 0.04871314, 0.07930497];
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

pub struct Fixture {
    pub files: ModelFiles,
    pub model: Model,
    pub tokenizer: tokenizers::Tokenizer,
}

pub fn fixture() -> Fixture {
    let files = model_files();
    let model = Model::load(&files, &Device::Cpu).expect("load the model");
    let tokenizer = tokenizer::load(&files.tokenizer).expect("load the tokenizer");
    Fixture {
        files,
        model,
        tokenizer,
    }
}

pub fn encode(fixture: &Fixture, text: &str) -> Encoded {
    tokenizer::encode(&fixture.tokenizer, text).expect("tokenize")
}

/// candle-transformers' `BertModel` only exposes the last hidden state, so the output of layer `k`
/// comes from a reference model built with the first `k` layers (0 = the embeddings alone).
pub struct ReferenceBert {
    tensors: HashMap<String, Tensor>,
    config: reference::Config,
}

impl ReferenceBert {
    pub fn load(files: &ModelFiles) -> Self {
        let text = std::fs::read_to_string(&files.config).expect("read config.json");
        let config: reference::Config = serde_json::from_str(&text).expect("parse config.json");
        let tensors =
            candle_core::safetensors::load(&files.weights, &Device::Cpu).expect("load weights");
        ReferenceBert { tensors, config }
    }

    pub fn hidden_after(&self, layers: usize, ids: &Tensor, mask: &Tensor) -> Tensor {
        let config = reference::Config {
            num_hidden_layers: layers,
            ..self.config.clone()
        };
        let vb = VarBuilder::from_tensors(self.tensors.clone(), DType::F32, &Device::Cpu);
        let bert = reference::BertModel::load(vb, &config).expect("load reference BERT");
        let token_types = ids.zeros_like().expect("token types");
        bert.forward(ids, &token_types, Some(mask))
            .expect("reference forward")
    }
}

/// max |ours - reference| / max |reference|: relative to the tensor's scale, so that entries near
/// zero do not turn float noise into a failure.
pub fn relative_error(ours: &Tensor, reference: &Tensor) -> f32 {
    assert_eq!(ours.dims(), reference.dims());
    let ours: Vec<f32> = ours.flatten_all().unwrap().to_vec1().unwrap();
    let reference: Vec<f32> = reference.flatten_all().unwrap().to_vec1().unwrap();
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = ours
        .iter()
        .zip(&reference)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(scale > 0.0 && worst.is_finite());
    worst / scale
}
