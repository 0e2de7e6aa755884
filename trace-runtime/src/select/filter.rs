//! Which tracepoints a session records, from a pattern list such as `layer:*,attention:*`.

use std::fmt;
use std::str::FromStr;

use super::glob::glob_match;
use crate::tracepoint::{Tracepoint, TracepointKind};

/// A list of patterns that selects tracepoints.
///
/// Syntax: patterns separated by commas, surrounding whitespace ignored, empty entries skipped.
/// Each pattern is `[-][kind:]glob[@file[:line]]`:
/// * `kind` is one of `model`, `layer`, `attention`, `logits`, `kv_cache`, `quant`, `tensor`,
///   `router` (the [`TracepointKind`] names); without it any kind matches.
/// * `glob` matches the tracepoint's name, or, when it contains `::`, the path
///   `module_path::function`. `*` matches any run of characters, `?` one character.
/// * `@file` keeps the tracepoints of one source file: `file` is compared with the end of the
///   tracepoint's path, whole components only (`model.rs` and `src/model.rs` match
///   `src/model.rs`, `del.rs` does not); `@file:line` keeps the tracepoint at that line, the
///   line [`Tracepoint`]'s listing shows.
/// * A leading `-` excludes what the pattern matches.
///
/// A tracepoint is admitted when it matches no exclusion and, if there is any inclusion, at
/// least one inclusion. The empty filter admits everything. Examples: `layer:*`, `forward`,
/// `*attn*`, `smollm::model::*`, `*,-tensor:*`, `layer:forward@model.rs:210`.
///
/// Two kinds follow the structure of the model rather than that rule alone:
/// * **Stages** (`tensor` tracepoints, `trace_tensor!`) belong to the layer they are recorded
///   in: a stage is recorded when the filter admits it, and also when the layer it runs in is
///   admitted and no exclusion matches the stage. So `layer:*` keeps the layers' stages,
///   `layer:*,-tensor:*` drops them all and `layer:*,-q_proj` drops one.
/// * **Forward passes** (`model` tracepoints, `#[trace_model]`) are selected by patterns of
///   kind `model` and by exclusions only: a pass is traced unless an exclusion matches its
///   tracepoint (`-model:draft`, `-model:*`) or inclusions of kind `model` exist and none
///   matches it (`model:decoder,*` traces the `decoder` passes only). While a pass that is not
///   traced runs, the session is suspended: nothing reached inside it is recorded, and it is
///   not counted as a pass. Inclusions of other kinds never suspend a pass, so `layer:*`
///   still numbers layers per forward pass; as any inclusion, `model:decoder` alone admits
///   nothing else, so it records the passes and nothing in them.
///
/// A pattern that matches none of the program's [`tracepoints()`](crate::tracepoints) is most
/// likely a typo: a session reports it when it starts (a warning on stderr, and in
/// [`Session::warnings`](crate::Session::warnings)); [`unmatched`](Self::unmatched) finds
/// them.
///
/// Two tracepoints can share a kind and a name (two `forward` methods of one module annotated
/// with `#[trace_layer]`, say): `@file:line` tells them apart, and
/// [`Tracepoint::selector`] gives the shortest pattern that selects exactly one tracepoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceFilter {
    source: String,
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Pattern {
    /// As written, for reports.
    text: String,
    exclude: bool,
    kind: Option<TracepointKind>,
    glob: String,
    location: Option<Location>,
}

/// `@file[:line]` of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Location {
    /// With `/` as the separator, as the tracepoint's file is compared.
    file: String,
    line: Option<u32>,
}

/// A filter string that does not parse; says which pattern and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pattern: String,
    reason: String,
}

impl fmt::Display for FilterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid trace filter pattern `{}`: {}",
            self.pattern, self.reason
        )
    }
}

impl std::error::Error for FilterError {}

