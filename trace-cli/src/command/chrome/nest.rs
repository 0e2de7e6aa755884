//! Spans of one thread made to nest, as the trace event format requires of complete events on a
//! thread, in every way a viewer reads the times back.
//!
//! The recorded times nest already (a layer ends before its pass does, on one clock), but only
//! in whole nanoseconds. The file carries microseconds with three decimals, and viewers read
//! them back in two ways:
//!
//! * as doubles, with the end at `ts + dur` (chrome://tracing, Python, JavaScript): the sum can
//!   round one ulp past the parent's end when both end on the same nanosecond;
//! * Perfetto takes `ts` exactly from the text but `dur` as `(int64)(double * 1000)`, which
//!   truncates `1.001` to 1000 ns: a parent can lose the nanosecond its child keeps.
//!
//! [`nest`] clamps each span into its parent and then takes single nanoseconds off the child's
//! end until both readings agree that it nests; a span that starts on the nanosecond its
//! predecessor ends starts one later. No span moves by more than a couple of nanoseconds.

use std::cmp::Reverse;

/// A span of one thread, in nanoseconds from the timeline's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Ranks spans that start and end together: the lower one is the parent (a pass before
    /// its layer, a layer before an instant at its end).
    pub(super) rank: u8,
}

impl Span {
    fn len(&self) -> u64 {
        self.end - self.start
    }
}

/// Microseconds as a double, as a reader parses the three-decimal text.
#[allow(clippy::cast_precision_loss)]
pub(super) fn micros(ns: u64) -> f64 {
    // Exact below 2^53 ns (104 days); the division then rounds once, like parsing the text.
    ns as f64 / 1000.0
}

/// The end as a reader working in doubles computes it: `ts + dur`.
fn double_end(span: &Span) -> f64 {
    micros(span.start) + micros(span.len())
}

/// The end as Perfetto computes it: `ts` exact, `dur` truncated from a double.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn perfetto_end(span: &Span) -> u64 {
    span.start + (micros(span.len()) * 1000.0) as u64
}

/// `child` lies within `parent` in nanoseconds and in both readings.
fn inside(child: &Span, parent: &Span) -> bool {
    child.start >= parent.start
        && child.end <= parent.end
        && double_end(child) <= double_end(parent)
        && micros(child.start) <= double_end(parent)
        && perfetto_end(child) <= perfetto_end(parent)
        && child.start <= perfetto_end(parent)
}

/// `earlier` ends at or before `later` starts, in nanoseconds and in both readings.
fn before(earlier: &Span, later: &Span) -> bool {
    earlier.end <= later.start && double_end(earlier) <= micros(later.start)
}

/// Makes the spans of one thread nest properly: each span lies within the innermost span that
/// is open when it starts, and ends at or before the next span at its level starts. A span that
/// pokes out of its parent is cut at the parent's end. The slice keeps its order; the spans'
/// times change.
pub(super) fn nest(spans: &mut [Span]) {
    let mut order: Vec<usize> = (0..spans.len()).collect();
    order.sort_by_key(|&i| (spans[i].start, Reverse(spans[i].end), spans[i].rank));
    let mut open: Vec<Span> = Vec::new();
    for i in order {
        let mut span = spans[i];
        while let Some(top) = open.last() {
            if top.end > span.start {
                break;
            }
            if !before(top, &span) {
                // Back to back on one nanosecond: the double sum of the earlier one rounds past
                // this start. One nanosecond later is past it.
                span.start += 1;
                span.end = span.end.max(span.start);
            }
            open.pop();
        }
        if let Some(parent) = open.last() {
            fit(&mut span, parent);
        }
        spans[i] = span;
        open.push(span);
    }
}

