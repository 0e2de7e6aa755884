//! How the rank of chosen tokens evolves through the layers of one forward pass (a logit lens).

use serde::{Deserialize, Serialize};

use super::{LogitRow, TrackedLogit};
use crate::stats::top_k_by_selection;

/// The logit and rank of one token at each layer where logits were recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenLogitEvolution {
    /// Vocabulary id.
    pub token_id: u32,
    /// Text of the token, when the caller knows it (the tracer has no tokenizer and leaves it empty).
    pub token_text: String,
    /// Layer index of each record; parallel to the two vectors below.
    pub layers: Vec<usize>,
    /// Logit at each recorded layer (NaN and ±Inf are written to JSON as the strings `"NaN"`,
    /// `"inf"`, `"-inf"`, so a broken model still produces a readable trace).
    #[serde(with = "crate::float::vec")]
    pub logits_by_layer: Vec<f32>,
    /// Rank at each recorded layer: how many logits were strictly greater (0 = top token).
    pub ranks_by_layer: Vec<usize>,
}

impl TokenLogitEvolution {
    /// A token with no records yet.
    pub fn new(token_id: u32, token_text: impl Into<String>) -> Self {
        Self {
            token_id,
            token_text: token_text.into(),
            ..Self::default()
        }
    }

    /// Appends a record for the layer after the previous one (layer 0 for the first record).
    pub fn record_layer(&mut self, logit: f32, rank: usize) {
        let layer = self.layers.last().map_or(0, |l| l + 1);
        self.record_at_layer(layer, logit, rank);
    }

    /// Appends a record for layer `layer_idx` (for a logit lens that probes only some layers).
    pub fn record_at_layer(&mut self, layer_idx: usize, logit: f32, rank: usize) {
        self.layers.push(layer_idx);
        self.logits_by_layer.push(logit);
        self.ranks_by_layer.push(rank);
    }

    /// Rank at the last record.
    pub fn final_rank(&self) -> Option<usize> {
        self.ranks_by_layer.last().copied()
    }

    /// The layer (its index, from `layers`) at which this token's rank improved the most over
    /// the previous record, improvement measured on a log scale:
    /// `ln(1 + rank_before) − ln(1 + rank_at_layer)`.
    ///
    /// The log scale is what "decisive" means for a vocabulary of tens of thousands: moving from
    /// rank 10 to rank 0 decides the output, moving from 40 000 to 30 000 does not, though the
    /// latter is the larger absolute change. Ties go to the earliest layer. `None` when there are
    /// fewer than two records or the rank never improved (the token was already where it ends
    /// up before the first traced layer, or it only lost ground).
    pub fn decisive_layer(&self) -> Option<usize> {
        #[allow(clippy::cast_precision_loss)]
        let log_rank = |r: usize| (r as f64).ln_1p();
        let mut best: Option<(usize, f64)> = None;
        for (i, pair) in self.ranks_by_layer.windows(2).enumerate() {
            let gain = log_rank(pair[0]) - log_rank(pair[1]);
            if gain > 0.0 && best.is_none_or(|(_, g)| gain > g) {
                best = Some((self.layers[i + 1], gain));
            }
        }
        best.map(|(layer, _)| layer)
    }
}

/// Tracked tokens of one forward pass (one batch row of it), layer by layer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogitEvolutionTrace {
    /// Position of the forward pass: that of its first token (`#[trace_model(position = ..)]`,
    /// or [`ModelTracer::begin_forward`](crate::ModelTracer::begin_forward)'s argument). The
    /// token being predicted follows the pass's last token.
    pub position: usize,
    /// The batch row whose logits these are.
    #[serde(default)]
    pub batch: usize,
    /// Sampling temperature in use (metadata; ranks do not depend on it).
    #[serde(with = "crate::float::single")]
    pub temperature: f32,
    /// Nucleus sampling threshold in use (metadata).
    #[serde(with = "crate::float::single")]
    pub top_p: f32,
    /// Tracked tokens, in tracking order (the tracer's automatic choice lists them by final
    /// rank, so the first one is the predicted token).
    pub tracked_tokens: Vec<TokenLogitEvolution>,
    /// Decisive layer of the predicted token (the tracked token with the best final rank,
    /// earliest tracked on ties); set by [`finalize`](Self::finalize).
    pub decisive_layer: Option<usize>,
}

impl LogitEvolutionTrace {
    /// An empty trace for the pass at `position`.
    pub fn new(position: usize, temperature: f32, top_p: f32) -> Self {
        Self {
            position,
            temperature,
            top_p,
            ..Self::default()
        }
    }

    /// Starts tracking `token_id` (or returns the existing entry if it is tracked already).
    pub fn track_token(
        &mut self,
        token_id: u32,
        token_text: impl Into<String>,
    ) -> &mut TokenLogitEvolution {
        let index = match self
            .tracked_tokens
            .iter()
            .position(|t| t.token_id == token_id)
        {
            Some(i) => i,
            None => {
                self.tracked_tokens
                    .push(TokenLogitEvolution::new(token_id, token_text));
                self.tracked_tokens.len() - 1
            }
        };
        &mut self.tracked_tokens[index]
    }

