//! The static that each annotation generates: its [`Tracepoint`], and what the session that
//! last asked wants of it ([`Interest`]), cached so that asking again is one atomic load.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use super::{Tracepoint, TracepointKind};

/// What a session wants of one tracepoint, decided once per session and tracepoint (from its
/// configuration and filter) and cached in the tracepoint's [`Callsite`].
///
/// A hook asks first whether it [runs](Self::runs) at all (the only question on the fast path),
/// then what it does. New ways for a hook to behave are new variants: every `match` on this
/// type names each one, so none is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interest {
    /// The hook does nothing: no session, or the session wants nothing of this tracepoint.
    Never,
    /// The hook keeps the pass's structure (a layer is numbered and is the enclosing layer of
    /// what runs inside it) and records nothing itself.
    Structure,
    /// The hook runs and records.
    Record,
    /// A stage that the filter does not admit itself: it records when the innermost open
    /// layer records (see [`TraceFilter`](crate::TraceFilter)'s rule for stages).
    InRecordedLayer,
    /// A `model` tracepoint whose passes the filter leaves out: the session is suspended while
    /// the pass runs.
    Suspend,
}

impl Interest {
    /// Every interest, in the order of [`code`](Self::code).
    const ALL: [Interest; 5] = [
        Self::Never,
        Self::Structure,
        Self::Record,
        Self::InRecordedLayer,
        Self::Suspend,
    ];

    /// Whether the hook runs at all.
    #[inline]
    pub(crate) fn runs(self) -> bool {
        self != Self::Never
    }

    /// Whether the hook records its own values.
    #[inline]
    pub(crate) fn records(self) -> bool {
        self == Self::Record
    }

    /// The value cached in a callsite's atomic: the index in [`ALL`](Self::ALL).
    const fn code(self) -> u8 {
        self as u8
    }

    fn from_code(code: u8) -> Self {
        Self::ALL
            .get(usize::from(code))
            .copied()
            .unwrap_or(Self::Never)
    }
}

/// One per tracepoint, generated as a `static`.
pub struct Callsite {
    tracepoint: Tracepoint,
    /// An inline macro's tracepoint with its function filled in from the [`FunctionSpan`]s,
    /// on first use (an inline macro cannot see the function it is in).
    resolved: OnceLock<Tracepoint>,
    /// `generation << 32 | interest code` of the last session that asked; generation 0 never
    /// belongs to a session, so the zero initial value is "unknown".
    interest: AtomicU64,
}

impl Callsite {
    /// `function` is empty for an inline macro: [`Callsite::tracepoint`] finds it.
    pub const fn new(
        kind: TracepointKind,
        name: &'static str,
        function: &'static str,
        module_path: &'static str,
        file: &'static str,
        line: u32,
    ) -> Self {
        Self {
            tracepoint: Tracepoint {
                kind,
                name,
                function,
                module_path,
                file,
                line,
            },
            resolved: OnceLock::new(),
            interest: AtomicU64::new(0),
        }
    }

    /// The tracepoint this callsite stands for. An inline macro's function is the innermost
    /// annotated function around its line, looked up once; deciding the interest never needs
    /// it.
    pub fn tracepoint(&'static self) -> &'static Tracepoint {
        if !self.tracepoint.function.is_empty() {
            return &self.tracepoint;
        }
        self.resolved.get_or_init(|| Tracepoint {
            function: FunctionSpan::enclosing(&self.tracepoint).map_or("", |span| span.name),
            ..self.tracepoint.clone()
        })
    }

    /// The interest cached for the session with `generation`, if that session decided it.
    #[inline]
    pub(crate) fn cached_interest(&self, generation: u32) -> Option<Interest> {
        let cached = self.interest.load(Ordering::Relaxed);
        #[allow(clippy::cast_possible_truncation)] // the low byte holds the code
        let code = cached as u8;
        ((cached >> 32) as u32 == generation).then(|| Interest::from_code(code))
    }

    /// Caches what the session with `generation` decided.
    pub(crate) fn cache_interest(&self, generation: u32, interest: Interest) {
        self.interest.store(
            u64::from(generation) << 32 | u64::from(interest.code()),
            Ordering::Relaxed,
        );
    }
}

/// What `inventory` collects: one per tracepoint.
pub struct Registered(pub &'static Callsite);

/// The lines of an annotated function, registered by its attribute so that the inline macros
/// inside it can name it.
pub struct FunctionSpan {
    name: &'static str,
    module_path: &'static str,
    file: &'static str,
    first_line: u32,
    last_line: u32,
}

impl FunctionSpan {
    /// From `fn` (`first_line`) to the last identifier of the body (`last_line`).
    pub const fn new(
        name: &'static str,
        module_path: &'static str,
        file: &'static str,
        first_line: u32,
        last_line: u32,
    ) -> Self {
        Self {
            name,
            module_path,
            file,
            first_line,
            last_line,
        }
    }

    /// The innermost registered function holding `tracepoint`'s line in its module and file.
    fn enclosing(tracepoint: &Tracepoint) -> Option<&'static FunctionSpan> {
        inventory::iter::<FunctionSpan>
            .into_iter()
            .filter(|span| {
                span.module_path == tracepoint.module_path
                    && span.file == tracepoint.file
                    && (span.first_line..=span.last_line).contains(&tracepoint.line)
            })
            .min_by_key(|span| {
                (
                    span.last_line - span.first_line,
                    std::cmp::Reverse(span.first_line),
                )
            })
    }
}

inventory::collect!(FunctionSpan);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interests_round_trip_through_their_codes() {
        for interest in Interest::ALL {
            assert_eq!(Interest::from_code(interest.code()), interest);
        }
        assert_eq!(Interest::from_code(200), Interest::Never);
    }

    #[test]
    fn a_cached_interest_belongs_to_its_generation() {
        static CALLSITE: Callsite = Callsite::new(TracepointKind::Layer, "l", "f", "m", "m.rs", 1);
        assert_eq!(CALLSITE.cached_interest(7), None);
        CALLSITE.cache_interest(7, Interest::InRecordedLayer);
        assert_eq!(CALLSITE.cached_interest(7), Some(Interest::InRecordedLayer));
        assert_eq!(CALLSITE.cached_interest(8), None);
    }
}
