//! What attention heads do, from their recorded rows: each head's specialization, each layer's
//! patterns, and pairs of heads that attend alike.
//!
//! Every rule judges a row against the keys it could see. In causal attention the query at
//! position `q` sees keys `0..=q`; in bidirectional attention it sees all `num_keys`. Attention
//! counts as causal until a row keeps a key after its query (rows before that one are judged
//! as causal, which for a bidirectional model is at most its first row or two). Rows that see
//! fewer than [`MIN_VISIBLE_KEYS`] keys are not judged: the first query of a causal head can
//! only attend to key 0, which says nothing about the head.
//!
//! The analysis is streaming: an [`AttentionAnalyzer`] takes rows one at a time and keeps
//! running sums per head and layer, so that it covers every row of a long trace in little
//! memory; [`analyze_attention`] runs one over a slice.
//!
//! Per judged row, with `v` visible keys and the kept (top-k) weights:
//! * normalized entropy `H / ln v` (0: one key; 1: uniform);
//! * sink weight: the weight on key 0, and its excess over the uniform share `1/v`;
//! * previous-token weight: the weight on key `q − 1`;
//! * local mass: the kept weight within `LOCAL_WINDOW` keys of the query (itself included);
//! * argmax offset: the heaviest key's position minus `q`.
//!
//! A head's specialization is the first rule its judged rows meet, on average:
//! 1. **first-token sink**: mean sink weight ≥ [`SINK_WEIGHT`] (and at least 3× the mean uniform
//!    share);
//! 2. **previous-token**: mean weight on `q − 1` ≥ [`PREVIOUS_TOKEN_WEIGHT`];
//! 3. **positional**: one argmax offset (other than −1) in ≥ [`POSITIONAL_SHARE`] of the rows
//!    (offset 0 is attention to the token itself);
//! 4. **local window**: mean local mass ≥ [`LOCAL_MASS`];
//! 5. **broad**: mean normalized entropy ≥ [`BROAD_ENTROPY`];
//! 6. **mixed**: none of these.

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;

use super::histogram::Histogram;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::record::AttentionWeightTrace;

/// Rows that see fewer keys are not judged.
pub const MIN_VISIBLE_KEYS: usize = 4;
/// Mean weight on key 0 from which a head is a first-token sink.
pub const SINK_WEIGHT: f32 = 0.5;
/// Mean weight on the previous key from which a head is a previous-token head.
pub const PREVIOUS_TOKEN_WEIGHT: f32 = 0.5;
/// Share of rows with the same argmax offset from which a head is positional.
pub const POSITIONAL_SHARE: f32 = 0.7;
/// Keys on either side of the query that count as local.
pub const LOCAL_WINDOW: usize = 2;
/// Mean local mass from which a head is a local-window head.
pub const LOCAL_MASS: f32 = 0.7;
/// Mean normalized entropy from which a head is broad.
pub const BROAD_ENTROPY: f32 = 0.8;
/// Share of rows that keep a key with weight ≥ [`COLUMN_WEIGHT`] for it to be a vertical column.
pub const COLUMN_SHARE: f32 = 0.9;
/// Weight a key needs in a row to count towards a vertical column.
pub const COLUMN_WEIGHT: f32 = 0.1;
/// Similarity from which two heads of a layer are redundant.
pub const REDUNDANT_SIMILARITY: f32 = 0.9;

/// What a head does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Specialization {
    /// Most of its weight on key 0, whatever the query.
    FirstTokenSink,
    /// Most of its weight on the key just before the query.
    PreviousToken,
    /// The heaviest key at one fixed offset from the query (offset 0: the query itself).
    Positional,
    /// Its weight within a few keys of the query.
    LocalWindow,
    /// Weight spread over most of the keys.
    Broad,
    /// None of these.
    Mixed,
    /// No row saw enough keys to judge.
    Unjudged,
}

impl Specialization {
    /// One word, for tables: `sink`, `prev`, `pos`, `local`, `broad`, `mixed`, `unjudged`.
    pub fn short_name(self) -> &'static str {
        match self {
            Self::FirstTokenSink => "sink",
            Self::PreviousToken => "prev",
            Self::Positional => "pos",
            Self::LocalWindow => "local",
            Self::Broad => "broad",
            Self::Mixed => "mixed",
            Self::Unjudged => "unjudged",
        }
    }

    /// Lowercase name, with spaces.
    pub fn name(self) -> &'static str {
        match self {
            Self::FirstTokenSink => "first-token sink",
            Self::PreviousToken => "previous-token",
            Self::Positional => "positional",
            Self::LocalWindow => "local window",
            Self::Broad => "broad",
            Self::Mixed => "mixed",
            Self::Unjudged => "unjudged",
        }
    }
}

