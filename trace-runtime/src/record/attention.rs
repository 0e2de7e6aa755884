//! Sparse record of one attention row: the keys a query attends to most, and how spread out it is.

use serde::{Deserialize, Serialize};

use crate::config::AttentionTraceConfig;
use crate::stats::top_k_by_selection;

/// Weight on position 0 at or above which the summary counts a row as an attention sink.
pub const ATTENTION_SINK_THRESHOLD: f32 = 0.3;

/// One query row of one head: its top-k keys (positions and weights, heaviest first) and
/// summaries of the whole row, instead of the full `k_len` weights.
///
/// Only finite, strictly positive weights take part: zeros are masked keys, and NaN or Inf
/// weights are a broken softmax that the activation rules report, not an attention pattern.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttentionWeightTrace {
    /// Layer of the head.
    pub layer_idx: usize,
    /// Row of the batch the query belongs to (index 0 of `[batch, heads, q_len, k_len]`).
    #[serde(default)]
    pub batch: usize,
    /// Head within the layer.
    pub head_idx: usize,
    /// Position of the query token.
    pub query_pos: usize,
    /// Length of the row (number of keys, masked ones included).
    pub num_keys: usize,
    /// Key positions of the kept weights, heaviest first (ties: lower position first).
    pub top_k_positions: Vec<usize>,
    /// The kept weights, descending.
    #[serde(with = "crate::float::vec")]
    pub top_k_weights: Vec<f32>,
    /// Weight not kept: the row's total minus the kept weights, which is `1 − Σ top-k` for a
    /// normalised row (kept that way so that rows which do not sum to one still say how much of
    /// their own mass the record leaves out).
    #[serde(with = "crate::float::single")]
    pub tail_mass: f32,
    /// Shannon entropy of the row in nats, `−Σ w ln w` over positive weights.
    #[serde(with = "crate::float::single")]
    pub entropy: f32,
    /// Weight on position 0 (the usual sink, BOS), recorded exactly whether or not it is in top-k.
    #[serde(with = "crate::float::single")]
    pub sink_weight: f32,
}

impl AttentionWeightTrace {
    /// Records a row keeping its `top_k` heaviest positive weights.
    pub fn from_weights(
        layer_idx: usize,
        head_idx: usize,
        query_pos: usize,
        weights: &[f32],
        top_k: usize,
    ) -> Self {
        Self::from_weights_with_threshold(layer_idx, head_idx, query_pos, weights, top_k, 0.0)
    }

    /// One row as `config` keeps it (its `top_k` and `weight_threshold`), or `None` when
    /// `config` leaves the layer or head out (nothing is computed then).
    pub fn configured(
        config: &AttentionTraceConfig,
        layer_idx: usize,
        head_idx: usize,
        query_pos: usize,
        weights: &[f32],
    ) -> Option<Self> {
        (config.should_trace_layer(layer_idx) && config.should_trace_head(head_idx)).then(|| {
            Self::from_weights_with_threshold(
                layer_idx,
                head_idx,
                query_pos,
                weights,
                config.top_k,
                config.weight_threshold,
            )
        })
    }

