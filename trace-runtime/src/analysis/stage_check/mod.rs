//! The stage check: whether a layer's recorded stages obey the identities their names promise,
//! so that a stage recorded on the wrong line (or a reference's map of a family it does not
//! know) is an error, never a quiet mislabel that `diff` would report as a numeric divergence.
//!
//! From the stages a layer recorded (`docs/trace-format.md`, "The stage check"), with `A` the
//! attention branch that joins the residual stream (`attn_post_norm` where recorded, else
//! `attn_out`), `M` the MLP's (`mlp_post_norm`, else `mlp_out`) and `r` the residual multiplier
//! ([`residual_multiplier`]):
//!
//! | | identity | when recorded |
//! |---|---|---|
//! | R1 | `resid_mid = input + r·A` | `resid_mid`, `input`, `A` |
//! | R2 | `output = resid_mid + r·M` | `output`, `resid_mid`, `M` |
//! | R3 | `output = input + r·(A + M)` | a parallel block: `output`, `input`, `A`, `M`, no `resid_mid` |
//! | N1 | `attn_in ≈ norm(input)` | `attn_in`, `input` |
//! | N2 | `mlp_in ≈ norm(resid_mid)` (`norm(input)` without `resid_mid`) | `mlp_in` and either |
//! | N3 | `attn_post_norm ≈ norm(attn_out)` | both |
//! | N4 | `mlp_post_norm ≈ norm(mlp_out)` | both |
//!
//! R1–R3 are checked on the captured values when every stage of the identity was captured
//! (error `‖lhs − rhs‖₂ / ‖lhs‖₂` within [`VALUES_TOLERANCE`]), else through the sketches,
//! which are linear in the values (estimated error within [`SKETCH_TOLERANCE`]). A post-norm
//! block (BERT) obeys R1 and R2 as `resid_mid ≈ norm(input + r·A)`, `output ≈ norm(resid_mid +
//! r·M)`: that form is accepted, on values only, where the additive form fails and the layer
//! recorded none of `attn_in`, `mlp_in`, `attn_post_norm`, `mlp_post_norm`. N1–N4 need values
//! and at least [`MIN_NORM_ROWS`] rows: a per-channel weight (and bias) is fitted over the rows
//! (RMS or LayerNorm, with an epsilon of 0, 1e-6 or 1e-5, whichever fits best), and what it
//! leaves of `Y` is the error. An identity over NaN or infinite values is skipped: the model
//! broke, which the anomaly rules report, and that says nothing of the map.
//!
//! Reading captured tensors is the caller's: [`check_layer`] asks a loader for the values of
//! a stage, as [`compare`](super::compare::compare) does.

mod norm;

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::record::{LayerEvent, StageEvent, TraceHeader};
use crate::summary::{TensorSummary, SKETCH_DIM};

/// The largest relative error `‖lhs − rhs‖₂ / ‖lhs‖₂` an identity may have on captured values.
pub const VALUES_TOLERANCE: f64 = 0.01;

/// The largest relative error an additive identity may have when estimated from sketches
/// (`sqrt(mean_k Δ_k²) / ‖lhs‖₂`; eight projections estimate the norm of the difference within
/// about a factor of 2, so the allowance is twice the values').
pub const SKETCH_TOLERANCE: f64 = 0.02;

/// Rows a norm identity needs: with fewer, a per-channel weight fitted over the rows fits
/// almost anything (a decode step has one row).
pub const MIN_NORM_ROWS: usize = 4;

/// The header key of the residual multiplier (`metadata.extra`).
pub const RESIDUAL_MULTIPLIER_KEY: &str = "residual_multiplier";

/// Stage names the check reads (the vocabulary of [`Stage`](crate::Stage)).
mod names {
    pub(super) const INPUT: &str = "input";
    pub(super) const ATTN_IN: &str = "attn_in";
    pub(super) const ATTN_OUT: &str = "attn_out";
    pub(super) const ATTN_POST_NORM: &str = "attn_post_norm";
    pub(super) const RESID_MID: &str = "resid_mid";
    pub(super) const MLP_IN: &str = "mlp_in";
    pub(super) const MLP_OUT: &str = "mlp_out";
    pub(super) const MLP_POST_NORM: &str = "mlp_post_norm";
    pub(super) const OUTPUT: &str = "output";
}

