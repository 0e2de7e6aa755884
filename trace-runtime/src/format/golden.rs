//! Golden files: the tensors of a run, kept in a repository to test a model against
//! ([`golden::check`](crate::golden::check) writes and compares them). A golden file holds what
//! a comparison needs and nothing that changes from one run to the next (no times, process ids
//! or attention rows), one line per layer of a pass, keys in a fixed order, so that it is small
//! enough to commit (about 80 KB for SmolLM2's 30 layers over 4 passes) and its `git diff`
//! shows which layers moved:
//!
//! ```text
//! {"format":"model-trace-golden","version":1,"machine":"x86_64 avx avx2 fma"}
//! {"pass":0,"position":0,"tokens":[504,3458,282]}
//! {"pass":0,"layer":0,"tensors":[["input",[1,3,576],"9f0c6d1e2b3a4c5d",0.0012,0.094,-0.61,0.58],...]}
//! {"pass":0,"layer":30,"tensors":[["logits",[1,49152],"...",-1.9,3.2,-17.5,21.4,{"top":[[12,21.4],[7,19.1]]}]]}
//! ```
//!
//! A pass line gives the pass, its position and tokens. A layer line lists the layer's tensors
//! in the order they were computed: each is its name (a stage; `attention` is the attention
//! probabilities, `logits` a logits record), shape, [short fingerprint](Fingerprint::short)
//! (`null` for a tensor recorded without one), mean, standard deviation, smallest and largest
//! finite value, then an object only where something is not the default: `dtype` when not
//! `f32`, `nan` and `inf` counts when not 0, `top` (the logits' top tokens and their logits,
//! of the first batch row). The Euclidean norm is not kept: it is computed from the others on
//! reading.
//!
//! [`TraceReader`](crate::TraceReader) reads golden files as traces (a pass's `pass_end`
//! follows its last line), so every `model-trace` command reads them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::record::{
    AttentionEvent, Event, LayerEvent, LogitRow, LogitsEvent, PassBegin, PassEnd, RunMetadata,
    StageEvent, TraceHeader,
};
use crate::stats::TensorStats;
use crate::summary::{Fingerprint, TensorSummary};

/// The `format` of a golden file's first line.
pub const GOLDEN_FORMAT_NAME: &str = "model-trace-golden";

/// The version of the golden format this crate writes (and the newest it reads).
pub const GOLDEN_VERSION: u32 = 1;

/// The name of an attention record's tensor in a layer line.
const ATTENTION: &str = "attention";

/// The name of a logits record's tensor in a layer line.
const LOGITS: &str = "logits";

/// A golden file's first line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GoldenHeader {
    /// Always [`GOLDEN_FORMAT_NAME`].
    pub format: String,
    /// [`GOLDEN_VERSION`] of the writer.
    pub version: u32,
    /// The machine it was recorded on ([`machine`]): on another one, the same program may
    /// round differently.
    pub machine: String,
}

impl GoldenHeader {
    /// The header of a golden file recorded on this machine.
    pub fn this_machine() -> Self {
        Self {
            format: GOLDEN_FORMAT_NAME.to_owned(),
            version: GOLDEN_VERSION,
            machine: machine(),
        }
    }

    /// As a trace header, for readers of traces: its `metadata.extra` holds `golden_machine`.
    pub(crate) fn trace_header(&self) -> TraceHeader {
        let mut header = TraceHeader::placeholder();
        header.format.clone_from(&self.format);
        header.schema = self.version;
        header.writer = format!("{GOLDEN_FORMAT_NAME} {}", self.version);
        header.config.trace_activations = true;
        header.config.trace_attention = true;
        header.config.trace_logits = true;
        header.metadata = RunMetadata::default();
        header
            .metadata
            .extra
            .insert("golden_machine".to_owned(), self.machine.clone());
        header
    }
}

/// This machine as far as the rounding of a program's floats can depend on it: the
/// architecture, the vector instructions that libraries pick their kernels by at run time, and
/// the processor's model (matrix multiplications block their sums by its cache sizes), as in
/// `x86_64 avx avx2 fma f16c; AMD EPYC 9654 96-Core Processor` (the model where the system
/// says it: Linux's `/proc/cpuinfo`). Two machines with the same string run the same kernels
/// the same way; a program built alike computes the same bits on both.
pub fn machine() -> String {
    let instructions = instructions();
    match cpu_model() {
        Some(model) => format!("{instructions}; {model}"),
        None => instructions,
    }
}

