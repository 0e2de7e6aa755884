//! Which tensors an intervention changes: [`InterventionSelector`], from a text such as
//! `stage=attn_out,layer=3,position=4..6`.

use std::fmt;

use crate::select::{glob_match, FilterError, IndexRange, TraceFilter};
use crate::tracepoint::Tracepoint;

/// Selects the tensors an intervention changes, by where they are seen: the tracepoint, the
/// pass, the layer, the stage (a layer's `input` or `output`, or a stage's name), and the
/// token positions (rows) within the tensor.
///
/// The syntax is the [`CaptureFilter`](crate::CaptureFilter)'s (comma-separated
/// [`TraceFilter`] patterns, `pass=RANGE`, `layer=RANGE`) plus two items:
/// * `stage=GLOB`: the stage's name. Default `output`: a selector without it changes what a
///   layer returns. `stage=input` changes what a layer receives; `stage=attn_out` the stage a
///   `trace_stage!("attn_out", ..)` returns.
/// * `position=RANGE`: the token positions changed, counted from the pass's position (the
///   `position` of `#[trace_model]`; 0 in a prefill), on the tensor's second-to-last dimension
///   (`[.., seq, hidden]`); the other rows keep their values. Default: every row.
///
/// `RANGE` is `N`, `A..B` (B excluded), `A..=B`, `A..` or `..B`. Patterns are optional: without
/// them every tracepoint is eligible. As in the capture filter, a layer's `input` and `output`
/// belong to its `layer` tracepoint and a stage to its own `tensor` tracepoint (named like the
/// stage), so `layer:forward,stage=attn_out` selects nothing: write `stage=attn_out` or
/// `tensor:attn_out`. Examples: `layer=7` (layer 7's output),
/// `stage=input,layer=0..` (every layer's input), `stage=attn_out,layer=3,position=5`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterventionSelector {
    source: String,
    tracepoints: Option<TraceFilter>,
    stage: String,
    passes: Option<IndexRange>,
    layers: Option<IndexRange>,
    positions: Option<IndexRange>,
}

/// The stage a selector changes when it names none.
const DEFAULT_STAGE: &str = "output";

impl InterventionSelector {
    /// Parses the syntax above.
    pub fn parse(text: &str) -> Result<Self, FilterError> {
        let mut patterns = Vec::new();
        let mut stage = None;
        let (mut passes, mut layers, mut positions) = (None, None, None);
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let range = |slot: &mut Option<IndexRange>, name: &str, value: &str| {
                if slot.is_some() {
                    return Err(FilterError::new(item, &format!("`{name}=` is given twice")));
                }
                let range = IndexRange::parse(value).map_err(|why| FilterError::new(item, &why))?;
                *slot = Some(range);
                Ok(())
            };
            if let Some(value) = item.strip_prefix("pass=") {
                range(&mut passes, "pass", value)?;
            } else if let Some(value) = item.strip_prefix("layer=") {
                range(&mut layers, "layer", value)?;
            } else if let Some(value) = item.strip_prefix("position=") {
                range(&mut positions, "position", value)?;
            } else if let Some(value) = item.strip_prefix("stage=") {
                if stage.is_some() {
                    return Err(FilterError::new(item, "`stage=` is given twice"));
                }
                if value.trim().is_empty() {
                    return Err(FilterError::new(item, "the stage is empty"));
                }
                stage = Some(value.trim().to_owned());
            } else {
                patterns.push(item);
            }
        }
        let tracepoints = if patterns.is_empty() {
            None
        } else {
            Some(TraceFilter::parse(&patterns.join(","))?)
        };
        Ok(Self {
            source: text.trim().to_owned(),
            tracepoints,
            stage: stage.unwrap_or_else(|| DEFAULT_STAGE.to_owned()),
            passes,
            layers,
            positions,
        })
    }

    /// Whether the tensor `stage` of `tracepoint`, seen in `pass` and `layer`, is selected
    /// (its positions are [`positions`](Self::positions)).
    pub fn selects(
        &self,
        tracepoint: &Tracepoint,
        pass: Option<usize>,
        layer: Option<usize>,
        stage: &str,
    ) -> bool {
        let within = |range: Option<IndexRange>, index: Option<usize>| match (range, index) {
            (None, _) => true,
            (Some(range), Some(index)) => range.contains(index),
            (Some(_), None) => false,
        };
        glob_match(&self.stage, stage)
            && within(self.passes, pass)
            && within(self.layers, layer)
            && self
                .tracepoints
                .as_ref()
                .is_none_or(|filter| filter.admits(tracepoint))
    }

    /// The token positions changed, inclusive; `None`: every row.
    pub fn positions(&self) -> Option<(usize, usize)> {
        self.positions.map(|range| (range.start, range.end))
    }

    /// The patterns that match none of `tracepoints` (most likely typos).
    pub(crate) fn unmatched<'a>(&'a self, tracepoints: &[&Tracepoint]) -> Vec<&'a str> {
        self.tracepoints
            .as_ref()
            .map(|filter| filter.unmatched(tracepoints))
            .unwrap_or_default()
    }
}

impl fmt::Display for InterventionSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracepoint::TracepointKind;

    #[test]
    fn a_selector_without_a_stage_changes_a_layers_output() {
        let layer = Tracepoint::for_test(TracepointKind::Layer, "forward");
        let selector = InterventionSelector::parse("layer=7").unwrap();
        assert!(selector.selects(&layer, Some(0), Some(7), "output"));
        assert!(!selector.selects(&layer, Some(0), Some(7), "input"));
        assert!(!selector.selects(&layer, Some(0), Some(6), "output"));
        assert!(!selector.selects(&layer, Some(0), None, "output"));
        assert_eq!(selector.positions(), None);
    }

    #[test]
    fn stages_patterns_passes_and_positions() {
        let stage = Tracepoint::for_test(TracepointKind::Tensor, "attn_out");
        let layer = Tracepoint::for_test(TracepointKind::Layer, "forward");
        let selector =
            InterventionSelector::parse("tensor:attn*, stage=attn_*, pass=1.., position=4..6")
                .unwrap();
        assert!(selector.selects(&stage, Some(1), Some(3), "attn_out"));
        assert!(!selector.selects(&stage, Some(0), Some(3), "attn_out"));
        assert!(!selector.selects(&layer, Some(1), Some(3), "attn_out"));
        assert_eq!(selector.positions(), Some((4, 5)));
        assert_eq!(
            selector.to_string(),
            "tensor:attn*, stage=attn_*, pass=1.., position=4..6"
        );
    }

    #[test]
    fn bad_selectors_are_errors_naming_the_item() {
        for bad in [
            "layer=x",
            "position=3..1",
            "stage=",
            "stage=a,stage=b",
            "layers:*",
        ] {
            assert!(InterventionSelector::parse(bad).is_err(), "{bad}");
        }
        let error = InterventionSelector::parse("layer=2,position=9..2").unwrap_err();
        assert!(error.to_string().contains("position=9..2"), "{error}");
    }
}