/// Declares the identities once: the enum, its `ALL`, codes and general forms.
macro_rules! identities {
    ($($(#[doc = $doc:literal])* $variant:ident = $code:literal, $form:literal;)*) => {
        /// Which identity of the stage check.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum IdentityKind {
            $($(#[doc = $doc])* #[serde(rename = $code)] $variant,)*
        }

        impl IdentityKind {
            /// Every identity, residual ones first.
            pub const ALL: &'static [IdentityKind] = &[$(IdentityKind::$variant,)*];

            /// `R1` ... `N4`.
            pub const fn code(self) -> &'static str {
                match self {
                    $(IdentityKind::$variant => $code,)*
                }
            }

            /// The general form: `resid_mid = input + r·A`.
            pub const fn form(self) -> &'static str {
                match self {
                    $(IdentityKind::$variant => $form,)*
                }
            }
        }
    };
}

identities! {
    /// `resid_mid = input + r·A`.
    ResidMid = "R1", "resid_mid = input + r·A";
    /// `output = resid_mid + r·M`.
    Output = "R2", "output = resid_mid + r·M";
    /// `output = input + r·(A + M)`, a parallel block.
    Parallel = "R3", "output = input + r·(A + M)";
    /// `attn_in ≈ norm(input)`.
    AttnIn = "N1", "attn_in ≈ norm(input)";
    /// `mlp_in ≈ norm(resid_mid)`, or `norm(input)` in a parallel block.
    MlpIn = "N2", "mlp_in ≈ norm(resid_mid or input)";
    /// `attn_post_norm ≈ norm(attn_out)`.
    AttnPostNorm = "N3", "attn_post_norm ≈ norm(attn_out)";
    /// `mlp_post_norm ≈ norm(mlp_out)`.
    MlpPostNorm = "N4", "mlp_post_norm ≈ norm(mlp_out)";
}

impl IdentityKind {
    /// Whether it is a norm identity (N1–N4), checked on values only.
    pub fn is_norm(self) -> bool {
        matches!(
            self,
            Self::AttnIn | Self::MlpIn | Self::AttnPostNorm | Self::MlpPostNorm
        )
    }
}

impl fmt::Display for IdentityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// One identity as a layer's stages instantiate it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Identity {
    /// Which.
    pub kind: IdentityKind,
    /// The stage on the left.
    pub lhs: String,
    /// The stages on the right: for a residual identity each added with its coefficient (the
    /// stream's 1, the branches' `r`); for a norm identity the one normalised, coefficient 1.
    pub rhs: Vec<(f64, String)>,
}

impl Identity {
    fn new(kind: IdentityKind, lhs: &str, rhs: &[(f64, &str)]) -> Self {
        Self {
            kind,
            lhs: lhs.to_owned(),
            rhs: rhs.iter().map(|&(c, s)| (c, s.to_owned())).collect(),
        }
    }

    /// The sum of the right-hand side: `input + attn_out`, `input + 0.22·attn_out`.
    fn sum_text(&self) -> String {
        let terms: Vec<String> = self
            .rhs
            .iter()
            .map(|(c, s)| {
                if *c == 1.0 {
                    s.clone()
                } else {
                    format!("{c}·{s}")
                }
            })
            .collect();
        terms.join(" + ")
    }

    /// The post-norm form of a residual identity: `resid_mid ≈ norm(input + attn_out)`.
    pub fn normalised_text(&self) -> String {
        format!("{} ≈ norm({})", self.lhs, self.sum_text())
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind.is_norm() {
            write!(f, "{} ≈ norm({})", self.lhs, self.sum_text())
        } else {
            write!(f, "{} = {}", self.lhs, self.sum_text())
        }
    }
}

/// How an identity was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// On the captured values: the error is exact.
    Values,
    /// Through the sketches of the summaries: the error is an estimate.
    Sketch,
}

