//! The examples' bug switch: `--inject-bug NAME[@LAYER][,NAME[@LAYER]...]`, porting bugs that
//! the tests inject, each in every layer (`NAME`) or in one (`NAME@LAYER`). Shared by the
//! examples (`#[path]`), each with its own list of bugs.

use std::sync::Mutex;

/// The bugs injected into this process, each with its layer (`None`: every layer).
pub(crate) struct BugSwitch<B: 'static> {
    injected: Mutex<Vec<(B, Option<usize>)>>,
}

impl<B: Copy + PartialEq + 'static> BugSwitch<B> {
    pub(crate) const fn new() -> Self {
        Self {
            injected: Mutex::new(Vec::new()),
        }
    }

    /// Parses `NAME[@LAYER][,NAME[@LAYER]...]` with `from_name`, and injects the bugs (in place
    /// of any injected before).
    pub(crate) fn inject_list(
        &self,
        text: &str,
        from_name: impl Fn(&str) -> Option<B>,
    ) -> Result<(), String> {
        let mut bugs = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, layer) = match item.split_once('@') {
                Some((name, layer)) => {
                    let layer = layer
                        .parse()
                        .map_err(|_| format!("`{item}`: `{layer}` is not a layer index"))?;
                    (name, Some(layer))
                }
                None => (item, None),
            };
            let bug = from_name(name).ok_or_else(|| format!("no bug named {name:?}"))?;
            bugs.push((bug, layer));
        }
        *self.lock() = bugs;
        Ok(())
    }

    /// Whether `bug` is injected, in any layer.
    pub(crate) fn injected(&self, bug: B) -> bool {
        self.lock().iter().any(|&(b, _)| b == bug)
    }

    /// Whether `bug` is injected in `layer` (or in every layer).
    pub(crate) fn injected_at(&self, bug: B, layer: usize) -> bool {
        self.lock()
            .iter()
            .any(|&(b, at)| b == bug && at.is_none_or(|at| at == layer))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(B, Option<usize>)>> {
        self.injected
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
