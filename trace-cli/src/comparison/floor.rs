//! The floor (`--floor`): a second implementation's trace that sets each tensor's tolerance,
//! and each compared tensor as judged with it.

use std::path::Path;

use serde::Serialize;
use trace_runtime::compare::{TensorComparison, TensorKey};

/// A second implementation's trace that sets the tolerance tensor by tensor (`--floor`): a
/// tensor's rtol is the larger of the given one and `factor` times the floor's error, the
/// smallest rtol at which the floor is close to the reference.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Floor<'a> {
    pub(crate) path: &'a Path,
    /// How many times the floor's error the other trace may have.
    pub(crate) factor: f64,
}

/// One tensor compared, with the tolerance a floor set it (where one did).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TensorJudgement {
    #[serde(flatten)]
    pub(crate) pair: TensorComparison,
    /// The floor's error: the smallest rtol at which the floor is close to the reference for
    /// this tensor; `null` without `--floor`, or where the floor sets no tolerance.
    pub(crate) floor_rtol: Option<f64>,
    /// Whether `floor_rtol` is exact (both captured) rather than bounded by summaries; `null`
    /// where `floor_rtol` is.
    pub(super) floor_exact: Option<bool>,
    /// Why the floor sets no tolerance for this tensor (`missing`, `shape_mismatch`,
    /// `not_close`); `null` where it sets one, or without `--floor`.
    pub(super) no_floor: Option<NoFloor>,
    /// The rtol the tensor was judged with: the larger of the given one and the floor factor
    /// times `floor_rtol`; `null` without `--floor`.
    pub(crate) allowed_rtol: Option<f64>,
}

impl TensorJudgement {
    /// `pair`, judged with the tolerance `floor` set (`None`: no floor given).
    pub(super) fn new(pair: TensorComparison, floor: Option<TensorFloor>) -> Self {
        let (floor_rtol, floor_exact, no_floor) = match floor {
            None => (None, None, None),
            Some(TensorFloor::Error { rtol, exact }) => (Some(rtol), Some(exact), None),
            Some(TensorFloor::Without(why)) => (None, None, Some(why)),
        };
        Self {
            allowed_rtol: floor.map(|_| pair.tolerance.rtol),
            pair,
            floor_rtol,
            floor_exact,
            no_floor,
        }
    }

    /// The other's error over the floor's: its least rtol over the floor's (0 where the other
    /// needs none, infinite where no rtol is enough or the floor needs none); `None` without a
    /// floor's error for this tensor.
    pub(crate) fn floor_ratio(&self) -> Option<f64> {
        let floor = self.floor_rtol?;
        Some(match self.pair.least_rtol {
            Some(0.0) => 0.0,
            Some(other) if floor > 0.0 => other / floor,
            _ => f64::INFINITY,
        })
    }
}

/// What a floor says of one tensor.
#[derive(Debug, Clone, Copy)]
pub(super) enum TensorFloor {
    /// Its error: the smallest rtol at which it is close to the reference, and whether that
    /// is exact (both captured).
    Error { rtol: f64, exact: bool },
    /// It sets no tolerance.
    Without(NoFloor),
}

/// Why a floor sets no tolerance for a tensor (the given rtol then applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NoFloor {
    /// The floor has no such tensor.
    Missing,
    /// The floor's tensor has another shape than the reference's.
    ShapeMismatch,
    /// No rtol makes the floor's tensor close to the reference's (NaN or infinity counts that
    /// differ, a value off where the reference is 0 under `elementwise`).
    NotClose,
}

impl NoFloor {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Self::Missing => "not in the floor",
            Self::ShapeMismatch => "another shape in the floor",
            Self::NotClose => "the floor close at no rtol",
        }
    }
}

/// A compared tensor the floor set no tolerance for.
#[derive(Debug, Serialize)]
pub(super) struct TensorWithoutFloor {
    #[serde(flatten)]
    pub(super) tensor: TensorKey,
    pub(super) why: NoFloor,
}