impl Method {
    /// The tolerance of the method.
    pub fn tolerance(self) -> f64 {
        match self {
            Self::Values => VALUES_TOLERANCE,
            Self::Sketch => SKETCH_TOLERANCE,
        }
    }
}

/// Why an identity that applies to a layer was not decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Skip {
    /// It needs the values (a norm identity, or a post-norm block's form) and a stage was not
    /// captured.
    NeedsCaptures,
    /// A norm identity on fewer than [`MIN_NORM_ROWS`] rows (a decode step).
    FewRows,
    /// The stages hold different numbers of elements, or a norm's channels differ.
    NotComparable,
    /// A stage was neither captured nor summarised with a sketch (digests off).
    NoSketch,
    /// A stage holds NaN or infinite values: the model broke (the anomaly rules' business),
    /// which says nothing of which tensor the stage is.
    NonFinite,
}

impl Skip {
    /// Every reason, in the order reports list them.
    pub const ALL: [Skip; 5] = [
        Skip::NeedsCaptures,
        Skip::FewRows,
        Skip::NotComparable,
        Skip::NoSketch,
        Skip::NonFinite,
    ];

    /// What it means, for reports.
    pub fn describe(self) -> &'static str {
        match self {
            Self::NeedsCaptures => "needs captures",
            Self::FewRows => "fewer than 4 rows",
            Self::NotComparable => "not comparable",
            Self::NoSketch => "no sketch, not captured",
            Self::NonFinite => "NaN or infinite values",
        }
    }
}

/// What checking an identity found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Within tolerance.
    Passed,
    /// Out of tolerance: the stages do not mean what their names say.
    Failed,
    /// Not decided.
    Skipped(Skip),
}

/// One identity checked on one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdentityResult {
    /// The identity, as the layer's stages instantiate it.
    pub identity: Identity,
    /// What was found.
    pub outcome: Outcome,
    /// How (`None` when nothing was computed).
    pub method: Option<Method>,
    /// The relative error of the form that decided (for a post-norm block whose additive form
    /// failed, the normalised form's), when computed.
    pub error: Option<f64>,
    /// The tolerance of the method.
    pub tolerance: f64,
    /// The additive form failed and the post-norm form `lhs ≈ norm(rhs)` was tried: this is
    /// its error (`None` where it was not tried or could not be: then `error` is the additive
    /// form's).
    pub normalised_error: Option<f64>,
}

impl IdentityResult {
    /// Whether the post-norm form decided (passed, or failed after the additive form did).
    pub fn is_normalised(&self) -> bool {
        self.normalised_error.is_some()
    }

    /// The identity in the form that decided: `resid_mid = input + attn_out`, or
    /// `resid_mid ≈ norm(input + attn_out)` for a post-norm block that passed in that form.
    pub fn describe(&self) -> String {
        if self.is_normalised() && self.outcome == Outcome::Passed {
            self.identity.normalised_text()
        } else {
            self.identity.to_string()
        }
    }
}

/// Every identity checked on one layer record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerCheck {
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The identities that apply to its stages, in [`IdentityKind::ALL`]'s order.
    pub results: Vec<IdentityResult>,
}

impl LayerCheck {
    /// Whether an identity failed.
    pub fn failed(&self) -> bool {
        self.results.iter().any(|r| r.outcome == Outcome::Failed)
    }
}

/// A header's residual multiplier that is not a number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiplierError {
    /// What the header says.
    pub value: String,
}

impl fmt::Display for MultiplierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the header's metadata.extra.{RESIDUAL_MULTIPLIER_KEY} is {:?}, not a finite number",
            self.value
        )
    }
}

impl std::error::Error for MultiplierError {}

/// The residual multiplier `r` of a trace: its header's `metadata.extra.residual_multiplier`
/// (Granite scales each branch before adding it to the stream), 1 when absent.
pub fn residual_multiplier(header: &TraceHeader) -> Result<f64, MultiplierError> {
    match header.metadata.extra.get(RESIDUAL_MULTIPLIER_KEY) {
        None => Ok(1.0),
        Some(text) => match text.trim().parse::<f64>() {
            Ok(r) if r.is_finite() => Ok(r),
            _ => Err(MultiplierError {
                value: text.clone(),
            }),
        },
    }
}

