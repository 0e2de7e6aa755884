//! The summary of a [`ModelTracer`], kept as running totals so that it covers every record,
//! also those past the memory limit.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::ModelTracer;
use crate::analysis::attention::{AttentionAnalysis, AttentionAnalyzer};
use crate::record::{Anomaly, AttentionWeightTrace, ErrorEvent, QuantizationErrorTrace};

/// Totals over every record a tracer was given, kept or not.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct Totals {
    pub(super) passes: usize,
    max_layers: usize,
    anomalous_passes: usize,
    first_anomaly: Option<(usize, String)>,
    pub(super) attention: AttentionAnalyzer,
    pub(super) logit_traces: usize,
    quant: usize,
    quant_warnings: usize,
    quant_criticals: usize,
    worst_quant: Option<QuantizationErrorTrace>,
    pub(super) dropped: usize,
    record_errors: usize,
    #[serde(default)]
    warnings: usize,
    #[serde(default)]
    first_warning: Option<String>,
    pub(super) errors_not_kept: usize,
    #[serde(default)]
    pub(super) router_calls: usize,
}

impl Totals {
    pub(super) fn close_pass(&mut self, layers: usize, position: usize, anomalies: &[Anomaly]) {
        self.max_layers = self.max_layers.max(layers);
        if let Some(reported) = anomalies.first() {
            self.anomalous_passes += 1;
            self.first_anomaly
                .get_or_insert_with(|| (position, reported.description.clone()));
        }
    }

    /// An error event: a record error, or a warning.
    pub(super) fn count_error(&mut self, error: &ErrorEvent) {
        if error.kind.is_warning() {
            self.warnings += 1;
            self.first_warning
                .get_or_insert_with(|| error.message.clone());
        } else {
            self.record_errors += 1;
        }
    }

    pub(super) fn count_attention(&mut self, row: &AttentionWeightTrace) {
        self.attention.add(row);
    }

    pub(super) fn count_quant(&mut self, trace: &QuantizationErrorTrace) {
        self.quant += 1;
        self.quant_warnings += usize::from(trace.is_warning());
        self.quant_criticals += usize::from(trace.is_critical());
        // A site with non-finite values counts as worst, then the lowest cosine.
        let worse = |a: &QuantizationErrorTrace, b: &QuantizationErrorTrace| {
            (a.non_finite > 0, -a.cosine_similarity) > (b.non_finite > 0, -b.cosine_similarity)
        };
        if self
            .worst_quant
            .as_ref()
            .is_none_or(|worst| worse(trace, worst))
        {
            self.worst_quant = Some(trace.clone());
        }
    }

    pub(super) fn summary(&self, tracer: &ModelTracer) -> ModelTracerSummary {
        let kv = &tracer.kv_trace;
        let config = &tracer.config;
        ModelTracerSummary {
            tracing_compiled_out: tracer.compiled_out,
            summary_only: tracer.summary_only,
            attention_traced: config.trace_attention,
            logits_traced: config.trace_logits,
            kv_cache_traced: config.trace_kv_cache,
            quant_traced: config.trace_quant_error,
            total_forwards: self.passes,
            layers_per_pass: self.max_layers,
            anomalies_detected: self.anomalous_passes,
            first_anomaly: self.first_anomaly.as_ref().map(|(_, d)| d.clone()),
            first_anomaly_position: self.first_anomaly.as_ref().map(|(p, _)| *p),
            attention_traces: self.attention.rows(),
            attention: self.attention.analysis(),
            logit_traces: self.logit_traces,
            kv_steps: kv.steps_seen,
            total_evictions: kv.total_evictions,
            peak_memory_bytes: kv.peak_memory_bytes,
            avg_hit_rate: kv.hit_rate(),
            kv_thrashing: kv.has_default_thrashing(),
            quant_traces: self.quant,
            quant_warnings: self.quant_warnings,
            quant_criticals: self.quant_criticals,
            worst_quant_cosine: self.worst_quant.as_ref().map(|t| t.cosine_similarity),
            worst_quant_site: self.worst_quant.as_ref().map(|t| t.site.clone()),
            router_calls: self.router_calls,
            records_dropped: self.dropped,
            memory_limit_bytes: tracer.config.memory_limit_bytes,
            record_errors: self.record_errors,
            record_errors_not_kept: self.errors_not_kept,
            warnings: self.warnings,
            first_warning: self.first_warning.clone(),
        }
    }
}

