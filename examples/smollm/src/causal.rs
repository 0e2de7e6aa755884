//! Causal tracing (ROME's activation patching) with model-trace's interventions: which layer,
//! at which token position, carries what decides the answer.
//!
//! A clean prompt whose answer is known ("The capital of France is" → " Paris") runs once with
//! its layers' outputs captured. A corrupted prompt of the same length ("... of Italy is") runs
//! once as it is, then once per (layer, position) with that one layer's output at that one
//! position replaced by the clean run's: the intervention
//! `pass=K,layer=L,position=P replace(clean.ndjson,pass=0)`. Where the answer's probability
//! comes back, that layer at that position carries the fact. Every run is a pass of one
//! traced session, so its trace file holds each intervention and the answer's probability, and
//! `model-trace report` draws the layer × position heatmap from it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use candle_core::Tensor;
use model_trace::{Action, DigestPolicy, Intervention, ModelTracerConfig, Session};
use serde_json::json;

use crate::{Error, GgufTokenizer, Model, Result};

/// What causal tracing found.
#[derive(Debug, Clone)]
pub struct CausalTrace {
    /// The prompts' tokens as text, the corrupted one's.
    pub tokens: Vec<String>,
    /// The answer's token.
    pub answer: u32,
    /// Its probability after the clean prompt, and after the corrupted one.
    pub clean: f32,
    pub corrupted: f32,
    /// `[layer][position]`: its probability after the corrupted prompt with that one layer's
    /// output at that one position from the clean run.
    pub patched: Vec<Vec<f32>>,
    /// The trace files: the clean run (captured) and the corrupted runs (patched).
    pub clean_trace: PathBuf,
    pub patched_trace: PathBuf,
    /// Forward passes run, and the time they took (tracing included).
    pub runs: usize,
    pub elapsed: Duration,
}

impl CausalTrace {
    /// The figures as JSON: what `causal_trace --json` prints.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "tokens": self.tokens,
            "answer": self.answer,
            "clean": self.clean,
            "corrupted": self.corrupted,
            "patched": self.patched,
            "clean_trace": self.clean_trace,
            "patched_trace": self.patched_trace,
            "runs": self.runs,
            "seconds": self.elapsed.as_secs_f64(),
        })
    }

    /// The (layer, position) whose patch restores the most probability.
    pub fn strongest(&self) -> (usize, usize, f32) {
        let mut best = (0, 0, f32::NEG_INFINITY);
        for (layer, row) in self.patched.iter().enumerate() {
            for (position, &p) in row.iter().enumerate() {
                if p > best.2 {
                    best = (layer, position, p);
                }
            }
        }
        best
    }
}

/// Causal tracing of `model` on `clean` and `corrupted` (prompts of the same token count) for
/// the token `answer`, the trace files written into `dir`.
pub fn causal_trace(
    model: &mut Model,
    tokenizer: &GgufTokenizer,
    clean: &str,
    corrupted: &str,
    answer: &str,
    dir: &Path,
) -> Result<CausalTrace> {
    let clean_ids = tokenizer.encode(clean)?;
    let corrupted_ids = tokenizer.encode(corrupted)?;
    if clean_ids.len() != corrupted_ids.len() || clean_ids.is_empty() {
        return Err(Error::Tokenizer(format!(
            "the prompts must have as many tokens: {} for {clean:?}, {} for {corrupted:?}",
            clean_ids.len(),
            corrupted_ids.len()
        )));
    }
    let answer_ids = tokenizer.encode(answer)?;
    let [answer_id] = answer_ids[..] else {
        return Err(Error::Tokenizer(format!(
            "the answer {answer:?} is {} tokens, not one",
            answer_ids.len()
        )));
    };
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let clean_trace = dir.join("clean.ndjson");
    let session = Session::builder(ModelTracerConfig::lightweight())
        .trace_file(&clean_trace)
        .capture("layer:*")
        .prompt(clean)
        .start()?;
    let clean_prob = probability(&model.forward(&clean_ids, 0)?, answer_id)?;
    drop(session);

    let layers = model.config().num_layers;
    let positions = corrupted_ids.len();
    let replay = Action::replace_from_pass(&clean_trace, 0).map_err(Error::Intervention)?;
    let mut interventions = Vec::with_capacity(layers * positions);
    for layer in 0..layers {
        for position in 0..positions {
            let pass = 1 + layer * positions + position;
            let selector = format!("pass={pass},layer={layer},position={position}");
            let patch = Intervention::new(&selector, replay.clone())
                .map_err(|e| Error::Intervention(e.to_string()))?;
            interventions.push(patch);
        }
    }
    let tokens: Vec<String> = corrupted_ids
        .iter()
        .map(|&id| tokenizer.decode(&[id]))
        .collect::<Result<_>>()?;
    let mut config = ModelTracerConfig::lightweight();
    // What is read is the answer's probability; digests would only cost.
    config.digests = DigestPolicy::Off;
    config.trace_logits = true;
    config.tracked_tokens = Some(vec![answer_id]);
    let patched_trace = dir.join("patched.ndjson");
    let session = Session::builder(config)
        .trace_file(&patched_trace)
        .interventions(interventions)
        .prompt(corrupted)
        .extra("tokens", serde_json::to_string(&tokens).unwrap_or_default())
        .extra("answer", answer)
        .start()?;
    let corrupted_prob = probability(&model.forward(&corrupted_ids, 0)?, answer_id)?;
    let mut patched = vec![vec![f32::NAN; positions]; layers];
    for row in &mut patched {
        for cell in row.iter_mut() {
            *cell = probability(&model.forward(&corrupted_ids, 0)?, answer_id)?;
        }
    }
    let (_, errors) = session.finish_with_errors();
    if let Some(error) = errors.first() {
        return Err(Error::Intervention(format!("a patch failed: {error}")));
    }
    Ok(CausalTrace {
        tokens,
        answer: answer_id,
        clean: clean_prob,
        corrupted: corrupted_prob,
        patched,
        clean_trace,
        patched_trace,
        runs: 2 + layers * positions,
        elapsed: started.elapsed(),
    })
}

/// The softmax probability of `token` in `logits` (`[vocab]`).
fn probability(logits: &Tensor, token: u32) -> Result<f32> {
    let logits: Vec<f32> = logits.to_dtype(candle_core::DType::F32)?.to_vec1()?;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let at = logits.get(token as usize).copied().unwrap_or(f32::NAN);
    #[allow(clippy::cast_possible_truncation)]
    Ok((f64::from(at - max).exp() / sum) as f32)
}
