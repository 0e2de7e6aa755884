//! The burn MiniLM against two references on the real weights, on both backends: the embedding
//! sentence-transformers publishes for this model, and the candle port (`minilm`, itself held
//! to candle-transformers' BERT) layer by layer. Missing weights fail the tests.

mod common;

use common::{
    burn_values, candle_port, candle_values, fixture, relative_error, SENTENCE_EMBEDDING_START,
    SENTENCE_IDS, TOLERANCE,
};
use minilm_burn::{Backend, Model};

/// How far the burn port's hidden states may be from the candle port's, relative to each
/// tensor's largest value: both compute in f32 with differently blocked sums (measured: at
/// most 2e-6 on either backend).
const PORT_TOLERANCE: f32 = 1e-5;

#[test]
fn the_sentence_embedding_matches_sentence_transformers_on_both_backends() {
    for backend in Backend::ALL {
        let fixture = fixture(backend);
        assert_eq!(fixture.encoded.ids, SENTENCE_IDS);
        let (ids, mask) = fixture.tensors();
        let embedding = burn_values(fixture.model.embed(ids, mask));
        assert_eq!(embedding.len(), 384);
        for (dim, (got, want)) in embedding.iter().zip(SENTENCE_EMBEDDING_START).enumerate() {
            assert!(
                (got - want).abs() <= TOLERANCE,
                "{backend:?}, dimension {dim}: {got} vs {want}"
            );
        }
        let norm = embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{backend:?}: norm {norm}");
    }
}

#[test]
fn every_layer_matches_the_candle_port_on_both_backends() {
    let (candle, candle_ids, candle_mask) = candle_port();
    let candle_bias = minilm::Model::attention_bias(&candle_mask).unwrap();
    let mut expected = vec![candle.embeddings().forward(&candle_ids).unwrap()];
    for layer in candle.layers() {
        let next = layer
            .forward(expected.last().unwrap(), &candle_bias)
            .unwrap();
        expected.push(next);
    }
    for backend in Backend::ALL {
        let fixture = fixture(backend);
        let (ids, mask) = fixture.tensors();
        let bias = Model::attention_bias(mask);
        let mut hidden = fixture.model.embeddings().forward(ids);
        let mut worst = 0f32;
        for (k, want) in expected.iter().enumerate() {
            if k > 0 {
                hidden = fixture.model.layers()[k - 1].forward(hidden, bias.clone());
            }
            assert_eq!(hidden.dims().as_slice(), want.dims());
            let error = relative_error(&burn_values(hidden.clone()), &candle_values(want));
            assert!(
                error <= PORT_TOLERANCE,
                "{backend:?}: {} differs from the candle port by {error:e}",
                if k == 0 {
                    "the embeddings".to_owned()
                } else {
                    format!("layer {}", k - 1)
                }
            );
            worst = worst.max(error);
        }
        eprintln!("{backend:?}: worst relative error against the candle port {worst:.2e}");
    }
}