/// Totals of a [`ModelTracer`]; `Display` prints a short report, with the lines of attention,
/// logits, KV cache and quantization only when that kind was traced or recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelTracerSummary {
    /// The tracer comes from a session of a build without the `enabled` feature: nothing could
    /// be recorded, and `Display` says only that.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tracing_compiled_out: bool,
    /// The tracer kept only this summary, not the records: they are in the session's trace
    /// file (see [`SessionBuilder::in_memory`](crate::SessionBuilder::in_memory)).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub summary_only: bool,
    /// Attention was traced ([`ModelTracerConfig::trace_attention`](crate::ModelTracerConfig)).
    #[serde(default)]
    pub attention_traced: bool,
    /// Logits were traced.
    #[serde(default)]
    pub logits_traced: bool,
    /// The KV cache was traced.
    #[serde(default)]
    pub kv_cache_traced: bool,
    /// Quantization error was traced.
    #[serde(default)]
    pub quant_traced: bool,
    /// Forward passes begun.
    pub total_forwards: usize,
    /// Most layers recorded in one pass.
    pub layers_per_pass: usize,
    /// Passes with an activation anomaly.
    pub anomalies_detected: usize,
    /// Description of the first pass's anomaly.
    pub first_anomaly: Option<String>,
    /// Position of the first pass with an anomaly.
    pub first_anomaly_position: Option<usize>,
    /// Attention rows recorded.
    pub attention_traces: usize,
    /// What the heads do, over every row (see [`crate::attention`] for the rules).
    pub attention: AttentionAnalysis,
    /// Passes with a logit trace.
    pub logit_traces: usize,
    /// KV-cache steps recorded.
    pub kv_steps: usize,
    /// Positions evicted over the session.
    pub total_evictions: usize,
    /// Largest cache size seen.
    pub peak_memory_bytes: usize,
    /// Mean hit rate over the steps that reported one.
    pub avg_hit_rate: Option<f32>,
    /// `has_thrashing(DEFAULT_THRASHING_WINDOW, DEFAULT_THRASHING_EVICTIONS_PER_STEP)`.
    pub kv_thrashing: bool,
    /// Quantization sites compared, over all passes.
    pub quant_traces: usize,
    /// Sites in the warning band.
    pub quant_warnings: usize,
    /// Critical sites.
    pub quant_criticals: usize,
    /// Lowest cosine similarity of any site.
    pub worst_quant_cosine: Option<f32>,
    /// Site of the lowest cosine similarity.
    pub worst_quant_site: Option<String>,
    /// Router calls recorded (`#[trace_router]`, `trace_router_value!`).
    #[serde(default)]
    pub router_calls: usize,
    /// Records counted but not kept in memory, past the tracer's memory limit.
    #[serde(default)]
    pub records_dropped: usize,
    /// The memory limit, in bytes.
    #[serde(default)]
    pub memory_limit_bytes: usize,
    /// Distinct record errors (values a tracepoint could not record, failed sinks).
    #[serde(default)]
    pub record_errors: usize,
    /// Occurrences of distinct errors beyond the session's limit, counted but not kept.
    #[serde(default)]
    pub record_errors_not_kept: usize,
    /// Distinct warnings: what was recorded, but probably not as meant (see
    /// [`RecordErrorKind::is_warning`](crate::RecordErrorKind::is_warning)).
    #[serde(default)]
    pub warnings: usize,
    /// The first warning's message.
    #[serde(default)]
    pub first_warning: Option<String>,
}