    /// Records the logit and rank of every tracked token from one vocabulary row of layer
    /// `layer_idx`. A token id outside the row gets logit NaN and rank `logits.len()`.
    pub fn record_logits(&mut self, layer_idx: usize, logits: &[f32]) {
        for token in &mut self.tracked_tokens {
            let logit = logits
                .get(token.token_id as usize)
                .copied()
                .unwrap_or(f32::NAN);
            let rank = Self::compute_rank(logits, token.token_id);
            token.record_at_layer(layer_idx, logit, rank);
        }
    }

    /// Rank of `token_id` in `logits`: the number of logits strictly greater than its own, so
    /// 0 is the top token and ties share a rank.
    ///
    /// NaN-safe: NaN logits outrank nothing; a token whose own logit is NaN ranks below every
    /// non-NaN logit (rank = their count); a token outside the row gets `logits.len()`.
    pub fn compute_rank(logits: &[f32], token_id: u32) -> usize {
        let Some(&target) = logits.get(token_id as usize) else {
            return logits.len();
        };
        if target.is_nan() {
            return logits.iter().filter(|x| !x.is_nan()).count();
        }
        logits.iter().filter(|&&x| x > target).count()
    }

    /// The tracked token with the best final rank (earliest tracked on ties).
    pub fn predicted_token(&self) -> Option<&TokenLogitEvolution> {
        self.tracked_tokens
            .iter()
            .filter_map(|t| t.final_rank().map(|r| (r, t)))
            .min_by_key(|(r, _)| *r)
            .map(|(_, t)| t)
    }

    /// Sets `decisive_layer` from the predicted token. Idempotent.
    pub fn finalize(&mut self) {
        self.decisive_layer = self
            .predicted_token()
            .and_then(TokenLogitEvolution::decisive_layer);
    }

    /// Number of layer records (the same for every tracked token when recorded through
    /// [`record_logits`](Self::record_logits)).
    pub fn layers_recorded(&self) -> usize {
        self.tracked_tokens
            .iter()
            .map(|t| t.layers.len())
            .max()
            .unwrap_or(0)
    }
}

/// The dimensions of logits, `[batch, seq, vocab]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LogitsDims {
    pub(crate) batch: usize,
    pub(crate) seq: usize,
    pub(crate) vocab: usize,
}

impl LogitsDims {
    /// From `[vocab]`, `[batch, vocab]` or `[batch, seq, vocab]`.
    pub(crate) fn of(shape: &[usize]) -> Option<Self> {
        let (batch, seq, vocab) = match *shape {
            [vocab] => (1, 1, vocab),
            [batch, vocab] => (batch, 1, vocab),
            [batch, seq, vocab] => (batch, seq, vocab),
            _ => return None,
        };
        Some(Self { batch, seq, vocab })
    }

    /// How many values a tensor of these dimensions holds; `None` when that overflows.
    pub(crate) fn len(self) -> Option<usize> {
        self.batch.checked_mul(self.seq)?.checked_mul(self.vocab)
    }

    /// The next-token row (the last position) of each batch row of `data`, which holds
    /// [`len`](Self::len) values.
    pub(crate) fn next_token_rows(self, data: &[f32]) -> impl Iterator<Item = &[f32]> {
        (0..self.batch).map(move |b| {
            let start = (b * self.seq + self.seq - 1) * self.vocab;
            &data[start..start + self.vocab]
        })
    }
}

/// One next-token row as recorded: its `top_k` tokens and the rank and logit of each tracked
/// token (NaN and past the last rank for a token beyond the row). `positions` and `values` are
/// scratch space, reused across rows.
pub(crate) fn logit_row(
    batch: usize,
    row: &[f32],
    top_k: usize,
    tracked: &[u32],
    (positions, values): (&mut Vec<usize>, &mut Vec<f32>),
) -> LogitRow {
    top_k_by_selection(row, top_k, f32::NEG_INFINITY, positions, values);
    // The softmax's normalizer, only when a tracked token needs it (one pass over the row).
    let log_normalizer = (!tracked.is_empty()).then(|| log_sum_exp(row));
    LogitRow {
        batch,
        top_tokens: positions
            .iter()
            .filter_map(|&p| u32::try_from(p).ok())
            .collect(),
        top_logits: values.clone(),
        tracked: tracked
            .iter()
            .map(|&token| TrackedLogit {
                token,
                logit: row.get(token as usize).copied().unwrap_or(f32::NAN),
                rank: LogitEvolutionTrace::compute_rank(row, token),
                #[allow(clippy::cast_possible_truncation)]
                prob: log_normalizer.map(|lse| {
                    let logit = row.get(token as usize).map_or(f64::NAN, |&l| f64::from(l));
                    (logit - lse).exp() as f32
                }),
            })
            .collect(),
    }
}