impl FilterError {
    pub(crate) fn new(pattern: &str, reason: &str) -> Self {
        Self {
            pattern: pattern.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

impl TraceFilter {
    /// The filter that admits every tracepoint.
    pub fn all() -> Self {
        Self::default()
    }

    /// Parses a comma-separated pattern list (syntax on [`TraceFilter`]).
    pub fn parse(filter: &str) -> Result<Self, FilterError> {
        let patterns = filter
            .split(',')
            .map(str::trim)
            .filter(|pattern| !pattern.is_empty())
            .map(Pattern::parse)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            source: filter.trim().to_owned(),
            patterns,
        })
    }

    /// Whether the session records `tracepoint`.
    pub fn admits(&self, tracepoint: &Tracepoint) -> bool {
        let mut any_include = false;
        let mut included = false;
        for pattern in &self.patterns {
            if pattern.exclude {
                if pattern.matches(tracepoint) {
                    return false;
                }
            } else {
                any_include = true;
                included = included || pattern.matches(tracepoint);
            }
        }
        included || !any_include
    }

    /// Whether an exclusion matches `tracepoint`: it is not recorded, even as a stage of an
    /// admitted layer or as a forward pass.
    pub fn excludes(&self, tracepoint: &Tracepoint) -> bool {
        self.patterns
            .iter()
            .any(|pattern| pattern.exclude && pattern.matches(tracepoint))
    }

    /// Whether the forward passes of the `model` tracepoint `tracepoint` are traced (see the
    /// type's docs: only exclusions and inclusions of kind `model` decide).
    pub fn traces_pass(&self, tracepoint: &Tracepoint) -> bool {
        if self.excludes(tracepoint) {
            return false;
        }
        let mut model_inclusions = self
            .patterns
            .iter()
            .filter(|pattern| !pattern.exclude && pattern.kind == Some(TracepointKind::Model))
            .peekable();
        model_inclusions.peek().is_none() || model_inclusions.any(|p| p.matches(tracepoint))
    }

    /// The patterns, as written, that match none of `tracepoints` (usually
    /// [`tracepoints()`](crate::tracepoints)): typos, or tracepoints this build does not have.
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::{TraceFilter, Tracepoint, TracepointKind};
    ///
    /// let block = Tracepoint {
    ///     kind: TracepointKind::Layer,
    ///     name: "block",
    ///     function: "block",
    ///     module_path: "tiny",
    ///     file: "src/lib.rs",
    ///     line: 3,
    /// };
    /// let filter = TraceFilter::parse("layer:*, *attn*, -blok").unwrap();
    /// assert_eq!(filter.unmatched(&[&block]), ["*attn*", "-blok"]);
    /// ```
    pub fn unmatched(&self, tracepoints: &[&Tracepoint]) -> Vec<&str> {
        self.patterns
            .iter()
            .filter(|pattern| !tracepoints.iter().any(|tp| pattern.matches(tp)))
            .map(|pattern| pattern.text.as_str())
            .collect()
    }

    /// Whether some tracepoint of `kind` could be admitted. Conservative: `false` only when
    /// every include pattern names another kind, or an exclusion drops the whole kind.
    pub fn may_admit_kind(&self, kind: TracepointKind) -> bool {
        let mut any_include = false;
        let mut kind_included = false;
        for pattern in &self.patterns {
            let same_kind = pattern.kind.is_none_or(|k| k == kind);
            if pattern.exclude {
                if pattern.kind == Some(kind) && pattern.glob == "*" && pattern.location.is_none() {
                    return false;
                }
            } else {
                any_include = true;
                kind_included = kind_included || same_kind;
            }
        }
        kind_included || !any_include
    }
}

impl fmt::Display for TraceFilter {
    /// The text it was parsed from (empty for [`TraceFilter::all`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl FromStr for TraceFilter {
    type Err = FilterError;

    fn from_str(filter: &str) -> Result<Self, Self::Err> {
        Self::parse(filter)
    }
}

impl Pattern {
    fn parse(text: &str) -> Result<Self, FilterError> {
        let error = |reason: &str| FilterError::new(text, reason);
        let (exclude, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, text),
        };
        let (rest, location) = match rest.split_once('@') {
            Some((rest, location)) => (rest.trim_end(), Some(Location::parse(location.trim()))),
            None => (rest, None),
        };
        let location = location.transpose().map_err(|reason| error(&reason))?;
        let (kind, glob) = split_kind(rest).map_err(|reason| error(&reason))?;
        if glob.is_empty() {
            return Err(error("the glob after the kind is empty (use `*` for all)"));
        }
        if let Some(bad) = glob
            .chars()
            .find(|c| c.is_whitespace() || matches!(c, '[' | ']' | '{' | '}' | '!'))
        {
            return Err(error(&format!(
                "`{bad}` is not allowed in a glob (only `*` and `?` are special)"
            )));
        }
        Ok(Self {
            text: text.to_owned(),
            exclude,
            kind,
            glob: glob.to_owned(),
            location,
        })
    }

    fn matches(&self, tracepoint: &Tracepoint) -> bool {
        if self.kind.is_some_and(|kind| kind != tracepoint.kind) {
            return false;
        }
        if let Some(location) = &self.location {
            if !location.matches(tracepoint) {
                return false;
            }
        }
        if self.glob.contains("::") {
            if tracepoint.function.is_empty() {
                return glob_match(&self.glob, tracepoint.module_path);
            }
            let path = format!("{}::{}", tracepoint.module_path, tracepoint.function);
            glob_match(&self.glob, &path)
        } else {
            glob_match(&self.glob, tracepoint.name)
        }
    }
}