/// Checks the identities that apply to `layer`'s stages, `multiplier` being the residual
/// multiplier `r`. `values` gives a stage's captured values (`None` when it was not captured,
/// or could not be read: the caller says why); it is asked at most once per stage, and only
/// for stages whose values an identity needs.
pub fn check_layer(
    layer: &LayerEvent,
    multiplier: f64,
    mut values: impl FnMut(&StageEvent) -> Option<Vec<f32>>,
) -> LayerCheck {
    let mut stages = Stages {
        layer,
        loaded: BTreeMap::new(),
        values: &mut values,
    };
    let results = applicable(layer, multiplier)
        .into_iter()
        .map(|identity| {
            if identity.kind.is_norm() {
                stages.check_norm(identity)
            } else {
                let post_norm = post_norm_block(layer);
                stages.check_residual(identity, post_norm)
            }
        })
        .collect();
    LayerCheck {
        pass: layer.pass,
        layer: layer.layer,
        results,
    }
}

/// The identities that `layer`'s stages instantiate, in [`IdentityKind::ALL`]'s order.
pub fn applicable(layer: &LayerEvent, r: f64) -> Vec<Identity> {
    use names::*;
    let has = |name: &str| layer.stage(name).is_some();
    let attn = [ATTN_POST_NORM, ATTN_OUT].into_iter().find(|s| has(s));
    let mlp = [MLP_POST_NORM, MLP_OUT].into_iter().find(|s| has(s));
    let mut found = Vec::new();
    if let (true, true, Some(a)) = (has(RESID_MID), has(INPUT), attn) {
        found.push(Identity::new(
            IdentityKind::ResidMid,
            RESID_MID,
            &[(1.0, INPUT), (r, a)],
        ));
    }
    if let (true, true, Some(m)) = (has(OUTPUT), has(RESID_MID), mlp) {
        found.push(Identity::new(
            IdentityKind::Output,
            OUTPUT,
            &[(1.0, RESID_MID), (r, m)],
        ));
    }
    if let (false, true, true, Some(a), Some(m)) =
        (has(RESID_MID), has(OUTPUT), has(INPUT), attn, mlp)
    {
        found.push(Identity::new(
            IdentityKind::Parallel,
            OUTPUT,
            &[(1.0, INPUT), (r, a), (r, m)],
        ));
    }
    let norms = [
        (IdentityKind::AttnIn, ATTN_IN, [INPUT, INPUT]),
        (IdentityKind::MlpIn, MLP_IN, [RESID_MID, INPUT]),
        (
            IdentityKind::AttnPostNorm,
            ATTN_POST_NORM,
            [ATTN_OUT, ATTN_OUT],
        ),
        (IdentityKind::MlpPostNorm, MLP_POST_NORM, [MLP_OUT, MLP_OUT]),
    ];
    for (kind, lhs, candidates) in norms {
        if let (true, Some(x)) = (has(lhs), candidates.into_iter().find(|s| has(s))) {
            found.push(Identity::new(kind, lhs, &[(1.0, x)]));
        }
    }
    found
}

/// Whether `layer` may be a post-norm block: it recorded none of the norm stages of pre-norm
/// and sandwich-norm blocks.
fn post_norm_block(layer: &LayerEvent) -> bool {
    use names::*;
    [ATTN_IN, MLP_IN, ATTN_POST_NORM, MLP_POST_NORM]
        .iter()
        .all(|name| layer.stage(name).is_none())
}

/// A layer's stages and the values loaded so far.
struct Stages<'a, F> {
    layer: &'a LayerEvent,
    /// Values by stage name; `None`: not captured.
    loaded: BTreeMap<String, Option<Vec<f32>>>,
    values: &'a mut F,
}

