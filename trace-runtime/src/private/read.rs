//! Reading a tensor: its summary, and its values for whoever else needs them.

use crate::record::RecordErrorKind;
use crate::session::registry;
use crate::session::state::{StageRead, TensorPlan};
use crate::summary::{RowSummaries, TensorSummary};
use crate::tensor::{summarize, takes_digest, SummaryRequest, TraceTensor, ValuesReader};
use crate::tracepoint::callsite::Callsite;

/// Reads a layer's tensor (a stage, the input or the output): started now and finished at the
/// end of the pass when the tensor can ([`TraceTensor::start_summary`]: a device's) and its
/// values are not needed at once (a capture needs them), else [`read_tensor`].
pub(super) fn read_stage(
    generation: u32,
    cs: &'static Callsite,
    what: &str,
    layer: usize,
    plan: TensorPlan,
    tensor: &dyn TraceTensor,
) -> Option<StageRead> {
    if !(plan.capture || plan.rows) {
        let request = SummaryRequest {
            digest: takes_digest(plan.digest, tensor),
            copy_below: plan.copy_below,
        };
        match tensor.start_summary(&request) {
            Some(Ok(read)) => return Some(StageRead::Later(read, cs.tracepoint())),
            Some(Err(error)) => {
                let message = format!("{what}: {error}");
                registry::with_session(generation, |s| {
                    s.note_error(Some(cs.tracepoint()), RecordErrorKind::Read, message);
                });
                return None;
            }
            None => {}
        }
    }
    read_tensor(generation, cs, what, Some(layer), plan, tensor, None).map(StageRead::Now)
}

/// Reads `tensor` as `plan` says, handing the values to `also` too when given, and saves it in
/// full when the plan captures it. `None` (and the error noted) when it cannot be read.
pub(super) fn read_tensor(
    generation: u32,
    cs: &'static Callsite,
    what: &str,
    layer: Option<usize>,
    plan: TensorPlan,
    tensor: &dyn TraceTensor,
    mut also: Option<ValuesReader<'_>>,
) -> Option<TensorSummary> {
    let mut captured: Option<Vec<f32>> = None;
    let mut rows = None;
    // Read only when rows are asked for: every other read of the hot path skips it.
    let shape = plan.rows.then(|| tensor.shape());
    let wants_values = plan.capture || plan.rows || also.is_some();
    let mut consume = |values: &[f32]| {
        if plan.capture {
            captured = Some(values.to_vec());
        }
        if let Some(shape) = shape.as_deref() {
            rows = RowSummaries::of_shape(values, shape);
        }
        if let Some(also) = also.as_mut() {
            also(values);
        }
    };
    let read = summarize(
        tensor,
        plan.digest,
        wants_values.then_some(&mut consume as &mut dyn FnMut(&[f32])),
    );
    let mut summary = match read {
        Ok(summary) => summary,
        Err(error) => {
            let message = format!("{what}: {error}");
            registry::with_session(generation, |s| {
                s.note_error(Some(cs.tracepoint()), RecordErrorKind::Read, message);
            });
            return None;
        }
    };
    summary.rows = rows;
    if let Some(values) = captured {
        registry::with_session(generation, |s| {
            s.attach_capture(cs.tracepoint(), layer, what, &mut summary, values);
        });
    }
    Some(summary)
}