/// The processor's model name, where the system says it.
fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|line| line.starts_with("model name"))?;
    let (_, name) = line.split_once(':')?;
    let name = name.split_whitespace().collect::<Vec<_>>().join(" ");
    (!name.is_empty()).then_some(name)
}

/// The architecture and its vector instructions.
fn instructions() -> String {
    let mut parts = vec![std::env::consts::ARCH];
    #[cfg(target_arch = "x86_64")]
    {
        let features = [
            ("avx", std::arch::is_x86_feature_detected!("avx")),
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("f16c", std::arch::is_x86_feature_detected!("f16c")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
        ];
        parts.extend(features.iter().filter(|(_, on)| *on).map(|(name, _)| *name));
    }
    #[cfg(target_arch = "aarch64")]
    {
        let features = [
            ("neon", std::arch::is_aarch64_feature_detected!("neon")),
            ("fp16", std::arch::is_aarch64_feature_detected!("fp16")),
        ];
        parts.extend(features.iter().filter(|(_, on)| *on).map(|(name, _)| *name));
    }
    parts.join(" ")
}

/// One tensor waiting for its layer line.
#[derive(Debug)]
struct Held {
    seq: u64,
    pass: usize,
    layer: usize,
    name: String,
    tensor: TensorSummary,
    /// The logits' top tokens and logits (first batch row).
    top: Option<(Vec<u32>, Vec<f32>)>,
}

/// Writes a golden file from a session's events: hand it every event in order
/// ([`event`](Self::event)), then take the text ([`finish`](Self::finish)).
#[derive(Debug)]
pub struct GoldenEncoder {
    text: String,
    held: Vec<Held>,
    tensors: usize,
}

impl Default for GoldenEncoder {
    fn default() -> Self {
        Self::new(&GoldenHeader::this_machine())
    }
}

impl GoldenEncoder {
    /// A golden file that begins with `header`.
    pub fn new(header: &GoldenHeader) -> Self {
        let mut text = serde_json::to_string(header).unwrap_or_default();
        text.push('\n');
        Self {
            text,
            held: Vec::new(),
            tensors: 0,
        }
    }

    /// Takes one event: a pass's beginning, a layer's stages, attention probabilities and
    /// logits; the others are not kept.
    pub fn event(&mut self, event: &Event) {
        match event {
            Event::PassBegin(begin) => {
                self.flush();
                let _ = write!(
                    self.text,
                    "{{\"pass\":{},\"position\":{}",
                    begin.pass, begin.position
                );
                if let Some(tokens) = &begin.tokens {
                    self.text.push_str(",\"tokens\":");
                    self.text
                        .push_str(&serde_json::to_string(tokens).unwrap_or_default());
                }
                self.text.push_str("}\n");
            }
            Event::PassEnd(_) => self.flush(),
            Event::Layer(layer) => {
                for stage in &layer.stages {
                    self.hold(Held {
                        seq: stage.seq,
                        pass: layer.pass,
                        layer: layer.layer,
                        name: stage.name.to_string(),
                        tensor: stage.tensor.clone(),
                        top: None,
                    });
                }
            }
            Event::Attention(attention) => self.hold(Held {
                seq: attention.seq,
                pass: attention.pass.unwrap_or(0),
                layer: attention.layer,
                name: ATTENTION.to_owned(),
                tensor: attention.probs.clone(),
                top: None,
            }),
            Event::Logits(logits) => self.hold(Held {
                seq: logits.seq,
                pass: logits.pass,
                layer: logits.layer,
                name: LOGITS.to_owned(),
                tensor: logits.logits.clone(),
                top: (logits.batch_rows.first())
                    .map(|row| (row.top_tokens.clone(), row.top_logits.clone())),
            }),
            _ => {}
        }
    }

    /// The tensors taken so far.
    pub fn tensors(&self) -> usize {
        self.tensors
    }

    /// The golden file's text.
    pub fn finish(mut self) -> String {
        self.flush();
        self.text
    }

    fn hold(&mut self, held: Held) {
        self.tensors += 1;
        self.held.push(held);
    }

    /// Writes the held tensors, a line per pass and layer, the lines in the order of their
    /// first tensor.
    fn flush(&mut self) {
        let mut held = std::mem::take(&mut self.held);
        held.sort_by_key(|h| h.seq);
        let mut lines: Vec<((usize, usize), Vec<Held>)> = Vec::new();
        let mut line_of: HashMap<(usize, usize), usize> = HashMap::new();
        for h in held {
            let key = (h.pass, h.layer);
            let at = *line_of.entry(key).or_insert_with(|| {
                lines.push((key, Vec::new()));
                lines.len() - 1
            });
            lines[at].1.push(h);
        }
        for ((pass, layer), tensors) in lines {
            let _ = write!(
                self.text,
                "{{\"pass\":{pass},\"layer\":{layer},\"tensors\":["
            );
            for (i, h) in tensors.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                write_tensor(&mut self.text, h);
            }
            self.text.push_str("]}\n");
        }
    }
}

