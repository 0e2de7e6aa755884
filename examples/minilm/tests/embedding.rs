//! The hand-written MiniLM against two independent references on the real weights: the embedding
//! sentence-transformers publishes for this model, and candle-transformers' own BERT layer by layer.
//! Missing weights fail the tests (with the command that fetches them); they never skip.

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert as reference;
use minilm::tokenizer::{self, Encoded};
use minilm::{weights, Model, ModelFiles};

const SENTENCE: &str = "This is an example sentence";
const SENTENCE_IDS: [u32; 7] = [101, 2023, 2003, 2019, 2742, 6251, 102];
/// sentence-transformers' all-MiniLM-L6-v2 embedding of `SENTENCE`, first four dimensions.
const SENTENCE_EMBEDDING_START: [f32; 4] = [0.06765684, 0.06349595, 0.04871314, 0.07930497];
const TOLERANCE: f32 = 1e-4;

fn model_files() -> ModelFiles {
    match weights::locate() {
        Ok(files) => files,
        Err(error) => panic!(
            "the MiniLM tests run on the real weights and could not find them; \
             run scripts/fetch-models first.\n{error}"
        ),
    }
}

struct Fixture {
    files: ModelFiles,
    model: Model,
    tokenizer: tokenizers::Tokenizer,
}

fn fixture() -> Fixture {
    let files = model_files();
    let model = Model::load(&files, &Device::Cpu).expect("load the model");
    let tokenizer = tokenizer::load(&files.tokenizer).expect("load the tokenizer");
    Fixture {
        files,
        model,
        tokenizer,
    }
}

fn encode(fixture: &Fixture, text: &str) -> Encoded {
    tokenizer::encode(&fixture.tokenizer, text).expect("tokenize")
}

/// candle-transformers' `BertModel` only exposes the last hidden state, so the output of layer `k`
/// comes from a reference model built with the first `k` layers (0 = the embeddings alone).
struct ReferenceBert {
    tensors: HashMap<String, Tensor>,
    config: reference::Config,
}

impl ReferenceBert {
    fn load(files: &ModelFiles) -> Self {
        let text = std::fs::read_to_string(&files.config).expect("read config.json");
        let config: reference::Config = serde_json::from_str(&text).expect("parse config.json");
        let tensors =
            candle_core::safetensors::load(&files.weights, &Device::Cpu).expect("load weights");
        ReferenceBert { tensors, config }
    }

    fn hidden_after(&self, layers: usize, ids: &Tensor, mask: &Tensor) -> Tensor {
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
fn relative_error(ours: &Tensor, reference: &Tensor) -> f32 {
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

#[test]
fn tokenizer_matches_the_reference_ids_without_padding() {
    let fixture = fixture();
    let encoded = encode(&fixture, SENTENCE);
    assert_eq!(encoded.ids, SENTENCE_IDS);
    assert_eq!(encoded.mask, vec![1; SENTENCE_IDS.len()]);
}

#[test]
fn sentence_embedding_matches_sentence_transformers() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let embedding: Vec<f32> = fixture
        .model
        .embed(&ids, &mask)
        .unwrap()
        .squeeze(0)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(embedding.len(), 384);
    for (dim, (got, want)) in embedding.iter().zip(SENTENCE_EMBEDDING_START).enumerate() {
        assert!(
            (got - want).abs() <= TOLERANCE,
            "dimension {dim}: {got} vs {want} (start {:?})",
            &embedding[..4]
        );
    }
    let norm = embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
}

#[test]
fn every_layer_matches_candle_transformers_bert() {
    let fixture = fixture();
    let reference = ReferenceBert::load(&fixture.files);
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let model = &fixture.model;
    assert_eq!(model.layers().len(), 6);

    // The same steps as `Model::forward`, one layer at a time so each output can be compared.
    let bias = Model::attention_bias(&mask).unwrap();
    let mut hidden = model.embeddings().forward(&ids).unwrap();
    let error = relative_error(&hidden, &reference.hidden_after(0, &ids, &mask));
    assert!(error <= TOLERANCE, "embeddings: relative error {error}");
    for layer in model.layers() {
        hidden = layer.forward(&hidden, &bias).unwrap();
        let expected = reference.hidden_after(layer.index() + 1, &ids, &mask);
        let error = relative_error(&hidden, &expected);
        eprintln!("layer {}: relative error {error:e}", layer.index());
        assert!(
            error <= TOLERANCE,
            "layer {}: relative error {error}",
            layer.index()
        );
    }
    let whole = model.forward(&ids, &mask).unwrap();
    assert_eq!(relative_error(&whole, &hidden), 0.0);
}

/// A padded batch: padding must not leak into real tokens (mask) nor into the mean (pooling).
#[test]
fn padded_batch_matches_reference_and_unpadded_embedding() {
    let fixture = fixture();
    let long = encode(&fixture, "The quick brown fox jumps over the lazy dog");
    let short = encode(&fixture, SENTENCE);
    let width = long.ids.len();
    assert!(short.ids.len() < width);
    let pad = |values: &[u32]| {
        let mut padded = values.to_vec();
        padded.resize(width, 0);
        padded
    };
    let ids = Tensor::new(vec![long.ids.clone(), pad(&short.ids)], &Device::Cpu).unwrap();
    let mask = Tensor::new(vec![long.mask.clone(), pad(&short.mask)], &Device::Cpu).unwrap();

    let ours = fixture.model.forward(&ids, &mask).unwrap();
    let expected = ReferenceBert::load(&fixture.files).hidden_after(6, &ids, &mask);
    let error = relative_error(&ours, &expected);
    assert!(error <= TOLERANCE, "padded batch: relative error {error}");

    let batched = fixture.model.embed(&ids, &mask).unwrap().get(1).unwrap();
    let (short_ids, short_mask) = short.to_tensors(&Device::Cpu).unwrap();
    let alone = fixture
        .model
        .embed(&short_ids, &short_mask)
        .unwrap()
        .squeeze(0)
        .unwrap();
    let error = relative_error(&batched, &alone);
    assert!(error <= TOLERANCE, "padding changed the embedding: {error}");
}

#[test]
fn forward_with_attention_returns_each_layers_probabilities() {
    let fixture = fixture();
    let (ids, mask) = encode(&fixture, SENTENCE).to_tensors(&Device::Cpu).unwrap();
    let (hidden, attention) = fixture.model.forward_with_attention(&ids, &mask).unwrap();
    assert_eq!(attention.len(), 6);
    for probs in &attention {
        assert_eq!(probs.dims(), [1, 12, 7, 7]);
        let row_sums: Vec<f32> = probs
            .sum(3)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert!(
            row_sums.iter().all(|s| (s - 1.0).abs() < 1e-5),
            "{row_sums:?}"
        );
    }
    let plain = fixture.model.forward(&ids, &mask).unwrap();
    assert_eq!(relative_error(&hidden, &plain), 0.0);
    // Layer 0 attended over the embeddings: its captured probabilities are a direct call on them.
    let embedded = fixture.model.embeddings().forward(&ids).unwrap();
    let bias = Model::attention_bias(&mask).unwrap();
    let direct = fixture.model.layers()[0]
        .attention()
        .attention_probs(&embedded, &bias)
        .unwrap();
    assert_eq!(relative_error(&attention[0], &direct), 0.0);
}