/// One head over every row it recorded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeadAnalysis {
    /// Layer.
    pub layer: usize,
    /// Head.
    pub head: usize,
    /// Rows recorded.
    pub rows: usize,
    /// Rows judged (seeing at least [`MIN_VISIBLE_KEYS`] keys).
    pub judged: usize,
    /// What it does.
    pub specialization: Specialization,
    /// The argmax offset of a positional head (0: the token itself).
    pub offset: Option<i64>,
    /// Mean entropy in nats over the judged rows.
    pub entropy: f32,
    /// Mean normalized entropy (0..1).
    pub normalized_entropy: f32,
    /// `1 − normalized_entropy`: 1 when each row attends to one key.
    pub sparsity: f32,
    /// Mean weight on key 0.
    pub sink_weight: f32,
    /// Mean weight on the previous key.
    pub previous_token_weight: f32,
    /// Mean mass within [`LOCAL_WINDOW`] keys of the query.
    pub local_mass: f32,
}

/// A layer's heads taken together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerPatterns {
    /// Layer.
    pub layer: usize,
    /// Heads recorded.
    pub heads: usize,
    /// The argmax offset shared by at least half of the layer's judged rows: a diagonal.
    pub diagonal_offset: Option<i64>,
    /// Keys that at least [`COLUMN_SHARE`] of the judged rows that could see them keep with
    /// weight ≥ [`COLUMN_WEIGHT`] (keys seen by fewer than half of the judged rows are not
    /// judged): vertical columns every query attends to.
    pub vertical_columns: Vec<usize>,
    /// Share of judged rows whose kept mass (≥ 80% of it) lies in one contiguous run of at most
    /// a quarter of the visible keys, away from key 0 and the query, holding at least two keys
    /// of weight ≥ [`COLUMN_WEIGHT`]: attention to a block.
    pub block_share: f32,
    /// Share of consecutive queries of a head whose heaviest key other than key 0 and the query
    /// itself is the same key: the head repeats one lookup for every query.
    pub repetitive_share: f32,
    /// Mean normalized entropy over the layer's judged rows.
    pub normalized_entropy: f32,
    /// Mean weight on key 0.
    pub sink_weight: f32,
    /// Mean heaviest weight.
    pub max_weight: f32,
}

/// Two heads of a layer that put their mass in the same places.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RedundantPair {
    /// Layer.
    pub layer: usize,
    /// The two heads.
    pub heads: (usize, usize),
    /// Mean over their common rows (same batch row and query, recorded together) of
    /// `Σ min(w₁[k], w₂[k])` over the keys both kept (1: the same distribution).
    pub similarity: f32,
}

/// The whole analysis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionAnalysis {
    /// Every head, by layer then head.
    pub heads: Vec<HeadAnalysis>,
    /// Every layer.
    pub layers: Vec<LayerPatterns>,
    /// Pairs with similarity ≥ [`REDUNDANT_SIMILARITY`], most similar first.
    pub redundant: Vec<RedundantPair>,
    /// Whether the attention is causal (no row keeps a key after its query).
    pub causal: bool,
    /// Rows analysed.
    pub rows: usize,
}

impl Default for AttentionAnalysis {
    /// No rows: causal, as attention counts until a row keeps a key after its query.
    fn default() -> Self {
        Self {
            heads: Vec::new(),
            layers: Vec::new(),
            redundant: Vec::new(),
            causal: true,
            rows: 0,
        }
    }
}

impl AttentionAnalysis {
    /// Heads with `specialization`, as `(layer, head)`.
    pub fn heads_with(&self, specialization: Specialization) -> Vec<(usize, usize)> {
        self.heads
            .iter()
            .filter(|h| h.specialization == specialization)
            .map(|h| (h.layer, h.head))
            .collect()
    }

    /// How many heads each specialization has.
    pub fn counts(&self) -> BTreeMap<Specialization, usize> {
        let mut counts = BTreeMap::new();
        for head in &self.heads {
            *counts.entry(head.specialization).or_default() += 1;
        }
        counts
    }
}

