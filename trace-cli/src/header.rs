//! The lines about a trace file that `list` and `summary` both begin with: the file, its
//! writer, its session and what it records.

use std::fmt::Write as _;

use trace_runtime::{ModelTracerConfig, RunMetadata, GOLDEN_FORMAT_NAME};

use crate::input::TraceRun;
use crate::style::Colors;

/// The lines about the file (or a run's rank files), its writer, its session and its
/// configuration.
pub(crate) fn describe_header(
    out: &mut String,
    run: &TraceRun,
    bytes: u64,
    colors: &Colors,
) -> std::fmt::Result {
    let header = run.header();
    if header.format == GOLDEN_FORMAT_NAME {
        return describe_golden(out, run, bytes, colors);
    }
    writeln!(
        out,
        "{} {} ({}, schema {}, written by {})",
        colors.bold("trace:"),
        run.label,
        crate::output::file_size(bytes),
        header.schema,
        header.writer
    )?;
    describe_run(out, run, colors)?;
    describe_metadata(out, &header.metadata, colors)?;
    writeln!(
        out,
        "{} {}",
        colors.bold("records:"),
        config_text(&header.config)
    )?;
    let filter = if header.filter.is_empty() {
        "(every tracepoint)"
    } else {
        &header.filter
    };
    let capture = if header.capture.is_empty() {
        "(nothing)"
    } else {
        &header.capture
    };
    writeln!(
        out,
        "{} {filter}   {} {capture}",
        colors.bold("filter:"),
        colors.bold("capture:")
    )?;
    if !header.interventions.is_empty() {
        // A changed run is no run of the model as it is: said where it cannot be missed.
        writeln!(
            out,
            "{} {}",
            colors.bold("changed by:"),
            colors.warn(&interventions_text(&header.interventions))
        )?;
    }
    Ok(())
}

/// The lines about a golden file: no session, times, configuration or filter, since a golden
/// file keeps none of them.
fn describe_golden(
    out: &mut String,
    run: &TraceRun,
    bytes: u64,
    colors: &Colors,
) -> std::fmt::Result {
    let header = run.header();
    let machine = header.metadata.extra.get("golden_machine");
    writeln!(
        out,
        "{} {} ({}, golden file, version {})",
        colors.bold("trace:"),
        run.label,
        crate::output::file_size(bytes),
        header.schema
    )?;
    writeln!(
        out,
        "{} every layer's stages, attention and logits as statistics and short fingerprints \
         (no times, attention rows or session), made on {:?}",
        colors.bold("golden:"),
        machine.map_or("an unnamed machine", String::as_str)
    )
}

/// The run: its rank files and the ranks missing, or the one session's process and thread.
fn describe_run(out: &mut String, run: &TraceRun, colors: &Colors) -> std::fmt::Result {
    let header = run.header();
    if !run.is_ranked() {
        let thread = header.thread.name.as_deref().unwrap_or("unnamed");
        return writeln!(
            out,
            "{} session {} of process {}, thread {} ({thread})",
            colors.bold("run:"),
            header.session,
            header.process_id,
            header.thread.id
        );
    }
    let world = header.world_size.unwrap_or(run.files.len());
    let files: Vec<String> = run
        .files
        .iter()
        .map(|f| format!("{} {}", f.label(), f.path.display()))
        .collect();
    writeln!(
        out,
        "{} run {}: {} of {world} ranks ({})",
        colors.bold("run:"),
        header.run,
        run.files.len(),
        files.join(", ")
    )?;
    if !run.missing_ranks.is_empty() {
        let missing: Vec<String> = run.missing_ranks.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "{}",
            colors.warn(&format!("missing: rank {}", missing.join(", ")))
        )?;
    }
    Ok(())
}

/// What the run says about itself (model, weights, prompt, dtype, device, the rest), in a
/// line; nothing where it says nothing.
fn describe_metadata(out: &mut String, meta: &RunMetadata, colors: &Colors) -> std::fmt::Result {
    let mut said = Vec::new();
    for (label, value) in [
        ("model", &meta.model),
        ("weights", &meta.weights),
        ("prompt", &meta.prompt),
        ("dtype", &meta.dtype),
        ("device", &meta.device),
    ] {
        if let Some(value) = value {
            said.push(format!("{label} {value:?}"));
        }
    }
    for (key, value) in &meta.extra {
        said.push(format!("{key} {value:?}"));
    }
    if !said.is_empty() {
        writeln!(out, "{} {}", colors.bold("about:"), said.join("; "))?;
    }
    if let Some(precision) = &meta.precision {
        writeln!(out, "{} {precision}", colors.bold("precision:"))?;
    }
    Ok(())
}

fn config_text(config: &ModelTracerConfig) -> String {
    let mut parts = Vec::new();
    if config.trace_activations {
        parts.push("activations".to_owned());
    }
    if config.trace_attention {
        let a = &config.attention_config;
        parts.push(format!(
            "attention (top {} ≥ {})",
            a.top_k, a.weight_threshold
        ));
    }
    if config.trace_logits {
        parts.push(match &config.tracked_tokens {
            Some(tokens) => format!("logits (tokens {tokens:?})"),
            None => format!("logits (final top {})", config.auto_track_top_k),
        });
    }
    if config.trace_quant_error {
        parts.push("quantization error".to_owned());
    }
    if config.trace_kv_cache {
        parts.push("KV cache".to_owned());
    }
    if parts.is_empty() {
        parts.push("nothing".to_owned());
    }
    let digests = match config.digests {
        trace_runtime::DigestPolicy::Off => "no digests",
        trace_runtime::DigestPolicy::HostOnly => "digests of host tensors",
        trace_runtime::DigestPolicy::Always => "digests of every tensor",
    };
    format!("{}; {digests}", parts.join(", "))
}

/// The interventions of a header, the first few of a long list (causal tracing has one a
/// patched pass) and how many there are.
pub(crate) fn interventions_text(interventions: &[String]) -> String {
    const SHOWN: usize = 3;
    if interventions.len() <= SHOWN + 1 {
        return interventions.join("; ");
    }
    format!(
        "{}; ... {} interventions in all",
        interventions[..SHOWN].join("; "),
        interventions.len()
    )
}