/// `[name, shape, fingerprint, mean, std, min, max]`, and the object of what is not the
/// default.
fn write_tensor(text: &mut String, held: &Held) {
    let t = &held.tensor;
    let json = |value: &dyn erased::Json| value.json();
    text.push('[');
    text.push_str(&json(&held.name.as_str()));
    text.push(',');
    text.push_str(&json(&t.shape));
    text.push(',');
    match &t.fingerprint {
        Some(fingerprint) => text.push_str(&json(&fingerprint.short())),
        None => text.push_str("null"),
    }
    for value in [t.stats.mean, t.stats.std, t.stats.min, t.stats.max] {
        text.push(',');
        text.push_str(&json(&Float(value)));
    }
    let mut extra = Vec::new();
    if t.dtype != "f32" {
        extra.push(format!("\"dtype\":{}", json(&t.dtype.as_ref())));
    }
    if t.stats.nan_count > 0 {
        extra.push(format!("\"nan\":{}", t.stats.nan_count));
    }
    if t.stats.inf_count > 0 {
        extra.push(format!("\"inf\":{}", t.stats.inf_count));
    }
    if let Some((tokens, logits)) = &held.top {
        let pairs: Vec<String> = (tokens.iter().zip(logits))
            .map(|(token, logit)| format!("[{token},{}]", json(&Float(*logit))))
            .collect();
        extra.push(format!("\"top\":[{}]", pairs.join(",")));
    }
    if !extra.is_empty() {
        let _ = write!(text, ",{{{}}}", extra.join(","));
    }
    text.push(']');
}

/// Serialising to one JSON value, for the writer above.
mod erased {
    /// A value written as JSON.
    pub(super) trait Json {
        fn json(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|_| "null".to_owned())
        }
    }
}

/// An `f32` written as the trace files write it (non-finite values as strings).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Float(#[serde(with = "crate::float::single")] f32);

/// One line of a golden file after the header.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    pass: usize,
    #[serde(default)]
    position: Option<usize>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(default)]
    layer: Option<usize>,
    #[serde(default)]
    tensors: Option<Vec<Vec<serde_json::Value>>>,
}

/// What a tensor's last, optional, element may say.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Extra {
    #[serde(default)]
    dtype: Option<String>,
    #[serde(default)]
    nan: usize,
    #[serde(default)]
    inf: usize,
    #[serde(default)]
    top: Vec<(u32, Float)>,
}

/// Reads a golden file's lines back as the events of a trace.
#[derive(Debug, Default)]
pub(crate) struct GoldenDecoder {
    seq: u64,
    /// The open pass: its number, position, and how many layers it had.
    open: Option<(usize, usize, usize)>,
}

impl GoldenDecoder {
    /// The events of one line (after the header).
    pub(crate) fn line(&mut self, text: &str) -> Result<Vec<Event>, String> {
        let line: Line = serde_json::from_str(text).map_err(|e| format!("bad golden line: {e}"))?;
        match (line.layer, line.tensors) {
            (None, None) => {
                let position = line.position.unwrap_or(0);
                let mut events = self.close().into_iter().collect::<Vec<_>>();
                self.open = Some((line.pass, position, 0));
                events.push(Event::PassBegin(PassBegin {
                    seq: self.next_seq(),
                    pass: line.pass,
                    position,
                    tracepoint: Cow::Borrowed(""),
                    function: Cow::Borrowed(""),
                    start_ns: 0,
                    tokens: line.tokens,
                }));
                Ok(events)
            }
            (Some(layer), Some(tensors)) => self.layer(line.pass, layer, tensors),
            _ => Err("a golden line has either \"layer\" and \"tensors\" or neither".to_owned()),
        }
    }