impl fmt::Display for AttentionAnalysis {
    /// What the heads do, a line per specialization found, then the redundant pairs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rows, {} heads in {} layers ({})",
            self.rows,
            self.heads.len(),
            self.layers.len(),
            if self.causal {
                "causal"
            } else {
                "bidirectional"
            }
        )?;
        let heads_in_layer: BTreeMap<usize, usize> =
            self.layers.iter().map(|l| (l.layer, l.heads)).collect();
        for (specialization, count) in self.counts() {
            let heads = self.heads_with(specialization);
            write!(
                f,
                "\n  {}: {count} head{}",
                specialization.name(),
                plural(count)
            )?;
            if heads.len() <= 6 {
                let names: Vec<String> = self
                    .heads
                    .iter()
                    .filter(|h| h.specialization == specialization)
                    .map(|h| match h.offset {
                        Some(offset) => format!("L{}.H{} ({offset:+})", h.layer, h.head),
                        None => format!("L{}.H{}", h.layer, h.head),
                    })
                    .collect();
                write!(f, ": {}", names.join(", "))?;
                continue;
            }
            let mut per_layer: BTreeMap<usize, usize> = BTreeMap::new();
            for (layer, _) in &heads {
                *per_layer.entry(*layer).or_default() += 1;
            }
            let layers: Vec<usize> = per_layer.keys().copied().collect();
            let whole: Vec<usize> = per_layer
                .iter()
                .filter(|&(layer, &n)| heads_in_layer.get(layer) == Some(&n))
                .map(|(&layer, _)| layer)
                .collect();
            write!(f, ", in layers {}", ranges(&layers))?;
            if !whole.is_empty() && whole.len() < layers.len() {
                write!(f, " (every head of {})", ranges(&whole))?;
            } else if whole.len() == layers.len() {
                write!(f, " (every head)")?;
            }
        }
        if !self.redundant.is_empty() {
            // Two sinks trivially attend alike; the other pairs are the news.
            let sink = |layer: usize, head: usize| {
                self.heads.iter().any(|h| {
                    (h.layer, h.head) == (layer, head)
                        && h.specialization == Specialization::FirstTokenSink
                })
            };
            let (sinks, others): (Vec<&RedundantPair>, Vec<&RedundantPair>) = self
                .redundant
                .iter()
                .partition(|p| sink(p.layer, p.heads.0) && sink(p.layer, p.heads.1));
            write!(f, "\n  redundant pairs: {}", self.redundant.len())?;
            if !sinks.is_empty() && others.is_empty() {
                write!(f, ", all between first-token sinks")?;
            } else if !sinks.is_empty() {
                write!(f, ", {} of them between first-token sinks", sinks.len())?;
            }
            if !others.is_empty() {
                let shown: Vec<String> = others
                    .iter()
                    .take(3)
                    .map(|p| {
                        format!(
                            "L{}.H{}~H{} {:.2}",
                            p.layer, p.heads.0, p.heads.1, p.similarity
                        )
                    })
                    .collect();
                let more = if others.len() > 3 { ", …" } else { "" };
                let label = if sinks.is_empty() { "" } else { "others: " };
                write!(f, " ({label}{}{more})", shown.join(", "))?;
            }
        }
        Ok(())
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `1-5, 7, 9-12` for sorted numbers.
fn ranges(numbers: &[usize]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < numbers.len() {
        let start = numbers[i];
        while i + 1 < numbers.len() && numbers[i + 1] == numbers[i] + 1 {
            i += 1;
        }
        parts.push(if numbers[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", numbers[i])
        });
        i += 1;
    }
    parts.join(", ")
}

/// A judged row's measures.
#[derive(Debug, Clone, Copy)]
struct RowMeasures {
    visible: usize,
    entropy: f32,
    normalized_entropy: f32,
    sink: f32,
    uniform: f32,
    previous: f32,
    local: f32,
    max_weight: f32,
    offset: i64,
}

fn visible_keys(row: &AttentionWeightTrace, causal: bool) -> usize {
    if causal {
        row.num_keys.min(row.query_pos + 1)
    } else {
        row.num_keys
    }
}

#[allow(clippy::cast_precision_loss, clippy::cast_possible_wrap)]
fn measure(row: &AttentionWeightTrace, causal: bool) -> Option<RowMeasures> {
    let visible = visible_keys(row, causal);
    if visible < MIN_VISIBLE_KEYS || row.top_k_positions.is_empty() {
        return None;
    }
    let weight_at = |key: usize| {
        row.top_k_positions
            .iter()
            .zip(&row.top_k_weights)
            .find(|(&p, _)| p == key)
            .map_or(0.0, |(_, &w)| w)
    };
    let query = row.query_pos;
    let local: f32 = row
        .top_k_positions
        .iter()
        .zip(&row.top_k_weights)
        .filter(|(&p, _)| p.abs_diff(query) <= LOCAL_WINDOW)
        .map(|(_, &w)| w)
        .sum();
    Some(RowMeasures {
        visible,
        entropy: row.entropy,
        normalized_entropy: (row.entropy / (visible as f32).ln()).clamp(0.0, 1.0),
        sink: row.sink_weight,
        uniform: 1.0 / visible as f32,
        previous: if query > 0 { weight_at(query - 1) } else { 0.0 },
        local,
        max_weight: row.top_k_weights.first().copied().unwrap_or(0.0),
        offset: row.top_k_positions[0] as i64 - query as i64,
    })
}

