//! Step 3: checks that need the whole invocation: a required argument, the `QuantType` name,
//! reserved stage names, and function shapes that cannot be traced. Every check reports on its
//! own token.

use crate::ast::{output, param, FnParts, Output, Param};
use crate::attr::{parse_args, FnArgs, Inline, InlineInput, QuantArgs, QuantAttrs};
use crate::errors::{both, Errors};
use crate::kind::Macro;
use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned as _;
use syn::{ExprPath, Ident, LitStr};

/// The `QuantType` variants of trace-runtime, by their ggml names. `tests/macro_lists.rs`
/// compares them with `QuantType::ALL` through `__quant_types!`.
pub(crate) const QUANT_TYPES: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4",
];

/// The stages that belong to the layer record itself (`Stage::is_layer_boundary` in the
/// runtime), compared by `tests/macro_lists.rs` through `__reserved_stages!`.
pub(crate) const RESERVED_STAGES: &[&str] = &["input", "output"];

impl FnArgs {
    /// Parses the arguments of an attribute, `#[trace_layer(index = i, name = "block")]`, and
    /// checks those of `#[trace_quant]`, which parsing alone cannot.
    pub(crate) fn parse(mac: Macro, tokens: TokenStream) -> syn::Result<Self> {
        let display = mac.display();
        match mac {
            Macro::Model => parse_args(display, tokens).map(FnArgs::Model),
            Macro::Layer => parse_args(display, tokens).map(FnArgs::Layer),
            Macro::Attention => parse_args(display, tokens).map(FnArgs::Attention),
            Macro::Logits => parse_args(display, tokens).map(FnArgs::Logits),
            Macro::KvCache => {
                parse_args(display, tokens).map(|args| FnArgs::KvCache(Box::new(args)))
            }
            Macro::Quant => parse_args(display, tokens)
                .and_then(QuantArgs::new)
                .map(FnArgs::Quant),
            Macro::Router => parse_args(display, tokens).map(|args| FnArgs::Router(Box::new(args))),
        }
    }
}

impl QuantArgs {
    pub(crate) fn new(attrs: QuantAttrs) -> syn::Result<Self> {
        let quant = attrs.quant.map(|variant| variant.0);
        let checked = both(reference_given(attrs.reference), quant_known(quant));
        let (reference, quant) = checked?;
        Ok(QuantArgs {
            reference,
            quant,
            name: attrs.name,
        })
    }
}

fn reference_given(reference: Option<ExprPath>) -> syn::Result<ExprPath> {
    reference.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing argument `reference`: `#[trace_quant]` compares the output with \
             `reference = PATH`, a function taking the same arguments",
        )
    })
}

fn quant_known(quant: Option<Ident>) -> syn::Result<Option<Ident>> {
    match quant {
        Some(variant) if !QUANT_TYPES.contains(&variant.to_string().as_str()) => {
            Err(syn::Error::new(
                variant.span(),
                format!(
                    "unknown QuantType `{variant}` in `quant`; expected one of {}",
                    QUANT_TYPES.join(", ")
                ),
            ))
        }
        quant => Ok(quant),
    }
}

/// The function shapes that `mac` cannot trace, checked whatever the arguments are, so that
/// one expansion reports the mistakes of both.
pub(crate) fn check_fn(mac: Macro, func: &FnParts) -> syn::Result<()> {
    let mut errors = Errors::default();
    errors.check(check_not_const(mac, func));
    errors.check(check_not_async(mac, func));
    errors.check(check_returns_value(mac, func));
    errors.check(check_params_named(mac, func));
    errors.finish()
}

impl InlineInput {
    pub(crate) fn validate(&self) -> syn::Result<()> {
        match &self.what {
            Inline::Tensor(stage) | Inline::Stage(stage) => check_stage_not_reserved(stage),
            Inline::Attention(_) | Inline::Logits(_) | Inline::Router(_) => Ok(()),
        }
    }
}

/// `input` and `output` are the layer's own, recorded by `#[trace_layer]`; the runtime would
/// refuse them.
fn check_stage_not_reserved(stage: &LitStr) -> syn::Result<()> {
    let name = stage.value();
    if RESERVED_STAGES.contains(&name.as_str()) {
        return Err(syn::Error::new(
            stage.span(),
            format!(
                "stage \"{name}\" is the layer's own {name}, which `#[trace_layer]` records; \
                 give this tensor another name"
            ),
        ));
    }
    Ok(())
}

fn check_not_const(mac: Macro, func: &FnParts) -> syn::Result<()> {
    match &func.sig.constness {
        Some(constness) => Err(syn::Error::new(
            constness.span,
            format!(
                "`{}` cannot trace a `const fn`: recording happens at run time",
                mac.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Rejected rather than supported: a guard held across `.await` would move between threads
/// while the session it records into is thread-local.
fn check_not_async(mac: Macro, func: &FnParts) -> syn::Result<()> {
    match &func.sig.asyncness {
        Some(asyncness) => Err(syn::Error::new(
            asyncness.span,
            format!(
                "`{}` does not support `async fn`: sessions are per thread; \
                 trace the synchronous forward functions the future calls",
                mac.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Attention, logits and quantization error are read from the return value.
fn check_returns_value(mac: Macro, func: &FnParts) -> syn::Result<()> {
    let what = match mac {
        Macro::Attention => "attention probabilities",
        Macro::Logits => "logits",
        Macro::Quant => "output to compare with `reference`",
        Macro::Router => "(logits, weights, experts)",
        Macro::Model | Macro::Layer | Macro::KvCache => return Ok(()),
    };
    match output(&func.sig.output) {
        Output::Nothing => Err(syn::Error::new(
            func.sig.ident.span(),
            format!(
                "`{}` records the returned {what}, but this function returns nothing",
                mac.display()
            ),
        )),
        Output::Value { .. } => Ok(()),
    }
}

/// `reference` is called with the same arguments, so each must have a name to pass on.
fn check_params_named(mac: Macro, func: &FnParts) -> syn::Result<()> {
    if mac != Macro::Quant {
        return Ok(());
    }
    let mut errors = Errors::default();
    for arg in &func.sig.inputs {
        if let Param::Unnamed(pat) = param(arg) {
            errors.push(syn::Error::new(
                pat.span(),
                "argument `reference` passes every parameter on, but this parameter has no \
                 name; bind it to a name",
            ));
        }
    }
    errors.finish()
}
