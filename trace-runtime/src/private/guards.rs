//! The drop guards of `#[trace_model]` and `#[trace_layer]`: they close what they opened,
//! also while a panic unwinds.

use super::read::read_stage;
use crate::session::state;
use crate::tensor::TraceTensor;
use crate::tracepoint::callsite::{Callsite, Interest};

/// Closes a forward pass on drop, also when unwinding from a panic, so a panicking pass is
/// kept and the next one starts clean. For a pass that the filter leaves out, suspends the
/// session until the drop instead.
#[must_use]
pub struct ModelGuard {
    generation: u32,
    pass: Option<usize>,
    suspended: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ModelGuard {
    /// Begins a forward pass at `position` (`None`: the number of passes begun so far).
    pub fn enter(cs: &'static Callsite, position: Option<usize>) -> Self {
        let interest = cs.interest();
        if !interest.runs() {
            return Self::inactive();
        }
        let generation = state::active_generation();
        if interest == Interest::Suspend {
            return Self {
                generation,
                pass: None,
                suspended: state::suspend(generation),
                _not_send: std::marker::PhantomData,
            };
        }
        let pass = state::with_session(generation, |session| {
            session.begin_model_pass(cs.tracepoint(), position)
        })
        .flatten();
        Self {
            generation,
            pass,
            suspended: false,
            _not_send: std::marker::PhantomData,
        }
    }

    /// A guard that does nothing on drop.
    pub fn inactive() -> Self {
        Self {
            generation: 0,
            pass: None,
            suspended: false,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for ModelGuard {
    fn drop(&mut self) {
        if let Some(pass) = self.pass {
            state::with_session(self.generation, |session| session.end_model_pass(pass));
        }
        if self.suspended {
            state::resume(self.generation);
        }
    }
}

/// Closes a layer record on drop, also when unwinding from a panic; the record goes to the
/// sinks with the stages recorded inside it.
#[must_use]
pub struct LayerGuard {
    generation: u32,
    frame: Option<(u64, usize)>,
    record: bool,
    callsite: Option<&'static Callsite>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl LayerGuard {
    /// Enters layer `index` (`None`: the number of layer calls so far in this pass).
    pub fn enter(
        cs: &'static Callsite,
        index: Option<usize>,
        input: Option<&dyn TraceTensor>,
    ) -> Self {
        let interest = cs.interest();
        if !interest.runs() {
            return Self::inactive();
        }
        let record = interest.records();
        let generation = state::active_generation();
        let entered = state::with_session(generation, |session| {
            let (frame, layer) = session.enter_layer(cs.tracepoint(), index, record);
            (frame, layer, session.plan(cs.tracepoint(), Some(layer)))
        });
        let Some((frame, layer, plan)) = entered else {
            return Self::inactive();
        };
        if let (true, Some(input)) = (record, input) {
            if let Some(read) = read_stage(generation, cs, "input", layer, plan, input) {
                state::with_session(generation, |s| s.set_layer_tensor(frame, "input", read));
            }
        }
        Self {
            generation,
            frame: Some((frame, layer)),
            record,
            callsite: Some(cs),
            _not_send: std::marker::PhantomData,
        }
    }

    /// A guard that does nothing.
    pub fn inactive() -> Self {
        Self {
            generation: 0,
            frame: None,
            record: false,
            callsite: None,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Records the layer's output; `None` (no tensor, an `Err`) records nothing.
    pub fn output(&mut self, output: Option<&dyn TraceTensor>) {
        let (Some((frame, layer)), Some(output), Some(cs), true) =
            (self.frame, output, self.callsite, self.record)
        else {
            return;
        };
        let generation = self.generation;
        let Some(plan) = state::with_session(generation, |s| s.plan(cs.tracepoint(), Some(layer)))
        else {
            return;
        };
        if let Some(read) = read_stage(generation, cs, "output", layer, plan, output) {
            state::with_session(generation, |s| s.set_layer_tensor(frame, "output", read));
        }
    }
}

impl Drop for LayerGuard {
    fn drop(&mut self) {
        if let Some((frame, _)) = self.frame {
            state::with_session(self.generation, |session| session.exit_layer(frame));
        }
    }
}