    /// The `pass_end` of the open pass, at the end of the file.
    pub(crate) fn finish(&mut self) -> Option<Event> {
        self.close()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn close(&mut self) -> Option<Event> {
        let (pass, position, layers) = self.open.take()?;
        Some(Event::PassEnd(PassEnd {
            seq: self.next_seq(),
            pass,
            position,
            duration_ns: 0,
            layers,
            anomalies: Vec::new(),
            logit_evolution: Vec::new(),
        }))
    }

    fn layer(
        &mut self,
        pass: usize,
        layer: usize,
        tensors: Vec<Vec<serde_json::Value>>,
    ) -> Result<Vec<Event>, String> {
        let mut event = LayerEvent {
            seq: self.next_seq(),
            pass,
            layer,
            tracepoint: Cow::Borrowed(""),
            function: Cow::Borrowed(""),
            start_ns: 0,
            duration_ns: 0,
            stages: Vec::new(),
            residual_ratio: None,
        };
        let mut others = Vec::new();
        for values in tensors {
            let (name, tensor, top) = read_tensor(values)?;
            let seq = self.next_seq();
            match name.as_str() {
                ATTENTION => others.push(Event::Attention(AttentionEvent {
                    seq,
                    pass: Some(pass),
                    layer,
                    tracepoint: Cow::Borrowed(""),
                    function: Cow::Borrowed(""),
                    probs: tensor,
                    rows: Vec::new(),
                })),
                LOGITS => others.push(Event::Logits(LogitsEvent {
                    seq,
                    pass,
                    layer,
                    tracepoint: Cow::Borrowed(""),
                    function: Cow::Borrowed(""),
                    logits: tensor,
                    batch_rows: top
                        .map(|(top_tokens, top_logits)| LogitRow {
                            batch: 0,
                            top_tokens,
                            top_logits,
                            tracked: Vec::new(),
                        })
                        .into_iter()
                        .collect(),
                })),
                _ => event.stages.push(StageEvent {
                    seq,
                    name: Cow::Owned(name),
                    tensor,
                }),
            }
        }
        let mut events = Vec::with_capacity(others.len() + 1);
        if !event.stages.is_empty() {
            if let Some((_, _, layers)) = &mut self.open {
                *layers += 1;
            }
            events.push(Event::Layer(event));
        }
        events.extend(others);
        Ok(events)
    }
}

/// A tensor of a layer line: its name, summary and (for logits) top tokens.
#[allow(clippy::type_complexity)]
fn read_tensor(
    values: Vec<serde_json::Value>,
) -> Result<(String, TensorSummary, Option<(Vec<u32>, Vec<f32>)>), String> {
    if !(7..=8).contains(&values.len()) {
        return Err(format!(
            "a golden tensor is [name, shape, fingerprint, mean, std, min, max] and an optional \
             object, not {}",
            serde_json::Value::Array(values)
        ));
    }
    let name: String = element(&values, 0, "name")?;
    let shape: Vec<usize> = element(&values, 1, "shape")?;
    let fingerprint: Option<Fingerprint> = element(&values, 2, "fingerprint")?;
    let [mean, std, min, max] = [(3, "mean"), (4, "std"), (5, "min"), (6, "max")]
        .map(|(i, what)| element::<Float>(&values, i, what).map(|f| f.0));
    let (mean, std, min, max) = (mean?, std?, min?, max?);
    let extra: Extra = if values.len() == 8 {
        element(&values, 7, "object")?
    } else {
        Extra::default()
    };
    let count: usize = shape.iter().product();
    let finite = count.saturating_sub(extra.nan + extra.inf);
    #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
    let l2_norm =
        ((finite as f64).sqrt() * (f64::from(std).powi(2) + f64::from(mean).powi(2)).sqrt()) as f32;
    let tensor = TensorSummary {
        shape,
        dtype: Cow::Owned(extra.dtype.unwrap_or_else(|| "f32".to_owned())),
        stats: TensorStats {
            count,
            min,
            max,
            mean,
            std,
            l2_norm,
            nan_count: extra.nan,
            inf_count: extra.inf,
        },
        fingerprint,
        sketch: None,
        head: Vec::new(),
        tail: Vec::new(),
        capture: None,
        rows: None,
    };
    let top = (!extra.top.is_empty()).then(|| extra.top.iter().map(|(t, l)| (*t, l.0)).unzip());
    Ok((name, tensor, top))
}

/// Element `i` of a tensor's array, read as a `T`.
fn element<T: serde::de::DeserializeOwned>(
    values: &[serde_json::Value],
    i: usize,
    what: &str,
) -> Result<T, String> {
    let value = values.get(i).cloned().unwrap_or_default();
    serde_json::from_value(value).map_err(|e| {
        format!(
            "bad {what} in golden tensor {}: {e}",
            serde_json::Value::Array(values.to_vec())
        )
    })
}

/// Whether a trace's first line (parsed) is a golden file's header; an error if it is one of
/// a version this crate does not read.
pub(crate) fn golden_header(value: &serde_json::Value) -> Option<Result<GoldenHeader, String>> {
    if value.get("format").and_then(serde_json::Value::as_str) != Some(GOLDEN_FORMAT_NAME) {
        return None;
    }
    Some(
        serde_json::from_value::<GoldenHeader>(value.clone())
            .map_err(|e| format!("bad golden header: {e}"))
            .and_then(|header| {
                if header.version > GOLDEN_VERSION {
                    Err(format!(
                        "golden format version {} (this model-trace reads up to {GOLDEN_VERSION}: \
                         upgrade it)",
                        header.version
                    ))
                } else {
                    Ok(header)
                }
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ReadError, TraceReader};

    fn summary(values: &[f32], dtype: &'static str, fingerprint: bool) -> TensorSummary {
        TensorSummary {
            shape: vec![1, values.len()],
            dtype: Cow::Borrowed(dtype),
            stats: TensorStats::from_slice(values),
            fingerprint: fingerprint.then(|| Fingerprint::of(values)),
            ..TensorSummary::default()
        }
    }

    fn events() -> Vec<Event> {
        let layer = LayerEvent {
            seq: 2,
            pass: 0,
            layer: 0,
            tracepoint: Cow::Borrowed("block"),
            function: Cow::Borrowed("m::forward"),
            start_ns: 17,
            duration_ns: 99,
            stages: vec![
                StageEvent {
                    seq: 3,
                    name: Cow::Borrowed("input"),
                    tensor: summary(&[1.0, -2.5, 0.25], "bf16", true),
                },
                StageEvent {
                    seq: 5,
                    name: Cow::Borrowed("output"),
                    tensor: summary(&[f32::NAN, f32::INFINITY, 3.0, 4.0], "f32", false),
                },
            ],
            residual_ratio: None,
        };
        let attention = AttentionEvent {
            seq: 4,
            pass: Some(0),
            layer: 0,
            tracepoint: Cow::Borrowed("attn"),
            function: Cow::Borrowed("m::attn"),
            probs: summary(&[0.5, 0.5], "f32", true),
            rows: Vec::new(),
        };
        let logits = LogitsEvent {
            seq: 6,
            pass: 0,
            layer: 1,
            tracepoint: Cow::Borrowed("head"),
            function: Cow::Borrowed("m::head"),
            logits: summary(&[0.1, 2.0, -1.0], "f32", true),
            batch_rows: vec![LogitRow {
                batch: 0,
                top_tokens: vec![1, 0],
                top_logits: vec![2.0, 0.1],
                tracked: Vec::new(),
            }],
        };
        vec![
            Event::PassBegin(PassBegin {
                seq: 1,
                pass: 0,
                position: 7,
                tracepoint: Cow::Borrowed("model"),
                function: Cow::Borrowed("m::model"),
                start_ns: 3,
                tokens: Some(vec![11, 12]),
            }),
            // A layer's attention comes before its layer event, which is sent when it ends.
            Event::Attention(attention),
            Event::Layer(layer),
            Event::Logits(logits),
            Event::PassEnd(PassEnd {
                seq: 7,
                pass: 0,
                position: 7,
                duration_ns: 1000,
                layers: 1,
                anomalies: Vec::new(),
                logit_evolution: Vec::new(),
            }),
        ]
    }

    fn encoded() -> String {
        let header = GoldenHeader {
            machine: "x86_64 avx".to_owned(),
            ..GoldenHeader::this_machine()
        };
        let mut encoder = GoldenEncoder::new(&header);
        for event in events() {
            encoder.event(&event);
        }
        assert_eq!(encoder.tensors(), 4);
        encoder.finish()
    }

    #[test]
    fn lines_hold_the_tensors_in_execution_order_with_only_what_is_not_the_default() {
        let text = encoded();
        let input = Fingerprint::of(&[1.0, -2.5, 0.25]).short();
        let probs = Fingerprint::of(&[0.5, 0.5]).short();
        let logits = Fingerprint::of(&[0.1, 2.0, -1.0]).short();
        let expected = [
            r#"{"format":"model-trace-golden","version":1,"machine":"x86_64 avx"}"#.to_owned(),
            r#"{"pass":0,"position":7,"tokens":[11,12]}"#.to_owned(),
            format!(
                r#"{{"pass":0,"layer":0,"tensors":[["input",[1,3],"{input}",-0.41666666,1.5046225,-2.5,1.0,{{"dtype":"bf16"}}],["attention",[1,2],"{probs}",0.5,0.0,0.5,0.5],["output",[1,4],null,3.5,0.5,3.0,4.0,{{"nan":1,"inf":1}}]]}}"#
            ),
            format!(
                r#"{{"pass":0,"layer":1,"tensors":[["logits",[1,3],"{logits}",0.36666664,1.2391753,-1.0,2.0,{{"top":[[1,2.0],[0,0.1]]}}]]}}"#
            ),
        ];
        assert_eq!(text.lines().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn read_back_as_a_trace_every_summary_is_what_was_recorded_but_the_digest_parts_left_out() {
        let text = encoded();
        let mut reader = TraceReader::new(text.as_bytes()).unwrap();
        assert_eq!(
            reader.header().metadata.extra["golden_machine"],
            "x86_64 avx"
        );
        let read: Vec<Event> = reader.by_ref().collect::<Result<_, _>>().unwrap();
        let original = events();
        let Event::PassBegin(begin) = &read[0] else {
            panic!("{read:?}")
        };
        assert_eq!((begin.pass, begin.position), (0, 7));
        assert_eq!(begin.tokens, Some(vec![11, 12]));
        let Event::Layer(layer) = &read[1] else {
            panic!("{read:?}")
        };
        let Event::Layer(recorded) = &original[2] else {
            unreachable!()
        };
        for (got, want) in layer.stages.iter().zip(&recorded.stages) {
            assert_eq!(got.name, want.name);
            let (g, w) = (&got.tensor, &want.tensor);
            assert_eq!((&g.shape, &g.dtype), (&w.shape, &w.dtype));
            assert_eq!(g.fingerprint, w.fingerprint.map(|f| f.short()));
            let (gs, ws) = (&g.stats, &w.stats);
            assert_eq!(
                (gs.count, gs.nan_count, gs.inf_count),
                (ws.count, ws.nan_count, ws.inf_count)
            );
            assert_eq!(
                [gs.mean, gs.std, gs.min, gs.max],
                [ws.mean, ws.std, ws.min, ws.max]
            );
            assert!(
                (gs.l2_norm - ws.l2_norm).abs() <= 1e-6 * ws.l2_norm,
                "{gs:?} {ws:?}"
            );
        }
        assert!(
            matches!(&read[2], Event::Attention(a) if a.layer == 0 && a.probs.stats.mean == 0.5)
        );
        let Event::Logits(logits) = &read[3] else {
            panic!("{read:?}")
        };
        assert_eq!(logits.batch_rows[0].top_tokens, vec![1, 0]);
        assert_eq!(logits.batch_rows[0].top_logits, vec![2.0, 0.1]);
        assert!(matches!(&read[4], Event::PassEnd(end) if end.pass == 0 && end.layers == 1));
        assert_eq!(read.len(), 5);
        // The order of execution survives: the stages and attention by their sequence numbers.
        assert!(
            layer.stages[0].seq
                < match &read[2] {
                    Event::Attention(a) => a.seq,
                    _ => unreachable!(),
                }
        );
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line_and_a_newer_version_is_refused() {
        let text = encoded();
        let broken = text.replace(r#"[[1,2.0],[0,0.1]]"#, r#"[[1,"two"]]"#);
        let errors: Vec<ReadError> = TraceReader::new(broken.as_bytes())
            .unwrap()
            .filter_map(Result::err)
            .collect();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].line(), Some(4));
        assert!(
            errors[0]
                .to_string()
                .contains("bad object in golden tensor"),
            "{}",
            errors[0]
        );
        let short = text.replace(r#"["attention",[1,2],"#, r#"["attention","#);
        let error = TraceReader::new(short.as_bytes())
            .unwrap()
            .find_map(Result::err)
            .unwrap();
        assert!(
            error
                .to_string()
                .contains(":3: a golden tensor is [name, shape,"),
            "{error}"
        );
        let newer = text.replace(r#""version":1"#, r#""version":2"#);
        let error = TraceReader::new(newer.as_bytes()).unwrap_err();
        assert!(
            error.to_string().contains("golden format version 2"),
            "{error}"
        );
        // A cut last line (a crash while writing) is a truncation.
        let cut = &text[..text.len() - 10];
        let last = TraceReader::new(cut.as_bytes()).unwrap().last().unwrap();
        assert!(
            matches!(last, Err(ReadError::Truncated { line: 4, .. })),
            "{last:?}"
        );
    }
}
