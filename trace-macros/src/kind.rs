//! Which macro is being expanded, and the `TracepointKind` each registers: named by every
//! step, so it sits below them all.

use proc_macro2::{Ident, Span};

/// Declares an enum of unit variants with `ALL`, every variant in order.
macro_rules! listed {
    ($(#[$doc:meta])* $vis:vis enum $name:ident { $($variant:ident,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        $vis enum $name {
            $($variant,)*
        }

        impl $name {
            $vis const ALL: &'static [$name] = &[$($name::$variant,)*];
        }
    };
}

listed! {
    /// One of the seven attribute macros.
    pub(crate) enum Macro {
        Model,
        Layer,
        Attention,
        Logits,
        KvCache,
        Quant,
        Router,
    }
}

listed! {
    /// One of the five function-like macros.
    pub(crate) enum InlineMacro {
        Tensor,
        Stage,
        AttentionValue,
        LogitsValue,
        RouterValue,
    }
}

/// The `TracepointKind` variant a callsite registers as.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Model,
    Layer,
    Attention,
    Logits,
    KvCache,
    Quant,
    Tensor,
    Router,
}

impl Kind {
    /// The variant's name in the runtime.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Model => "Model",
            Kind::Layer => "Layer",
            Kind::Attention => "Attention",
            Kind::Logits => "Logits",
            Kind::KvCache => "KvCache",
            Kind::Quant => "Quant",
            Kind::Tensor => "Tensor",
            Kind::Router => "Router",
        }
    }

    pub(crate) fn ident(self) -> Ident {
        Ident::new(self.name(), Span::call_site())
    }

    /// Every kind that some macro registers, in the order of the macros.
    pub(crate) fn registered() -> Vec<Kind> {
        let mut kinds: Vec<Kind> = Vec::new();
        let all = Macro::ALL.iter().map(|mac| mac.kind());
        for kind in all.chain(InlineMacro::ALL.iter().map(|mac| mac.kind())) {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        kinds
    }
}

impl Macro {
    /// How the user wrote it, for error messages.
    pub(crate) fn display(self) -> &'static str {
        match self {
            Macro::Model => "#[trace_model]",
            Macro::Layer => "#[trace_layer]",
            Macro::Attention => "#[trace_attention]",
            Macro::Logits => "#[trace_logits]",
            Macro::KvCache => "#[trace_kv_cache]",
            Macro::Quant => "#[trace_quant]",
            Macro::Router => "#[trace_router]",
        }
    }

    pub(crate) fn kind(self) -> Kind {
        match self {
            Macro::Model => Kind::Model,
            Macro::Layer => Kind::Layer,
            Macro::Attention => Kind::Attention,
            Macro::Logits => Kind::Logits,
            Macro::KvCache => Kind::KvCache,
            Macro::Quant => Kind::Quant,
            Macro::Router => Kind::Router,
        }
    }
}

impl InlineMacro {
    /// How the user wrote it, for error messages.
    pub(crate) fn display(self) -> &'static str {
        match self {
            InlineMacro::Tensor => "trace_tensor!",
            InlineMacro::Stage => "trace_stage!",
            InlineMacro::AttentionValue => "trace_attention_value!",
            InlineMacro::LogitsValue => "trace_logits_value!",
            InlineMacro::RouterValue => "trace_router_value!",
        }
    }

    pub(crate) fn kind(self) -> Kind {
        match self {
            InlineMacro::Tensor | InlineMacro::Stage => Kind::Tensor,
            InlineMacro::AttentionValue => Kind::Attention,
            InlineMacro::LogitsValue => Kind::Logits,
            InlineMacro::RouterValue => Kind::Router,
        }
    }
}
