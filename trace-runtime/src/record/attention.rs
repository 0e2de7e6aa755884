//! Sparse record of one attention row: the keys a query attends to most, and how spread out it is.

use serde::{Deserialize, Serialize};

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
    #[serde(with = "crate::record::float::vec")]
    pub top_k_weights: Vec<f32>,
    /// Weight not kept: the row's total minus the kept weights, which is `1 − Σ top-k` for a
    /// normalised row (kept that way so that rows which do not sum to one still say how much of
    /// their own mass the record leaves out).
    #[serde(with = "crate::record::float::single")]
    pub tail_mass: f32,
    /// Shannon entropy of the row in nats, `−Σ w ln w` over positive weights.
    #[serde(with = "crate::record::float::single")]
    pub entropy: f32,
    /// Weight on position 0 (the usual sink, BOS), recorded exactly whether or not it is in top-k.
    #[serde(with = "crate::record::float::single")]
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

/// Writes the `k` largest finite values of `values` that are `>= min_value` into
/// `positions` / `kept`, largest first; equal values keep the lower position first, so the
/// result equals a stable sort by descending value truncated to `k`.
///
/// Selection, not a sort of the row: the output buffers hold a min-heap of the best `k` seen so
/// far, a value is compared with its root once, and only the `k` kept values are sorted at the
/// end. Both buffers are cleared first and grow to at most `min(k, n)`; nothing else allocates.
pub fn top_k_by_selection(
    values: &[f32],
    k: usize,
    min_value: f32,
    positions: &mut Vec<usize>,
    kept: &mut Vec<f32>,
) {
    positions.clear();
    kept.clear();
    if k == 0 {
        return;
    }
    let cap = k.min(values.len());
    positions.reserve(cap);
    kept.reserve(cap);
    let mut heap = Heap { positions, kept };
    // Fill: the first k admissible values enter unconditionally.
    let mut next = 0;
    while next < values.len() && heap.len() < k {
        let v = values[next];
        // NaN fails `>=`; infinities are excluded explicitly.
        if v >= min_value && v.is_finite() {
            heap.push(v, next);
        }
        next += 1;
    }
    if heap.len() == k {
        // From here a value must beat the root (the worst kept value, itself >= min_value); an
        // equal value comes later in the row and loses the tie, so `>` is exact.
        let mut bar = heap.kept[0];
        let offer = |heap: &mut Heap<'_>, bar: &mut f32, v: f32, pos: usize| {
            if v > *bar && v != f32::INFINITY {
                heap.replace_root(v, pos);
                *bar = heap.kept[0];
            }
        };
        const CHUNK: usize = 16;
        let mut chunks = values[next..].chunks_exact(CHUNK);
        for chunk in &mut chunks {
            // Most chunks of a row hold nothing better than the bar: one vectorised test skips them.
            if chunk.iter().fold(false, |any, &v| any | (v > bar)) {
                for (i, &v) in chunk.iter().enumerate() {
                    offer(&mut heap, &mut bar, v, next + i);
                }
            }
            next += CHUNK;
        }
        for (i, &v) in chunks.remainder().iter().enumerate() {
            offer(&mut heap, &mut bar, v, next + i);
        }
    }
    heap.sort_descending();
}

/// A min-heap on (value, then higher position = smaller) stored in two parallel vectors, so the
/// kept entries end up in the caller's buffers with no scratch space.
struct Heap<'a> {
    positions: &'a mut Vec<usize>,
    kept: &'a mut Vec<f32>,
}

impl Heap<'_> {
    fn len(&self) -> usize {
        self.kept.len()
    }

    /// `a` ranks below `b`: smaller value, or same value at a later position.
    fn worse(&self, a: usize, b: usize) -> bool {
        let (va, vb) = (self.kept[a], self.kept[b]);
        va < vb || (va == vb && self.positions[a] > self.positions[b])
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.kept.swap(a, b);
        self.positions.swap(a, b);
    }

    fn push(&mut self, value: f32, pos: usize) {
        self.kept.push(value);
        self.positions.push(pos);
        let mut child = self.len() - 1;
        while child > 0 {
            let parent = (child - 1) / 2;
            if !self.worse(child, parent) {
                break;
            }
            self.swap(child, parent);
            child = parent;
        }
    }

    fn replace_root(&mut self, value: f32, pos: usize) {
        self.kept[0] = value;
        self.positions[0] = pos;
        self.sift_down(0, self.len());
    }

    fn sift_down(&mut self, mut node: usize, end: usize) {
        loop {
            let left = 2 * node + 1;
            if left >= end {
                break;
            }
            let right = left + 1;
            let child = if right < end && self.worse(right, left) {
                right
            } else {
                left
            };
            if !self.worse(child, node) {
                break;
            }
            self.swap(child, node);
            node = child;
        }
    }

    /// Heapsort: moving the worst to the back repeatedly leaves the best first.
    fn sort_descending(&mut self) {
        let mut end = self.len();
        while end > 1 {
            end -= 1;
            self.swap(0, end);
            self.sift_down(0, end);
        }
    }
}

