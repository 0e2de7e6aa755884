//! The stage vocabulary: names with one exact meaning that both examples and the Python writer
//! use, so that a stage of one trace matches the same stage of another.

use std::fmt;

/// Declares the vocabulary once: the enum, its `ALL` and its names.
macro_rules! stages {
    ($($(#[doc = $doc:literal])* $variant:ident = $name:literal,)*) => {
        /// A stage of a transformer block with an exact meaning (TransformerLens names the same
        /// points `hook_resid_pre`, `hook_attn_out`, `hook_resid_mid`, `hook_mlp_out`,
        /// `hook_resid_post`).
        ///
        /// Stages are recorded by name (`trace_tensor!("attn_out", &t)`), and any other name is
        /// kept as the user's own; these are the names that mean the same thing in every trace
        /// (`docs/trace-format.md` has which family records which), and `model-trace check`
        /// checks that a trace's stages obey the identities they promise
        /// ([`stage_check`](crate::stage_check)). `input` and `output` are the layer's own
        /// input and output: `#[trace_layer]` records them, and `trace_tensor!` rejects them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Stage {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Stage {
            /// Every stage, in the order data flows through a block.
            pub const ALL: &'static [Stage] = &[$(Stage::$variant,)*];

            /// The name recorded in traces.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Stage::$variant => $name,)*
                }
            }
        }
    };
}

stages! {
    /// The residual stream entering the block (`resid_pre`): the layer's input. Layer 0's is
    /// the embeddings as the model scales them (Gemma's `√hidden`, Granite's multiplier): the
    /// record before the first layer.
    Input = "input",
    /// The output of the norm the attention reads (Llama's `input_layernorm`; a parallel
    /// block's attention norm).
    AttnIn = "attn_in",
    /// The query norm's output, where a family has one: per head (`[batch, seq, heads,
    /// head_dim]`, Gemma 3, Qwen 3) or over the whole projection (OLMo 2).
    QNorm = "q_norm",
    /// The key norm's output, shaped as [`QNorm`](Stage::QNorm).
    KNorm = "k_norm",
    /// The attention's output after its output projection, before any post-norm and the
    /// residual add.
    AttnOut = "attn_out",
    /// The output of the post-attention norm that joins the residual stream (Gemma 2/3's and
    /// OLMo 2's `post_attention_layernorm`).
    AttnPostNorm = "attn_post_norm",
    /// The stream between the two sub-blocks: `input` plus the attention branch
    /// (`attn_post_norm` where there is one, else `attn_out`); in post-norm blocks (BERT) the
    /// norm of that sum. Absent in parallel blocks.
    ResidMid = "resid_mid",
    /// The output of the norm the MLP reads (Llama's `post_attention_layernorm`, Gemma 2/3's
    /// `pre_feedforward_layernorm`).
    MlpIn = "mlp_in",
    /// The MLP's (or mixture of experts') output after its down projection, before any
    /// post-norm and the residual add.
    MlpOut = "mlp_out",
    /// The output of the post-MLP norm that joins the stream (Gemma 2/3's
    /// `post_feedforward_layernorm`, OLMo 2's).
    MlpPostNorm = "mlp_post_norm",
    /// The residual stream leaving the block (`resid_post`; in post-norm blocks, after the
    /// block's last norm): the layer's output.
    Output = "output",
}

impl Stage {
    /// The stage called `name`, if it is one of the vocabulary.
    pub fn from_name(name: &str) -> Option<Stage> {
        Self::ALL
            .iter()
            .copied()
            .find(|stage| stage.as_str() == name)
    }

    /// `input` and `output`, which belong to the layer record itself.
    pub fn is_layer_boundary(self) -> bool {
        matches!(self, Stage::Input | Stage::Output)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &stage in Stage::ALL {
            assert_eq!(Stage::from_name(stage.as_str()), Some(stage));
        }
        assert_eq!(Stage::from_name("post_attn"), None);
        assert!(Stage::Input.is_layer_boundary() && !Stage::MlpOut.is_layer_boundary());
    }
}
