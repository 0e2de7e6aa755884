//! Names of compared tensors, and the maps that rename one trace's names into another's.
//!
//! A tensor of a trace has the full name `layer.{L}.{name}`: `name` is a stage (`attn_out`,
//! `input`, a module path such as `self_attn`), `attention` or `logits`. A [`NameMap`] is a
//! list of rules `FROM = TO` over the full names of stages, where `{i}` stands for a layer
//! index on both sides; a rule renames every stage it matches, in either trace (attention and
//! logits records are matched as such, whatever the map says).

use std::fmt;

/// A renaming rule: `FROM = TO`, `{i}` standing for a layer index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameRule {
    from: String,
    to: String,
}

/// Rules applied in order; the first that matches renames a name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameMap {
    rules: Vec<NameRule>,
}

/// A map that does not parse, with the line that says why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameMapError {
    /// 1-based line of the map's text.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for NameMapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.reason)
    }
}

impl std::error::Error for NameMapError {}

// The presets' rules, generated from the Python package's family files.
mod presets;

impl NameMap {
    /// The identity.
    pub fn identity() -> Self {
        Self::default()
    }

    /// The presets: `llama` and `bert`, the module names of transformers' blocks (as the
    /// Python writer records them with `names="modules"`, and as converted
    /// `model_addition_debugger_context` traces have them) in the stage vocabulary. Their rules
    /// come from the family files of the Python package (`python/model_trace/families/`), which
    /// the Python tracer reads too.
    pub fn preset(name: &str) -> Option<Self> {
        let (_, rules) = presets::PRESETS
            .iter()
            .find(|(preset, _)| *preset == name)?;
        Self::parse(rules).ok()
    }

    /// Names of the presets.
    pub const PRESETS: [&'static str; presets::PRESETS.len()] = preset_names();

    /// Parses rules, one per line: `FROM = TO`; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Self, NameMapError> {
        let mut rules = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let error = |reason: &str| NameMapError {
                line: number + 1,
                reason: reason.to_owned(),
            };
            let (from, to) = line
                .split_once('=')
                .ok_or_else(|| error("expected `FROM = TO`"))?;
            let (from, to) = (from.trim(), to.trim());
            if from.is_empty() || to.is_empty() {
                return Err(error("both sides of `=` need a name"));
            }
            if from.matches("{i}").count() > 1 || to.matches("{i}").count() > 1 {
                return Err(error("`{i}` may stand once on each side"));
            }
            if to.contains("{i}") && !from.contains("{i}") {
                return Err(error("`{i}` on the right needs one on the left"));
            }
            rules.push(NameRule {
                from: from.to_owned(),
                to: to.to_owned(),
            });
        }
        Ok(Self { rules })
    }

    /// Adds the rules of `other` after these.
    #[must_use]
    pub fn then(mut self, other: NameMap) -> Self {
        self.rules.extend(other.rules);
        self
    }

    /// The name `full` maps to (itself when no rule matches).
    pub fn rename(&self, full: &str) -> String {
        for rule in &self.rules {
            if let Some(index) = matches(&rule.from, full) {
                return match index {
                    Some(i) => rule.to.replace("{i}", &i.to_string()),
                    None => rule.to.clone(),
                };
            }
        }
        full.to_owned()
    }

    /// Whether there are no rules.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// The first element of each preset, in a constant.
const fn preset_names() -> [&'static str; presets::PRESETS.len()] {
    let mut names = [""; presets::PRESETS.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = presets::PRESETS[i].0;
        i += 1;
    }
    names
}

/// `Some(Some(i))` when `pattern` (with `{i}`) matches `name` with index `i`, `Some(None)` when a
/// pattern without `{i}` equals `name`, `None` otherwise.
fn matches(pattern: &str, name: &str) -> Option<Option<usize>> {
    let Some((before, after)) = pattern.split_once("{i}") else {
        return (pattern == name).then_some(None);
    };
    let digits = name.strip_prefix(before)?.strip_suffix(after)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Some)
}

/// `layer.{layer}.{name}`.
pub fn full_name(layer: usize, name: &str) -> String {
    format!("layer.{layer}.{name}")
}

/// The layer and name of `layer.{L}.{name}`; `None` for anything else.
pub fn split_full_name(full: &str) -> Option<(usize, &str)> {
    let rest = full.strip_prefix("layer.")?;
    let (layer, name) = rest.split_once('.')?;
    Some((layer.parse().ok()?, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_rename_with_the_layer_index() {
        let map = NameMap::parse(
            "# ours = theirs\nlayer.{i}.post_attn = layer.{i}.resid_mid\n\nlayer.30.logits = layer.{i}.x\n",
        );
        assert!(map.is_err(), "{{i}} on the right needs one on the left");
        let map =
            NameMap::parse("layer.{i}.post_attn = layer.{i}.resid_mid\nlogits = layer.30.logits")
                .unwrap();
        assert_eq!(map.rename("layer.12.post_attn"), "layer.12.resid_mid");
        assert_eq!(map.rename("layer.x.post_attn"), "layer.x.post_attn");
        assert_eq!(map.rename("logits"), "layer.30.logits");
        assert_eq!(map.rename("layer.3.attn_out"), "layer.3.attn_out");
        let error = NameMap::parse("\nnonsense").unwrap_err();
        assert_eq!(error.line, 2);
    }

    #[test]
    fn presets_speak_the_stage_vocabulary() {
        let llama = NameMap::preset("llama").unwrap();
        assert_eq!(
            llama.rename("layer.4.post_attention_layernorm:input"),
            "layer.4.resid_mid"
        );
        assert_eq!(llama.rename("layer.4.self_attn"), "layer.4.attn_out");
        let bert = NameMap::preset("bert").unwrap();
        assert_eq!(
            bert.rename("layer.0.attention.output.dense"),
            "layer.0.attn_out"
        );
        assert!(NameMap::preset("gpt").is_none());
        assert_eq!(NameMap::PRESETS, ["llama", "bert"]);
        assert_eq!(
            split_full_name("layer.12.mlp.down_proj"),
            Some((12, "mlp.down_proj"))
        );
        assert_eq!(split_full_name("logits"), None);
    }

    #[test]
    fn every_preset_renames_module_names_to_the_stage_vocabulary() {
        for name in NameMap::PRESETS {
            let map = NameMap::preset(name).unwrap();
            assert!(!map.is_empty(), "{name}");
            for rule in &map.rules {
                let (from, to) = (rule.from.replace("{i}", "7"), rule.to.replace("{i}", "7"));
                assert_eq!(map.rename(&from), to);
                let (_, stage) = split_full_name(&to).unwrap();
                assert!(
                    crate::record::Stage::from_name(stage).is_some(),
                    "--map {name}: {} renames to {stage}, not a stage of the vocabulary",
                    rule.from
                );
            }
        }
    }
}
