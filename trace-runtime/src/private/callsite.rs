//! Whether a tracepoint is active: its [`Interest`] for the session recording on this thread.
//!
//! [`Callsite`] itself (the tracepoint and its cached interest) sits with the tracepoints,
//! below the session; what needs the session to answer is here, above it.

use crate::record::RecordErrorKind;
use crate::session::registry;
use crate::tracepoint::callsite::{Callsite, Interest};

impl Callsite {
    /// False unless a session is active on this thread, its config records this kind and its
    /// filter admits this tracepoint (for `model`/`layer`: unless the pass structure is needed,
    /// see the session docs).
    #[inline]
    pub fn is_active(&'static self) -> bool {
        self.interest().runs()
    }

    /// What the active session wants of this tracepoint: a thread-local load, then (with a
    /// session) an atomic load and compare; the slow path runs once per session and callsite.
    #[inline]
    pub(crate) fn interest(&'static self) -> Interest {
        if !cfg!(feature = "enabled") {
            return Interest::Never;
        }
        let generation = registry::active_generation();
        if generation == 0 {
            return Interest::Never;
        }
        match self.cached_interest(generation) {
            Some(interest) => interest,
            None => self.decide(generation),
        }
    }

    #[cold]
    #[inline(never)]
    fn decide(&'static self, generation: u32) -> Interest {
        // `None`: the state is borrowed (a hook re-entered); answer "never" without caching it.
        let Some(interest) = registry::decide(generation, self) else {
            return Interest::Never;
        };
        self.cache_interest(generation, interest);
        interest
    }

    pub(crate) fn records(&'static self) -> bool {
        self.interest().records()
    }

    pub(crate) fn note_error(&'static self, kind: RecordErrorKind, message: String) {
        let tracepoint = self.tracepoint();
        registry::with_active(|session| session.note_error(Some(tracepoint), kind, message));
    }
}
