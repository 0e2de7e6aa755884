//! What a session wants of a tracepoint, from its configuration and its filter: decided once
//! per callsite and session, and cached by both.

use crate::config::ModelTracerConfig;
use crate::select::TraceFilter;
use crate::tracepoint::callsite::Interest;
use crate::tracepoint::{Tracepoint, TracepointKind};

/// How much of `tracepoint` a session with `config` and `filter` records: nothing, the
/// structure of the pass (a layer's numbering, a pass left out), or its records.
pub(super) fn interest(
    config: &ModelTracerConfig,
    filter: &TraceFilter,
    tracepoint: &Tracepoint,
) -> Interest {
    let admitted = filter.admits(tracepoint);
    let records = |on: bool| {
        if on && admitted {
            Interest::Record
        } else {
            Interest::Never
        }
    };
    match tracepoint.kind {
        TracepointKind::Model => match (config.is_enabled(), filter.traces_pass(tracepoint)) {
            (false, _) => Interest::Never,
            (true, true) => Interest::Structure,
            (true, false) => Interest::Suspend,
        },
        TracepointKind::Layer => {
            // A layer the filter drops still runs (numbering, enclosing index) when something
            // recorded inside it may be admitted; otherwise it costs a load and a branch.
            let may = |on: bool, kind| on && filter.may_admit_kind(kind);
            let needs_context = may(config.trace_activations, TracepointKind::Tensor)
                || may(config.trace_activations, TracepointKind::Layer)
                || may(config.trace_attention, TracepointKind::Attention)
                || may(config.trace_logits, TracepointKind::Logits)
                || may(config.trace_quant_error, TracepointKind::Quant)
                || may(config.trace_kv_cache, TracepointKind::KvCache)
                || may(config.trace_router, TracepointKind::Router);
            match (needs_context, config.trace_activations && admitted) {
                (false, _) => Interest::Never,
                (true, false) => Interest::Structure,
                (true, true) => Interest::Record,
            }
        }
        TracepointKind::Tensor => {
            if !config.trace_activations {
                Interest::Never
            } else if admitted {
                Interest::Record
            } else if !filter.excludes(tracepoint) && filter.may_admit_kind(TracepointKind::Layer) {
                Interest::InRecordedLayer
            } else {
                Interest::Never
            }
        }
        TracepointKind::Attention => records(config.trace_attention),
        TracepointKind::Logits => records(config.trace_logits),
        TracepointKind::KvCache => records(config.trace_kv_cache),
        TracepointKind::Quant => records(config.trace_quant_error),
        TracepointKind::Router => records(config.trace_router),
    }
}
