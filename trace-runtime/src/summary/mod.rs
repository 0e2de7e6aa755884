//! What is recorded of one tensor: its statistics, and for comparing runs across builds and
//! frameworks, an exact fingerprint, a tolerant sketch and a few sample values.

mod fingerprint;
mod rows;
mod sketch;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

pub use fingerprint::{
    canonical_bits, Fingerprint, FingerprintParseError, CANONICAL_NAN, SHORT_FINGERPRINT_BYTES,
};
pub use rows::{Row, RowSummaries};
pub use sketch::{element_hash, Sketch, SKETCH_DIM, SKETCH_SEED};

use crate::stats::TensorStats;

/// Values kept from each end of a tensor ([`TensorSummary::head`], [`TensorSummary::tail`]).
pub const SAMPLE_LEN: usize = 4;

/// One tensor as recorded: shape, element type, statistics and, when a digest was taken (see
/// [`DigestPolicy`](crate::config::DigestPolicy)), the fingerprint, sketch and sample values; `capture` says where the full
/// values were saved, when they were.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorSummary {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Element type as the backend names it (`"f32"`, `"bf16"`, ...). Statistics, fingerprint
    /// and sketch are of the values converted to `f32`.
    pub dtype: Cow<'static, str>,
    /// Statistics of all values.
    pub stats: TensorStats,
    /// BLAKE3 of the values as `f32` little-endian bytes, every NaN as [`CANONICAL_NAN`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<Fingerprint>,
    /// Seeded projections of the values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sketch: Option<Sketch>,
    /// The first `min(SAMPLE_LEN, n)` values.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::float::vec"
    )]
    pub head: Vec<f32>,
    /// The last `min(SAMPLE_LEN, n)` values (overlapping `head` when `n < 2·SAMPLE_LEN`).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        with = "crate::float::vec"
    )]
    pub tail: Vec<f32>,
    /// Where the full tensor was saved, when a capture filter selected it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureRef>,
    /// Each row of its last dimension summarised, when the session records rows
    /// ([`ModelTracerConfig::row_summaries`](crate::ModelTracerConfig::row_summaries)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<RowSummaries>,
}

/// A tensor saved in full: a safetensors file beside the trace file, and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRef {
    /// File name, relative to the trace file's directory.
    pub file: String,
    /// Name of the tensor inside the file.
    pub tensor: String,
}

impl TensorSummary {
    /// Statistics only.
    #[must_use]
    pub fn from_stats(
        shape: Vec<usize>,
        dtype: impl Into<Cow<'static, str>>,
        stats: TensorStats,
    ) -> Self {
        Self {
            shape,
            dtype: dtype.into(),
            stats,
            ..Self::default()
        }
    }

    /// Statistics and digest of `values`, in that `shape`.
    #[must_use]
    pub fn of_values(
        shape: Vec<usize>,
        dtype: impl Into<Cow<'static, str>>,
        values: &[f32],
    ) -> Self {
        let head = values.iter().take(SAMPLE_LEN).copied().collect();
        let tail = values[values.len().saturating_sub(SAMPLE_LEN)..].to_vec();
        let stats = TensorStats::from_slice(values);
        Self {
            shape,
            dtype: dtype.into(),
            stats,
            fingerprint: Some(Fingerprint::of_counted(values, stats.nan_count > 0)),
            sketch: Some(Sketch::of(values)),
            head,
            tail,
            capture: None,
            rows: None,
        }
    }

    /// Whether a digest was taken.
    pub fn has_digest(&self) -> bool {
        self.fingerprint.is_some()
    }

    /// Number of elements the shape holds.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cover_both_ends() {
        let summary =
            TensorSummary::of_values(vec![2, 5], "f32", &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9.]);
        assert_eq!(summary.head, [0., 1., 2., 3.]);
        assert_eq!(summary.tail, [6., 7., 8., 9.]);
        let short = TensorSummary::of_values(vec![3], "f32", &[1., 2., 3.]);
        assert_eq!((short.head.len(), short.tail.len()), (3, 3));
        assert_eq!(short.numel(), 3);
    }

    #[test]
    fn non_finite_values_round_trip_through_json() {
        let values = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.5,
            -0.0,
            f32::MIN_POSITIVE,
        ];
        let summary = TensorSummary::of_values(vec![6], "f32", &values);
        let json = serde_json::to_string(&summary).unwrap();
        let back: TensorSummary = serde_json::from_str(&json).unwrap();
        assert!(back.head[0].is_nan());
        assert_eq!(back.head[1..], summary.head[1..]);
        assert_eq!(back.tail[3].to_bits(), f32::MIN_POSITIVE.to_bits());
        assert_eq!(back.tail[2].to_bits(), (-0.0f32).to_bits());
        assert_eq!(back.fingerprint, summary.fingerprint);
        assert_eq!(back.sketch, summary.sketch);
        assert_eq!(back.stats, summary.stats);
    }
}
