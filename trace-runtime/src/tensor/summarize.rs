//! A user tensor read into its [`TensorSummary`]: once, with a digest when the policy allows,
//! and its values lent to a capture while they are borrowed.

use crate::config::DigestPolicy;
use crate::stats::TensorStats;
use crate::summary::TensorSummary;

use super::{TensorError, TraceTensor};

/// Something that wants a tensor's values while they are borrowed.
pub(crate) type ValuesReader<'a> = &'a mut dyn FnMut(&[f32]);

/// Whether `tensor` gets a digest under `policy`.
pub(crate) fn takes_digest(policy: DigestPolicy, tensor: &dyn TraceTensor) -> bool {
    match policy {
        DigestPolicy::Off => false,
        DigestPolicy::HostOnly => tensor.on_host(),
        DigestPolicy::Always => true,
    }
}

/// Reads `tensor` once: its summary (with a digest when `digest` asks and the policy allows) and,
/// when `capture` is given, the values handed to it while they are borrowed.
pub(crate) fn summarize(
    tensor: &dyn TraceTensor,
    digest: DigestPolicy,
    capture: Option<ValuesReader<'_>>,
) -> Result<TensorSummary, TensorError> {
    let with_digest = takes_digest(digest, tensor);
    let shape = tensor.shape().into_owned();
    let dtype = tensor.dtype_name();
    if !(with_digest || capture.is_some()) {
        return Ok(TensorSummary::from_stats(shape, dtype, tensor.stats()?));
    }
    let mut summary = None;
    let mut capture = capture;
    tensor.with_f32(&mut |values| {
        summary = Some(if with_digest {
            TensorSummary::of_values(shape.clone(), dtype, values)
        } else {
            TensorSummary::from_stats(shape.clone(), dtype, TensorStats::from_slice(values))
        });
        if let Some(capture) = capture.as_mut() {
            capture(values);
        }
    })?;
    Ok(summary.unwrap_or_else(|| TensorSummary::from_stats(shape, dtype, TensorStats::default())))
}
