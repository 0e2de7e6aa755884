//! The session's interventions at a tracepoint: which of them select the tensor it sees,
//! applying them to it (with the session not borrowed), and their bookkeeping: an
//! `intervention` event for each change, and at the end a warning for one that changed nothing.
//! What an intervention is and does to a tensor is [`crate::intervene`]'s.

use std::borrow::Cow;

use super::registry::with_session;
use super::state::SessionState;
use crate::intervene::{self, Intervention, InterventionSite};
use crate::record::{labels, Event, InterventionEvent, RecordErrorKind};
use crate::tensor::TraceTensor;
use crate::tracepoint::callsite::Callsite;
use crate::tracepoint::Tracepoint;

/// Applies the interventions of the active session that select `stage` of `cs`'s tracepoint
/// at `layer` to `tensor` (`None`: the value is not a tensor that can be changed), and writes
/// an event for each change. The session is not borrowed while the tensor is read, changed and
/// rebuilt. What cannot be done is an error of the tracepoint, never skipped silently.
pub(crate) fn intervene(
    generation: u32,
    cs: &'static Callsite,
    layer: Option<usize>,
    stage: &str,
    tensor: Option<&mut dyn TraceTensor>,
) {
    let tracepoint = cs.tracepoint();
    let Some((selected, pass_position)) = with_session(generation, |s| {
        s.has_interventions()
            .then(|| s.interventions_for(tracepoint, layer, stage))
    })
    .flatten() else {
        return;
    };
    if selected.is_empty() {
        return;
    }
    let Some(tensor) = tensor else {
        let text = selected[0].1.to_string();
        cs.note_error(
            RecordErrorKind::Intervention,
            format!(
                "intervention `{text}` selects `{stage}` here, which cannot be changed: not an \
                 owned tensor (an `impl` or generic parameter, an `input = EXPR` that is no \
                 parameter, an output borrowed from the input)"
            ),
        );
        return;
    };
    let pass = with_session(generation, |s| s.pass_id()).flatten();
    let shape = tensor.shape().into_owned();
    let site = InterventionSite {
        pass,
        layer,
        stage,
        shape: &shape,
    };
    for (index, intervention) in selected {
        let outcome = intervene::apply(&intervention, tensor, &site, pass_position);
        if !matches!(outcome, Ok(None)) {
            // Its `position=` rows outside this tensor's: not counted, so that one that never
            // reaches a row is warned about at the end.
            with_session(generation, |s| s.count_selection(index));
        }
        match outcome {
            Ok(Some(applied)) => {
                with_session(generation, |s| {
                    s.record_intervention(index, tracepoint, layer, stage, applied);
                });
            }
            Ok(None) => {}
            Err(reason) => cs.note_error(
                RecordErrorKind::Intervention,
                format!("intervention `{intervention}` on `{stage}`: {reason}"),
            ),
        }
    }
}

impl SessionState {
    /// Whether the session has interventions at all: the one check a tracepoint makes when it
    /// has none.
    pub(crate) fn has_interventions(&self) -> bool {
        !self.interventions.is_empty()
    }

    /// Whether an intervention selects `stage` of `tracepoint` at `layer` in the open pass.
    pub(crate) fn intervenes(
        &self,
        tracepoint: &Tracepoint,
        layer: Option<usize>,
        stage: &str,
    ) -> bool {
        let pass = self.pass_id();
        self.interventions
            .iter()
            .any(|(i, _)| i.selector().selects(tracepoint, pass, layer, stage))
    }

    /// The interventions that select `stage` of `tracepoint` at `layer` in the open pass, with
    /// their index, and the pass's first token position.
    fn interventions_for(
        &self,
        tracepoint: &Tracepoint,
        layer: Option<usize>,
        stage: &str,
    ) -> (Vec<(usize, Intervention)>, usize) {
        let pass = self.pass_id();
        let selected = self
            .interventions
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| i.selector().selects(tracepoint, pass, layer, stage))
            .map(|(index, (i, _))| (index, i.clone()))
            .collect();
        (selected, self.pass_position())
    }

    /// Counts a tensor that intervention `index` changed (or failed to change, an error of its
    /// own).
    fn count_selection(&mut self, index: usize) {
        if let Some((_, selected)) = self.interventions.get_mut(index) {
            *selected += 1;
        }
    }

    /// Writes the event of a change by intervention `index`.
    fn record_intervention(
        &mut self,
        index: usize,
        tracepoint: &'static Tracepoint,
        layer: Option<usize>,
        stage: &str,
        applied: intervene::Applied,
    ) {
        let Some((intervention, _)) = self.interventions.get(index) else {
            return;
        };
        let text = intervention.to_string();
        let (tracepoint, function) = labels(Some(tracepoint));
        let stage = Cow::Owned(stage.to_owned());
        self.emit_record(|seq, pass| {
            Event::Intervention(InterventionEvent {
                seq,
                pass,
                layer,
                stage,
                tracepoint,
                function,
                intervention: text,
                source: applied.source,
                positions: applied.positions,
                before_l2: applied.before_l2,
                delta_l2: applied.delta_l2,
            })
        });
    }

    /// At the end: an intervention that changed nothing was most likely mistyped.
    pub(super) fn warn_unused_interventions(&mut self) {
        let unused: Vec<String> = self
            .interventions
            .iter()
            .filter(|(_, selected)| *selected == 0)
            .map(|(intervention, _)| intervention.to_string())
            .collect();
        for text in unused {
            let message = format!(
                "intervention `{text}` changed nothing in the whole session: it selected no \
                 tensor, or no row of one (check its stage=, layer=, pass= and position=; \
                 model_trace::tracepoints() lists the tracepoints; a stage recorded with \
                 `trace_tensor!` is only borrowed and cannot be changed: record it with \
                 `trace_stage!`)"
            );
            self.note_error(None, RecordErrorKind::UnusedIntervention, message);
        }
    }
}