/// Moves `span` into `parent`, which is open at its start (`parent.end > span.start`).
fn fit(span: &mut Span, parent: &Span) {
    span.start = span.start.clamp(parent.start, parent.end);
    span.end = span.end.clamp(span.start, parent.end);
    // Ends at last at its start, which lies inside: a reading loses less than the nanosecond
    // between it and the parent's end.
    while span.end > span.start && !inside(span, parent) {
        span.end -= 1;
    }
    debug_assert!(inside(span, parent), "{span:?} in {parent:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start: u64, end: u64, rank: u8) -> Span {
        Span { start, end, rank }
    }

    /// Checks nesting as a reader would: sorted by start (longer first), with a stack, in
    /// nanoseconds, in doubles and in Perfetto's reading.
    fn assert_nested(spans: &[Span]) {
        let mut sorted = spans.to_vec();
        sorted.sort_by_key(|s| (s.start, Reverse(s.end), s.rank));
        let mut open: Vec<Span> = Vec::new();
        for span in sorted {
            while open.last().is_some_and(|top| before(top, &span)) {
                open.pop();
            }
            if let Some(parent) = open.last() {
                assert!(inside(&span, parent), "{span:?} pokes out of {parent:?}");
            }
            open.push(span);
        }
    }

    #[test]
    fn a_double_sum_that_rounds_past_the_parent_is_pulled_back() {
        // Both end at 26_563_121_371 ns, but in doubles the child's ts + dur is one ulp larger.
        let (parent, child) = (
            span(25_865_676_515, 26_563_121_371, 0),
            span(26_447_013_738, 26_563_121_371, 1),
        );
        assert!(double_end(&child) > double_end(&parent), "the case is real");
        let mut spans = [parent, child];
        nest(&mut spans);
        assert_nested(&spans);
        assert_eq!(spans[0], parent, "the parent does not move");
        assert_eq!(spans[1].end, child.end - 1);
    }

    #[test]
    fn a_parent_whose_duration_perfetto_truncates_keeps_its_child() {
        // dur 1.001 µs reads back as 1000 ns in Perfetto; the child's 0.5 µs stays 500 ns.
        let (parent, child) = (span(0, 1001, 0), span(501, 1001, 1));
        assert_eq!(perfetto_end(&parent), 1000, "the case is real");
        let mut spans = [parent, child];
        nest(&mut spans);
        assert_nested(&spans);
        assert_eq!(spans[1], span(501, 1000, 1));
    }

    #[test]
    fn a_child_that_pokes_out_is_cut_at_its_parents_end() {
        let mut spans = [span(100, 200, 0), span(150, 260, 1), span(210, 300, 0)];
        nest(&mut spans);
        assert_nested(&spans);
        assert_eq!(spans[1], span(150, 200, 1));
        assert_eq!(spans[2], span(210, 300, 0), "the next span is untouched");
    }

    #[test]
    fn an_instant_at_a_layers_end_follows_it() {
        let mut spans = [span(0, 2002, 0), span(0, 1001, 1), span(1001, 1001, 2)];
        nest(&mut spans);
        assert_nested(&spans);
        assert_eq!(spans[1], span(0, 1001, 1), "nothing to change");
        assert_eq!(
            spans[2],
            span(1001, 1001, 2),
            "after the layer, inside the pass"
        );
    }

    #[test]
    fn random_trees_with_shared_boundaries_nest_in_every_reading() {
        // A deterministic generator: passes back to back, layers back to back inside them,
        // boundaries often shared, lengths that Perfetto's reading truncates.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        for _ in 0..200 {
            let mut spans = Vec::new();
            let mut t = next(1 << 40);
            for _ in 0..8 {
                let pass_start = t;
                let mut inner = pass_start + next(3);
                for _ in 0..6 {
                    let end = inner + next(5000);
                    spans.push(span(inner, end, 1));
                    if next(3) == 0 {
                        spans.push(span(end, end, 2));
                    }
                    inner = end + next(2);
                }
                // The pass ends with its last layer, or a little after (or a little before:
                // the layer is cut).
                let pass_end = (inner + next(3)).saturating_sub(next(3)).max(pass_start);
                spans.push(span(pass_start, pass_end, 0));
                t = pass_end + next(2);
            }
            let before_nesting = spans.clone();
            nest(&mut spans);
            assert_nested(&spans);
            for (old, new) in before_nesting.iter().zip(&spans) {
                assert!(
                    new.start + 1 >= old.start && new.start <= old.start + 2,
                    "{old:?} -> {new:?}"
                );
                assert!(new.end <= old.end.max(new.start), "{old:?} -> {new:?}");
            }
        }
    }
}