impl<F: FnMut(&StageEvent) -> Option<Vec<f32>>> Stages<'_, F> {
    fn stage(&self, name: &str) -> &StageEvent {
        self.layer
            .stage(name)
            .expect("applicable() only names recorded stages")
    }

    /// Loads the values of `names`, each once; true when every one was captured.
    fn load(&mut self, names: &[&str]) -> bool {
        for &name in names {
            if !self.loaded.contains_key(name) {
                let stage = self.layer.stage(name);
                let values = stage.filter(|s| s.tensor.capture.is_some());
                let values = values.and_then(|s| (self.values)(s));
                self.loaded.insert(name.to_owned(), values);
            }
        }
        names.iter().all(|name| self.loaded[*name].is_some())
    }

    fn values(&self, name: &str) -> &[f32] {
        self.loaded[name].as_deref().unwrap_or_default()
    }

    fn check_residual(&mut self, identity: Identity, post_norm: bool) -> IdentityResult {
        let mut names: Vec<&str> = vec![&identity.lhs];
        names.extend(identity.rhs.iter().map(|(_, s)| s.as_str()));
        let counts: Vec<usize> = names.iter().map(|n| self.stage(n).tensor.numel()).collect();
        let result = |outcome, method, error| IdentityResult {
            identity: identity.clone(),
            outcome,
            method,
            error,
            tolerance: method.map_or(VALUES_TOLERANCE, Method::tolerance),
            normalised_error: None,
        };
        if counts.iter().any(|&c| c != counts[0]) {
            return result(Outcome::Skipped(Skip::NotComparable), None, None);
        }
        if names.iter().any(|n| !all_finite(&self.stage(n).tensor)) {
            return result(Outcome::Skipped(Skip::NonFinite), None, None);
        }
        if self.load(&names) {
            let sum = self.weighted_sum(&identity.rhs);
            let lhs = self.values(&identity.lhs);
            let error = difference_error(lhs, &sum);
            if error <= VALUES_TOLERANCE {
                return result(Outcome::Passed, Some(Method::Values), Some(error));
            }
            if !post_norm {
                return result(Outcome::Failed, Some(Method::Values), Some(error));
            }
            let channels = self.stage(&identity.lhs).tensor.shape.last().copied();
            let channels = channels.unwrap_or(0);
            if channels == 0 || counts[0] / channels < MIN_NORM_ROWS {
                return result(
                    Outcome::Skipped(Skip::FewRows),
                    Some(Method::Values),
                    Some(error),
                );
            }
            let normalised = norm::fit_error(lhs, &sum, channels);
            let outcome = if normalised <= VALUES_TOLERANCE {
                Outcome::Passed
            } else {
                Outcome::Failed
            };
            return IdentityResult {
                normalised_error: Some(normalised),
                error: Some(if outcome == Outcome::Passed {
                    normalised
                } else {
                    error
                }),
                ..result(outcome, Some(Method::Values), None)
            };
        }
        let Some(error) = self.sketch_error(&identity) else {
            return result(Outcome::Skipped(Skip::NoSketch), None, None);
        };
        let outcome = if error <= SKETCH_TOLERANCE {
            Outcome::Passed
        } else if post_norm {
            // A post-norm block's form cannot be checked through the sketch.
            Outcome::Skipped(Skip::NeedsCaptures)
        } else {
            Outcome::Failed
        };
        result(outcome, Some(Method::Sketch), Some(error))
    }

    /// `Σ c·values(s)` over the terms, in `f64`, non-finite values as 0.
    fn weighted_sum(&self, terms: &[(f64, String)]) -> Vec<f64> {
        let mut sum = vec![0.0f64; self.values(&terms[0].1).len()];
        for (c, name) in terms {
            for (acc, &v) in sum.iter_mut().zip(self.values(name)) {
                *acc += c * norm::finite(v);
            }
        }
        sum
    }

    /// `sqrt(mean_k Δ_k²) / ‖lhs‖₂`, `Δ = sketch(lhs) − Σ c·sketch(term)`; `None` when a
    /// stage has no sketch.
    fn sketch_error(&self, identity: &Identity) -> Option<f64> {
        let lhs = self.stage(&identity.lhs).tensor.sketch?;
        let mut delta: [f64; SKETCH_DIM] = lhs.0.map(f64::from);
        for (c, name) in &identity.rhs {
            let sketch = self.stage(name).tensor.sketch?;
            for (d, &s) in delta.iter_mut().zip(&sketch.0) {
                *d -= c * f64::from(s);
            }
        }
        #[allow(clippy::cast_precision_loss)]
        let mean_square = delta.iter().map(|d| d * d).sum::<f64>() / SKETCH_DIM as f64;
        let l2 = f64::from(self.stage(&identity.lhs).tensor.stats.l2_norm);
        Some(norm::relative(mean_square.sqrt(), l2))
    }

    fn check_norm(&mut self, identity: Identity) -> IdentityResult {
        let x_name = identity.rhs[0].1.clone();
        let (y, x) = (self.stage(&identity.lhs), self.stage(&x_name));
        let channels = y.tensor.shape.last().copied().unwrap_or(0);
        let comparable = y.tensor.numel() == x.tensor.numel()
            && x.tensor.shape.last().copied() == Some(channels)
            && channels > 0;
        let rows = y.tensor.numel().checked_div(channels).unwrap_or(0);
        let skipped = |skip| IdentityResult {
            identity: identity.clone(),
            outcome: Outcome::Skipped(skip),
            method: None,
            error: None,
            tolerance: VALUES_TOLERANCE,
            normalised_error: None,
        };
        if !comparable {
            return skipped(Skip::NotComparable);
        }
        if !(all_finite(&y.tensor) && all_finite(&x.tensor)) {
            return skipped(Skip::NonFinite);
        }
        if rows < MIN_NORM_ROWS {
            return skipped(Skip::FewRows);
        }
        if !self.load(&[&identity.lhs, &x_name]) {
            return skipped(Skip::NeedsCaptures);
        }
        let x: Vec<f64> = self
            .values(&x_name)
            .iter()
            .map(|&v| norm::finite(v))
            .collect();
        let error = norm::fit_error(self.values(&identity.lhs), &x, channels);
        IdentityResult {
            outcome: if error <= VALUES_TOLERANCE {
                Outcome::Passed
            } else {
                Outcome::Failed
            },
            method: Some(Method::Values),
            error: Some(error),
            ..skipped(Skip::NeedsCaptures)
        }
    }
}

