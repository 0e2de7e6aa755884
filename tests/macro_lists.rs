//! The macro crate cannot depend on the runtime (generated code calls it, the macros never do),
//! so it keeps its own copies of three runtime lists: the tracepoint kinds it registers, the
//! `QuantType` names `quant = ...` accepts, and the stage names `trace_tensor!` refuses. These
//! tests fail when a copy drifts from the runtime.

use model_trace::{QuantType, Stage, TracepointKind};

fn sorted(names: impl IntoIterator<Item = impl Into<String>>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().map(Into::into).collect();
    names.sort();
    names
}

/// Every kind the runtime knows is registered by some macro, and every kind a macro registers
/// exists (the macros name the variants; the runtime's `Debug` prints their names).
#[test]
fn macros_register_exactly_the_runtime_kinds() {
    let runtime = sorted(TracepointKind::ALL.iter().map(|kind| format!("{kind:?}")));
    let macros = sorted(model_trace::__tracepoint_kinds!().iter().copied());
    assert_eq!(macros, runtime);
}

#[test]
fn quant_accepts_exactly_the_runtime_quant_types() {
    let runtime = sorted(QuantType::ALL.iter().map(|quant| quant.name()));
    let macros = sorted(model_trace::__quant_types!().iter().copied());
    assert_eq!(macros, runtime);
}

#[test]
fn trace_tensor_refuses_exactly_the_layer_boundary_stages() {
    let runtime = sorted(
        Stage::ALL
            .iter()
            .filter(|stage| stage.is_layer_boundary())
            .map(|stage| stage.as_str()),
    );
    let macros = sorted(model_trace::__reserved_stages!().iter().copied());
    assert_eq!(macros, runtime);
}