    /// As [`from_weights`](Self::from_weights), but weights below `min_weight` are not kept even
    /// when fewer than `top_k` are left (they still count in `tail_mass` and `entropy`).
    ///
    /// Cost: one pass for the top-k (a bounded heap, `O(n log k)` worst case and close to `n`
    /// comparisons on real rows) and one for the sums; the only allocations are the two result
    /// vectors, sized `min(top_k, n)`.
    pub fn from_weights_with_threshold(
        layer_idx: usize,
        head_idx: usize,
        query_pos: usize,
        weights: &[f32],
        top_k: usize,
        min_weight: f32,
    ) -> Self {
        // Keeping only strictly positive weights: the smallest positive f32 as the floor.
        let floor = if min_weight > 0.0 {
            min_weight
        } else {
            f32::from_bits(1)
        };
        let mut top_k_positions = Vec::new();
        let mut top_k_weights = Vec::new();
        top_k_by_selection(
            weights,
            top_k,
            floor,
            &mut top_k_positions,
            &mut top_k_weights,
        );
        let (total, entropy) = mass_and_entropy(weights);
        let kept: f64 = top_k_weights.iter().map(|&w| f64::from(w)).sum();
        let sink_weight = weights
            .first()
            .copied()
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(0.0);
        #[allow(clippy::cast_possible_truncation)]
        Self {
            layer_idx,
            head_idx,
            query_pos,
            batch: 0,
            num_keys: weights.len(),
            top_k_positions,
            top_k_weights,
            tail_mass: (total - kept).max(0.0) as f32,
            // A row with one key has entropy −0.0 from the negation; 0 is what it means.
            entropy: if entropy > 0.0 { entropy as f32 } else { 0.0 },
            sink_weight,
        }
    }

    /// Whether the query puts at least `threshold` of its weight on position 0.
    pub fn is_attention_sink(&self, threshold: f32) -> bool {
        self.sink_weight >= threshold
    }

    /// Whether the kept weights on the last `window` positions up to the query
    /// (`query_pos + 1 − window ..= query_pos`) sum to at least `threshold`.
    ///
    /// Only the top-k entries are known after recording, so this is a lower bound of the row's
    /// true recent mass: it never reports a bias that is not there, and it is exact whenever the
    /// recent positions carrying weight made it into the top-k (as they do when the bias is
    /// strong enough to matter).
    pub fn has_recency_bias(&self, window: usize, threshold: f32) -> bool {
        if window == 0 {
            return false;
        }
        let start = (self.query_pos + 1).saturating_sub(window);
        let recent: f32 = self
            .top_k_positions
            .iter()
            .zip(&self.top_k_weights)
            .filter(|(&p, _)| p >= start && p <= self.query_pos)
            .map(|(_, &w)| w)
            .sum();
        recent >= threshold
    }
}

/// Total mass and entropy (nats) of a row's positive, finite weights.
///
/// This is the expensive half of a trace (a logarithm per key), so it runs in eight independent
/// f32 lanes with a branch-free logarithm that the compiler vectorises; the lanes are summed in
/// f64. Subnormal weights (< 1.2e-38) are left out: their share of mass and entropy is below
/// f32 resolution.
fn mass_and_entropy(weights: &[f32]) -> (f64, f64) {
    const LANES: usize = 8;
    let mut mass = [0.0f32; LANES];
    let mut plogp = [0.0f32; LANES];
    let mut chunks = weights.chunks_exact(LANES);
    for chunk in &mut chunks {
        for lane in 0..LANES {
            let (m, e) = mass_and_plogp(chunk[lane]);
            mass[lane] += m;
            plogp[lane] += e;
        }
    }
    let mut total: f64 = mass.iter().map(|&m| f64::from(m)).sum();
    let mut sum_plogp: f64 = plogp.iter().map(|&e| f64::from(e)).sum();
    for &w in chunks.remainder() {
        let (m, e) = mass_and_plogp(w);
        total += f64::from(m);
        sum_plogp += f64::from(e);
    }
    (total, -sum_plogp)
}

/// `(w, w ln w)` for a normal positive finite weight, `(0, 0)` for anything else.
#[inline(always)]
fn mass_and_plogp(w: f32) -> (f32, f32) {
    let keep = (f32::MIN_POSITIVE..=f32::MAX).contains(&w);
    // ln(1) = 0 exactly, so a rejected weight contributes nothing without a branch.
    let x = if keep { w } else { 1.0 };
    (if keep { w } else { 0.0 }, x * ln_normal(x))
}

