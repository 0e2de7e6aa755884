//! The subcommands, one file each (`list`, `summary`, `check`, `diff`, `report`, `chrome`):
//! each reads its input, does its work through the modules beside this folder and writes its
//! output; and what a command found, for the exit code.

pub(crate) mod check;
pub(crate) mod chrome;
pub(crate) mod diff;
pub(crate) mod list;
pub(crate) mod report;
pub(crate) mod summary;

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