/// A running mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
struct Mean {
    sum: f64,
    n: usize,
}

impl Mean {
    fn add(&mut self, value: f32) {
        self.sum += f64::from(value);
        self.n += 1;
    }

    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    fn get(self) -> f32 {
        if self.n == 0 {
            0.0
        } else {
            (self.sum / self.n as f64) as f32
        }
    }
}

/// Running sums of one head. Its histograms, like the layer's, are `BTreeMap`s: they are
/// serialized, and a `HashMap`'s order changes from process to process, so two tracers holding the
/// same records would serialize differently.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct HeadSums {
    rows: usize,
    judged: usize,
    entropy: Mean,
    normalized_entropy: Mean,
    sink: Mean,
    uniform: Mean,
    previous: Mean,
    local: Mean,
    offsets: Histogram,
    /// The previous row's heaviest key elsewhere, if that row was judged.
    last_elsewhere: Option<Option<usize>>,
}

/// Running sums of one layer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct LayerSums {
    /// Its heads.
    heads: BTreeMap<usize, HeadSums>,
    judged: usize,
    offsets: Histogram,
    /// Judged rows keeping each key with weight ≥ `COLUMN_WEIGHT`.
    columns: Histogram,
    /// Judged rows by the number of keys they could see.
    visible: Histogram,
    blocks: usize,
    repeat_pairs: usize,
    repeat_same: usize,
    normalized_entropy: Mean,
    sink: Mean,
    max_weight: Mean,
    /// Overlap of each pair of heads (lower head, then higher) over their common rows.
    pairs: BTreeMap<usize, BTreeMap<usize, Mean>>,
}

/// The kept keys of one row waiting for its heads' siblings.
type KeptRow = (Vec<usize>, Vec<f32>);

/// Rows of one (layer, batch row, query) recorded together, by head.
type Pending = HashMap<(usize, usize, usize), BTreeMap<usize, KeptRow>>;

/// Analyses attention rows as they come, in memory that does not grow with the number of rows
/// (only with the number of heads, the rows of one group, and the longest sequence: 4 bytes per
/// head and position for its histograms of offsets and keys).
///
/// Rows of different heads are compared for redundancy when they share a layer, batch row and
/// query and arrive in one group: a group ends at [`end_group`](Self::end_group) (the tracer
/// calls it after each attention record and pass) or when a head repeats for a query.
///
/// ```
/// use trace_runtime::{AttentionAnalyzer, Specialization};
/// use trace_runtime::AttentionWeightTrace;
///
/// let mut analyzer = AttentionAnalyzer::default();
/// for query in 0..16 {
///     // every query puts 90% of its weight on the first token
///     let mut row = vec![0.1 / query as f32; query + 1];
///     row[0] = if query == 0 { 1.0 } else { 0.9 };
///     analyzer.add(&AttentionWeightTrace::from_weights(0, 0, query, &row, 8));
/// }
/// let analysis = analyzer.analysis();
/// assert_eq!(analysis.heads[0].specialization, Specialization::FirstTokenSink);
/// ```
///
/// It serializes with serde (an open group is not included).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttentionAnalyzer {
    layers: BTreeMap<usize, LayerSums>,
    #[serde(skip)]
    pending: Pending,
    bidirectional: bool,
    rows: usize,
}

