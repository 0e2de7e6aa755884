//! The shortest pattern that selects one tracepoint: [`Tracepoint::selector`].

use std::fmt;

use crate::tracepoint::{tracepoints, Tracepoint};

use super::TraceFilter;

// Selectors are a fact about patterns, so they live with the filter; `Tracepoint` (below the
// filter) is extended here rather than importing the filter upward.
impl Tracepoint {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracepoint::TracepointKind;

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
}