/// `ln Σ exp(row)`, shifted by the largest value so that nothing overflows; NaN when the
/// row holds one.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if row.iter().any(|v| v.is_nan()) || !max.is_finite() {
        return f64::NAN;
    }
    let max = f64::from(max);
    let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_tokens_carry_their_probability() {
        let row = [1.0f32, 2.0, 3.0];
        let mut scratch = (Vec::new(), Vec::new());
        let logit_row = logit_row(0, &row, 1, &[2, 0], (&mut scratch.0, &mut scratch.1));
        let z: f64 = row.iter().map(|&v| f64::from(v).exp()).sum();
        let expected = [(3f64).exp() / z, (1f64).exp() / z];
        for (tracked, expected) in logit_row.tracked.iter().zip(expected) {
            assert!((f64::from(tracked.prob.unwrap()) - expected).abs() < 1e-6);
        }
        let none = super::logit_row(0, &row, 1, &[], (&mut scratch.0, &mut scratch.1));
        assert!(none.tracked.is_empty());
    }

    #[test]
    fn rank_counts_strictly_greater_and_is_nan_safe() {
        let logits = [1.0, 5.0, 3.0, 2.0, 4.0];
        assert_eq!(LogitEvolutionTrace::compute_rank(&logits, 1), 0);
        assert_eq!(LogitEvolutionTrace::compute_rank(&logits, 0), 4);
        assert_eq!(LogitEvolutionTrace::compute_rank(&[2.0, 2.0, 1.0], 1), 0);
        let with_nan = [f32::NAN, 1.0, 3.0, f32::NAN];
        assert_eq!(LogitEvolutionTrace::compute_rank(&with_nan, 2), 0);
        assert_eq!(LogitEvolutionTrace::compute_rank(&with_nan, 1), 1);
        assert_eq!(LogitEvolutionTrace::compute_rank(&with_nan, 0), 2);
        assert_eq!(LogitEvolutionTrace::compute_rank(&with_nan, 9), 4);
    }

    #[test]
    fn decisive_layer_uses_log_rank_gain_and_layer_indices() {
        let mut token = TokenLogitEvolution::new(42, "hello");
        for (logit, rank) in [(0.5, 500), (1.0, 200), (3.0, 10), (5.0, 1)] {
            token.record_layer(logit, rank);
        }
        assert_eq!(token.layers, [0, 1, 2, 3]);
        // gains: ln(501/201)=0.91, ln(201/11)=2.91, ln(11/2)=1.70
        assert_eq!(token.decisive_layer(), Some(2));

        let mut sparse = TokenLogitEvolution::new(7, "");
        sparse.record_at_layer(10, 0.0, 100);
        sparse.record_at_layer(20, 1.0, 0);
        sparse.record_at_layer(29, 2.0, 0);
        assert_eq!(sparse.decisive_layer(), Some(20));

        // ties: the earliest layer
        let mut tie = TokenLogitEvolution::new(1, "");
        for rank in [3, 1, 3, 1] {
            tie.record_layer(0.0, rank);
        }
        assert_eq!(tie.decisive_layer(), Some(1));

        let mut never = TokenLogitEvolution::new(1, "");
        never.record_layer(0.0, 0);
        assert_eq!(never.decisive_layer(), None);
        never.record_layer(0.0, 4);
        assert_eq!(never.decisive_layer(), None);
    }

    #[test]
    fn trace_records_all_tracked_tokens_and_finalizes() {
        let mut trace = LogitEvolutionTrace::new(3, 0.7, 0.9);
        trace.track_token(2, "b");
        trace.track_token(0, "a");
        assert_eq!(trace.track_token(2, "ignored").token_text, "b");
        assert_eq!(trace.tracked_tokens.len(), 2);
        trace.record_logits(0, &[3.0, 1.0, 0.0]);
        trace.record_logits(5, &[0.0, 1.0, 3.0]);
        assert_eq!(trace.tracked_tokens[0].ranks_by_layer, [2, 0]);
        assert_eq!(trace.tracked_tokens[0].layers, [0, 5]);
        trace.finalize();
        assert_eq!(trace.predicted_token().map(|t| t.token_id), Some(2));
        assert_eq!(trace.decisive_layer, Some(5));
        assert_eq!(trace.layers_recorded(), 2);
    }

    #[test]
    fn non_finite_logits_round_trip_through_json() {
        let mut token = TokenLogitEvolution::new(1, "x");
        token.record_layer(f32::NAN, 3);
        token.record_layer(f32::INFINITY, 0);
        token.record_layer(f32::NEG_INFINITY, 9);
        token.record_layer(1.5, 1);
        let json = serde_json::to_string(&token).unwrap();
        assert!(json.contains(r#"["NaN","inf","-inf",1.5]"#), "{json}");
        assert!(
            serde_json::from_str::<TokenLogitEvolution>(&json.replace("1.5", "\"1.5\"")).is_err()
        );
        let back: TokenLogitEvolution = serde_json::from_str(&json).unwrap();
        assert!(back.logits_by_layer[0].is_nan());
        assert_eq!(back.logits_by_layer[1..], token.logits_by_layer[1..]);
        assert!(serde_json::from_str::<TokenLogitEvolution>(
            r#"{"token_id":1,"token_text":"","layers":[0],"logits_by_layer":["nope"],"ranks_by_layer":[0]}"#
        )
        .is_err());
    }
}
