//! The static list of tracepoints compiled into the program.
//!
//! Every annotation (an attribute such as `#[trace_layer]`, or an inline macro such as
//! `trace_tensor!`) defines a static [`Tracepoint`] and submits it to `inventory`, which collects
//! them when the program starts (before `main`, through the platform's static constructors), so
//! a program can print what it is able to trace before it runs anything.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::__private::Registered;
use crate::session::TraceFilter;

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
}

impl TracepointKind {
    /// Every kind, in the order tracepoints are sorted by.
    pub const ALL: [TracepointKind; 7] = [
        Self::Model,
        Self::Layer,
        Self::Attention,
        Self::Logits,
        Self::KvCache,
        Self::Quant,
        Self::Tensor,
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

    /// The shortest filter pattern (see [`TraceFilter`]) that selects this tracepoint and no
    /// other among [`tracepoints()`]: the name when no other tracepoint has it, else
    /// `kind:name`, else `kind:name@file:line` with the shortest end of the file's path that
    /// tells it apart (`layer:forward@model.rs:210`). A name that is not a valid glob (with a
    /// space, `,`, `:` or `@`) is replaced by `*` in the last form.
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// for tracepoint in model_trace::tracepoints() {
    ///     let filter = model_trace::TraceFilter::parse(&tracepoint.selector()).unwrap();
    ///     assert!(filter.admits(tracepoint));
    /// }
    /// ```
    pub fn selector(&self) -> String {
        self.selector_among(&tracepoints())
    }

    pub(crate) fn selector_among(&self, all: &[&Tracepoint]) -> String {
        let selects_only_self = |text: &str| {
            TraceFilter::parse(text).is_ok_and(|filter| {
                filter.admits(self) && !all.iter().any(|tp| *tp != self && filter.admits(tp))
            })
        };
        let kind = self.kind;
        let (name, line) = (self.name, self.line);
        let mut suffixes = file_suffixes(self.file);
        let mut candidates = [name.to_owned(), format!("{kind}:{name}")]
            .into_iter()
            .chain(
                suffixes
                    .clone()
                    .map(|file| format!("{kind}:{name}@{file}:{line}")),
            )
            .chain(
                suffixes
                    .clone()
                    .map(|file| format!("{kind}:*@{file}:{line}")),
            );
        if let Some(unique) = candidates.find(|text| selects_only_self(text)) {
            return unique;
        }
        // Tracepoints that differ only in what a pattern cannot see (one file, line, kind and
        // name in two modules): the most precise pattern, which selects all of them.
        let file = suffixes.next_back().unwrap_or(self.file);
        let named = format!("{kind}:{name}@{file}:{line}");
        if TraceFilter::parse(&named).is_ok_and(|filter| filter.admits(self)) {
            named
        } else {
            format!("{kind}:*@{file}:{line}")
        }
    }

    /// Orders by kind, module, name, then location, so listings are stable across builds:
    /// inventory's own order depends on the linker.
    fn sort_key(&self) -> (TracepointKind, &str, &str, &str, u32) {
        (self.kind, self.module_path, self.name, self.file, self.line)
    }
}

/// `model.rs`, `src/model.rs`, ..., the whole path: the ends of `file` at its separators.
fn file_suffixes(file: &str) -> impl DoubleEndedIterator<Item = &str> + Clone {
    let starts = file
        .char_indices()
        .filter(|&(_, c)| c == '/' || c == '\\')
        .map(|(at, _)| at + 1)
        .rev()
        .chain([0]);
    starts.map(move |start| &file[start..])
}

/// One line: the kind, the [selector](Tracepoint::selector) (the text that a filter such as
/// `MODEL_TRACE` takes to select this tracepoint alone; its name when that is unique), then
/// the function and where it is:
///
/// ```text
/// model      model:forward  (tiny::model::forward at src/model.rs:40)
/// layer      layer:forward  (tiny::model::forward at src/model.rs:12)
/// tensor     attn_in  (tiny::model::forward at src/model.rs:15)
/// ```
///
/// An inline macro outside an annotated function shows its module alone.
impl fmt::Display for Tracepoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<9}  {}  ({}", self.kind, self.selector(), self.path())?;
        write!(f, " at {}:{})", self.file, self.line)
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
    fn display_is_one_line_with_kind_name_path_and_location() {
        let mut tracepoint = Tracepoint {
            kind: TracepointKind::KvCache,
            name: "append",
            function: "forward",
            module_path: "smollm::cache",
            file: "src/cache.rs",
            line: 42,
        };
        assert_eq!(
            tracepoint.to_string(),
            "kv_cache   append  (smollm::cache::forward at src/cache.rs:42)"
        );
        tracepoint.function = "";
        assert_eq!(
            tracepoint.to_string(),
            "kv_cache   append  (smollm::cache at src/cache.rs:42)"
        );
    }

    #[test]
    fn selectors_are_the_shortest_pattern_that_selects_one_tracepoint() {
        let at = |kind, name, file, line| Tracepoint {
            kind,
            name,
            function: "forward",
            module_path: "tiny::model",
            file,
            line,
        };
        let model = at(TracepointKind::Model, "forward", "src/model.rs", 40);
        let layer = at(TracepointKind::Layer, "forward", "src/model.rs", 12);
        let other_layer = at(TracepointKind::Layer, "forward", "src/block/model.rs", 12);
        let stage = at(TracepointKind::Tensor, "attn_in", "src/model.rs", 15);
        let spaced = at(TracepointKind::Tensor, "attn in", "src/model.rs", 16);
        let all = [&model, &layer, &other_layer, &stage, &spaced];
        assert_eq!(stage.selector_among(&all), "attn_in");
        assert_eq!(model.selector_among(&all), "model:forward");
        assert_eq!(layer.selector_among(&all), "layer:forward@src/model.rs:12");
        assert_eq!(
            other_layer.selector_among(&all),
            "layer:forward@block/model.rs:12"
        );
        assert_eq!(spaced.selector_among(&all), "tensor:*@model.rs:16");
        for tp in all {
            let filter = TraceFilter::parse(&tp.selector_among(&all)).unwrap();
            let selected: Vec<_> = all.iter().filter(|other| filter.admits(other)).collect();
            assert_eq!(selected, [&tp]);
        }
        // Twins that no pattern tells apart (one file and line, another module): the most
        // precise pattern, which selects both.
        let twin = Tracepoint {
            module_path: "tiny::other",
            ..layer.clone()
        };
        assert_eq!(
            layer.selector_among(&[&layer, &twin]),
            "layer:forward@src/model.rs:12"
        );
    }

    #[test]
    fn kinds_round_trip_through_their_names() {
        for kind in TracepointKind::ALL {
            assert_eq!(TracepointKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(TracepointKind::from_name("kv-cache"), None);
    }
}
