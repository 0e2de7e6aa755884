//! Interventions: a tracepoint changes the tensor it sees before the program goes on with it
//! (ablation, scaling, steering, a function of the user's): what an intervention selects
//! ([`InterventionSelector`]), what it does ([`Action`]), and applying one to a tensor.

mod action;
mod reference;
mod selector;

use std::fmt;

pub use action::{Action, InterventionSite};
pub use reference::ReferenceCaptures;
pub use selector::InterventionSelector;

use crate::tensor::TraceTensor;

/// One intervention of a session: the tensors it selects and what it does to them
/// ([`SessionBuilder::intervene`](crate::SessionBuilder::intervene), `MODEL_TRACE_PATCH`).
#[derive(Debug, Clone)]
pub struct Intervention {
    selector: InterventionSelector,
    action: Action,
}

/// `MODEL_TRACE_PATCH`, or an intervention's selector, does not parse: which entry and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterventionError {
    entry: String,
    reason: String,
}

impl fmt::Display for InterventionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid intervention `{}`: {}", self.entry, self.reason)
    }
}

impl std::error::Error for InterventionError {}

impl Intervention {
    /// `action` on the tensors that `selector` selects (syntax on [`InterventionSelector`]).
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::{Action, Intervention};
    /// let ablate = Intervention::new("stage=attn_out,layer=3", Action::Zero)?;
    /// assert_eq!(ablate.to_string(), "stage=attn_out,layer=3 zero");
    /// # Ok::<(), model_trace::InterventionError>(())
    /// ```
    pub fn new(selector: &str, action: Action) -> Result<Self, InterventionError> {
        let selector =
            InterventionSelector::parse(selector).map_err(|error| InterventionError {
                entry: selector.to_owned(),
                reason: error.to_string(),
            })?;
        Ok(Self { selector, action })
    }

    /// Parses `MODEL_TRACE_PATCH`'s syntax: `SELECTOR ACTION[; SELECTOR ACTION ...]`, where
    /// the action is the last word of each entry (`zero`, `scale(F)`, `add(V1 V2 ...)`; see
    /// [`Action`]) and the selector everything before it. Empty entries are skipped.
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// let patch = model_trace::Intervention::parse_list(
    ///     "layer=7 zero; stage=mlp_out,layer=0..4 scale(0.5)",
    /// )?;
    /// assert_eq!(patch.len(), 2);
    /// # Ok::<(), model_trace::InterventionError>(())
    /// ```
    pub fn parse_list(text: &str) -> Result<Vec<Self>, InterventionError> {
        text.split(';')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(|entry| {
                let error = |reason: String| InterventionError {
                    entry: entry.to_owned(),
                    reason,
                };
                // The action is the last word, but `add(1 2 3)` holds spaces: split before
                // its opening parenthesis's word.
                let cut = match entry.rfind('(') {
                    Some(open) => entry[..open].rfind(char::is_whitespace),
                    None => entry.rfind(char::is_whitespace),
                };
                let Some(cut) = cut else {
                    return Err(error(
                        "expected `SELECTOR ACTION` (an action alone would change every \
                         layer's output; write `layer=0.. ACTION` to mean that)"
                            .to_owned(),
                    ));
                };
                let action = Action::parse(&entry[cut..]).map_err(error)?;
                Self::new(entry[..cut].trim(), action).map_err(|e| error(e.reason))
            })
            .collect()
    }

    /// What the intervention selects.
    pub fn selector(&self) -> &InterventionSelector {
        &self.selector
    }

    /// What it does.
    pub fn action(&self) -> &Action {
        &self.action
    }
}

impl fmt::Display for Intervention {
    /// `SELECTOR ACTION`, as `MODEL_TRACE_PATCH` takes it (a closure is `closure`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.selector, self.action)
    }
}

/// What an intervention did to one tensor.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Applied {
    /// The positions changed, inclusive; `None`: every row.
    pub(crate) positions: Option<[usize; 2]>,
    /// The L2 norm of the tensor before.
    pub(crate) before_l2: f32,
    /// The L2 norm of the change.
    pub(crate) delta_l2: f32,
    /// Where the new values came from (a reference's capture), if not from the action.
    pub(crate) source: Option<String>,
}