/// Which rows to record and how much of each to keep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AttentionTraceConfig {
    /// Keys kept per query row.
    pub top_k: usize,
    /// Layers to trace; `None` traces all.
    pub layers: Option<Vec<usize>>,
    /// Heads to trace (in every traced layer); `None` traces all.
    pub heads: Option<Vec<usize>>,
    /// Weights below this are not kept in the top-k (they still count in tail mass and entropy),
    /// so a diffuse row costs no storage.
    pub weight_threshold: f32,
}

impl Default for AttentionTraceConfig {
    /// Top 10 keys per row, weights of at least 1%, every layer and head.
    fn default() -> Self {
        Self {
            top_k: 10,
            layers: None,
            heads: None,
            weight_threshold: 0.01,
        }
    }
}

impl AttentionTraceConfig {
    /// Whether rows of layer `layer_idx` are recorded.
    pub fn should_trace_layer(&self, layer_idx: usize) -> bool {
        self.layers.as_ref().is_none_or(|l| l.contains(&layer_idx))
    }

    /// Whether rows of head `head_idx` are recorded.
    pub fn should_trace_head(&self, head_idx: usize) -> bool {
        self.heads.as_ref().is_none_or(|h| h.contains(&head_idx))
    }

    /// Records one row with this configuration's `top_k` and `weight_threshold`, or `None` when
    /// the layer or head is filtered out (nothing is computed then).
    pub fn trace_row(
        &self,
        layer_idx: usize,
        head_idx: usize,
        query_pos: usize,
        weights: &[f32],
    ) -> Option<AttentionWeightTrace> {
        (self.should_trace_layer(layer_idx) && self.should_trace_head(head_idx)).then(|| {
            AttentionWeightTrace::from_weights_with_threshold(
                layer_idx,
                head_idx,
                query_pos,
                weights,
                self.top_k,
                self.weight_threshold,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift64*: deterministic rows without a dev-dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32
        }
    }

    fn sort_based(values: &[f32], k: usize, min: f32) -> (Vec<usize>, Vec<f32>) {
        let mut idx: Vec<usize> = (0..values.len())
            .filter(|&i| values[i].is_finite() && values[i] >= min)
            .collect();
        idx.sort_by(|&a, &b| values[b].total_cmp(&values[a]).then(a.cmp(&b)));
        idx.truncate(k);
        let w = idx.iter().map(|&i| values[i]).collect();
        (idx, w)
    }

    #[test]
    fn top_k_equals_sort_based_top_k_on_random_rows() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut pos, mut kept) = (Vec::new(), Vec::new());
        for case in 0..400 {
            let n = (rng.next() % 300) as usize;
            // coarse values in some rows so ties are frequent
            let coarse = case % 3 == 0;
            let mut row: Vec<f32> = (0..n)
                .map(|_| {
                    let u = rng.unit();
                    if coarse {
                        (u * 8.0).floor() / 8.0
                    } else {
                        u
                    }
                })
                .collect();
            if case % 7 == 0 && n > 3 {
                row[1] = f32::NAN;
                row[n - 1] = f32::INFINITY;
                row[2] = f32::NEG_INFINITY;
            }
            for k in [0, 1, 2, 5, 10, 32, 500] {
                for min in [f32::NEG_INFINITY, 0.25] {
                    top_k_by_selection(&row, k, min, &mut pos, &mut kept);
                    let (want_pos, want_w) = sort_based(&row, k, min);
                    assert_eq!(pos, want_pos, "case {case} n {n} k {k} min {min}");
                    assert_eq!(kept, want_w);
                }
            }
        }
    }

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
        assert!(config.trace_row(14, 0, 0, &[1.0]).is_none());
        let mut row = vec![0.001f32; 1000];
        row[7] = 0.5;
        row[3] = 0.4;
        let t = config.trace_row(15, 1, 999, &row).unwrap();
        assert_eq!(t.top_k_positions, [7, 3]);
        assert!((t.tail_mass - 0.998).abs() < 1e-4, "{}", t.tail_mass);
        let default = AttentionTraceConfig::default();
        assert_eq!((default.top_k, default.weight_threshold), (10, 0.01));
        assert!(default.should_trace_layer(123) && default.should_trace_head(45));
    }
}