impl AttentionAnalyzer {
    /// Takes one row into account.
    pub fn add(&mut self, row: &AttentionWeightTrace) {
        self.rows += 1;
        if !self.bidirectional && row.top_k_positions.iter().any(|&p| p > row.query_pos) {
            self.bidirectional = true;
        }
        let causal = !self.bidirectional;
        let measured = measure(row, causal);
        let layer = self.layers.entry(row.layer_idx).or_default();
        let head = layer.heads.entry(row.head_idx).or_default();
        head.rows += 1;
        let elsewhere = heaviest_elsewhere(row);
        let repeated = head
            .last_elsewhere
            .map(|previous| previous.is_some() && previous == elsewhere);
        head.last_elsewhere = measured.map(|_| elsewhere);
        if let Some(m) = measured {
            head.judged += 1;
            head.entropy.add(m.entropy);
            head.normalized_entropy.add(m.normalized_entropy);
            head.sink.add(m.sink);
            head.uniform.add(m.uniform);
            head.previous.add(m.previous);
            head.local.add(m.local);
            head.offsets.add(m.offset);

            layer.judged += 1;
            layer.offsets.add(m.offset);
            layer.visible.add(key_of(m.visible));
            for (&p, &w) in row.top_k_positions.iter().zip(&row.top_k_weights) {
                if w >= COLUMN_WEIGHT {
                    layer.columns.add(key_of(p));
                }
            }
            layer.blocks += usize::from(is_block(row, m.visible));
            layer.normalized_entropy.add(m.normalized_entropy);
            layer.sink.add(m.sink);
            layer.max_weight.add(m.max_weight);
        }
        if let Some(same) = repeated {
            layer.repeat_pairs += 1;
            layer.repeat_same += usize::from(same);
        }

        let key = (row.layer_idx, row.batch, row.query_pos);
        if self
            .pending
            .get(&key)
            .is_some_and(|heads| heads.contains_key(&row.head_idx))
        {
            if let Some(group) = self.pending.remove(&key) {
                add_overlaps(layer, &group);
            }
        }
        if measured.is_some() {
            self.pending.entry(key).or_default().insert(
                row.head_idx,
                (row.top_k_positions.clone(), row.top_k_weights.clone()),
            );
        }
    }

    /// Ends a group of rows recorded together: their heads are compared for redundancy.
    pub fn end_group(&mut self) {
        for ((layer, _, _), group) in self.pending.drain() {
            if let Some(sums) = self.layers.get_mut(&layer) {
                add_overlaps(sums, &group);
            }
        }
    }

    /// Rows taken into account.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The analysis of every row so far (an open group included).
    pub fn analysis(&self) -> AttentionAnalysis {
        let mut layers = self.layers.clone();
        for ((layer, _, _), group) in &self.pending {
            if let Some(sums) = layers.get_mut(layer) {
                add_overlaps(sums, group);
            }
        }
        let heads = layers
            .iter()
            .flat_map(|(&layer, sums)| {
                sums.heads
                    .iter()
                    .map(move |(&head, sums)| head_analysis(layer, head, sums))
            })
            .collect();
        let mut redundant: Vec<RedundantPair> = Vec::new();
        for (&layer, sums) in &layers {
            for (&h1, with) in &sums.pairs {
                for (&h2, overlap) in with {
                    let similarity = overlap.get();
                    if similarity >= REDUNDANT_SIMILARITY {
                        redundant.push(RedundantPair {
                            layer,
                            heads: (h1, h2),
                            similarity,
                        });
                    }
                }
            }
        }
        redundant.sort_by(|a, b| b.similarity.total_cmp(&a.similarity));
        AttentionAnalysis {
            heads,
            layers: layers
                .iter()
                .map(|(&layer, sums)| layer_patterns(layer, sums))
                .collect(),
            redundant,
            causal: !self.bidirectional,
            rows: self.rows,
        }
    }
}

/// Analyses the rows (of any number of passes); rows of different heads are compared where
/// they share a layer, batch row and query, a repeated head starting a new group.
pub fn analyze_attention(rows: &[AttentionWeightTrace]) -> AttentionAnalysis {
    let mut analyzer = AttentionAnalyzer::default();
    for row in rows {
        analyzer.add(row);
    }
    analyzer.analysis()
}

fn add_overlaps(layer: &mut LayerSums, group: &BTreeMap<usize, KeptRow>) {
    let heads: Vec<(&usize, &KeptRow)> = group.iter().collect();
    for (i, &(&h1, r1)) in heads.iter().enumerate() {
        for &(&h2, r2) in &heads[i + 1..] {
            layer
                .pairs
                .entry(h1)
                .or_default()
                .entry(h2)
                .or_default()
                .add(overlap(r1, r2));
        }
    }
}