/// Whether every value of the tensor is finite (its statistics count NaN and ±∞).
fn all_finite(tensor: &TensorSummary) -> bool {
    tensor.stats.nan_count == 0 && tensor.stats.inf_count == 0
}

/// `‖lhs − rhs‖₂ / ‖lhs‖₂`, non-finite values of `lhs` as 0.
fn difference_error(lhs: &[f32], rhs: &[f64]) -> f64 {
    let (mut difference, mut reference) = (0.0f64, 0.0f64);
    for (&a, &b) in lhs.iter().zip(rhs) {
        let a = norm::finite(a);
        difference += (a - b) * (a - b);
        reference += a * a;
    }
    norm::relative(difference.sqrt(), reference.sqrt())
}

/// Where an error was measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Located {
    /// The relative error.
    pub error: f64,
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The rank whose record it was, in a run of several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// The identity in the form measured.
    pub identity: String,
}

/// One identity's results over a trace: how many layers passed, failed or were skipped (and
/// why), and the largest error of each method.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KindTally {
    /// Layers within tolerance.
    pub passed: usize,
    /// Of those, layers that passed in the post-norm form `lhs ≈ norm(rhs)` (a post-norm block).
    pub passed_post_norm: usize,
    /// Layers out of tolerance.
    pub failed: usize,
    /// Layers not decided, by reason (only reasons that occurred).
    pub skipped: BTreeMap<Skip, usize>,
    /// The largest error measured on values, of the identities decided (passed or failed).
    pub largest_values_error: Option<Located>,
    /// The largest error estimated from sketches, of the identities decided.
    pub largest_sketch_error: Option<Located>,
}

impl KindTally {
    /// Layers not decided, all reasons together.
    pub fn skipped_count(&self) -> usize {
        self.skipped.values().sum()
    }
}

