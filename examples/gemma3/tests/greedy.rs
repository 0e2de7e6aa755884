//! The port on the real Gemma 3 270M weights: the tokenizer and greedy decoding give
//! transformers' ids, and, traced, every pass records Gemma 3's stages and every quantized
//! matmul under its own format. Missing weights fail the tests (never skip): run
//! `scripts/fetch-models`.

mod common;

use common::model;
use gemma3::generate::greedy;

const PROMPT: &str = "The capital of France is";
/// transformers' `Gemma3ForCausalLM` on the same GGUF (`python/tests/gemma3_weights.py`, which
/// a Python test checks against transformers' own tokenizer and `generate`): the prompt's ids,
/// BOS first, and the 8 tokens greedy decoding chooses (" the capital of the country of
/// France.").
const PROMPT_IDS: [u32; 6] = [2, 818, 5279, 529, 7001, 563];
const GREEDY_IDS: [u32; 8] = [506, 5279, 529, 506, 2891, 529, 7001, 236761];

#[test]
fn greedy_decoding_chooses_transformers_tokens() {
    let mut guard = model();
    let (model, tokenizer) = &mut *guard;
    let generation = greedy(model, tokenizer, PROMPT, GREEDY_IDS.len()).unwrap();
    assert_eq!(generation.prompt_ids, PROMPT_IDS);
    assert_eq!(generation.generated, GREEDY_IDS);
    assert_eq!(generation.text, " the capital of the country of France.");
    assert!(!generation.stopped);
}