/// A position or a count as a histogram key.
fn key_of(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The most common entry of a histogram, ties to the smallest |offset|.
fn most_common(offsets: &Histogram) -> Option<(i64, usize)> {
    offsets
        .to_map()
        .iter()
        .map(|(&o, &n)| (o, n))
        .max_by_key(|&(offset, n)| (n, -offset.abs(), -offset))
}

fn head_analysis(layer: usize, head: usize, sums: &HeadSums) -> HeadAnalysis {
    let (sink, uniform, previous) = (sums.sink.get(), sums.uniform.get(), sums.previous.get());
    let (local, normalized) = (sums.local.get(), sums.normalized_entropy.get());
    #[allow(clippy::cast_precision_loss)]
    let positional = most_common(&sums.offsets)
        .filter(|&(offset, n)| offset != -1 && n as f32 >= POSITIONAL_SHARE * sums.judged as f32);
    let specialization = if sums.judged == 0 {
        Specialization::Unjudged
    } else if sink >= SINK_WEIGHT && sink >= 3.0 * uniform {
        Specialization::FirstTokenSink
    } else if previous >= PREVIOUS_TOKEN_WEIGHT {
        Specialization::PreviousToken
    } else if positional.is_some() {
        Specialization::Positional
    } else if local >= LOCAL_MASS {
        Specialization::LocalWindow
    } else if normalized >= BROAD_ENTROPY {
        Specialization::Broad
    } else {
        Specialization::Mixed
    };
    HeadAnalysis {
        layer,
        head,
        rows: sums.rows,
        judged: sums.judged,
        specialization,
        offset: positional
            .filter(|_| specialization == Specialization::Positional)
            .map(|(o, _)| o),
        entropy: sums.entropy.get(),
        normalized_entropy: normalized,
        sparsity: if sums.judged == 0 {
            0.0
        } else {
            1.0 - normalized
        },
        sink_weight: sink,
        previous_token_weight: previous,
        local_mass: local,
    }
}

#[allow(clippy::cast_precision_loss)]
fn layer_patterns(layer: usize, sums: &LayerSums) -> LayerPatterns {
    let n = sums.judged as f32;
    let diagonal_offset = most_common(&sums.offsets)
        .filter(|&(_, count)| n > 0.0 && count as f32 >= 0.5 * n)
        .map(|(offset, _)| offset);
    // judged rows that could see key k: those with more than k visible keys
    let visible = sums.visible.to_map();
    let seeing = |key: i64| -> usize {
        visible
            .range((Bound::Excluded(key), Bound::Unbounded))
            .map(|(_, n)| n)
            .sum()
    };
    let mut vertical_columns: Vec<usize> = sums
        .columns
        .to_map()
        .iter()
        .filter(|&(&key, &count)| {
            let could = seeing(key);
            could > 0 && could as f32 >= 0.5 * n && count as f32 >= COLUMN_SHARE * could as f32
        })
        .filter_map(|(&key, _)| usize::try_from(key).ok())
        .collect();
    vertical_columns.sort_unstable();
    LayerPatterns {
        layer,
        heads: sums.heads.len(),
        diagonal_offset,
        vertical_columns,
        block_share: if n > 0.0 { sums.blocks as f32 / n } else { 0.0 },
        repetitive_share: if sums.repeat_pairs > 0 {
            sums.repeat_same as f32 / sums.repeat_pairs as f32
        } else {
            0.0
        },
        normalized_entropy: sums.normalized_entropy.get(),
        sink_weight: sums.sink.get(),
        max_weight: sums.max_weight.get(),
    }
}

/// The heaviest kept key that is neither key 0 nor the query itself.
fn heaviest_elsewhere(row: &AttentionWeightTrace) -> Option<usize> {
    row.top_k_positions
        .iter()
        .copied()
        .find(|&p| p != 0 && p != row.query_pos)
}

/// ≥ 80% of the kept mass in one contiguous run of keys no longer than a quarter of the visible
/// keys (at least 2), holding at least two keys of weight ≥ [`COLUMN_WEIGHT`], containing
/// neither key 0 nor the query.
fn is_block(row: &AttentionWeightTrace, visible: usize) -> bool {
    let width = (visible / 4).max(2);
    let kept: f32 = row.top_k_weights.iter().sum();
    if kept <= 0.0 {
        return false;
    }
    let mut keys: Vec<(usize, f32)> = row
        .top_k_positions
        .iter()
        .copied()
        .zip(row.top_k_weights.iter().copied())
        .collect();
    keys.sort_unstable_by_key(|&(p, _)| p);
    keys.iter().any(|&(start, _)| {
        let end = start + width;
        let run = || keys.iter().filter(|&&(p, _)| p >= start && p < end);
        let inside: f32 = run().map(|&(_, w)| w).sum();
        let heavy = run().filter(|&&(_, w)| w >= COLUMN_WEIGHT).count();
        inside >= 0.8 * kept && heavy >= 2 && !(start..end).contains(&row.query_pos) && start != 0
    })
}

/// `Σ min(w₁[k], w₂[k])` over the keys both rows kept.
fn overlap(a: &KeptRow, b: &KeptRow) -> f32 {
    a.0.iter()
        .zip(&a.1)
        .filter_map(|(p, &w)| b.0.iter().position(|q| q == p).map(|i| w.min(b.1[i])))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A causal head over `queries` queries whose row for query `q` is `weights(q)` over
    /// `q + 1` keys.
    fn head(
        layer: usize,
        head: usize,
        queries: usize,
        weights: impl Fn(usize) -> Vec<f32>,
    ) -> Vec<AttentionWeightTrace> {
        (0..queries)
            .map(|q| {
                let mut row = weights(q);
                row.resize(q + 1, 0.0);
                AttentionWeightTrace::from_weights(layer, head, q, &row, 10)
            })
            .collect()
    }

    fn one_hot(at: usize, len: usize) -> Vec<f32> {
        let mut row = vec![0.0; len];
        row[at] = 1.0;
        row
    }

    fn spread(len: usize) -> Vec<f32> {
        vec![1.0 / len as f32; len]
    }

    #[test]
    fn each_rule_on_attention_whose_answer_is_known() {
        let mut rows = Vec::new();
        rows.extend(head(0, 0, 16, |q| {
            let mut w = spread(q + 1).iter().map(|v| v * 0.2).collect::<Vec<_>>();
            w[0] += 0.8;
            w
        }));
        rows.extend(head(0, 1, 16, |q| one_hot(q.saturating_sub(1), q + 1)));
        rows.extend(head(0, 2, 16, |q| one_hot(q, q + 1)));
        rows.extend(head(0, 3, 16, |q| {
            // the window q-2..=q, its heaviest key rotating so that no offset dominates
            let mut w = vec![0.0; q + 1];
            for (i, k) in (q.saturating_sub(2)..=q).enumerate() {
                w[k] = if (i + q) % 3 == 0 { 0.4 } else { 0.3 };
            }
            w
        }));
        rows.extend(head(0, 4, 16, |q| spread(q + 1)));
        rows.extend(head(0, 5, 16, |q| {
            let mut w = vec![0.0; q + 1];
            w[q / 2] = 0.45;
            w[q / 3] = 0.3;
            w[0] = 0.25;
            w
        }));
        let analysis = analyze_attention(&rows);
        assert!(analysis.causal);
        let found: Vec<Specialization> = analysis.heads.iter().map(|h| h.specialization).collect();
        assert_eq!(
            found,
            [
                Specialization::FirstTokenSink,
                Specialization::PreviousToken,
                Specialization::Positional,
                Specialization::LocalWindow,
                Specialization::Broad,
                Specialization::Mixed,
            ]
        );
        assert_eq!(analysis.heads[2].offset, Some(0));
        assert!(analysis.heads[1].sparsity > 0.99 && analysis.heads[4].sparsity < 0.01);
    }

    #[test]
    fn early_causal_rows_are_not_judged_as_sinks() {
        // Every first row sees only key 0 and so puts all its weight there: not a sink head.
        let rows = head(1, 0, 12, |q| spread(q + 1));
        let analysis = analyze_attention(&rows);
        assert_eq!(analysis.heads[0].specialization, Specialization::Broad);
        assert_eq!(analysis.heads[0].judged, 12 - (MIN_VISIBLE_KEYS - 1));
        let short = head(1, 0, 3, |q| spread(q + 1));
        assert_eq!(
            analyze_attention(&short).heads[0].specialization,
            Specialization::Unjudged
        );
    }

    #[test]
    fn layer_patterns_and_redundant_heads() {
        let mut rows = head(2, 0, 20, |q| one_hot(q, q + 1));
        rows.extend(head(2, 1, 20, |q| one_hot(q, q + 1)));
        rows.extend(head(2, 2, 20, |q| {
            let mut w = vec![0.0; q + 1];
            w[0] = 0.5;
            w[q] = 0.5;
            w
        }));
        let analysis = analyze_attention(&rows);
        let layer = &analysis.layers[0];
        assert_eq!(layer.diagonal_offset, Some(0));
        assert_eq!(layer.heads, 3);
        assert_eq!(analysis.redundant.len(), 1);
        assert_eq!(analysis.redundant[0].heads, (0, 1));
        assert!((analysis.redundant[0].similarity - 1.0).abs() < 1e-6);

        // a column every query keeps, a block away from the diagonal, a repeated pattern
        let mut rows = head(3, 0, 24, |q| {
            let mut w = vec![0.0; q + 1];
            if q >= 8 {
                w[4] = 0.45;
                w[5] = 0.45;
                w[q] = 0.1;
            } else {
                w[q] = 1.0;
            }
            w
        });
        rows.extend(head(3, 1, 24, |q| {
            let mut w = vec![0.0; q + 1];
            w[q.min(3)] = 0.9;
            w[q] += 0.1;
            w
        }));
        let analysis = analyze_attention(&rows);
        let layer = &analysis.layers[0];
        // judged: queries 3..=23 of both heads (42 rows); head 0's queries 8..=23 hold keys 4-5
        assert!((layer.block_share - 16.0 / 42.0).abs() < 1e-6, "{layer:?}");
        // consecutive pairs from query 3: head 0 repeats key 4 or 5 from query 8 (15 of 20),
        // head 1 key 3 from query 4 (19 of 20)
        assert!(
            (layer.repetitive_share - 34.0 / 40.0).abs() < 1e-6,
            "{layer:?}"
        );
        assert!(layer.vertical_columns.is_empty(), "{layer:?}");
        assert_eq!(layer.diagonal_offset, None, "{layer:?}");
    }

    #[test]
    fn bidirectional_rows_see_every_key() {
        let rows: Vec<AttentionWeightTrace> = (0..6)
            .map(|q| {
                let mut w = vec![0.02; 6];
                w[5] = 0.9;
                AttentionWeightTrace::from_weights(0, 0, q, &w, 10)
            })
            .collect();
        let analysis = analyze_attention(&rows);
        assert!(!analysis.causal);
        assert_eq!(
            analysis.heads[0].judged, 6,
            "the first query sees all 6 keys"
        );
        assert_eq!(analysis.layers[0].vertical_columns, [5]);
    }

    #[test]
    fn heads_are_compared_on_rows_recorded_together() {
        // Two passes of a decode: each pass records query q for heads 0 and 1 together.
        let mut analyzer = AttentionAnalyzer::default();
        for q in 4..12 {
            for h in 0..2 {
                let w = if h == 0 {
                    one_hot(q, q + 1)
                } else {
                    one_hot(q - 1, q + 1)
                };
                analyzer.add(&AttentionWeightTrace::from_weights(0, h, q, &w, 4));
            }
            analyzer.end_group();
        }
        let analysis = analyzer.analysis();
        assert!(analysis.redundant.is_empty(), "{:?}", analysis.redundant);
        let json = serde_json::to_string(&analyzer).unwrap();
        let back: AttentionAnalyzer = serde_json::from_str(&json).unwrap();
        assert_eq!(back.analysis(), analysis);

        // The same head twice for one query starts a new group: head 0 of the first group is
        // compared with head 1, never with its own later row.
        let mut analyzer = AttentionAnalyzer::default();
        for _ in 0..2 {
            for h in 0..2 {
                analyzer.add(&AttentionWeightTrace::from_weights(0, h, 5, &spread(6), 6));
            }
        }
        let analysis = analyzer.analysis();
        assert_eq!(analysis.redundant.len(), 1);
        assert_eq!(analysis.redundant[0].heads, (0, 1));
        assert_eq!(analysis.rows, 4);
    }

    #[test]
    fn the_display_names_heads_and_layers() {
        let mut rows = Vec::new();
        for layer in 0..3 {
            for h in 0..8 {
                rows.extend(head(layer, h, 10, |q| {
                    if layer == 2 && h == 7 {
                        one_hot(q.saturating_sub(1), q + 1)
                    } else {
                        one_hot(0, q + 1)
                    }
                }));
            }
        }
        let text = analyze_attention(&rows).to_string();
        assert!(
            text.starts_with("240 rows, 24 heads in 3 layers (causal)"),
            "{text}"
        );
        assert!(
            text.contains("first-token sink: 23 heads, in layers 0-2 (every head of 0-1)"),
            "{text}"
        );
        assert!(text.contains("previous-token: 1 head: L2.H7"), "{text}");
        assert_eq!(ranges(&[1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
    }

    #[test]
    fn analyzers_of_the_same_rows_serialize_alike() {
        // Many distinct offsets and columns: a histogram in a `HashMap` would serialize them in
        // an order of its own in each analyzer.
        let rows = head(0, 0, 40, |q| one_hot((q * 7) % (q + 1), q + 1));
        let json = || {
            let mut analyzer = AttentionAnalyzer::default();
            rows.iter().for_each(|row| analyzer.add(row));
            analyzer.end_group();
            serde_json::to_string(&analyzer).unwrap()
        };
        let first = json();
        for _ in 0..8 {
            assert_eq!(json(), first);
        }
    }
}
