//! What a command found, for the exit code.

/// What a command found: [`Ok`](Outcome::Ok) exits 0, [`Diverged`](Outcome::Diverged) and
/// [`Failed`](Outcome::Failed) 1 (an error, bad input, exits 2).
pub(crate) enum Outcome {
    /// Everything matched, or the command did what it was asked.
    Ok,
    /// `diff` or `report --against` found a divergence.
    Diverged,
    /// `check` found an identity that does not hold.
    Failed,
}
