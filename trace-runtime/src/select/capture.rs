//! Which tensors are saved in full: [`CaptureFilter`], from a pattern list such as
//! `layer:*,pass=0,layer=3..6`.

use std::fmt;

use super::filter::{FilterError, TraceFilter};
use super::range::IndexRange as Span;
use crate::tracepoint::Tracepoint;

/// Selects the tensors a session saves in full, beside its trace file.
///
/// The syntax is [`TraceFilter`]'s (comma-separated `[-][kind:]glob` patterns), plus two kinds
/// of range items: `pass=RANGE` and `layer=RANGE`, where `RANGE` is `N`, `A..B` (B excluded),
/// `A..=B`, `A..` or `..B`. A tensor is captured when its tracepoint matches the patterns (a
/// layer's input and output belong to its `layer` tracepoint, a stage to its `tensor`
/// tracepoint) and its pass and layer fall in the ranges. Examples: `layer:*` (every layer's
/// input and output), `*,pass=0` (everything of the first pass), `tensor:attn_out,layer=0..4`.
///
/// An empty filter captures nothing (unlike an empty [`TraceFilter`], which admits all): a
/// capture is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureFilter {
    source: String,
    /// No pattern and no range (an empty text, or only separators): nothing is captured.
    empty: bool,
    tracepoints: TraceFilter,
    passes: Option<Span>,
    layers: Option<Span>,
}

impl CaptureFilter {
    /// Parses the syntax above.
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        let mut patterns = Vec::new();
        let (mut passes, mut layers) = (None, None);
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let range = |slot: &mut Option<Span>, name: &str, value: &str| {
                if slot.is_some() {
                    return Err(FilterError::new(item, &format!("`{name}=` is given twice")));
                }
                *slot = Some(Span::parse(value).map_err(|reason| FilterError::new(item, &reason))?);
                Ok(())
            };
            if let Some(value) = item.strip_prefix("pass=") {
                range(&mut passes, "pass", value)?;
            } else if let Some(value) = item.strip_prefix("layer=") {
                range(&mut layers, "layer", value)?;
            } else {
                patterns.push(item);
            }
        }
        if patterns.is_empty() && (passes.is_some() || layers.is_some()) {
            // Ranges alone: every tracepoint within them.
            patterns.push("*");
        }
        Ok(Self {
            source: text.trim().to_owned(),
            empty: patterns.is_empty(),
            tracepoints: TraceFilter::parse(&patterns.join(","))?,
            passes,
            layers,
        })
    }

    /// Whether nothing can be captured.
    pub fn is_empty(&self) -> bool {
        self.empty
    }

    /// Whether a tensor of `tracepoint`, recorded in `pass` and `layer`, is captured.
    pub fn captures(
        &self,
        tracepoint: &Tracepoint,
        pass: Option<usize>,
        layer: Option<usize>,
    ) -> bool {
        let within = |span: Option<Span>, index: Option<usize>| match (span, index) {
            (None, _) => true,
            (Some(span), Some(index)) => span.contains(index),
            (Some(_), None) => false,
        };
        !self.is_empty()
            && within(self.passes, pass)
            && within(self.layers, layer)
            && self.tracepoints.admits(tracepoint)
    }
}

impl fmt::Display for CaptureFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracepoint::TracepointKind;

    #[test]
    fn patterns_and_ranges() {
        let filter =
            CaptureFilter::parse("layer:*, tensor:attn_out, pass=1..3, layer=..=4").unwrap();
        let layer = Tracepoint::for_test(TracepointKind::Layer, "forward");
        let stage = Tracepoint::for_test(TracepointKind::Tensor, "attn_out");
        assert!(filter.captures(&layer, Some(1), Some(4)));
        assert!(filter.captures(&stage, Some(2), Some(0)));
        assert!(!filter.captures(&layer, Some(3), Some(0)), "3 is excluded");
        assert!(!filter.captures(&layer, Some(1), Some(5)));
        assert!(
            !filter.captures(&layer, None, Some(0)),
            "a pass range needs a pass"
        );
        assert!(!filter.captures(
            &Tracepoint::for_test(TracepointKind::Tensor, "mlp_out"),
            Some(1),
            Some(0)
        ));
        assert_eq!(
            filter.to_string(),
            "layer:*, tensor:attn_out, pass=1..3, layer=..=4"
        );

        let ranges_only = CaptureFilter::parse("pass=0").unwrap();
        assert!(ranges_only.captures(&stage, Some(0), None));
        assert!(!ranges_only.captures(&stage, Some(1), None));
        let open = CaptureFilter::parse("*,layer=28..").unwrap();
        assert!(open.captures(&layer, None, Some(29)) && !open.captures(&layer, None, Some(27)));
    }

    #[test]
    fn empty_captures_nothing_and_bad_ranges_are_errors() {
        let empty = CaptureFilter::parse(" ").unwrap();
        assert!(empty.is_empty());
        assert!(!empty.captures(
            &Tracepoint::for_test(TracepointKind::Layer, "x"),
            Some(0),
            Some(0)
        ));
        for bad in [
            "pass=x",
            "layer=3..1",
            "layer=..0",
            "pass=0,pass=1",
            "layers:*",
        ] {
            assert!(CaptureFilter::parse(bad).is_err(), "{bad}");
        }
    }
}
