//! How close is close: `atol` and `rtol` as in `torch.testing.assert_close` (an element `b` of
//! the compared tensor is close to the reference's `a` when `|b − a| ≤ atol + rtol·|a|`), a
//! default and per-name overrides as in Polygraphy, and which error statistic decides when
//! full tensors are compared (also a default and per-name overrides).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::select::glob_match;

/// Polygraphy's default absolute tolerance (for FP32 comparisons).
pub const DEFAULT_ATOL: f64 = 1e-5;
/// Polygraphy's default relative tolerance (for FP32 comparisons).
pub const DEFAULT_RTOL: f64 = 1e-5;
/// The quantile of [`ErrorStat::Quantile`] where none is given (Polygraphy's default).
pub const DEFAULT_ERROR_QUANTILE: f64 = 0.99;

/// Absolute and relative tolerance of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part, times the reference's magnitude.
    pub rtol: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Self {
            atol: DEFAULT_ATOL,
            rtol: DEFAULT_RTOL,
        }
    }
}

/// Which statistic of the error decides (Polygraphy's `--check-error-stat`, plus `norm`).
///
/// For the elementwise statistics each element's error is measured against its own allowance,
/// `r_i = |b_i − a_i| / (atol + rtol·|a_i|)`, and the tensors are close when the statistic of
/// the `r_i` is at most 1 (captured tensors; summaries are checked against the elementwise
/// bounds). `Norm` judges the whole tensor at once, as NMSE and L2 criteria do: close when
/// `‖b − a‖₂ ≤ √n·atol + rtol·‖a‖₂`, i.e. the RMS error is at most `atol` plus `rtol` times
/// the reference's RMS; summaries are then checked against the bounds that criterion implies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStat {
    /// Every element (the strictest; the default).
    #[default]
    Elementwise,
    /// The mean of the `r_i`.
    Mean,
    /// Their median.
    Median,
    /// Their `q`-quantile.
    Quantile(f64),
    /// The L2 norm of the error against `√n·atol + rtol·‖a‖₂`.
    Norm,
}

impl ErrorStat {
    /// Every statistic, [`Quantile`](Self::Quantile) with [`DEFAULT_ERROR_QUANTILE`]: what
    /// [`name`](Self::name), [`description`](Self::description) and parsing go through.
    pub const ALL: [Self; 5] = [
        Self::Elementwise,
        Self::Mean,
        Self::Median,
        Self::Quantile(DEFAULT_ERROR_QUANTILE),
        Self::Norm,
    ];

    /// Its name, as [`FromStr`] reads it: `elementwise`, `mean`, `median`, `quantile` (whatever
    /// the quantile), `norm`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Elementwise => "elementwise",
            Self::Mean => "mean",
            Self::Median => "median",
            Self::Quantile(_) => "quantile",
            Self::Norm => "norm",
        }
    }

    /// What decides, in one line (for a command's help).
    pub fn description(self) -> &'static str {
        match self {
            Self::Elementwise => "Every element within atol + rtol·|a| (the built-in default)",
            Self::Mean => "The mean of the elements' error over their allowance",
            Self::Median => "Its median",
            Self::Quantile(_) => "Its q-quantile",
            Self::Norm => {
                "The whole tensor: ‖b − a‖ ≤ √n·atol + rtol·‖a‖ (RMS error against the \
                 reference's RMS, as NMSE checks judge quantized ports)"
            }
        }
    }
}

/// The name, and for a quantile `quantile q` (`quantile 0.99`).
impl fmt::Display for ErrorStat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quantile(q) => write!(f, "{} {q}", self.name()),
            _ => f.write_str(self.name()),
        }
    }
}

/// A [`name`](ErrorStat::name); `quantile` is the [`DEFAULT_ERROR_QUANTILE`].
impl FromStr for ErrorStat {
    type Err = ToleranceError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|stat| stat.name() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|stat| stat.name()).collect();
                ToleranceError(format!(
                    "{name:?} is not an error statistic ({})",
                    names.join(", ")
                ))
            })
    }
}

/// A default tolerance and overrides by name (globs over full names such as `layer.*.mlp_out`;
/// the last override that matches wins), for `atol`, `rtol` and the error statistic separately.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tolerances {
    /// For every tensor no override matches.
    pub default: Tolerance,
    /// `(glob, atol)` overrides.
    pub atol_overrides: Vec<(String, f64)>,
    /// `(glob, rtol)` overrides.
    pub rtol_overrides: Vec<(String, f64)>,
    /// The statistic that decides for captured tensors.
    pub error_stat: ErrorStat,
    /// `(glob, statistic)` overrides of `error_stat`.
    #[serde(default)]
    pub error_stat_overrides: Vec<(String, ErrorStat)>,
}

