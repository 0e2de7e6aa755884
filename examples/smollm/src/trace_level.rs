//! How much model-trace records during generation, as the `--trace` flag of the CLI and of the
//! benchmark's decode worker names it.

use model_trace::ModelTracerConfig;
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceLevel {
    /// No session: the annotations only check that none is active.
    Off,
    /// Activations and the KV cache.
    Lightweight,
    /// Everything but the quantization error, whose f32 reference matmuls dominate `Full`'s
    /// cost; the benchmark compares the two.
    FullNoQuant,
    Full,
}

impl TraceLevel {
    /// Tracing is on by default only where it was compiled in, and then records everything, so
    /// a run shows attention sinks and quantization error; 16 tokens take seconds either way.
    pub const DEFAULT: Self = if cfg!(feature = "trace") {
        Self::Full
    } else {
        Self::Off
    };

    /// Each level with the name `--trace` gives it.
    const NAMED: [(Self, &'static str); 4] = [
        (Self::Off, "off"),
        (Self::Lightweight, "lightweight"),
        (Self::FullNoQuant, "full-noquant"),
        (Self::Full, "full"),
    ];

    pub fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(level, _)| *level == self)
            .map_or("", |&(_, name)| name)
    }

    /// The session's configuration; `None` for no session.
    pub fn config(self) -> Option<ModelTracerConfig> {
        match self {
            Self::Off => None,
            Self::Lightweight => Some(ModelTracerConfig::lightweight()),
            Self::FullNoQuant => Some(ModelTracerConfig {
                trace_quant_error: false,
                ..ModelTracerConfig::full()
            }),
            Self::Full => Some(ModelTracerConfig::full()),
        }
    }

    /// The level to run at: `self` where tracing was compiled in, else `Off` with a note on
    /// stderr when something else was asked for.
    pub fn effective(self) -> Self {
        if cfg!(feature = "trace") || self == Self::Off {
            self
        } else {
            eprintln!("note: built without `--features trace`; --trace has nothing to record");
            Self::Off
        }
    }
}

impl FromStr for TraceLevel {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::NAMED
            .iter()
            .find(|(_, known)| *known == name)
            .map(|&(level, _)| level)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::NAMED.iter().map(|&(_, known)| known).collect();
                format!("--trace takes {}, not {name:?}", names.join(", "))
            })
    }
}

impl fmt::Display for TraceLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::TraceLevel;

    #[test]
    fn names_round_trip() {
        for (level, name) in TraceLevel::NAMED {
            assert_eq!(level.to_string(), name);
            assert_eq!(name.parse::<TraceLevel>(), Ok(level));
        }
        assert!("everything".parse::<TraceLevel>().is_err());
    }
}
