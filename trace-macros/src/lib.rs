//! Attribute macros of `model-trace`. Use them through the `model-trace` crate, whose
//! documentation describes what each macro records.
//!
//! Each invocation goes through four steps, one module each: `attr` parses the arguments,
//! `ast` reads the annotated function, `valid` rejects what cannot be traced, `expand` writes the
//! code. The first three run in both builds, so a mistake is a compile error in both; without the
//! `enabled` feature, `expand` returns the function as written, its arguments type-checked in a
//! closure that is never called.
//!
//! Imports run one way, down that list: `attr` imports none of the steps, `ast` only `attr`,
//! `valid` `attr` and `ast`, `expand` all of them. Below the steps, `kind` names the macro being
//! expanded and `errors` collects every mistake of one invocation.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod ast;
mod attr;
mod errors;
mod expand;
mod kind;
mod valid;

use expand::List;
use kind::{InlineMacro, Macro};
use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

/// Marks one forward pass; see `model_trace::trace_model`.
#[proc_macro_attribute]
pub fn trace_model(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Model, args, item)
}

/// Records one layer; see `model_trace::trace_layer`.
#[proc_macro_attribute]
pub fn trace_layer(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Layer, args, item)
}

/// Records returned attention probabilities; see `model_trace::trace_attention`.
#[proc_macro_attribute]
pub fn trace_attention(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Attention, args, item)
}

/// Records returned logits; see `model_trace::trace_logits`.
#[proc_macro_attribute]
pub fn trace_logits(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Logits, args, item)
}

/// Records one KV-cache step; see `model_trace::trace_kv_cache`.
#[proc_macro_attribute]
pub fn trace_kv_cache(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::KvCache, args, item)
}

/// Records quantization error against a reference; see `model_trace::trace_quant`.
#[proc_macro_attribute]
pub fn trace_quant(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Quant, args, item)
}

/// Records a mixture-of-experts router's choice; see `model_trace::trace_router`.
#[proc_macro_attribute]
pub fn trace_router(args: TokenStream, item: TokenStream) -> TokenStream {
    attribute(Macro::Router, args, item)
}

/// Records an intermediate tensor as a stage; see `model_trace::trace_tensor!`.
#[proc_macro]
pub fn trace_tensor(input: TokenStream) -> TokenStream {
    function_like(InlineMacro::Tensor, input)
}

/// Records an intermediate tensor as a stage and returns it, so that an intervention can
/// change it; see `model_trace::trace_stage!`.
#[proc_macro]
pub fn trace_stage(input: TokenStream) -> TokenStream {
    function_like(InlineMacro::Stage, input)
}

/// Records attention probabilities computed inline; see `model_trace::trace_attention_value!`.
#[proc_macro]
pub fn trace_attention_value(input: TokenStream) -> TokenStream {
    function_like(InlineMacro::AttentionValue, input)
}

/// Records logits computed inline; see `model_trace::trace_logits_value!`.
#[proc_macro]
pub fn trace_logits_value(input: TokenStream) -> TokenStream {
    function_like(InlineMacro::LogitsValue, input)
}

/// Records a router's choice computed inline; see `model_trace::trace_router_value!`.
#[proc_macro]
pub fn trace_router_value(input: TokenStream) -> TokenStream {
    function_like(InlineMacro::RouterValue, input)
}

/// The `TracepointKind` variants the macros register, as `&[&str]`. Not public API.
#[doc(hidden)]
#[proc_macro]
pub fn __tracepoint_kinds(input: TokenStream) -> TokenStream {
    list(List::TracepointKinds, input)
}

/// The `QuantType` names that `quant = ...` accepts, as `&[&str]`. Not public API.
#[doc(hidden)]
#[proc_macro]
pub fn __quant_types(input: TokenStream) -> TokenStream {
    list(List::QuantTypes, input)
}

/// The stage names that `trace_tensor!` refuses, as `&[&str]`. Not public API.
#[doc(hidden)]
#[proc_macro]
pub fn __reserved_stages(input: TokenStream) -> TokenStream {
    list(List::ReservedStages, input)
}

/// On error, the errors and the item as it came, so that the item raises no second error.
fn attribute(mac: Macro, args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::attribute(mac, args.into(), &item)
        .unwrap_or_else(|error| expand::with_item(error, item))
        .into()
}

fn function_like(mac: InlineMacro, input: TokenStream) -> TokenStream {
    expand::inline(mac, input.into())
        .unwrap_or_else(expand::inline_errors)
        .into()
}

fn list(list: List, input: TokenStream) -> TokenStream {
    expand::list(list, input.into())
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}
