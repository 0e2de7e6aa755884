//! Reading a tensor: its summary, and its values for whoever else needs them.

use crate::record::RecordErrorKind;
use crate::session::state::{self, TensorPlan};
use crate::summary::{summarize, TensorSummary, ValuesReader};
use crate::tensor::TraceTensor;
use crate::tracepoint::callsite::Callsite;

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
    let wants_values = plan.capture || also.is_some();
    let mut consume = |values: &[f32]| {
        if plan.capture {
            captured = Some(values.to_vec());
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
            state::with_session(generation, |s| {
                s.note_error(Some(cs.tracepoint()), RecordErrorKind::Read, message);
            });
            return None;
        }
    };
    if let Some(values) = captured {
        state::with_session(generation, |s| {
            s.attach_capture(cs.tracepoint(), layer, what, &mut summary, values);
        });
    }
    Some(summary)
}
