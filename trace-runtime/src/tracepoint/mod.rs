//! The static list of tracepoints compiled into the program.
//!
//! Every annotation (an attribute such as `#[trace_layer]`, or an inline macro such as
//! `trace_tensor!`) defines a static [`Tracepoint`] and submits it to `inventory`, which collects
//! them when the program starts (before `main`, through the platform's static constructors), so
//! a program can print what it is able to trace before it runs anything.

use std::cell::RefCell;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use serde::{Deserialize, Serialize};

pub(crate) mod callsite;

use crate::id_hash::IdMap;

use callsite::Registered;

/// What a tracepoint records. `Display` gives the lowercase name that filters use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TracepointKind {
    /// `#[trace_model]`: one forward pass.
    Model,
    /// `#[trace_layer]`: one layer call.
    Layer,
    /// `#[trace_attention]`, `trace_attention!`: attention probabilities.
    Attention,
    /// `#[trace_logits]`, `trace_logits!`: logits.
    Logits,
    /// `#[trace_kv_cache]`: one KV-cache step.
    KvCache,
    /// `#[trace_quant]`: quantization error against a reference.
    Quant,
    /// `trace_tensor!`: an intermediate tensor, a stage of the enclosing layer.
    Tensor,
    /// `#[trace_router]`, `trace_router_value!`: a mixture-of-experts router's choice.
    Router,
}

impl TracepointKind {
    /// Every kind, in the order tracepoints are sorted by.
    pub const ALL: [TracepointKind; 8] = [
        Self::Model,
        Self::Layer,
        Self::Attention,
        Self::Logits,
        Self::KvCache,
        Self::Quant,
        Self::Tensor,
        Self::Router,
    ];

    /// The lowercase name used in `Display` and in filters such as `kv_cache:*`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Layer => "layer",
            Self::Attention => "attention",
            Self::Logits => "logits",
            Self::KvCache => "kv_cache",
            Self::Quant => "quant",
            Self::Tensor => "tensor",
            Self::Router => "router",
        }
    }

    /// Parses the name that [`as_str`](Self::as_str) gives.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for TracepointKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One annotated site in the source: an attribute on a function or an inline macro.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Tracepoint {
    /// What the tracepoint records.
    pub kind: TracepointKind,
    /// `name = "..."` of the annotation, or the function name.
    pub name: &'static str,
    /// The annotated function. For an inline macro, the innermost annotated function whose
    /// lines hold it (closures included); empty outside any.
    pub function: &'static str,
    /// `module_path!()` at the annotation.
    pub module_path: &'static str,
    /// `file!()` at the annotation.
    pub file: &'static str,
    /// `line!()` at the annotation.
    pub line: u32,
}

#[cfg(test)]
impl Tracepoint {
    /// A tracepoint of `kind` named `name`, in `forward` of `src/model.rs`: for tests.
    pub(crate) fn for_test(kind: TracepointKind, name: &'static str) -> Self {
        Self {
            kind,
            name,
            function: "forward",
            module_path: "smollm::model",
            file: "src/model.rs",
            line: 1,
        }
    }
}

impl Tracepoint {
    /// `module_path::function`, or the module path alone for an inline macro outside an
    /// annotated function.
    pub fn path(&self) -> String {
        if self.function.is_empty() {
            self.module_path.to_owned()
        } else {
            format!("{}::{}", self.module_path, self.function)
        }
    }

    /// [`path`](Self::path) of a tracepoint that lives as long as the program (every
    /// annotation's does), built once per tracepoint and kept: events carry it on every call,
    /// and formatting it anew each time was a fifth of a layer call's bookkeeping. One string
    /// a tracepoint is kept for the process; a thread finds it in its own table after the
    /// first time, without a lock.
    pub(crate) fn static_path(&'static self) -> &'static str {
        type Paths = IdMap<usize, &'static str>;
        thread_local! {
            static SEEN: RefCell<Paths> = RefCell::default();
        }
        static KEPT: OnceLock<Mutex<Paths>> = OnceLock::new();
        // The address names the tracepoint: a `'static` one is never freed, so never reused.
        let key = std::ptr::from_ref(self) as usize;
        let seen = |seen: &RefCell<Paths>| seen.borrow().get(&key).copied();
        if let Some(path) = SEEN.try_with(seen).ok().flatten() {
            return path;
        }
        let path = *KEPT
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_insert_with(|| Box::leak(self.path().into_boxed_str()));
        let _ = SEEN.try_with(|seen| seen.borrow_mut().insert(key, path));
        path
    }

    /// Orders by kind, module, name, then location, so listings are stable across builds:
    /// inventory's own order depends on the linker.
    pub(crate) fn sort_key(&self) -> (TracepointKind, &str, &str, &str, u32) {
        (self.kind, self.module_path, self.name, self.file, self.line)
    }
}

inventory::collect!(Registered);

/// Every tracepoint compiled into the program, sorted by kind, module, name and location.
///
/// Empty when the `enabled` feature is off, because then no annotation emits a tracepoint.
pub fn tracepoints() -> Vec<&'static Tracepoint> {
    if !cfg!(feature = "enabled") {
        return Vec::new();
    }
    let mut all: Vec<&'static Tracepoint> = inventory::iter::<Registered>
        .into_iter()
        .map(|registered| registered.0.tracepoint())
        .collect();
    all.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in TracepointKind::ALL {
            assert_eq!(TracepointKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(TracepointKind::from_name("kv-cache"), None);
    }
}
