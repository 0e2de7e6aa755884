//! `N`, `A..B`, `A..=B`, `A..`, `..B`: the index ranges of the selectors (`pass=`, `layer=`,
//! `position=`).

use std::ops::Bound;

/// An inclusive range of indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexRange {
    pub(crate) start: usize,
    pub(crate) end: usize,
}

impl IndexRange {
    /// `N`, `A..B` (B excluded), `A..=B`, `A..` or `..B`; the reason when it is none of
    /// these or empty.
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let number = |s: &str| {
            s.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}` is not an index (expected N, A..B, A..=B, A.. or ..B)"))
        };
        let (start, end) = match text.split_once("..") {
            None => {
                let n = number(text)?;
                (Bound::Included(n), Bound::Included(n))
            }
            Some((a, b)) => {
                let start = if a.trim().is_empty() {
                    Bound::Unbounded
                } else {
                    Bound::Included(number(a)?)
                };
                let end = match b.strip_prefix('=') {
                    Some(b) => Bound::Included(number(b)?),
                    None if b.trim().is_empty() => Bound::Unbounded,
                    None => Bound::Excluded(number(b)?),
                };
                (start, end)
            }
        };
        let start = match start {
            Bound::Included(n) => n,
            _ => 0,
        };
        let end = match end {
            Bound::Included(n) => n,
            Bound::Excluded(0) => return Err(format!("`{text}` is empty")),
            Bound::Excluded(n) => n - 1,
            Bound::Unbounded => usize::MAX,
        };
        if start > end {
            return Err(format!("`{text}` is empty"));
        }
        Ok(Self { start, end })
    }

    pub(crate) fn contains(self, index: usize) -> bool {
        self.start <= index && index <= self.end
    }
}