#[test]
fn the_tokenizer_round_trips_text_with_characters_outside_the_vocabulary() {
    let guard = model();
    let (_, tokenizer) = &*guard;
    for text in [
        "Grüße aus Köln, 東京 and Paris!",
        "  two spaces, a tab\tand\nnewlines\n\n",
        "a crab 🦀 and an unusual glyph \u{10FFFD}",
    ] {
        let ids = tokenizer.encode(text).unwrap();
        assert_eq!(ids[0], tokenizer.bos_id, "{text:?}");
        assert_eq!(tokenizer.decode(&ids).unwrap(), text, "{ids:?}");
    }
    // A private-use character is not a piece: it falls back to its four UTF-8 bytes.
    let ids = tokenizer.encode("\u{10FFFD}").unwrap();
    let pieces: Vec<&str> = ids[1..]
        .iter()
        .filter_map(|&id| tokenizer.piece(id))
        .collect();
    assert_eq!(pieces, ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBD>"]);
}

#[cfg(feature = "trace")]
mod traced {
    use super::*;

    /// 4 greedy tokens against their golden trace (`tests/golden/gemma3-paris.ndjson`): Gemma
    /// 3's 11 stages of each of 18 layers, attention and logits, bit-exact on the machine that
    /// blessed it. After a change that moves the numbers on purpose: `MODEL_TRACE_BLESS=1 cargo
    /// test -p gemma3 --features trace --test greedy golden`.
    #[test]
    fn four_greedy_tokens_match_their_golden_trace() {
        let mut guard = model();
        let (model, tokenizer) = &mut *guard;
        let generation = model_trace::golden::check("tests/golden/gemma3-paris.ndjson", || {
            greedy(model, tokenizer, PROMPT, 4).unwrap()
        });
        assert_eq!(generation.generated, GREEDY_IDS[..4]);
    }
    use model_trace::{ModelTracerConfig, QuantType, Session, TraceFilter};

    /// Gemma 3's stages in the order its block computes them.
    const STAGES: [&str; 11] = [
        "input",
        "attn_in",
        "q_norm",
        "k_norm",
        "attn_out",
        "attn_post_norm",
        "resid_mid",
        "mlp_in",
        "mlp_out",
        "mlp_post_norm",
        "output",
    ];

    #[test]
    fn every_pass_records_gemma3_stages_and_every_quantized_format() {
        let mut guard = model();
        let (model, tokenizer) = &mut *guard;
        let session = Session::with_trace_filter(ModelTracerConfig::full(), TraceFilter::all());
        let generation = greedy(model, tokenizer, PROMPT, 2).unwrap();
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(generation.generated, GREEDY_IDS[..2]);

        let config = model.config().clone();
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), 2);
        for (p, pass) in passes.iter().enumerate() {
            let rows = if p == 0 { PROMPT_IDS.len() } else { 1 };
            assert_eq!(pass.layers.len(), config.num_layers, "pass {p}");
            for (i, layer) in pass.layers.iter().enumerate() {
                assert_eq!(layer.layer_idx, i);
                let names: Vec<&str> = layer.stages().map(|(name, _)| name).collect();
                assert_eq!(names, STAGES, "pass {p} layer {i}");
                for (stage, stats) in layer.stages() {
                    let width = match stage {
                        "q_norm" => config.num_heads * config.head_dim,
                        "k_norm" => config.num_kv_heads * config.head_dim,
                        _ => config.hidden_size,
                    };
                    assert_eq!(stats.count, rows * width, "pass {p} layer {i} {stage}");
                    assert_eq!(stats.nan_count + stats.inf_count, 0);
                }
            }
        }

        // Every matmul under its file's format: 7 a block and the tied Q8_0 head.
        let quant = tracer.quant_traces();
        assert_eq!(quant.len(), 2);
        for pass in quant {
            assert_eq!(pass.traces.len(), 7 * config.num_layers + 1);
            let count = |t: QuantType| pass.traces.iter().filter(|q| q.quant_type == t).count();
            let counts = [
                count(QuantType::Q4_K),
                count(QuantType::Q5_0),
                count(QuantType::Q6_K),
                count(QuantType::Q8_0),
            ];
            // The GGUF's tensor types (Q4_K_M): Q5_0 for q, k, gate, up and most v; Q4_K for
            // the output projections and most down projections; Q6_K for 9 down projections;
            // Q8_0 for 9 v projections and the tied head.
            assert_eq!(counts, [27, 81, 9, 10]);
            for trace in &pass.traces {
                assert_eq!(trace.non_finite, 0);
                assert!(trace.cosine_similarity > 0.99, "{trace:?}");
            }
        }
    }

    /// A batch's passes go through the same traced pass: its stages are `[rows, seq, width]`,
    /// and finite, the padding columns' included (a padding query sees its own key, so no
    /// softmax row is all -inf).
    #[test]
    fn a_padded_batch_records_finite_stages_for_every_row() {
        let mut guard = model();
        let (model, tokenizer) = &mut *guard;
        let prompts: Vec<Vec<u32>> = [PROMPT, "Water boils at a temperature of", "Hi"]
            .iter()
            .map(|p| tokenizer.encode(p).unwrap())
            .collect();
        let columns = prompts.iter().map(Vec::len).max().unwrap();
        let session = Session::with_trace_filter(ModelTracerConfig::full(), TraceFilter::all());
        let rows = gemma3::passes::greedy_batch(model, tokenizer, &prompts, 2).unwrap();
        let (tracer, errors) = session.finish_with_errors();
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rows[0], GREEDY_IDS[..2]);

        let config = model.config().clone();
        let passes = tracer.activation_traces();
        assert_eq!(passes.len(), 2);
        for (p, pass) in passes.iter().enumerate() {
            let (position, seq) = if p == 0 { (0, columns) } else { (columns, 1) };
            assert_eq!(pass.position, position, "pass {p}");
            assert!(!pass.has_anomaly, "pass {p}: {:?}", pass.anomaly_desc);
            for layer in &pass.layers {
                for (stage, stats) in layer.stages() {
                    let width = match stage {
                        "q_norm" => config.num_heads * config.head_dim,
                        "k_norm" => config.num_kv_heads * config.head_dim,
                        _ => config.hidden_size,
                    };
                    let at = format!("pass {p} layer {} {stage}", layer.layer_idx);
                    assert_eq!(stats.count, prompts.len() * seq * width, "{at}");
                    assert_eq!(stats.nan_count + stats.inf_count, 0, "{at}");
                }
            }
        }
    }
}