/// A failed identity, where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The pass.
    pub pass: usize,
    /// The layer.
    pub layer: usize,
    /// The rank whose record it was, in a run of several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// What failed and by how much.
    #[serde(flatten)]
    pub result: IdentityResult,
}

/// The stage check of a whole trace, folded layer by layer: per identity, the counts and the
/// largest errors; the failures in the order met (the first [`StageCheckTally::LISTED`], and
/// how many).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageCheckTally {
    /// Layer records checked.
    pub layers: usize,
    /// Per identity that applied to some layer.
    pub identities: BTreeMap<IdentityKind, KindTally>,
    /// The first failures.
    pub failures: Vec<Failure>,
    /// How many identities failed in all.
    pub failure_count: usize,
}

impl StageCheckTally {
    /// Failures kept; the others are counted.
    pub const LISTED: usize = 1000;

    /// Folds in one layer's check, recorded by `rank` (in a run of several).
    pub fn add(&mut self, check: LayerCheck, rank: Option<usize>) {
        self.layers += 1;
        for result in check.results {
            let tally = self.identities.entry(result.identity.kind).or_default();
            match result.outcome {
                Outcome::Passed if result.is_normalised() => {
                    tally.passed += 1;
                    tally.passed_post_norm += 1;
                }
                Outcome::Passed => tally.passed += 1,
                Outcome::Failed => tally.failed += 1,
                Outcome::Skipped(skip) => *tally.skipped.entry(skip).or_default() += 1,
            }
            let error = match result.normalised_error {
                Some(normalised) if result.outcome == Outcome::Passed => Some(normalised),
                _ => result.error,
            };
            // Over the decided identities only: a skipped one's additive error (a post-norm
            // block's, say) is no error of the trace.
            let largest = match (result.outcome, result.method) {
                (Outcome::Skipped(_), _) | (_, None) => None,
                (_, Some(Method::Values)) => Some(&mut tally.largest_values_error),
                (_, Some(Method::Sketch)) => Some(&mut tally.largest_sketch_error),
            };
            if let (Some(largest), Some(error)) = (largest, error) {
                if largest
                    .as_ref()
                    .is_none_or(|l| error.is_nan() || error > l.error)
                {
                    *largest = Some(Located {
                        error,
                        pass: check.pass,
                        layer: check.layer,
                        rank,
                        identity: result.describe(),
                    });
                }
            }
            if result.outcome == Outcome::Failed {
                self.failure_count += 1;
                if self.failures.len() < Self::LISTED {
                    self.failures.push(Failure {
                        pass: check.pass,
                        layer: check.layer,
                        rank,
                        result,
                    });
                }
            }
        }
    }

    /// Whether every identity checked held.
    pub fn passed(&self) -> bool {
        self.failure_count == 0
    }

    /// The first failure met.
    pub fn first_failure(&self) -> Option<&Failure> {
        self.failures.first()
    }

    /// Identities decided (passed or failed), all kinds together.
    pub fn decided(&self) -> usize {
        self.identities.values().map(|t| t.passed + t.failed).sum()
    }
}

impl Failure {
    /// `pass 0, layer 3: resid_mid = input + attn_out: error 8.31e-1 > 1.00e-2 (values)`.
    pub fn describe(&self) -> String {
        let r = &self.result;
        let rank = self
            .rank
            .map_or_else(String::new, |rank| format!(" (rank {rank})"));
        let method = match r.method {
            Some(Method::Values) => "values",
            Some(Method::Sketch) => "sketch estimate",
            None => "not computed",
        };
        let error = r
            .error
            .map_or_else(|| "-".to_owned(), |e| format!("{e:.2e}"));
        let normalised = r.normalised_error.map_or_else(String::new, |e| {
            format!(
                ", nor its post-norm form {} ({e:.2e})",
                r.identity.normalised_text()
            )
        });
        format!(
            "pass {}, layer {}{rank}: {} ({}): error {error} > {:.0e} ({method}){normalised}",
            self.pass, self.layer, r.identity, r.identity.kind, r.tolerance
        )
    }
}

#[cfg(test)]
mod tests;
