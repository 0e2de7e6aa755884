//! Where records go: the [`TraceSink`] trait, and the sinks this crate provides — the in-memory
//! [`ModelTracer`], the trace-file writer ([`TraceFileSink`]) and, with the `tracing` feature,
//! [`TracingSink`], which hands passes and layers to the `tracing` crate.
//!
//! A session sends every sink the same header and the same events, in order, on the thread
//! that records; a sink never calls back into the session.

mod file;
mod tracer;
#[cfg(feature = "tracing")]
mod tracing;

use std::borrow::Cow;

pub use file::TraceFileSink;
pub use tracer::*;
#[cfg(feature = "tracing")]
pub use tracing::TracingSink;

use crate::record::{Event, TraceHeader};

/// What a sink's method returns when it fails.
pub type SinkError = Box<dyn std::error::Error + Send + Sync>;

/// A layer call that has just begun (its [`LayerEvent`](crate::LayerEvent) comes when it ends),
/// for sinks that open a span per layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerBegin {
    /// The sequence number its event will carry.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// The layer index.
    pub layer: usize,
    /// The `#[trace_layer]` tracepoint.
    pub tracepoint: &'static str,
    /// Its function's `module::fn` path.
    pub function: Cow<'static, str>,
    /// When, in ns on the header's clock.
    pub start_ns: u64,
}

/// A layer call that has just ended, for sinks that open a span per layer: its
/// [`LayerEvent`](crate::LayerEvent) may come later, when the statistics of a device's tensors
/// are read back at the end of the pass (see
/// [`TraceTensor::start_summary`](crate::TraceTensor::start_summary)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerEnd {
    /// The sequence number of its [`LayerBegin`] and of its event.
    pub seq: u64,
    /// The pass.
    pub pass: usize,
    /// The layer index.
    pub layer: usize,
    /// When, in ns on the header's clock.
    pub end_ns: u64,
}

/// A destination for what a session records.
///
/// The session calls [`start`](Self::start) once, then [`event`](Self::event) for each event in
/// order (and [`layer_begin`](Self::layer_begin) when a layer is entered), then
/// [`finish`](Self::finish) once: when the session finishes, is dropped, or is unwound by a
/// panic. Every call happens on the session's thread.
///
/// A method that returns an error stops the sink: it gets no further call, and the error is
/// reported by [`Session::errors`](crate::Session::errors) and at
/// [`Session::finish_with_errors`](crate::Session::finish_with_errors). The model's computation
/// is never affected.
///
/// ```
/// # use trace_runtime as model_trace;
/// use model_trace::{Event, ModelTracerConfig, Session, SinkError, TraceSink};
/// use std::sync::mpsc;
///
/// /// Sends the position and anomaly count of every finished pass over a channel.
/// struct PassReport(mpsc::Sender<(usize, usize)>);
///
/// impl TraceSink for PassReport {
///     fn name(&self) -> std::borrow::Cow<'_, str> {
///         "pass report".into()
///     }
///
///     fn event(&mut self, event: &Event) -> Result<(), SinkError> {
///         if let Event::PassEnd(end) = event {
///             self.0.send((end.position, end.anomalies.len()))?;
///         }
///         Ok(())
///     }
/// }
///
/// let (sender, receiver) = mpsc::channel();
/// let session = Session::builder(ModelTracerConfig::lightweight())
///     .sink(PassReport(sender))
///     .start()
///     .expect("no file to open");
/// // ... run the model ...
/// session.finish();
/// let reports: Vec<(usize, usize)> = receiver.try_iter().collect();
/// assert!(reports.is_empty()); // no `#[trace_model]` ran in this example
/// ```
pub trait TraceSink {
    /// A short name for messages about the sink (`"trace file run.ndjson"`).
    fn name(&self) -> Cow<'_, str>;

    /// The session's header, before any event.
    fn start(&mut self, header: &TraceHeader) -> Result<(), SinkError> {
        let _ = header;
        Ok(())
    }

    /// A layer call begins; its event follows when it ends.
    fn layer_begin(&mut self, begin: &LayerBegin) -> Result<(), SinkError> {
        let _ = begin;
        Ok(())
    }

    /// A layer call ends. Its event, if it records anything, came just before, or comes at the
    /// end of the pass when the pass reads device tensors (they are read back once a pass, and
    /// the pass's events are held until then); every [`layer_begin`](Self::layer_begin) is
    /// matched by one `layer_end`, innermost first.
    fn layer_end(&mut self, end: &LayerEnd) -> Result<(), SinkError> {
        let _ = end;
        Ok(())
    }

    /// One event.
    fn event(&mut self, event: &Event) -> Result<(), SinkError>;

    /// The session ends: flush what is buffered.
    fn finish(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Whether tensors should carry a digest (fingerprint, sketch, samples) for this sink. A
    /// session computes digests only if one of its sinks wants them.
    fn wants_digests(&self) -> bool {
        false
    }
}
