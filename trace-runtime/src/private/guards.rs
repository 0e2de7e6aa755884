//! The drop guards of `#[trace_model]` and `#[trace_layer]`: they close what they opened,
//! also while a panic unwinds.

use super::read::read_stage;
use crate::session::state::TensorPlan;
use crate::session::{interventions, registry};
use crate::tensor::{TokensError, TraceTensor};
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
    /// Begins a forward pass at `position` (`None`: the number of passes begun so far) that
    /// consumes `tokens` (`None`: not said; an error: noted, the pass begun without them).
    pub fn enter(
        cs: &'static Callsite,
        position: Option<usize>,
        tokens: Option<Result<Vec<u32>, TokensError>>,
    ) -> Self {
        let interest = cs.interest();
        if !interest.runs() {
            return Self::inactive();
        }
        let generation = registry::active_generation();
        if interest == Interest::Suspend {
            return Self {
                generation,
                pass: None,
                suspended: registry::suspend(generation),
                _not_send: std::marker::PhantomData,
            };
        }
        let pass = registry::with_session(generation, |session| {
            session.begin_model_pass(cs.tracepoint(), position, tokens)
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
            registry::with_session(self.generation, |session| session.end_model_pass(pass));
        }
        if self.suspended {
            registry::resume(self.generation);
        }
    }
}

/// Closes a layer record on drop, also when unwinding from a panic; the record goes to the
/// sinks with the stages recorded inside it.
///
/// Between [`enter`](Self::enter) and the drop, the layer's input and output can be changed by
/// the session's interventions: generated code asks [`replaces_input`](Self::replaces_input)
/// and [`replaces_output`](Self::replaces_output), one field each, before it does anything.
#[must_use]
pub struct LayerGuard {
    generation: u32,
    frame: Option<(u64, usize)>,
    record: bool,
    callsite: Option<&'static Callsite>,
    plan: Option<TensorPlan>,
    replaces: Replaces,
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Which of a layer call's tensors an intervention selects.
#[derive(Clone, Copy, Default)]
struct Replaces {
    input: bool,
    output: bool,
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
        let generation = registry::active_generation();
        let entered = registry::with_session(generation, |session| {
            let tracepoint = cs.tracepoint();
            let (frame, layer) = session.enter_layer(tracepoint, index, record);
            let replaces = if session.has_interventions() {
                Replaces {
                    input: session.intervenes(tracepoint, Some(layer), "input"),
                    output: session.intervenes(tracepoint, Some(layer), "output"),
                }
            } else {
                Replaces::default()
            };
            (
                frame,
                layer,
                session.plan(tracepoint, Some(layer)),
                replaces,
            )
        });
        let Some((frame, layer, plan, replaces)) = entered else {
            return Self::inactive();
        };
        let guard = Self {
            generation,
            frame: Some((frame, layer)),
            record,
            callsite: Some(cs),
            plan: Some(plan),
            replaces,
            _not_send: std::marker::PhantomData,
        };
        guard.input(input);
        guard
    }

    /// Records the layer's input, when [`enter`](Self::enter) was given none because it could
    /// still be changed ([`replace_input`](Self::replace_input)).
    pub fn input(&self, input: Option<&dyn TraceTensor>) {
        let (Some((frame, layer)), Some(input), Some(cs), Some(plan), true) =
            (self.frame, input, self.callsite, self.plan, self.record)
        else {
            return;
        };
        let generation = self.generation;
        if let Some(read) = read_stage(generation, cs, "input", layer, plan, input) {
            registry::with_session(generation, |s| s.set_layer_tensor(frame, "input", read));
        }
    }

    /// Whether an intervention changes this call's input.
    pub fn replaces_input(&self) -> bool {
        self.replaces.input
    }

    /// Whether an intervention changes this call's output.
    pub fn replaces_output(&self) -> bool {
        self.replaces.output
    }

    /// Applies the interventions on the input to `input` (`None`: it cannot be changed, which
    /// is an error of the tracepoint).
    pub fn replace_input(&self, input: Option<&mut dyn TraceTensor>) {
        self.replace("input", input);
    }

    /// Applies the interventions on the output to `output`, before it is recorded.
    pub fn replace_output(&self, output: Option<&mut dyn TraceTensor>) {
        self.replace("output", output);
    }

    fn replace(&self, stage: &str, tensor: Option<&mut dyn TraceTensor>) {
        if let (Some((_, layer)), Some(cs)) = (self.frame, self.callsite) {
            interventions::intervene(self.generation, cs, Some(layer), stage, tensor);
        }
    }

    /// A guard that does nothing.
    pub fn inactive() -> Self {
        Self {
            generation: 0,
            frame: None,
            record: false,
            callsite: None,
            plan: None,
            replaces: Replaces {
                input: false,
                output: false,
            },
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
        let Some(plan) =
            registry::with_session(generation, |s| s.plan(cs.tracepoint(), Some(layer)))
        else {
            return;
        };
        if let Some(read) = read_stage(generation, cs, "output", layer, plan, output) {
            registry::with_session(generation, |s| s.set_layer_tensor(frame, "output", read));
        }
    }
}

impl Drop for LayerGuard {
    fn drop(&mut self) {
        if let Some((frame, _)) = self.frame {
            registry::with_session(self.generation, |session| session.exit_layer(frame));
        }
    }
}