/// A tolerance argument that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToleranceError(pub String);

impl fmt::Display for ToleranceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ToleranceError {}

impl Tolerances {
    /// Adds `--atol [NAME:]VALUE` (Polygraphy's syntax: split on the last `:`; no name sets the
    /// default).
    pub fn add_atol(&mut self, argument: &str) -> Result<(), ToleranceError> {
        match parse_argument(argument, "atol")? {
            (None, value) => self.default.atol = value,
            (Some(name), value) => self.atol_overrides.push((name, value)),
        }
        Ok(())
    }

    /// Adds `--rtol [NAME:]VALUE`.
    pub fn add_rtol(&mut self, argument: &str) -> Result<(), ToleranceError> {
        match parse_argument(argument, "rtol")? {
            (None, value) => self.default.rtol = value,
            (Some(name), value) => self.rtol_overrides.push((name, value)),
        }
        Ok(())
    }

    /// Adds `--check-error-stat [NAME:]STAT`, STAT an [`ErrorStat`] name (split on the last
    /// `:` as the tolerances are; no name sets the default).
    pub fn add_error_stat(&mut self, argument: &str) -> Result<(), ToleranceError> {
        let (name, stat) = split_argument(argument, "check-error-stat")?;
        let stat: ErrorStat = stat.parse().map_err(|ToleranceError(why)| {
            ToleranceError(format!(
                "--check-error-stat takes [NAME:]STAT: {why}, in {argument:?}"
            ))
        })?;
        match name {
            None => self.error_stat = stat,
            Some(name) => self.error_stat_overrides.push((name, stat)),
        }
        Ok(())
    }

    /// The error statistic of the tensor with full name `name`.
    pub fn error_stat_for(&self, name: &str) -> ErrorStat {
        self.error_stat_overrides
            .iter()
            .rev()
            .find(|(glob, _)| glob_match(glob, name))
            .map_or(self.error_stat, |(_, stat)| *stat)
    }

    /// The overrides whose glob matches none of `names` (full names such as `layer.3.mlp_out`),
    /// in the order they were added: an override that changes nothing is a mistake (a
    /// misspelt name) the user should hear about.
    pub fn unused_overrides(
        &self,
        names: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Vec<UnusedOverride> {
        let globs: Vec<(Overridden, &str)> = (self.atol_overrides.iter())
            .map(|(glob, _)| (Overridden::Atol, glob.as_str()))
            .chain(
                self.rtol_overrides
                    .iter()
                    .map(|(glob, _)| (Overridden::Rtol, glob.as_str())),
            )
            .chain(
                self.error_stat_overrides
                    .iter()
                    .map(|(glob, _)| (Overridden::ErrorStat, glob.as_str())),
            )
            .collect();
        if globs.is_empty() {
            return Vec::new();
        }
        let mut used = vec![false; globs.len()];
        for name in names {
            for (used, (_, glob)) in used.iter_mut().zip(&globs) {
                *used = *used || glob_match(glob, name.as_ref());
            }
        }
        globs
            .into_iter()
            .zip(used)
            .filter(|&(_, used)| !used)
            .map(|((setting, glob), _)| UnusedOverride {
                setting,
                glob: glob.to_owned(),
            })
            .collect()
    }

    /// The tolerance of the tensor with full name `name`.
    pub fn for_name(&self, name: &str) -> Tolerance {
        let pick = |overrides: &[(String, f64)], default: f64| {
            overrides
                .iter()
                .rev()
                .find(|(glob, _)| glob_match(glob, name))
                .map_or(default, |(_, value)| *value)
        };
        Tolerance {
            atol: pick(&self.atol_overrides, self.default.atol),
            rtol: pick(&self.rtol_overrides, self.default.rtol),
        }
    }
}

/// What a per-name override sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Overridden {
    /// The absolute tolerance (`--atol NAME:VALUE`).
    Atol,
    /// The relative tolerance (`--rtol NAME:VALUE`).
    Rtol,
    /// The error statistic (`--check-error-stat NAME:STAT`).
    ErrorStat,
}

impl Overridden {
    /// The command-line option that sets it.
    pub fn option(self) -> &'static str {
        match self {
            Self::Atol => "--atol",
            Self::Rtol => "--rtol",
            Self::ErrorStat => "--check-error-stat",
        }
    }
}