impl fmt::Display for ModelTracerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tracing_compiled_out {
            return f.write_str(
                "ModelTracer Summary: tracing is compiled out: build with --features enabled \
                 (or your crate's feature forwarding to it)",
            );
        }
        writeln!(f, "ModelTracer Summary:")?;
        writeln!(f, "  Forward passes: {}", self.total_forwards)?;
        writeln!(f, "  Layers per pass: {}", self.layers_per_pass)?;
        write!(f, "  Anomalies: {}", self.anomalies_detected)?;
        if let Some(desc) = &self.first_anomaly {
            match self.first_anomaly_position {
                Some(p) => write!(f, " (first at position {p}: {desc})")?,
                None => write!(f, " (first: {desc})")?,
            }
        }
        if self.attention_traced || self.attention_traces > 0 {
            if self.attention_traces == 0 {
                write!(f, "\n  Attention: none recorded")?;
            } else {
                let analysis = self.attention.to_string().replace('\n', "\n  ");
                write!(f, "\n  Attention: {analysis}")?;
            }
        }
        if self.logits_traced || self.logit_traces > 0 {
            write!(f, "\n  Logit traces: {}", self.logit_traces)?;
        }
        if self.kv_cache_traced || self.kv_steps > 0 {
            write!(f, "\n  KV cache steps: {}", self.kv_steps)?;
            write!(f, "\n  KV evictions: {}", self.total_evictions)?;
            write!(
                f,
                "\n  KV peak memory: {}",
                ByteSize(self.peak_memory_bytes)
            )?;
            match self.avg_hit_rate {
                Some(rate) => write!(f, "\n  Avg hit rate: {:.2}%", rate * 100.0)?,
                None => write!(f, "\n  Avg hit rate: n/a")?,
            }
            let thrashing = if self.kv_thrashing { "yes" } else { "no" };
            write!(f, "\n  KV thrashing: {thrashing}")?;
        }
        if self.quant_traced || self.quant_traces > 0 {
            write!(f, "\n  Quant traces: {}", self.quant_traces)?;
            write!(f, "\n  Quant warnings: {}", self.quant_warnings)?;
            write!(f, "\n  Quant criticals: {}", self.quant_criticals)?;
            if let (Some(cos), Some(site)) = (self.worst_quant_cosine, &self.worst_quant_site) {
                write!(f, "\n  Worst quant cosine: {cos:.6} ({site})")?;
            }
        }
        if self.router_calls > 0 {
            write!(f, "\n  Router calls: {}", self.router_calls)?;
        }
        if self.warnings > 0 {
            write!(f, "\n  Warnings: {}", self.warnings)?;
            if let Some(first) = &self.first_warning {
                write!(f, " (first: {first})")?;
            }
        }
        if self.record_errors > 0 {
            write!(
                f,
                "\n  Record errors: {} (see Session::errors or the trace file's error events)",
                self.record_errors
            )?;
            if self.record_errors_not_kept > 0 {
                write!(
                    f,
                    "; {} more occurrences of further errors were counted, not kept",
                    self.record_errors_not_kept
                )?;
            }
        }
        if self.summary_only {
            f.write_str(
                "\n  Records: in the trace file (kept in memory with SessionBuilder::in_memory(true))",
            )?;
        }
        if self.records_dropped > 0 {
            write!(
                f,
                "\n  Records not kept in memory: {} past the {} limit (the summary counts them; a trace file keeps them)",
                self.records_dropped,
                ByteSize(self.memory_limit_bytes)
            )?;
        }
        Ok(())
    }
}

/// Bytes with a binary unit, for the report.
struct ByteSize(usize);

impl fmt::Display for ByteSize {
    #[allow(clippy::cast_precision_loss)]
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}
