//! The events of the trace event format that `chrome` writes, and their JSON: one object a
//! line, `ph` and `ts` first (Perfetto looks for `ts` before parsing an event and refuses an
//! array at an event's top level), times as microseconds with exactly three decimals, which
//! Perfetto reads back to the nanosecond and never as an exponent.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};

use serde::ser::SerializeMap as _;
use serde::{Serialize, Serializer};

/// What an event is (`ph`), with what only that kind carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// `X`: a span, with its duration in ns.
    Complete { dur_ns: u64 },
    /// `i` with thread scope (`"s": "t"`): a moment on the thread's track.
    Instant,
    /// `C`: the value of a counter from this moment on (counters belong to the process).
    Counter,
    /// `M`: names and order of processes and threads.
    Metadata,
}

impl Phase {
    fn code(self) -> &'static str {
        match self {
            Self::Complete { .. } => "X",
            Self::Instant => "i",
            Self::Counter => "C",
            Self::Metadata => "M",
        }
    }

    /// Among events at one time: metadata, then spans (the longer, the outer, first), then
    /// moments.
    pub(super) fn rank(self) -> u8 {
        match self {
            Self::Metadata => 0,
            Self::Complete { .. } => 1,
            Self::Instant => 2,
            Self::Counter => 3,
        }
    }

    pub(super) fn dur_ns(self) -> u64 {
        match self {
            Self::Complete { dur_ns } => dur_ns,
            _ => 0,
        }
    }
}

/// One event of the output.
#[derive(Debug)]
pub(super) struct TraceEvent<'a> {
    pub(super) phase: Phase,
    /// Nanoseconds from the timeline's origin.
    pub(super) ts_ns: u64,
    pub(super) pid: u32,
    pub(super) tid: u64,
    pub(super) name: Cow<'a, str>,
    /// `pass`, `layer`, `anomaly`, `counter`; none for metadata.
    pub(super) cat: Option<&'static str>,
    pub(super) args: Args<'a>,
}

impl TraceEvent<'_> {
    /// Writes the event as one JSON object (no newline).
    pub(super) fn write(&self, out: &mut impl Write) -> io::Result<()> {
        write!(
            out,
            "{{\"ph\":\"{}\",\"ts\":{}",
            self.phase.code(),
            Micros(self.ts_ns)
        )?;
        match self.phase {
            Phase::Complete { dur_ns } => write!(out, ",\"dur\":{}", Micros(dur_ns))?,
            Phase::Instant => out.write_all(b",\"s\":\"t\"")?,
            Phase::Counter | Phase::Metadata => {}
        }
        write!(out, ",\"pid\":{},\"tid\":{},\"name\":", self.pid, self.tid)?;
        serde_json::to_writer(&mut *out, &self.name)?;
        if let Some(cat) = self.cat {
            write!(out, ",\"cat\":\"{cat}\"")?;
        }
        out.write_all(b",\"args\":")?;
        serde_json::to_writer(&mut *out, &self.args)?;
        out.write_all(b"}")
    }
}

/// Nanoseconds written as microseconds with three decimals: `1234.567`.
pub(super) struct Micros(pub(super) u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// An `f32` statistic: a number when finite, else `"NaN"`, `"inf"` or `"-inf"` (as in trace
/// files; JSON has no such numbers).
#[derive(Debug, Clone, Copy)]
pub(super) struct Float(pub(super) f32);

impl Serialize for Float {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            x if x.is_finite() => serializer.serialize_f32(x),
            x if x.is_nan() => serializer.serialize_str("NaN"),
            x if x > 0.0 => serializer.serialize_str("inf"),
            _ => serializer.serialize_str("-inf"),
        }
    }
}

/// An event's `args`: what a viewer shows when the event is selected.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum Args<'a> {
    Pass(PassArgs<'a>),
    Layer(LayerArgs<'a>),
    Anomaly(AnomalyArgs<'a>),
    Counter(CounterValue),
    /// `process_name`, `thread_name`.
    Name {
        name: Cow<'a, str>,
    },
    /// `thread_sort_index`.
    SortIndex {
        sort_index: u64,
    },
}

/// A forward pass.
#[derive(Debug, Serialize)]
pub(super) struct PassArgs<'a> {
    pub(super) pass: usize,
    pub(super) position: usize,
    /// Layer calls in the pass.
    pub(super) layers: usize,
    /// The `#[trace_model]` tracepoint and its function; empty for a pass opened by records
    /// outside any.
    pub(super) tracepoint: &'a str,
    pub(super) function: &'a str,
    /// The pass's anomaly (the first one it reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) anomaly: Option<&'a str>,
    /// Layers that broke an anomaly rule.
    pub(super) anomalies: usize,
    /// Set when the file ends inside the pass.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) cut_short: Option<&'static str>,
    pub(super) session: u64,
    pub(super) file: Cow<'a, str>,
}

/// A layer call.
#[derive(Debug, Serialize)]
pub(super) struct LayerArgs<'a> {
    pub(super) pass: usize,
    pub(super) layer: usize,
    pub(super) tracepoint: &'a str,
    pub(super) function: &'a str,
    /// The recorded duration (the span's may be a few ns shorter to nest).
    pub(super) duration_ns: u64,
    /// The output's statistics, when the output was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_mean: Option<Float>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_std: Option<Float>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_max_abs: Option<Float>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_nan_count: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) output_inf_count: Option<usize>,
    /// Every recorded tensor of the layer with NaN or Inf values: `attn_out: 3 NaN`.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) non_finite: &'a str,
}

/// An anomaly a pass reported.
#[derive(Debug, Serialize)]
pub(super) struct AnomalyArgs<'a> {
    pub(super) pass: usize,
    pub(super) position: usize,
    pub(super) layer: usize,
    /// The stage whose statistics broke the rule; none for residual dominance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stage: Option<&'a str>,
    /// The rule: `NaN`, `Inf`, `explosion`, `vanishing`, `residual dominance`.
    pub(super) kind: String,
    /// Whether it is the pass's anomaly (the first it reports).
    pub(super) first: bool,
}

/// One series of a counter: `{"bytes": 1048576}`.
#[derive(Debug)]
pub(super) struct CounterValue {
    pub(super) series: &'static str,
    pub(super) value: f64,
}

impl Serialize for CounterValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(self.series, &self.value)?;
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_microseconds_with_three_decimals() {
        assert_eq!(Micros(0).to_string(), "0.000");
        assert_eq!(Micros(1_001).to_string(), "1.001");
        assert_eq!(Micros(26_563_121_371).to_string(), "26563121.371");
    }

    #[test]
    fn an_event_is_one_object_with_ts_first() {
        let event = TraceEvent {
            phase: Phase::Instant,
            ts_ns: 1_500,
            pid: 7,
            tid: 2,
            name: Cow::Borrowed("layer 1 \"scores\": NaN"),
            cat: Some("anomaly"),
            args: Args::Counter(CounterValue {
                series: "bytes",
                value: 4.0,
            }),
        };
        let mut text = Vec::new();
        event.write(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.starts_with(r#"{"ph":"i","ts":1.500,"s":"t","pid":7"#),
            "{text}"
        );
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["name"], "layer 1 \"scores\": NaN");
        assert_eq!(value["args"]["bytes"], 4.0);
    }

    #[test]
    fn non_finite_statistics_are_strings() {
        let text = serde_json::to_string(&[
            Float(0.1),
            Float(f32::NAN),
            Float(f32::INFINITY),
            Float(f32::NEG_INFINITY),
        ])
        .unwrap();
        assert_eq!(text, r#"[0.1,"NaN","inf","-inf"]"#);
    }
}
