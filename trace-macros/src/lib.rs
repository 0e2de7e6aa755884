//! Attribute macros of `model-trace`. Use them through the `model-trace` crate, whose
//! documentation describes what each macro records.
//!
//! Each invocation goes through four steps, one module each: `attr` parses the arguments,
//! `ast` reads the annotated function, `valid` rejects what cannot be traced, `expand` writes the
//! code. Without the `enabled` feature, `expand` returns the item unchanged; the first three steps
//! run either way, so a mistake is a compile error in both builds.

mod ast;
mod attr;
mod expand;
mod valid;

use ast::Macro;
use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;

// The macros are documented where users meet them: their re-exports in `model-trace`.

#[proc_macro_attribute]
pub fn trace_model(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::Model, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro_attribute]
pub fn trace_layer(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::Layer, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro_attribute]
pub fn trace_attention(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::Attention, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro_attribute]
pub fn trace_logits(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::Logits, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro_attribute]
pub fn trace_kv_cache(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::KvCache, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro_attribute]
pub fn trace_quant(args: TokenStream, item: TokenStream) -> TokenStream {
    let item = TokenStream2::from(item);
    expand::traced_fn(Macro::Quant, args.into(), &item)
        .unwrap_or_else(|error| expand::fallback(error, item))
        .into()
}

#[proc_macro]
pub fn trace_tensor(input: TokenStream) -> TokenStream {
    expand::inline(Macro::Tensor, input.into())
        .unwrap_or_else(expand::inline_fallback)
        .into()
}

#[proc_macro]
pub fn trace_attention_value(input: TokenStream) -> TokenStream {
    expand::inline(Macro::AttentionValue, input.into())
        .unwrap_or_else(expand::inline_fallback)
        .into()
}

#[proc_macro]
pub fn trace_logits_value(input: TokenStream) -> TokenStream {
    expand::inline(Macro::LogitsValue, input.into())
        .unwrap_or_else(expand::inline_fallback)
        .into()
}
