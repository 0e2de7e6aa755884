//! Step 3: checks that need the whole invocation: repeated arguments, the `QuantType` name, and
//! function shapes that cannot be traced. Every check reports on its own token.

use crate::ast::{Macro, Output, Param, TracedFn};
use crate::attr::{Args, InlineInput, Key};
use proc_macro2::Span;
use syn::spanned::Spanned as _;

/// The `QuantType` variants of trace-runtime, by their ggml names. Keep in the order of
/// `QuantType::ALL`: the UI case `tests/ui/pass/quant_type_names.rs` compares the two lists.
pub(crate) const QUANT_TYPES: &[&str] = &[
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K",
    "Q5_K", "Q6_K", "Q8_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S",
    "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4",
];

/// Collects errors so that one expansion reports all of them.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.0 {
            Some(first) => first.combine(error),
            None => self.0 = Some(error),
        }
    }

    pub(crate) fn check<T>(&mut self, result: syn::Result<T>) -> Option<T> {
        result.map_err(|error| self.push(error)).ok()
    }

    pub(crate) fn finish(self) -> syn::Result<()> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Both results, or every error of the two.
pub(crate) fn both<A, B>(a: syn::Result<A>, b: syn::Result<B>) -> syn::Result<(A, B)> {
    let mut errors = Errors::default();
    let a = errors.check(a);
    let b = errors.check(b);
    errors.finish()?;
    a.zip(b)
        .ok_or_else(|| syn::Error::new(Span::call_site(), "invalid macro input"))
}

impl TracedFn {
    pub(crate) fn validate(&self) -> syn::Result<()> {
        let mut errors = Errors::default();
        errors.check(check_args(&self.args));
        errors.check(check_not_const(self));
        errors.check(check_not_async(self));
        errors.check(check_returns_value(self));
        errors.check(check_reference_given(self));
        errors.check(check_params_named(self));
        errors.finish()
    }
}

impl InlineInput {
    pub(crate) fn validate(&self) -> syn::Result<()> {
        check_args(&self.args)
    }
}

fn check_args(args: &Args) -> syn::Result<()> {
    let mut errors = Errors::default();
    errors.check(check_repeats(args));
    errors.check(check_quant(args));
    errors.finish()
}

/// Each argument at most once. No two different arguments conflict today; a pair that did
/// would be rejected here too, so that the message names both.
fn check_repeats(args: &Args) -> syn::Result<()> {
    let mut errors = Errors::default();
    for (position, arg) in args.list.iter().enumerate() {
        if args.list[..position].iter().any(|seen| seen.key == arg.key) {
            let key = arg.key.as_str();
            errors.push(syn::Error::new(
                arg.key_span,
                format!("duplicate argument `{key}`"),
            ));
        }
    }
    errors.finish()
}

fn check_quant(args: &Args) -> syn::Result<()> {
    match args.quant() {
        Some(variant) if !QUANT_TYPES.contains(&variant.to_string().as_str()) => {
            Err(syn::Error::new(
                variant.span(),
                format!(
                    "unknown QuantType `{variant}` in `quant`; expected one of {}",
                    QUANT_TYPES.join(", ")
                ),
            ))
        }
        _ => Ok(()),
    }
}

fn check_not_const(traced: &TracedFn) -> syn::Result<()> {
    match &traced.func.sig.constness {
        Some(constness) => Err(syn::Error::new(
            constness.span,
            format!(
                "`{}` cannot trace a `const fn`: recording happens at run time",
                traced.mac.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Rejected rather than supported: a guard held across `.await` would move between threads
/// while the session it records into is thread-local.
fn check_not_async(traced: &TracedFn) -> syn::Result<()> {
    match &traced.func.sig.asyncness {
        Some(asyncness) => Err(syn::Error::new(
            asyncness.span,
            format!(
                "`{}` does not support `async fn`: sessions are per thread; \
                 trace the synchronous forward functions the future calls",
                traced.mac.display()
            ),
        )),
        None => Ok(()),
    }
}

/// Attention, logits and quantization error are read from the return value.
fn check_returns_value(traced: &TracedFn) -> syn::Result<()> {
    let what = match traced.mac {
        Macro::Attention => "attention probabilities",
        Macro::Logits => "logits",
        Macro::Quant => "output to compare with `reference`",
        _ => return Ok(()),
    };
    match traced.output {
        Output::Nothing => Err(syn::Error::new(
            traced.func.sig.ident.span(),
            format!(
                "`{}` records the returned {what}, but this function returns nothing",
                traced.mac.display()
            ),
        )),
        Output::Value { .. } => Ok(()),
    }
}

fn check_reference_given(traced: &TracedFn) -> syn::Result<()> {
    if traced.mac == Macro::Quant && traced.args.reference().is_none() {
        return Err(syn::Error::new(
            Span::call_site(),
            "missing argument `reference`: `#[trace_quant]` compares the output with \
             `reference = PATH`, a function taking the same arguments",
        ));
    }
    Ok(())
}

/// `reference` is called with the same arguments, so each must have a name to pass on.
fn check_params_named(traced: &TracedFn) -> syn::Result<()> {
    if traced.args.reference().is_none() {
        return Ok(());
    }
    let mut errors = Errors::default();
    for param in &traced.params {
        if let Param::Unnamed(pat) = param {
            errors.push(syn::Error::new(
                pat.span(),
                format!(
                    "argument `{}` passes every parameter on, but this parameter has no name; \
                     bind it to a name",
                    Key::Reference.as_str()
                ),
            ));
        }
    }
    errors.finish()
}