/// Natural logarithm of a normal positive f32, branch-free: `x = m·2^e` with `m` in
/// `[√½, √2)`, then Cephes' `logf` polynomial for `ln(m)` (about 1 ulp).
#[inline(always)]
fn ln_normal(x: f32) -> f32 {
    let bits = x.to_bits();
    #[allow(clippy::cast_possible_wrap)]
    let mut exponent = (bits >> 23) as i32 - 127;
    let mut m = f32::from_bits((bits & 0x007f_ffff) | 0x3f80_0000);
    let high = m > std::f32::consts::SQRT_2;
    m = if high { m * 0.5 } else { m };
    exponent += i32::from(high);
    let t = m - 1.0;
    let z = t * t;
    let mut p = 7.037_683_6e-2_f32;
    p = p * t - 1.151_461_1e-1;
    p = p * t + 1.167_699_9e-1;
    p = p * t - 1.242_014_1e-1;
    p = p * t + 1.424_932_3e-1;
    p = p * t - 1.666_805_8e-1;
    p = p * t + 2.000_071_5e-1;
    p = p * t - 2.499_999_4e-1;
    p = p * t + 3.333_333e-1;
    #[allow(clippy::cast_precision_loss)]
    let e = exponent as f32;
    t * z * p - 0.5 * z + t + e * std::f32::consts::LN_2
}

/// The dimensions of attention probabilities, `[batch, heads, q_len, k_len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AttentionDims {
    pub(crate) batch: usize,
    pub(crate) heads: usize,
    pub(crate) q_len: usize,
    pub(crate) k_len: usize,
}

impl AttentionDims {
    /// From a shape of up to four dimensions, missing leading dimensions taken as 1.
    pub(crate) fn of(shape: &[usize]) -> Option<Self> {
        let (batch, heads, q_len, k_len) = match *shape {
            [k_len] => (1, 1, 1, k_len),
            [q_len, k_len] => (1, 1, q_len, k_len),
            [heads, q_len, k_len] => (1, heads, q_len, k_len),
            [batch, heads, q_len, k_len] => (batch, heads, q_len, k_len),
            _ => return None,
        };
        Some(Self {
            batch,
            heads,
            q_len,
            k_len,
        })
    }

    /// How many values a tensor of these dimensions holds; `None` when that overflows.
    pub(crate) fn len(self) -> Option<usize> {
        self.batch
            .checked_mul(self.heads)?
            .checked_mul(self.q_len)?
            .checked_mul(self.k_len)
    }
}

