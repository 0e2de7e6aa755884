//! What an intervention does to the values it selects: [`Action`].

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use super::reference::ReferenceCaptures;

/// Where an intervention fires: what a closure ([`Action::closure`]) is told besides the values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterventionSite<'a> {
    /// The forward pass, if one is open.
    pub pass: Option<usize>,
    /// The layer, if one is open.
    pub layer: Option<usize>,
    /// A layer's `input` or `output`, or the stage's name.
    pub stage: &'a str,
    /// The tensor's shape; the values are row-major.
    pub shape: &'a [usize],
}

/// The function of [`Action::closure`].
type Closure = dyn Fn(&mut [f32], &InterventionSite<'_>) + Send + Sync;

/// What an intervention does to the tensor it selects. The values are changed as `f32` and
/// written back in the tensor's own element type and device
/// ([`TraceTensor::overwrite`](crate::TraceTensor::overwrite)).
///
/// As text (`MODEL_TRACE_PATCH`): `zero`, `scale(F)`, `add(V1 V2 ...)`, `add(FILE[:TENSOR])`
/// (a steering vector saved as an `F32` safetensors tensor), `replace(FILE)`,
/// `replace(FILE,pass=N)`.
#[derive(Clone)]
#[non_exhaustive]
pub enum Action {
    /// Every selected value becomes 0 (ablation).
    Zero,
    /// Every selected value is multiplied by the factor.
    Scale(f32),
    /// The vector is added to each selected row (steering): its length is the tensor's last
    /// dimension.
    Add(Arc<[f32]>),
    /// [`Add`](Self::Add) of a vector read from a file, which it is written as.
    AddFrom {
        /// The vector.
        vector: Arc<[f32]>,
        /// `FILE` or `FILE:TENSOR`, as given.
        source: String,
    },
    /// The values the reference trace captured at the same pass, layer and stage take the
    /// place of the program's (activation patching; what isolation does to every layer's
    /// input): see [`Action::replace`].
    Replace(Arc<ReferenceCaptures>),
    /// A function of the user's changes the values in place (see [`Action::closure`]).
    Closure(Arc<Closure>),
}

impl Action {
    /// An action that runs `change` on the tensor's values (row-major `f32`, all of them: rows
    /// outside a selector's `position=` are put back afterwards).
    ///
    /// ```
    /// # use trace_runtime as model_trace;
    /// use model_trace::Action;
    /// // Clamp the residual stream, as a test of what outliers do.
    /// let clamp = Action::closure(|values, _site| {
    ///     values.iter_mut().for_each(|v| *v = v.clamp(-10.0, 10.0));
    /// });
    /// # let _ = clamp;
    /// ```
    pub fn closure(
        change: impl Fn(&mut [f32], &InterventionSite<'_>) + Send + Sync + 'static,
    ) -> Self {
        Self::Closure(Arc::new(change))
    }

    /// The tensors captured in the trace at `path` replace those the program computes, matched
    /// by pass, layer and stage (a Rust- or Python-written trace, recorded with captures:
    /// `MODEL_TRACE_CAPTURE=layer:*`, or `capture="layer:*"` in Python). A tensor the reference
    /// did not capture, or one of another element count, is an error of the tracepoint.
    ///
    /// # Errors
    ///
    /// The trace cannot be read, or it holds no captured tensor.
    pub fn replace(path: impl AsRef<Path>) -> Result<Self, String> {
        ReferenceCaptures::open(path.as_ref()).map(|reference| Self::Replace(Arc::new(reference)))
    }

    /// [`replace`](Self::replace) from the reference's pass `pass` in every pass of the
    /// program: one clean run patched into each of many corrupted runs (causal tracing).
    ///
    /// # Errors
    ///
    /// As [`replace`](Self::replace), or the reference captured nothing in `pass`.
    pub fn replace_from_pass(path: impl AsRef<Path>, pass: usize) -> Result<Self, String> {
        let reference = ReferenceCaptures::open(path.as_ref())?.from_pass(pass)?;
        Ok(Self::Replace(Arc::new(reference)))
    }

    /// Parses `zero`, `scale(F)`, `add(V1 V2 ...)` (values separated by spaces or commas),
    /// `add(FILE[:TENSOR])` ([`add_from`](Self::add_from)), `replace(FILE)` or
    /// `replace(FILE,pass=N)` ([`replace`](Self::replace), [`replace_from_pass`](Self::replace_from_pass);
    /// both read the trace's captures now).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text == "zero" {
            return Ok(Self::Zero);
        }
        let call = |name: &str| {
            text.strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('('))
                .and_then(|rest| rest.strip_suffix(')'))
        };
        let number = |s: &str| {
            s.trim()
                .parse::<f32>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("`{s}` is not a finite number (in `{text}`)"))
        };
        if let Some(inside) = call("replace") {
            return match inside.rsplit_once(",pass=") {
                Some((path, pass)) => {
                    let pass = pass
                        .trim()
                        .parse()
                        .map_err(|_| format!("`{pass}` is not a pass (in `{text}`)"))?;
                    Self::replace_from_pass(path.trim(), pass)
                }
                None => Self::replace(inside.trim()),
            };
        }
        if let Some(factor) = call("scale") {
            return number(factor).map(Self::Scale);
        }
        if let Some(vector) = call("add") {
            if vector.contains(|c: char| c.is_ascii_alphabetic() && !"eE".contains(c))
                || vector.contains(['/', '\\'])
            {
                return Self::add_from(vector.trim());
            }
            let values = vector
                .split([' ', ','])
                .filter(|v| !v.is_empty())
                .map(number)
                .collect::<Result<Vec<f32>, _>>()?;
            if values.is_empty() {
                return Err(format!("`{text}` adds no values"));
            }
            return Ok(Self::Add(values.into()));
        }
        Err(format!(
            "unknown action `{text}` (expected zero, scale(F), add(V1 V2 ...) or replace(FILE))"
        ))
    }

    /// Adds the vector that `FILE[:TENSOR]` holds (an `F32` safetensors tensor, of any shape:
    /// its values in order; `TENSOR` may be left out when it is the file's only one) to each
    /// selected row.
    ///
    /// # Errors
    ///
    /// The file cannot be read, or does not hold that tensor as `F32`.
    pub fn add_from(source: &str) -> Result<Self, String> {
        // A Windows drive's `C:` is no tensor name: split at the last `:` after the file name.
        let (path, name) = match source.rsplit_once(':') {
            Some((path, name)) if !name.contains(['/', '\\']) && !path.is_empty() => {
                (path, Some(name))
            }
            _ => (source, None),
        };
        let (_, values) = crate::format::read_f32_tensor(Path::new(path), name)
            .map_err(|e| format!("add({source}): {e}"))?;
        Ok(Self::AddFrom {
            vector: values.into(),
            source: source.to_owned(),
        })
    }

    /// Changes `values` (of `site.shape`, row-major) in place; where the new values came
    /// from, when not from the action itself. `Err`: why the action does not fit the tensor.
    pub(crate) fn apply(
        &self,
        values: &mut [f32],
        site: &InterventionSite<'_>,
    ) -> Result<Option<String>, String> {
        match self {
            Self::Replace(reference) => {
                let (replayed, source) = reference.values(site.pass, site.layer, site.stage)?;
                if replayed.len() != values.len() {
                    return Err(format!(
                        "{source} holds {} values, this tensor {} (shape {:?})",
                        replayed.len(),
                        values.len(),
                        site.shape
                    ));
                }
                values.copy_from_slice(&replayed);
                return Ok(Some(source));
            }
            Self::Zero => values.fill(0.0),
            Self::Scale(factor) => values.iter_mut().for_each(|v| *v *= factor),
            Self::Add(vector) | Self::AddFrom { vector, .. } => {
                let width = site.shape.last().copied().unwrap_or(1);
                if vector.len() != width {
                    return Err(format!(
                        "add: a vector of {} values for rows of {width} (shape {:?})",
                        vector.len(),
                        site.shape
                    ));
                }
                for row in values.chunks_exact_mut(width.max(1)) {
                    row.iter_mut().zip(vector.iter()).for_each(|(v, a)| *v += a);
                }
            }
            Self::Closure(change) => change(values, site),
        }
        Ok(None)
    }
}

