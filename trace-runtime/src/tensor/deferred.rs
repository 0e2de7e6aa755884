//! Reads that start now and finish later: a device tensor's summary computed where the tensor
//! lives while the model goes on, and read back with every other read of the forward pass.

use std::fmt;

use super::TensorError;
use crate::summary::TensorSummary;

/// What a deferred read ([`TraceTensor::start_summary`](super::TraceTensor::start_summary)) is
/// asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SummaryRequest {
    /// A digest (fingerprint, sketch, samples) besides the statistics: the values must reach the
    /// host.
    pub digest: bool,
    /// Tensors with fewer elements than this are copied whole to the host and summarised there
    /// rather than reduced on the device (see
    /// [`ModelTracerConfig::device_copy_below`](crate::ModelTracerConfig::device_copy_below)).
    pub copy_below: usize,
}

impl SummaryRequest {
    /// Statistics only, reduced on the device whatever the size.
    #[must_use]
    pub fn stats() -> Self {
        Self::default()
    }

    /// Statistics and a digest.
    #[must_use]
    pub fn with_digest() -> Self {
        Self {
            digest: true,
            ..Self::default()
        }
    }

    /// The same, with tensors of fewer than `elements` values copied to the host.
    #[must_use]
    pub fn copy_below(self, elements: usize) -> Self {
        Self {
            copy_below: elements,
            ..self
        }
    }
}

/// A tensor summary being computed where the tensor lives; [`finish`](Self::finish) waits for it.
///
/// A backend returns one from [`TraceTensor::start_summary`](super::TraceTensor::start_summary)
/// after it has queued the work (a reduction kernel, a copy) on the device. The session finishes
/// every read of a forward pass when the pass ends, in the order they were started, so a backend
/// that writes the results of a pass's reads into one buffer can read it back once, at the first
/// `finish`, and let the others take their part of it.
#[must_use = "a pending summary is only read by finishing it"]
pub struct PendingSummary {
    finish: Box<dyn FnOnce() -> Result<TensorSummary, TensorError>>,
}

impl PendingSummary {
    /// A read that `finish` completes.
    pub fn new(finish: impl FnOnce() -> Result<TensorSummary, TensorError> + 'static) -> Self {
        Self {
            finish: Box::new(finish),
        }
    }

    /// Waits for the read and returns the summary.
    pub fn finish(self) -> Result<TensorSummary, TensorError> {
        (self.finish)()
    }
}

impl fmt::Debug for PendingSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PendingSummary")
    }
}
