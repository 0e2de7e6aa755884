//! The hand-written MiniLM against two independent references on the real weights: the embedding
//! sentence-transformers publishes for this model, and candle-transformers' own BERT layer by layer.
//! Missing weights fail the tests (with the command that fetches them); they never skip.

mod common;

use candle_core::{Device, Tensor};
use common::{
    encode, fixture, relative_error, ReferenceBert, SENTENCE, SENTENCE_EMBEDDING_START,
    SENTENCE_IDS, TOLERANCE,
};
use minilm::Model;

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