impl Location {
    /// `file` or `file:line`.
    fn parse(text: &str) -> Result<Self, String> {
        let (file, line) = match text.rsplit_once(':') {
            Some((file, line)) => {
                let line = line
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{line}` after `{file}:` is not a line number"))?;
                (file.trim(), Some(line))
            }
            None => (text, None),
        };
        if file.is_empty() {
            return Err("the file after `@` is empty".to_owned());
        }
        Ok(Self {
            file: file.replace('\\', "/"),
            line,
        })
    }

    fn matches(&self, tracepoint: &Tracepoint) -> bool {
        if self.line.is_some_and(|line| line != tracepoint.line) {
            return false;
        }
        let path = tracepoint.file.replace('\\', "/");
        path.strip_suffix(self.file.as_str())
            .is_some_and(|before| before.is_empty() || before.ends_with('/'))
    }
}

/// Splits `kind:glob`; a single `:` can only introduce a kind, since names never hold one and
/// paths use `::`.
fn split_kind(text: &str) -> Result<(Option<TracepointKind>, &str), String> {
    match text.find(':') {
        Some(at) if !text[at..].starts_with("::") => {
            let kind_name = text[..at].trim();
            let kind = TracepointKind::from_name(kind_name).ok_or_else(|| {
                let names: Vec<&str> = TracepointKind::ALL.iter().map(|k| k.as_str()).collect();
                format!(
                    "unknown kind `{kind_name}` (expected one of {})",
                    names.join(", ")
                )
            })?;
            Ok((Some(kind), text[at + 1..].trim()))
        }
        _ => Ok((None, text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn may_admit_kind_is_false_only_when_no_pattern_can_admit_the_kind() {
        let kv_only = TraceFilter::parse("kv_cache:*").unwrap();
        assert!(kv_only.may_admit_kind(TracepointKind::KvCache));
        assert!(!kv_only.may_admit_kind(TracepointKind::Attention));
        assert!(!kv_only.may_admit_kind(TracepointKind::Tensor));
        let by_name = TraceFilter::parse("*attn*").unwrap();
        assert!(by_name.may_admit_kind(TracepointKind::Tensor));
        let no_stages = TraceFilter::parse("-tensor:*").unwrap();
        assert!(!no_stages.may_admit_kind(TracepointKind::Tensor));
        assert!(no_stages.may_admit_kind(TracepointKind::Layer));
        assert!(TraceFilter::all().may_admit_kind(TracepointKind::Quant));
    }

    #[test]
    fn kinds_names_paths_and_exclusions() {
        let filter = TraceFilter::parse("layer:*, *attn*").unwrap();
        assert!(filter.admits(&Tracepoint::for_test(TracepointKind::Layer, "block")));
        assert!(filter.admits(&Tracepoint::for_test(
            TracepointKind::Attention,
            "self_attn"
        )));
        assert!(!filter.admits(&Tracepoint::for_test(TracepointKind::Logits, "head")));

        let filter = TraceFilter::parse("smollm::model::*,-tensor:*").unwrap();
        assert!(filter.admits(&Tracepoint::for_test(TracepointKind::Layer, "x")));
        assert!(!filter.admits(&Tracepoint::for_test(TracepointKind::Tensor, "x")));

        let filter = TraceFilter::parse("-logits:*").unwrap();
        assert!(filter.admits(&Tracepoint::for_test(TracepointKind::Layer, "x")));
        assert!(!filter.admits(&Tracepoint::for_test(TracepointKind::Logits, "x")));

        assert!(TraceFilter::parse(" , ")
            .unwrap()
            .admits(&Tracepoint::for_test(TracepointKind::Quant, "q")));
    }

    #[test]
    fn locations_select_by_file_suffix_and_line() {
        let at = |file: &'static str, line: u32| Tracepoint {
            file,
            line,
            ..Tracepoint::for_test(TracepointKind::Layer, "forward")
        };
        let filter = TraceFilter::parse("forward@model.rs:440").unwrap();
        assert!(filter.admits(&at("src/model.rs", 440)));
        assert!(filter.admits(&at("model.rs", 440)));
        assert!(!filter.admits(&at("src/model.rs", 441)));
        assert!(!filter.admits(&at("src/bigmodel.rs", 440)));

        let filter = TraceFilter::parse("layer:*@src/model.rs").unwrap();
        assert!(filter.admits(&at("examples/smollm/src/model.rs", 3)));
        assert!(!filter.admits(&at("examples/smollm/src/block.rs", 3)));
        assert!(TraceFilter::parse(r"*@src\model.rs")
            .unwrap()
            .admits(&at(r"examples\smollm\src\model.rs", 3)));

        let filter = TraceFilter::parse("*,-layer:*@model.rs:440").unwrap();
        assert!(!filter.admits(&at("src/model.rs", 440)));
        assert!(filter.admits(&at("src/model.rs", 12)));
        assert!(filter.may_admit_kind(TracepointKind::Layer));
    }

    #[test]
    fn invalid_patterns_are_errors() {
        for bad in [
            "layers:*",
            "layer:",
            "[ab]",
            "a b",
            "kv-cache:x",
            "forward@",
            "forward@model.rs:x",
            "forward@:12",
        ] {
            let error = TraceFilter::parse(bad).unwrap_err();
            assert!(
                error.to_string().contains("invalid trace filter"),
                "{bad}: {error}"
            );
        }
    }
}