impl fmt::Display for Action {
    /// As `MODEL_TRACE_PATCH` writes it; a closure is `closure`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Zero => f.write_str("zero"),
            Self::Scale(factor) => write!(f, "scale({factor})"),
            Self::Add(vector) => {
                f.write_str("add(")?;
                for (i, v) in vector.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str(")")
            }
            Self::AddFrom { source, .. } => write!(f, "add({source})"),
            Self::Replace(reference) => match reference.pass() {
                Some(pass) => write!(f, "replace({},pass={pass})", reference.path().display()),
                None => write!(f, "replace({})", reference.path().display()),
            },
            Self::Closure(_) => f.write_str("closure"),
        }
    }
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Action({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(shape: &[usize]) -> InterventionSite<'_> {
        InterventionSite {
            pass: Some(0),
            layer: Some(1),
            stage: "output",
            shape,
        }
    }

    #[test]
    fn actions_parse_and_print_as_written() {
        for text in ["zero", "scale(0.5)", "add(1 -2 0.25)"] {
            assert_eq!(Action::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(
            Action::parse(" add(1, 2) ").unwrap().to_string(),
            "add(1 2)"
        );
        for bad in [
            "",
            "zeros",
            "scale()",
            "scale(nan)",
            "scale(1",
            "add()",
            "add(x)",
        ] {
            assert!(Action::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn actions_change_the_values() {
        let shape = [2, 3];
        let mut values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        Action::Scale(2.0)
            .apply(&mut values, &site(&shape))
            .unwrap();
        assert_eq!(values, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
        let add = Action::parse("add(1 0 -1)").unwrap();
        add.apply(&mut values, &site(&shape)).unwrap();
        assert_eq!(values, [3.0, 4.0, 5.0, 9.0, 10.0, 11.0]);
        let too_short = Action::parse("add(1 2)").unwrap();
        assert!(too_short.apply(&mut values, &site(&shape)).is_err());
        Action::Zero.apply(&mut values, &site(&shape)).unwrap();
        assert_eq!(values, [0.0; 6]);
        let seen = Action::closure(|values, site| {
            values[0] = site.layer.unwrap() as f32;
        });
        seen.apply(&mut values, &site(&shape)).unwrap();
        assert_eq!(values[0], 1.0);
    }
}