/// A per-name override whose glob matched no tensor of either trace
/// ([`Tolerances::unused_overrides`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnusedOverride {
    /// What it sets.
    pub setting: Overridden,
    /// Its glob.
    pub glob: String,
}

impl fmt::Display for UnusedOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}:... matches no tensor of either trace (full names such as layer.3.mlp_out)",
            self.setting.option(),
            self.glob
        )
    }
}

/// `[NAME:]VALUE` split on the last `:`, both trimmed; an empty name is an error.
fn split_argument<'a>(
    argument: &'a str,
    what: &str,
) -> Result<(Option<String>, &'a str), ToleranceError> {
    let (name, value) = match argument.rsplit_once(':') {
        Some((name, value)) => (Some(name.trim().to_owned()), value.trim()),
        None => (None, argument.trim()),
    };
    if name.as_deref() == Some("") {
        return Err(ToleranceError(format!(
            "--{what}: an empty name in {argument:?}"
        )));
    }
    Ok((name, value))
}

fn parse_argument(argument: &str, what: &str) -> Result<(Option<String>, f64), ToleranceError> {
    let (name, value) = split_argument(argument, what)?;
    let value: f64 = value.parse().map_err(|_| {
        ToleranceError(format!(
            "--{what} takes [NAME:]VALUE with a number VALUE, not {argument:?}"
        ))
    })?;
    if !(value >= 0.0 && value.is_finite()) {
        return Err(ToleranceError(format!(
            "--{what} must be a finite number ≥ 0, not {argument:?}"
        )));
    }
    Ok((name, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polygraphy_style_overrides() {
        let mut tolerances = Tolerances::default();
        tolerances.add_atol("1e-4").unwrap();
        tolerances.add_atol("layer.*.mlp_out:1e-2").unwrap();
        tolerances.add_rtol("layer.2?.*:0.5").unwrap();
        assert_eq!(
            tolerances.for_name("layer.3.attn_out"),
            Tolerance {
                atol: 1e-4,
                rtol: 1e-5
            }
        );
        assert_eq!(tolerances.for_name("layer.3.mlp_out").atol, 1e-2);
        assert_eq!(
            tolerances.for_name("layer.21.mlp_out"),
            Tolerance {
                atol: 1e-2,
                rtol: 0.5
            }
        );
        for bad in ["x", "-1", "inf", ":1", "layer:nan"] {
            assert!(tolerances.add_atol(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn error_stats_have_one_name_each() {
        for stat in ErrorStat::ALL {
            assert_eq!(stat.name().parse::<ErrorStat>(), Ok(stat));
        }
        assert_eq!(
            ErrorStat::Quantile(0.5).to_string(),
            "quantile 0.5",
            "Display keeps the quantile"
        );
        assert!("quantiles".parse::<ErrorStat>().is_err());
    }

    #[test]
    fn per_name_error_stats() {
        let mut tolerances = Tolerances::default();
        tolerances.add_error_stat("norm").unwrap();
        tolerances
            .add_error_stat("layer.*.attention:median")
            .unwrap();
        tolerances.add_error_stat("layer.1?.*:elementwise").unwrap();
        assert_eq!(
            tolerances.error_stat_for("layer.3.mlp_out"),
            ErrorStat::Norm
        );
        assert_eq!(
            tolerances.error_stat_for("layer.3.attention"),
            ErrorStat::Median
        );
        assert_eq!(
            tolerances.error_stat_for("layer.12.attention"),
            ErrorStat::Elementwise,
            "the last override that matches wins"
        );
        for bad in ["worst", "layer.1.*:", ":mean", "layer.1.*:0.5"] {
            assert!(tolerances.add_error_stat(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn overrides_that_match_nothing_are_listed() {
        let mut tolerances = Tolerances::default();
        tolerances.add_atol("1e-3").unwrap();
        tolerances.add_atol("layer.*.mlp_out:1e-2").unwrap();
        tolerances.add_rtol("layer.9.*:0.5").unwrap();
        tolerances.add_error_stat("layer.*.atention:mean").unwrap();
        let names = ["layer.0.mlp_out", "layer.0.attention", "layer.1.output"];
        let unused = tolerances.unused_overrides(names);
        assert_eq!(
            unused,
            [
                UnusedOverride {
                    setting: Overridden::Rtol,
                    glob: "layer.9.*".to_owned()
                },
                UnusedOverride {
                    setting: Overridden::ErrorStat,
                    glob: "layer.*.atention".to_owned()
                }
            ]
        );
        assert!(unused[0].to_string().starts_with("--rtol layer.9.*:"));
    }
}
