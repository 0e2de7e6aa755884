//! The sessions of each thread: which one records now, the stack of those started and not yet
//! ended, and the one way to reach a session's state from a hook.
//!
//! Two thread-locals: the generation of the active session in a `Cell<u32>` (the only thing
//! the fast path reads), and the stack of sessions in a `RefCell`, borrowed only by hooks of
//! tracepoints that are active. A hook never holds the borrow while it calls into tensor code,
//! so a user `TraceTensor` that itself reaches a tracepoint cannot cause a double borrow.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};

use super::state::SessionState;
use crate::tracepoint::callsite::{Callsite, Interest};

thread_local! {
    /// Generation of the session recording on this thread; 0 when none.
    static ACTIVE_GENERATION: Cell<u32> = const { Cell::new(0) };
    /// Sessions started on this thread and not yet ended, oldest first.
    static SESSIONS: RefCell<Vec<SessionState>> = const { RefCell::new(Vec::new()) };
}

/// Generations are unique across threads, so a callsite's cached decision, keyed by
/// generation, can never be mistaken for another session's.
static NEXT_GENERATION: AtomicU32 = AtomicU32::new(1);

#[inline(always)]
pub(crate) fn active_generation() -> u32 {
    ACTIVE_GENERATION.with(Cell::get)
}

/// Runs `f` on the session with `generation`, if it is still alive on this thread and the
/// state is not already borrowed (it never is, unless a hook is re-entered from tensor code).
pub(crate) fn with_session<R>(
    generation: u32,
    f: impl FnOnce(&mut SessionState) -> R,
) -> Option<R> {
    if generation == 0 {
        return None;
    }
    SESSIONS
        .try_with(|sessions| {
            let mut sessions = sessions.try_borrow_mut().ok()?;
            let session = sessions
                .iter_mut()
                .rev()
                .find(|session| session.generation == generation)?;
            Some(f(session))
        })
        .ok()
        .flatten()
}

/// [`with_session`] on the session recording on this thread.
pub(crate) fn with_active<R>(f: impl FnOnce(&mut SessionState) -> R) -> Option<R> {
    with_session(active_generation(), f)
}

/// Makes `state` the active session of this thread; its generation, or 0 if the state could
/// not be stored (a hook is running).
#[cfg_attr(not(feature = "enabled"), allow(dead_code))]
pub(crate) fn push(mut state: SessionState) -> u32 {
    let generation = loop {
        let generation = NEXT_GENERATION.fetch_add(1, Ordering::Relaxed);
        if generation != 0 {
            break generation;
        }
    };
    state.generation = generation;
    let pushed = SESSIONS
        .try_with(|sessions| match sessions.try_borrow_mut() {
            Ok(mut sessions) => {
                sessions.push(state);
                true
            }
            Err(_) => false,
        })
        .unwrap_or(false);
    if pushed {
        ACTIVE_GENERATION.with(|active| active.set(generation));
        generation
    } else {
        0
    }
}

pub(crate) fn remove(generation: u32) -> Option<SessionState> {
    if generation == 0 {
        return None;
    }
    SESSIONS
        .try_with(|sessions| {
            let mut sessions = sessions.try_borrow_mut().ok()?;
            let at = sessions.iter().position(|s| s.generation == generation)?;
            let removed = sessions.remove(at);
            ACTIVE_GENERATION.with(|active| active.set(recording(&sessions)));
            Some(removed)
        })
        .ok()
        .flatten()
}

/// The generation that records on this thread: the newest session's, unless it is suspended.
fn recording(sessions: &[SessionState]) -> u32 {
    sessions
        .last()
        .filter(|session| session.suspended == 0)
        .map_or(0, |session| session.generation)
}

/// Suspends the session `generation` while a forward pass that its filter leaves out runs:
/// until [`resume`], tracepoints on this thread see no session. `false` when it is not there.
pub(crate) fn suspend(generation: u32) -> bool {
    set_suspended(generation, |depth| depth + 1)
}

/// Ends one [`suspend`] of the session `generation`.
pub(crate) fn resume(generation: u32) {
    set_suspended(generation, |depth| depth.saturating_sub(1));
}

fn set_suspended(generation: u32, change: impl FnOnce(usize) -> usize) -> bool {
    SESSIONS
        .try_with(|sessions| {
            let Ok(mut sessions) = sessions.try_borrow_mut() else {
                return false;
            };
            let Some(session) = sessions.iter_mut().find(|s| s.generation == generation) else {
                return false;
            };
            session.suspended = change(session.suspended);
            ACTIVE_GENERATION.with(|active| active.set(recording(&sessions)));
            true
        })
        .unwrap_or(false)
}

/// What the session with `generation` wants of `callsite`; `None` when the state cannot be
/// read right now (borrowed by a hook further up the stack).
pub(crate) fn decide(generation: u32, callsite: &'static Callsite) -> Option<Interest> {
    let decided = with_session(generation, |session| session.interest_in(callsite));
    if decided.is_some() {
        return decided;
    }
    let borrowed = SESSIONS
        .try_with(|sessions| sessions.try_borrow_mut().is_err())
        .unwrap_or(false);
    // Not borrowed: the session is gone, and "never" is the right answer to cache.
    (!borrowed).then_some(Interest::Never)
}
