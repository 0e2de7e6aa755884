//! What the report shows, gathered in one read of a trace file: compact per-pass and per-layer
//! figures, with the large series packed as base64 little-endian `f32` for the page to decode.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use trace_runtime::{
    AttentionAnalysis, AttentionWeightTrace, Event, LayerEvent, LogitEvolutionTrace, ModelTracer,
    PassEnd, TraceHeader,
};

use crate::router_load::{LayerLoad, RouterTally};

/// Passes whose per-layer statistics and logit evolution the page can show, at most.
pub(crate) const SHOWN_PASSES: usize = 48;
/// The first passes always shown (the prompt, the first tokens).
const FIRST_SHOWN: usize = 8;
/// The last passes always shown.
const LAST_SHOWN: usize = 4;
/// Query positions (and keys) of the attention heatmaps.
pub(crate) const PATTERN_QUERIES: usize = 64;
/// The statistics kept per (pass, layer, stage), in this order.
const STAT_NAMES: [&str; 4] = ["mean", "std", "max |x|", "l2 norm"];

/// Everything the page draws.
#[derive(Debug, Serialize)]
pub(crate) struct ReportData {
    pub(crate) title: String,
    pub(crate) file: String,
    pub(crate) bytes: u64,
    pub(crate) writer: String,
    /// Unix time of the session's start, in ms.
    pub(crate) started_unix_ms: f64,
    pub(crate) metadata: serde_json::Value,
    pub(crate) cut_short: Option<String>,
    /// The tracer's summary, as `model-trace summary` prints it.
    pub(crate) summary_text: String,
    pub(crate) passes: Vec<PassInfo>,
    pub(crate) layers: usize,
    pub(crate) stages: Vec<String>,
    pub(crate) stat_names: [&'static str; 4],
    /// The passes of `stats` and `logits`.
    pub(crate) shown_passes: Vec<usize>,
    /// `[shown pass][layer][stage][stat]`, NaN where not recorded.
    pub(crate) stats: String,
    /// `[pass][layer]` of every pass: the output's l2 norm and max |x|.
    pub(crate) output_norm: String,
    pub(crate) output_max: String,
    /// Per layer: milliseconds per call.
    pub(crate) layer_ms: Vec<LayerTime>,
    pub(crate) attention: Option<AttentionData>,
    /// Per shown pass: the logit evolution of its first batch row, if recorded.
    pub(crate) logits: Vec<Option<LogitEvolutionTrace>>,
    pub(crate) quant: Vec<QuantRow>,
    pub(crate) kv: Vec<KvStep>,
    /// Passes that each patched one (layer, position): the tracked token's probability.
    pub(crate) patching: Option<PatchingData>,
    /// Per layer with routers: each expert's load over every call, the imbalance, the
    /// narrowest margins (empty without router calls).
    pub(crate) routers: Vec<LayerLoad>,
    pub(crate) diff: Option<super::DiffData>,
}

/// Activation patching (causal tracing) as a layer × position heatmap: the passes of the run
/// that each changed one layer's tensor at one token position, and the probability of the
/// first tracked token that each of them ended with.
#[derive(Debug, Serialize)]
pub(crate) struct PatchingData {
    /// The tracked token.
    pub(crate) token: u32,
    /// The intervention of the first patched pass, as written.
    pub(crate) intervention: String,
    /// The token's probability in the first pass that changed nothing (the unpatched run).
    pub(crate) unpatched: Option<f32>,
    pub(crate) layers: usize,
    pub(crate) positions: usize,
    /// `[position][layer]`, NaN where no pass patched that cell.
    pub(crate) probs: String,
    /// The prompt's tokens, when the header's `metadata.extra.tokens` lists them (JSON).
    pub(crate) tokens: Vec<String>,
    /// The tracked token as text, when the header's `metadata.extra.answer` says it.
    pub(crate) answer: Option<String>,
}

/// What one pass changed and ended with, for [`PatchingData`].
#[derive(Debug, Default)]
struct PassPatch {
    /// `(layer, first position, last position, intervention)` of each intervention event.
    changes: Vec<(Option<usize>, Option<[usize; 2]>, String)>,
    /// The first tracked token and its probability in the pass's logits.
    prob: Option<(u32, f32)>,
}

#[derive(Debug, Serialize)]
pub(crate) struct PassInfo {
    pub(crate) pass: usize,
    pub(crate) position: usize,
    pub(crate) ms: f64,
    pub(crate) layers: usize,
    pub(crate) anomalies: Vec<AnomalyMark>,
}

#[derive(Debug, Serialize)]
pub(crate) struct AnomalyMark {
    pub(crate) layer: usize,
    pub(crate) stage: Option<String>,
    pub(crate) description: String,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct LayerTime {
    pub(crate) layer: usize,
    /// In the first pass (the prompt, for a decoder).
    pub(crate) first_ms: f64,
    /// Mean over the other passes.
    pub(crate) rest_mean_ms: f64,
    /// Slowest of the other passes.
    pub(crate) rest_max_ms: f64,
    #[serde(skip)]
    rest_sum_ms: f64,
    #[serde(skip)]
    rest_calls: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct AttentionData {
    pub(crate) analysis: AttentionAnalysis,
    /// One heatmap per head: rows of queries `0..PATTERN_QUERIES`, keys likewise.
    pub(crate) patterns: Vec<HeadPattern>,
    pub(crate) pattern_size: usize,
}

/// A head's first rows, packed: per query a count `n` (u8), then `n` × (key u8, weight u8
/// scaled to 0..=255); queries never recorded have `n = 0`.
#[derive(Debug, Serialize)]
pub(crate) struct HeadPattern {
    pub(crate) layer: usize,
    pub(crate) head: usize,
    pub(crate) rows: String,
}

#[derive(Debug, Serialize)]
pub(crate) struct QuantRow {
    pub(crate) site: String,
    pub(crate) quant_type: String,
    pub(crate) layer: usize,
    pub(crate) count: usize,
    pub(crate) cosine_mean: f64,
    pub(crate) cosine_min: f64,
    pub(crate) snr_mean_db: f64,
    pub(crate) snr_min_db: f64,
    pub(crate) non_finite: usize,
}

#[derive(Debug, Default, Serialize)]
pub(crate) struct KvStep {
    pub(crate) pass: usize,
    /// The most positions any layer's cache held.
    pub(crate) positions: usize,
    pub(crate) capacity: usize,
    /// Every layer's cache, summed (each layer's last state in the pass).
    pub(crate) bytes: usize,
    pub(crate) evictions: usize,
}

/// One pass's layer statistics: (layer, stage index) → the four statistics.
type PassStats = HashMap<(usize, usize), [f32; 4]>;

/// A head's first rows: per query, the kept (key, weight scaled to 0..=255) pairs.
type HeadRows = Vec<Vec<(u8, u8)>>;

/// A pass's KV cache: the step, and each layer's latest cache size.
type KvPass = (KvStep, HashMap<usize, usize>);

/// Reads events into what the page shows.
pub(crate) struct Collector {
    header: TraceHeader,
    tracer: ModelTracer,
    passes: Vec<PassInfo>,
    /// Pass number → index in `passes`.
    pass_index: HashMap<usize, usize>,
    stages: Vec<String>,
    stage_index: HashMap<String, usize>,
    /// Per pass index, of the passes the page may show (see [`Collector::may_show`]).
    stats: HashMap<usize, PassStats>,
    /// Every `stride`-th pass is kept as one the page may show: doubled whenever more than
    /// twice [`SHOWN_PASSES`] are, so that a long run keeps a bounded number.
    stride: usize,
    output: Vec<Vec<(usize, f32, f32)>>,
    layers: usize,
    layer_ms: BTreeMap<usize, LayerTime>,
    patterns: BTreeMap<(usize, usize), HeadRows>,
    logits: HashMap<usize, LogitEvolutionTrace>,
    quant: BTreeMap<(String, usize), QuantSums>,
    kv: BTreeMap<usize, KvPass>,
    patches: BTreeMap<usize, PassPatch>,
    routers: RouterTally,
}

#[derive(Debug, Default)]
struct QuantSums {
    quant_type: String,
    count: usize,
    cosine_sum: f64,
    cosine_min: f64,
    snr_sum: f64,
    snr_finite: usize,
    snr_min: f64,
    non_finite: usize,
}

impl Collector {
    pub(crate) fn new(header: &TraceHeader) -> Self {
        Self {
            header: header.clone(),
            // The summary covers every record; keeping them would grow with the passes.
            tracer: ModelTracer::summary_only(header.config.clone()),
            passes: Vec::new(),
            pass_index: HashMap::new(),
            stages: Vec::new(),
            stage_index: HashMap::new(),
            stats: HashMap::new(),
            stride: 1,
            output: Vec::new(),
            layers: 0,
            layer_ms: BTreeMap::new(),
            patterns: BTreeMap::new(),
            logits: HashMap::new(),
            quant: BTreeMap::new(),
            kv: BTreeMap::new(),
            patches: BTreeMap::new(),
            routers: RouterTally::default(),
        }
    }

    pub(crate) fn accept(&mut self, event: Event) {
        match &event {
            Event::PassBegin(begin) => {
                self.pass_index.insert(begin.pass, self.passes.len());
                self.passes.push(PassInfo {
                    pass: begin.pass,
                    position: begin.position,
                    ms: 0.0,
                    layers: 0,
                    anomalies: Vec::new(),
                });
                self.stats.insert(self.passes.len() - 1, PassStats::new());
                self.output.push(Vec::new());
                self.forget_passes_not_shown();
            }
            Event::PassEnd(end) => self.end_pass(end),
            Event::Layer(layer) => self.layer(layer),
            Event::Attention(attention) => {
                for row in &attention.rows {
                    self.pattern_row(row);
                }
            }
            Event::Quant(quant) => {
                let e = &quant.error;
                let sums = self.quant.entry((e.site.clone(), e.layer_idx)).or_default();
                if sums.count == 0 {
                    sums.quant_type = e.quant_type.to_string();
                    sums.cosine_min = f64::INFINITY;
                    sums.snr_min = f64::INFINITY;
                }
                sums.count += 1;
                sums.non_finite += e.non_finite;
                sums.cosine_sum += f64::from(e.cosine_similarity);
                sums.cosine_min = sums.cosine_min.min(f64::from(e.cosine_similarity));
                if e.snr_db.is_finite() {
                    sums.snr_sum += f64::from(e.snr_db);
                    sums.snr_finite += 1;
                    sums.snr_min = sums.snr_min.min(f64::from(e.snr_db));
                }
            }
            Event::Intervention(change) => {
                if let Some(pass) = change.pass {
                    let patch = self.patches.entry(pass).or_default();
                    patch.changes.push((
                        change.layer,
                        change.positions,
                        change.intervention.clone(),
                    ));
                }
            }
            Event::Logits(logits) => {
                let tracked = logits
                    .batch_rows
                    .first()
                    .and_then(|row| row.tracked.first());
                if let Some(prob) = tracked.and_then(|t| Some((t.token, t.prob?))) {
                    self.patches.entry(logits.pass).or_default().prob = Some(prob);
                }
            }
            Event::Router(call) => self.routers.accept(call),
            Event::KvCache(kv) => {
                let (step, bytes_by_layer) = self.kv.entry(kv.pass.unwrap_or(0)).or_default();
                let state = &kv.state;
                step.positions = step.positions.max(state.valid_positions);
                step.capacity = step.capacity.max(state.capacity);
                step.evictions += state.evictions_this_step;
                bytes_by_layer.insert(state.layer.unwrap_or(0), state.cache_size_bytes);
            }
            _ => {}
        }
        self.tracer.accept(&event);
    }

    fn end_pass(&mut self, end: &PassEnd) {
        let Some(&at) = self.pass_index.get(&end.pass) else {
            return;
        };
        #[allow(clippy::cast_precision_loss)]
        let ms = end.duration_ns as f64 / 1e6;
        let info = &mut self.passes[at];
        info.ms = ms;
        info.layers = end.layers;
        info.anomalies = end
            .anomalies
            .iter()
            .map(|a| AnomalyMark {
                layer: a.layer,
                stage: a.stage.clone(),
                description: a.description.clone(),
            })
            .collect();
        if let Some(first) = end.logit_evolution.first() {
            if self.may_show(at) {
                self.logits.insert(at, first.clone());
            }
        }
    }

    /// Whether the page may show the pass at index `at` (see [`shown_passes`]): one of the
    /// first 8 or the last 4, anomalous, or on the stride.
    fn may_show(&self, at: usize) -> bool {
        at < FIRST_SHOWN
            || at + LAST_SHOWN >= self.passes.len()
            || at.is_multiple_of(self.stride)
            || !self.passes[at].anomalies.is_empty()
    }

    /// Drops the statistics of passes the page can no longer show: the one that has just left
    /// the last 4, and when the stride doubles, those off it.
    fn forget_passes_not_shown(&mut self) {
        let n = self.passes.len();
        if n.saturating_sub(FIRST_SHOWN) / self.stride > 2 * SHOWN_PASSES {
            self.stride *= 2;
            let dropped: Vec<usize> = (self.stats.keys().copied())
                .filter(|&at| !self.may_show(at))
                .collect();
            for at in dropped {
                self.stats.remove(&at);
                self.logits.remove(&at);
            }
        }
        if let Some(left) = n.checked_sub(LAST_SHOWN + 1) {
            if !self.may_show(left) {
                self.stats.remove(&left);
                self.logits.remove(&left);
            }
        }
    }

    fn layer(&mut self, layer: &LayerEvent) {
        self.layers = self.layers.max(layer.layer + 1);
        #[allow(clippy::cast_precision_loss)]
        let ms = layer.duration_ns as f64 / 1e6;
        let time = self.layer_ms.entry(layer.layer).or_default();
        time.layer = layer.layer;
        if layer.pass == 0 {
            time.first_ms += ms;
        } else {
            time.rest_sum_ms += ms;
            time.rest_calls += 1;
            time.rest_max_ms = time.rest_max_ms.max(ms);
        }
        let Some(&at) = self.pass_index.get(&layer.pass) else {
            return;
        };
        for stage in &layer.stages {
            let index = match self.stage_index.get(stage.name.as_ref()) {
                Some(&index) => index,
                None => {
                    self.stages.push(stage.name.to_string());
                    self.stage_index
                        .insert(stage.name.to_string(), self.stages.len() - 1);
                    self.stages.len() - 1
                }
            };
            let s = &stage.tensor.stats;
            let max_abs = s.min.abs().max(s.max.abs());
            if let Some(stats) = self.stats.get_mut(&at) {
                stats.insert((layer.layer, index), [s.mean, s.std, max_abs, s.l2_norm]);
            }
        }
        if let Some(output) = layer.stage("output") {
            let s = &output.tensor.stats;
            self.output[at].push((layer.layer, s.l2_norm, s.min.abs().max(s.max.abs())));
        }
    }

    fn pattern_row(&mut self, row: &AttentionWeightTrace) {
        if row.batch != 0 || row.query_pos >= PATTERN_QUERIES {
            return;
        }
        let rows = self
            .patterns
            .entry((row.layer_idx, row.head_idx))
            .or_insert_with(|| vec![Vec::new(); PATTERN_QUERIES]);
        let slot = &mut rows[row.query_pos];
        if !slot.is_empty() {
            return; // the first pass that recorded this query
        }
        for (&key, &weight) in row.top_k_positions.iter().zip(&row.top_k_weights) {
            if key < PATTERN_QUERIES {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let level = (weight.clamp(0.0, 1.0) * 255.0).round() as u8;
                #[allow(clippy::cast_possible_truncation)]
                slot.push((key as u8, level.max(1)));
            }
        }
    }

    /// The page's data; `bytes` is the file's size.
    pub(crate) fn finish(self, file: String, bytes: u64, cut_short: Option<String>) -> ReportData {
        let mut summary = self.tracer.summary();
        // Said of a session's tracer: where its records went. Here they are in the file read.
        summary.summary_only = false;
        let mut kept: Vec<usize> = self.stats.keys().copied().collect();
        kept.sort_unstable();
        let shown_passes = shown_passes(&self.passes, &kept);
        let stats = self.stats_of(&shown_passes);
        let (output_norm, output_max) = self.outputs();
        let attention = (summary.attention_traces > 0).then(|| AttentionData {
            analysis: summary.attention.clone(),
            patterns: self
                .patterns
                .iter()
                .map(|(&(layer, head), rows)| HeadPattern {
                    layer,
                    head,
                    rows: pack_rows(rows),
                })
                .collect(),
            pattern_size: PATTERN_QUERIES,
        });
        let logits = shown_passes
            .iter()
            .map(|at| self.logits.get(at).cloned())
            .collect();
        let patching = patching(&self.patches, &self.header.metadata.extra);
        let header = &self.header;
        let title = header
            .metadata
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| file.clone());
        #[allow(clippy::cast_precision_loss)]
        let started_unix_ms =
            (header.clock.epoch_unix_ns + header.clock.session_start_ns) as f64 / 1e6;
        ReportData {
            title,
            file,
            bytes,
            writer: header.writer.clone(),
            started_unix_ms,
            metadata: serde_json::to_value(&header.metadata).unwrap_or_default(),
            cut_short,
            summary_text: summary.to_string(),
            passes: self.passes,
            layers: self.layers,
            stages: self.stages,
            stat_names: STAT_NAMES,
            shown_passes: shown_passes.clone(),
            stats: pack_f32(&stats),
            output_norm: pack_f32(&output_norm),
            output_max: pack_f32(&output_max),
            layer_ms: layer_times(self.layer_ms),
            attention,
            logits,
            quant: quant_rows(self.quant),
            kv: kv_steps(self.kv),
            patching,
            routers: self.routers.layers(),
            diff: None,
        }
    }

    /// The statistics of the passes at `shown` (indices in `passes`), `[pass][layer][stage]`
    /// of four each, NaN where none was recorded.
    fn stats_of(&self, shown: &[usize]) -> Vec<f32> {
        let (layers, stages) = (self.layers, self.stages.len());
        let mut stats = Vec::with_capacity(shown.len() * layers * stages * 4);
        for &at in shown {
            for layer in 0..layers {
                for stage in 0..stages {
                    let values = (self.stats.get(&at))
                        .and_then(|stats| stats.get(&(layer, stage)))
                        .copied()
                        .unwrap_or([f32::NAN; 4]);
                    stats.extend(values);
                }
            }
        }
        stats
    }

    /// The layer outputs' norms and largest magnitudes, `[pass][layer]`, NaN where none was
    /// recorded.
    fn outputs(&self) -> (Vec<f32>, Vec<f32>) {
        let layers = self.layers;
        let mut output_norm = vec![f32::NAN; self.passes.len() * layers];
        let mut output_max = output_norm.clone();
        for (at, outputs) in self.output.iter().enumerate() {
            for &(layer, norm, max) in outputs {
                output_norm[at * layers + layer] = norm;
                output_max[at * layers + layer] = max;
            }
        }
        (output_norm, output_max)
    }
}

/// Each layer's times, with the mean of its calls after the first.
fn layer_times(layer_ms: BTreeMap<usize, LayerTime>) -> Vec<LayerTime> {
    layer_ms
        .into_values()
        .map(|mut t| {
            #[allow(clippy::cast_precision_loss)]
            if t.rest_calls > 0 {
                t.rest_mean_ms = t.rest_sum_ms / t.rest_calls as f64;
            }
            t
        })
        .collect()
}

/// One row per quantized site and layer: its error's means and extremes.
#[allow(clippy::cast_precision_loss)]
fn quant_rows(quant: BTreeMap<(String, usize), QuantSums>) -> Vec<QuantRow> {
    quant
        .into_iter()
        .map(|((site, layer), s)| QuantRow {
            site,
            quant_type: s.quant_type,
            layer,
            count: s.count,
            cosine_mean: s.cosine_sum / s.count.max(1) as f64,
            cosine_min: s.cosine_min,
            snr_mean_db: if s.snr_finite > 0 {
                s.snr_sum / s.snr_finite as f64
            } else {
                f64::NAN
            },
            snr_min_db: s.snr_min,
            non_finite: s.non_finite,
        })
        .collect()
}

/// One KV-cache step per pass, its size the sum of each layer's latest.
fn kv_steps(kv: BTreeMap<usize, KvPass>) -> Vec<KvStep> {
    kv.into_iter()
        .map(|(pass, (mut step, bytes))| {
            step.pass = pass;
            step.bytes = bytes.values().sum();
            step
        })
        .collect()
}

/// The heatmap of the passes that each patched one (layer, position), when at least two did.
fn patching(
    patches: &BTreeMap<usize, PassPatch>,
    extra: &BTreeMap<String, String>,
) -> Option<PatchingData> {
    let mut cells = Vec::new();
    let mut unpatched = None;
    let mut first = None;
    for patch in patches.values() {
        let Some((token, prob)) = patch.prob else {
            continue;
        };
        match patch.changes.as_slice() {
            [] => {
                unpatched.get_or_insert((token, prob));
            }
            [(Some(layer), Some([p, q]), text)] if p == q => {
                first.get_or_insert_with(|| text.clone());
                cells.push((token, *layer, *p, prob));
            }
            _ => {}
        }
    }
    let token = cells.first()?.0;
    if cells.len() < 2 {
        return None;
    }
    let layers = cells.iter().map(|c| c.1 + 1).max().unwrap_or(0);
    let positions = cells.iter().map(|c| c.2 + 1).max().unwrap_or(0);
    let mut probs = vec![f32::NAN; layers * positions];
    for &(cell_token, layer, position, prob) in &cells {
        if cell_token == token {
            probs[position * layers + layer] = prob;
        }
    }
    let tokens = extra
        .get("tokens")
        .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
        .unwrap_or_default();
    Some(PatchingData {
        token,
        intervention: first.unwrap_or_default(),
        unpatched: unpatched.filter(|u| u.0 == token).map(|u| u.1),
        layers,
        positions,
        probs: pack_f32(&probs),
        tokens,
        answer: extra.get("answer").cloned(),
    })
}

/// Indices (into the passes) of those the page shows: all of them up to [`SHOWN_PASSES`],
/// else the first 8, the anomalous ones, the last 4 and others spread evenly, each the one of
/// `kept` (sorted: the passes whose statistics were kept) nearest its even place.
fn shown_passes(passes: &[PassInfo], kept: &[usize]) -> Vec<usize> {
    let n = passes.len();
    if n <= SHOWN_PASSES {
        return (0..n).collect();
    }
    let mut chosen: Vec<usize> = (0..FIRST_SHOWN).chain(n - LAST_SHOWN..n).collect();
    chosen.extend(
        passes
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.anomalies.is_empty())
            .map(|(i, _)| i)
            .take(SHOWN_PASSES / 3),
    );
    chosen.sort_unstable();
    chosen.dedup();
    let room = SHOWN_PASSES.saturating_sub(chosen.len());
    for k in 1..=room {
        let even = k * (n - 1) / (room + 1);
        let after = kept.partition_point(|&at| at < even);
        let nearest = [after.checked_sub(1), Some(after)]
            .into_iter()
            .flatten()
            .filter_map(|i| kept.get(i).copied())
            .min_by_key(|&at| at.abs_diff(even));
        chosen.extend(nearest);
    }
    chosen.sort_unstable();
    chosen.dedup();
    chosen
}

/// Little-endian `f32`s as base64.
fn pack_f32(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64(&bytes)
}

fn pack_rows(rows: &[Vec<(u8, u8)>]) -> String {
    let mut bytes = Vec::new();
    for row in rows {
        #[allow(clippy::cast_possible_truncation)]
        bytes.push(row.len().min(255) as u8);
        for &(key, weight) in row.iter().take(255) {
            bytes.push(key);
            bytes.push(weight);
        }
    }
    base64(&bytes)
}

/// Standard base64 with padding (what the page's `atob` reads).
pub(crate) fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_that_each_patch_one_cell_make_the_heatmap() {
        let patch = |layer, position, prob| PassPatch {
            changes: vec![(Some(layer), Some([position, position]), "x".to_owned())],
            prob: Some((7, prob)),
        };
        let mut patches = BTreeMap::new();
        patches.insert(
            0,
            PassPatch {
                changes: Vec::new(),
                prob: Some((7, 0.01)),
            },
        );
        patches.insert(1, patch(0, 1, 0.5));
        patches.insert(2, patch(2, 0, 0.25));
        // Two changes in one pass, or a range of positions: not one cell.
        patches.insert(
            3,
            PassPatch {
                changes: vec![(Some(1), Some([0, 1]), "y".to_owned())],
                prob: Some((7, 0.9)),
            },
        );
        let extra = BTreeMap::from([("tokens".to_owned(), r#"["a","b"]"#.to_owned())]);
        let data = patching(&patches, &extra).expect("two cells");
        assert_eq!((data.layers, data.positions, data.token), (3, 2, 7));
        assert_eq!(data.unpatched, Some(0.01));
        assert_eq!(data.tokens, ["a", "b"]);
        // [position][layer]
        let nan = f32::NAN;
        assert_eq!(data.probs, pack_f32(&[nan, nan, 0.25, 0.5, nan, nan]));
        patches.remove(&2);
        assert!(
            patching(&patches, &extra).is_none(),
            "one cell is no heatmap"
        );
    }

    #[test]
    fn base64_matches_the_standard() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0x00]), "//4A");
    }

    #[test]
    fn long_runs_show_the_first_last_anomalous_and_spaced_passes() {
        let passes: Vec<PassInfo> = (0..1000)
            .map(|pass| PassInfo {
                pass,
                position: pass,
                ms: 1.0,
                layers: 1,
                anomalies: if pass == 500 {
                    vec![AnomalyMark {
                        layer: 0,
                        stage: None,
                        description: String::new(),
                    }]
                } else {
                    Vec::new()
                },
            })
            .collect();
        let all: Vec<usize> = (0..passes.len()).collect();
        let shown = shown_passes(&passes, &all);
        assert!(shown.len() <= SHOWN_PASSES, "{}", shown.len());
        assert!(shown.len() >= SHOWN_PASSES - 2, "{}", shown.len());
        for must in [0, 7, 500, 996, 999] {
            assert!(shown.contains(&must), "{must} not in {shown:?}");
        }
        assert!(shown.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(
            shown_passes(&passes[..10], &all),
            (0..10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_long_run_keeps_the_statistics_of_a_bounded_number_of_passes() {
        let config = serde_json::to_value(trace_runtime::ModelTracerConfig::lightweight()).unwrap();
        let header: TraceHeader = serde_json::from_value(serde_json::json!({
            "format": "model-trace", "schema": 1, "writer": "test", "session": 1,
            "process_id": 1, "thread": {"id": 1, "name": null},
            "clock": {"epoch_unix_ns": 0, "session_start_ns": 0},
            "config": config, "filter": "", "capture": "", "tracepoints": [], "metadata": {}
        }))
        .unwrap();
        let mut collector = Collector::new(&header);
        let passes = 5000;
        let mut most_kept = 0;
        for pass in 0..passes {
            let begin = serde_json::json!({"event": "pass_begin", "seq": 0, "pass": pass,
                "position": pass, "tracepoint": "m", "function": "f", "start_ns": 0});
            collector.accept(serde_json::from_value(begin).unwrap());
            let anomalies = if pass == 2500 {
                serde_json::json!([{"layer": 0, "stage": "output", "kind": "Nan",
                    "description": "NaN"}])
            } else {
                serde_json::json!([])
            };
            let end = serde_json::json!({"event": "pass_end", "seq": 0, "pass": pass,
                "position": pass, "duration_ns": 1, "layers": 0, "anomalies": anomalies,
                "logit_evolution": []});
            collector.accept(serde_json::from_value(end).unwrap());
            most_kept = most_kept.max(collector.stats.len());
        }
        assert!(
            most_kept <= 2 * SHOWN_PASSES + FIRST_SHOWN + LAST_SHOWN + 2,
            "{most_kept}"
        );
        let mut kept: Vec<usize> = collector.stats.keys().copied().collect();
        kept.sort_unstable();
        let shown = shown_passes(&collector.passes, &kept);
        assert!(shown.len() >= SHOWN_PASSES - 4, "{shown:?}");
        for must in [0, 7, 2500, passes - 1] {
            assert!(shown.contains(&must), "{must} not in {shown:?}");
        }
        assert!(
            shown.iter().all(|at| kept.contains(at)),
            "{shown:?} {kept:?}"
        );
    }
}