/// Applies `intervention` to `tensor`, seen at `site`, in a pass that starts at token position
/// `pass_position`. `Ok(None)`: its positions hold none of the tensor's rows, nothing changed.
pub(crate) fn apply(
    intervention: &Intervention,
    tensor: &mut dyn TraceTensor,
    site: &InterventionSite<'_>,
    pass_position: usize,
) -> Result<Option<Applied>, String> {
    let old = tensor.to_f32().map_err(|e| e.to_string())?.into_owned();
    let rows = match intervention.selector.positions() {
        None => None,
        Some((first, last)) => {
            let Some(selected) = selected_rows(site.shape, pass_position, first, last)? else {
                return Ok(None);
            };
            Some(selected)
        }
    };
    let mut new = old.clone();
    let source = intervention.action.apply(&mut new, site)?;
    if let Some(rows) = &rows {
        rows.restore_unselected(&mut new, &old);
    }
    let (mut before, mut delta) = (0f64, 0f64);
    for (&o, &n) in old.iter().zip(&new) {
        before += f64::from(o) * f64::from(o);
        let d = f64::from(n) - f64::from(o);
        delta += d * d;
    }
    tensor
        .overwrite(&new, site.shape)
        .map_err(|e| e.to_string())?;
    #[allow(clippy::cast_possible_truncation)]
    Ok(Some(Applied {
        positions: rows.map(|rows| [rows.first_position, rows.last_position]),
        before_l2: before.sqrt() as f32,
        delta_l2: delta.sqrt() as f32,
        source,
    }))
}

/// The rows (token positions) of a tensor that a `position=` range selects.
struct SelectedRows {
    /// Rows of one token dimension (the second-to-last), and values per row.
    rows: usize,
    width: usize,
    /// Indices into the token dimension, inclusive.
    first_row: usize,
    last_row: usize,
    first_position: usize,
    last_position: usize,
}

/// `None`: the range holds none of the rows. `Err`: the tensor has no token dimension.
fn selected_rows(
    shape: &[usize],
    pass_position: usize,
    first: usize,
    last: usize,
) -> Result<Option<SelectedRows>, String> {
    let [.., rows, width] = *shape else {
        return Err(format!(
            "`position=` needs a tensor of [.., seq, hidden]; this one has shape {shape:?}"
        ));
    };
    let end = pass_position.saturating_add(rows);
    let first_position = first.max(pass_position);
    let last_position = last.min(end.saturating_sub(1));
    if rows == 0 || first_position > last_position {
        return Ok(None);
    }
    Ok(Some(SelectedRows {
        rows,
        width,
        first_row: first_position - pass_position,
        last_row: last_position - pass_position,
        first_position,
        last_position,
    }))
}

impl SelectedRows {
    /// Puts `old`'s values back into `new` for every row outside the selection.
    fn restore_unselected(&self, new: &mut [f32], old: &[f32]) {
        if self.width == 0 {
            return;
        }
        let rows = new
            .chunks_exact_mut(self.width)
            .zip(old.chunks_exact(self.width));
        for (index, (new_row, old_row)) in rows.enumerate() {
            let row = index % self.rows;
            if row < self.first_row || row > self.last_row {
                new_row.copy_from_slice(old_row);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_lists_parse_entry_by_entry() {
        let list = Intervention::parse_list(
            " layer=7 zero ;; stage=mlp_out,layer=0..4 scale(0.5); layer=1 add(1 2 3) ",
        )
        .unwrap();
        let texts: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(
            texts,
            [
                "layer=7 zero",
                "stage=mlp_out,layer=0..4 scale(0.5)",
                "layer=1 add(1 2 3)"
            ]
        );
        for bad in [
            "zero",
            "layer=7 explode",
            "layer=x zero",
            "layer=1 scale(a)",
        ] {
            let error = Intervention::parse_list(bad).unwrap_err();
            assert!(error.to_string().contains(bad), "{bad}: {error}");
        }
    }

    #[test]
    fn positions_change_only_their_rows_and_are_counted_from_the_pass() {
        let intervention = Intervention::new("position=3..=4", Action::Zero).unwrap();
        // [batch 2, seq 3, hidden 2], a pass starting at position 2: rows are positions 2..=4.
        let mut tensor: Vec<f32> = (1..=12).map(|v| v as f32).collect();
        let shape = [2, 3, 2];
        let site = InterventionSite {
            pass: Some(0),
            layer: Some(0),
            stage: "output",
            shape: &shape,
        };
        let applied = apply(&intervention, &mut tensor, &site, 2)
            .unwrap()
            .unwrap();
        assert_eq!(
            tensor,
            [1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 7.0, 8.0, 0.0, 0.0, 0.0, 0.0]
        );
        assert_eq!(applied.positions, Some([3, 4]));
        let changed: f32 = [3f32, 4., 5., 6., 9., 10., 11., 12.]
            .iter()
            .map(|v| v * v)
            .sum();
        assert!((applied.delta_l2 - changed.sqrt()).abs() < 1e-4);
        // A range past the rows changes nothing.
        let later = Intervention::new("position=9..", Action::Zero).unwrap();
        assert_eq!(apply(&later, &mut tensor, &site, 2).unwrap(), None);
        // A vector has no token dimension.
        let mut flat = vec![1f32, 2.0];
        let flat_site = InterventionSite {
            shape: &[2],
            ..site
        };
        assert!(apply(&intervention, &mut flat, &flat_site, 0).is_err());
    }
}