/// The rows of one attention tensor (`data` holds [`AttentionDims::len`] values, `k_len > 0`)
/// that `config` keeps, each with its batch row, head and query position. The queries are the
/// last `q_len` positions of the `k_len` keys (a prefill sees all of them, a decode step the
/// last).
pub(crate) fn attention_rows(
    config: &AttentionTraceConfig,
    layer: usize,
    dims: AttentionDims,
    data: &[f32],
) -> Vec<AttentionWeightTrace> {
    let AttentionDims {
        heads,
        q_len,
        k_len,
        ..
    } = dims;
    let mut rows = Vec::new();
    for (index, weights) in data.chunks_exact(k_len).enumerate() {
        let (batch, rest) = (index / (heads * q_len), index % (heads * q_len));
        let (head, row) = (rest / q_len, rest % q_len);
        let query_pos = (k_len + row).saturating_sub(q_len);
        if let Some(mut trace) =
            AttentionWeightTrace::configured(config, layer, head, query_pos, weights)
        {
            trace.batch = batch;
            rows.push(trace);
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::top_k::tests::Rng;

    #[test]
    fn fast_entropy_matches_f64() {
        let mut rng = Rng(42);
        for n in [0, 1, 7, 8, 9, 100, 4096] {
            let row: Vec<f32> = (0..n)
                .map(|_| rng.unit() * 10f32.powi(-((rng.next() % 30) as i32)))
                .collect();
            let (mut mass, mut ent) = (0.0f64, 0.0f64);
            for &w in &row {
                if w > 0.0 {
                    mass += f64::from(w);
                    ent -= f64::from(w) * f64::from(w).ln();
                }
            }
            let (m, e) = mass_and_entropy(&row);
            assert!((m - mass).abs() <= 1e-6 * mass, "n {n}: {m} vs {mass}");
            assert!(
                (e - ent).abs() <= 1e-5 * ent.abs() + 1e-30,
                "n {n}: {e} vs {ent}"
            );
        }
        for x in [
            f32::MIN_POSITIVE,
            1e-30,
            0.001,
            0.5,
            0.707_05,
            0.707_15,
            1.0,
            1.5,
            2.0,
            1e30,
            f32::MAX,
        ] {
            let want = f64::from(x).ln();
            assert!(
                (f64::from(ln_normal(x)) - want).abs() <= 2e-7 * want.abs().max(1.0),
                "{x}"
            );
        }
        assert_eq!(ln_normal(1.0), 0.0);
        assert_eq!(
            mass_and_entropy(&[f32::NAN, f32::INFINITY, -1.0, 0.0, 1e-45]),
            (0.0, 0.0)
        );
    }

    #[test]
    fn seed_row() {
        let weights = [0.4, 0.1, 0.05, 0.05, 0.2, 0.1, 0.1];
        let t = AttentionWeightTrace::from_weights(0, 0, 6, &weights, 5);
        assert_eq!(t.top_k_positions, [0, 4, 1, 5, 6]);
        assert_eq!(t.top_k_weights, [0.4, 0.2, 0.1, 0.1, 0.1]);
        assert!((t.tail_mass - 0.1).abs() < 1e-6);
        let h: f32 = weights.iter().map(|&w: &f32| -w * w.ln()).sum();
        assert!((t.entropy - h).abs() < 1e-5);
        assert!(t.is_attention_sink(0.3));
        assert!(!t.is_attention_sink(0.5));
        // last 5 positions up to 6 are 2..=6: 0.05 + 0.2 + 0.1 + 0.1 kept (0.05 at 2/3 not kept)
        assert!(t.has_recency_bias(5, 0.4));
        assert!(!t.has_recency_bias(5, 0.5));
        assert!(!t.has_recency_bias(0, 0.0));
    }

    #[test]
    fn zeros_and_non_finite_are_never_kept() {
        let weights = [0.0, f32::NAN, 0.5, f32::INFINITY, 0.5, 0.0];
        let t = AttentionWeightTrace::from_weights(1, 2, 5, &weights, 4);
        assert_eq!(t.top_k_positions, [2, 4]);
        assert_eq!(t.tail_mass, 0.0);
        assert!((t.entropy - 2f32.ln()).abs() < 1e-6);
        assert_eq!(t.sink_weight, 0.0);
        assert_eq!(t.num_keys, 6);
        let empty = AttentionWeightTrace::from_weights(0, 0, 0, &[], 5);
        assert!(empty.top_k_positions.is_empty());
        assert_eq!((empty.tail_mass, empty.entropy), (0.0, 0.0));
    }

    #[test]
    fn config_filters_and_threshold() {
        let config = AttentionTraceConfig {
            top_k: 10,
            layers: Some(vec![0, 15, 31]),
            heads: Some(vec![0, 1]),
            weight_threshold: 0.01,
        };
        assert!(config.should_trace_layer(15) && config.should_trace_head(0));
        assert!(!config.should_trace_layer(14) && !config.should_trace_head(2));
        assert!(AttentionWeightTrace::configured(&config, 14, 0, 0, &[1.0]).is_none());
        let mut row = vec![0.001f32; 1000];
        row[7] = 0.5;
        row[3] = 0.4;
        let t = AttentionWeightTrace::configured(&config, 15, 1, 999, &row).unwrap();
        assert_eq!(t.top_k_positions, [7, 3]);
        assert!((t.tail_mass - 0.998).abs() < 1e-4, "{}", t.tail_mass);
        let default = AttentionTraceConfig::default();
        assert_eq!((default.top_k, default.weight_threshold), (10, 0.01));
        assert!(default.should_trace_layer(123) && default.should_trace_head(45));
    }
}
