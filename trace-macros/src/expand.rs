//! Step 4: generate code. Without the `enabled` feature the validated item is returned as it
//! came (inline macros become dead code that only borrows their arguments), so a build without
//! tracing compiles to the same machine code as one without the annotations.
//!
//! With `enabled`, a function keeps its signature and its body: the body moves into a block
//! (labeled when a `return` had to become a `break`), preceded by a static callsite and a guard,
//! followed by the recording of the output. Nothing is wrapped in a closure.

use crate::ast::{parse_fn, Macro, Output, Param, TracedFn};
use crate::attr::{parse_args, parse_inline, InlineInput, Key};
use crate::valid::both;
use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned, ToTokens};
use syn::spanned::Spanned as _;
use syn::visit_mut::{self, VisitMut};
use syn::{AttrStyle, Block, Expr, ExprBreak, Ident, Item, Lifetime, LitStr, Token};

const ENABLED: bool = cfg!(feature = "enabled");

/// Lints that the casts of user expressions (`(index) as usize`) trigger for some types.
fn allow_casts() -> TokenStream {
    quote! {
        #[allow(
            trivial_numeric_casts,
            clippy::unnecessary_cast,
            clippy::cast_lossless,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
    }
}

/// An attribute macro: validate, then return the item or its traced version.
pub(crate) fn traced_fn(
    mac: Macro,
    args: TokenStream,
    item: &TokenStream,
) -> syn::Result<TokenStream> {
    let (args, func) = both(parse_args(mac, args), parse_fn(mac, item))?;
    let traced = TracedFn::new(mac, args, func);
    traced.validate()?;
    if !ENABLED {
        return Ok(item.clone());
    }
    Ok(traced.expand())
}

/// The error and the untouched item, so that the item's other uses raise no second error.
pub(crate) fn fallback(error: syn::Error, item: TokenStream) -> TokenStream {
    let mut tokens = error.into_compile_error();
    tokens.extend(item);
    tokens
}

/// An inline macro: validate, then trace the value or only borrow it.
pub(crate) fn inline(mac: Macro, tokens: TokenStream) -> syn::Result<TokenStream> {
    let input = parse_inline(mac, tokens)?;
    input.validate()?;
    if !ENABLED {
        return Ok(input.compiled_out());
    }
    Ok(input.expand(mac))
}

/// Several `compile_error!`s are statements, so they go in a block to stand as one expression.
pub(crate) fn inline_fallback(error: syn::Error) -> TokenStream {
    let errors = error.into_compile_error();
    quote!({ #errors })
}

impl TracedFn {
    fn expand(&self) -> TokenStream {
        let func = &self.func;
        let outer = func
            .attrs
            .iter()
            .filter(|a| matches!(a.style, AttrStyle::Outer));
        let inner = func
            .attrs
            .iter()
            .filter(|a| matches!(a.style, AttrStyle::Inner(_)));
        let (vis, sig) = (&func.vis, &func.sig);
        let callsite = callsite(
            self.mac,
            &self.tracepoint_name(),
            &self.function_name(),
            sig.ident.span(),
        );
        let prologue = self.prologue();
        let epilogue = self.epilogue();
        let body = self.body(epilogue.is_some());
        quote! {
            #(#outer)*
            #vis #sig {
                #(#inner)*
                #callsite
                #prologue
                #body
                #epilogue
            }
        }
    }

    /// The user's statements. When code follows them, returns become breaks out of the block
    /// and the value is kept in `__trace_out`, annotated with the return type so that tail
    /// expressions such as `.collect()` still infer.
    fn body(&self, code_follows: bool) -> TokenStream {
        let mut block = (*self.func.block).clone();
        NameInlineMacros::apply(&mut block, &self.function_name());
        if !code_follows {
            return block.into_token_stream();
        }
        let label = ReturnToBreak::rewrite(&mut block).then(|| {
            let label = body_label();
            quote!(#label:)
        });
        match &self.output {
            Output::Nothing => quote!(#label #block),
            Output::Value { ty, annotate: true } => quote!(let __trace_out: #ty = #label #block;),
            Output::Value {
                annotate: false, ..
            } => quote!(let __trace_out = #label #block;),
        }
    }

    fn prologue(&self) -> TokenStream {
        match self.mac {
            Macro::Model => self.model_guard(),
            Macro::Layer => self.layer_guard(),
            Macro::Quant => self.reference_call(),
            _ => TokenStream::new(),
        }
    }

    /// What runs after the body; `None` when nothing does, so the body stays as it was.
    fn epilogue(&self) -> Option<TokenStream> {
        let has_output = matches!(self.output, Output::Value { .. });
        match self.mac {
            Macro::Layer if has_output => Some(layer_output()),
            Macro::Attention => Some(self.record_output("record_attention")),
            Macro::Logits => Some(self.record_output("record_logits")),
            Macro::KvCache => Some(self.kv_cache_step(has_output)),
            Macro::Quant => Some(quant_record(self.args.quant())),
            _ => None,
        }
    }

    fn model_guard(&self) -> TokenStream {
        let position = cast_arg(self.args.expr(Key::Position), "usize");
        let allow_casts = allow_casts();
        quote! {
            let __trace_guard = if __TRACE_CALLSITE.is_active() {
                #allow_casts
                let __trace_position = #position;
                ::model_trace::__private::ModelGuard::enter(&__TRACE_CALLSITE, __trace_position)
            } else {
                ::model_trace::__private::ModelGuard::inactive()
            };
        }
    }

    fn layer_guard(&self) -> TokenStream {
        let allow_casts = allow_casts();
        let index = cast_arg(self.args.expr(Key::Index), "usize");
        let input = self.args.expr(Key::Input).map_or_else(
            || first_tensor(&self.input_candidates().collect::<Vec<_>>()),
            probe,
        );
        let mutability = matches!(self.output, Output::Value { .. }).then(|| quote!(mut));
        quote! {
            let __trace_active = __TRACE_CALLSITE.is_active();
            let #mutability __trace_guard = if __trace_active {
                #allow_casts
                let __trace_index = #index;
                ::model_trace::__private::LayerGuard::enter(&__TRACE_CALLSITE, __trace_index, #input)
            } else {
                ::model_trace::__private::LayerGuard::inactive()
            };
        }
    }

    /// Calls `reference` with the same arguments before the body can move them.
    fn reference_call(&self) -> TokenStream {
        let reference = self.args.reference();
        let args = self.params.iter().filter_map(|param| match param {
            Param::Receiver(self_token) => Some(self_token.to_token_stream()),
            Param::Named(ident) => Some(ident.to_token_stream()),
            Param::Unnamed(_) => None,
        });
        quote! {
            #[allow(clippy::used_underscore_binding)]
            let __trace_reference = if __TRACE_CALLSITE.is_active() {
                ::core::option::Option::Some(#reference(#(#args),*))
            } else {
                ::core::option::Option::None
            };
        }
    }

    fn record_output(&self, record: &str) -> TokenStream {
        let allow_casts = allow_casts();
        let record = Ident::new(record, Span::call_site());
        let layer = cast_arg(self.args.expr(Key::Layer), "usize");
        quote! {
            if __TRACE_CALLSITE.is_active() {
                #allow_casts
                let __trace_layer = #layer;
                ::model_trace::__private::#record(
                    &__TRACE_CALLSITE,
                    __trace_layer,
                    ::model_trace::__private::probe!(&__trace_out),
                );
            }
            __trace_out
        }
    }

    fn kv_cache_step(&self, has_output: bool) -> TokenStream {
        let allow_casts = allow_casts();
        let field = |key: Key, ty: &str| cast_arg(self.args.expr(key), ty);
        let layer = field(Key::Layer, "usize");
        let (len, capacity, bytes) = (
            field(Key::Len, "usize"),
            field(Key::Capacity, "usize"),
            field(Key::Bytes, "usize"),
        );
        let (evictions, hit_rate) = (field(Key::Evictions, "usize"), field(Key::HitRate, "f32"));
        let tail = has_output.then(|| quote!(__trace_out));
        quote! {
            if __TRACE_CALLSITE.is_active() {
                #allow_casts
                let __trace_step = ::model_trace::__private::KvCacheStep {
                    layer: #layer,
                    len: #len,
                    capacity: #capacity,
                    bytes: #bytes,
                    evictions: #evictions,
                    hit_rate: #hit_rate,
                };
                ::model_trace::__private::record_kv_cache(&__TRACE_CALLSITE, __trace_step);
            }
            #tail
        }
    }
}

fn layer_output() -> TokenStream {
    quote! {
        if __trace_active {
            __trace_guard.output(::model_trace::__private::probe!(&__trace_out));
        }
        __trace_out
    }
}

fn quant_record(quant: Option<&Ident>) -> TokenStream {
    let quant = quant.map_or_else(
        || quote!(::core::option::Option::None),
        |variant| {
            quote_spanned!(variant.span()=>
                ::core::option::Option::Some(::model_trace::__private::QuantType::#variant))
        },
    );
    quote! {
        if let ::core::option::Option::Some(__trace_reference) = __trace_reference {
            ::model_trace::__private::record_quant(
                &__TRACE_CALLSITE,
                #quant,
                ::model_trace::__private::probe!(&__trace_out),
                ::model_trace::__private::probe!(&__trace_reference),
            );
        }
        __trace_out
    }
}

/// The static tracepoint and its registration. `line!()` carries the function name's span so
/// the tracepoint points at the `fn` line rather than at the attribute.
fn callsite(mac: Macro, name: &str, function: &str, line_span: Span) -> TokenStream {
    let kind = Ident::new(mac.tracepoint_kind(), Span::call_site());
    let line = quote_spanned!(line_span=> ::core::line!());
    quote! {
        static __TRACE_CALLSITE: ::model_trace::__private::Callsite =
            ::model_trace::__private::Callsite::new(
                ::model_trace::__private::TracepointKind::#kind,
                #name,
                #function,
                ::core::module_path!(),
                ::core::file!(),
                #line,
            );
        ::model_trace::__private::inventory::submit! {
            ::model_trace::__private::Registered(&__TRACE_CALLSITE)
        }
    }
}

/// `Some((expr) as ty)`, spanned on the user's expression so a bad type is reported there.
fn cast_arg(expr: Option<&Expr>, ty: &str) -> TokenStream {
    let Some(expr) = expr else {
        return quote!(::core::option::Option::None);
    };
    let span = expr.span();
    let ty = Ident::new(ty, span);
    quote_spanned!(span=> ::core::option::Option::Some((#expr) as #ty))
}

/// `probe!(&value)`, or the user's own `&value` as it is.
fn probe(expr: &Expr) -> TokenStream {
    match expr {
        Expr::Reference(reference) if reference.mutability.is_none() => {
            quote!(::model_trace::__private::probe!(#expr))
        }
        _ => quote!(::model_trace::__private::probe!(&(#expr))),
    }
}

/// The first parameter that reads as a tensor; each probe only builds a reference.
fn first_tensor(params: &[&Ident]) -> TokenStream {
    let mut probes = params
        .iter()
        .map(|ident| quote!(::model_trace::__private::probe!(&#ident)));
    let Some(first) = probes.next() else {
        return quote!(::core::option::Option::None);
    };
    probes.fold(first, |chain, next| quote!(#chain.or_else(|| #next)))
}

/// Made with the call-site span both where it is declared and where returns break to it.
fn body_label() -> Lifetime {
    Lifetime::new("'__trace_body", Span::call_site())
}

/// Turns `return e` into `break '__trace_body e` so the output is recorded before leaving.
/// Closures, async blocks and nested items have their own `return`; macro arguments are left
/// alone (a `return` there leaves without recording the output; guards still close).
struct ReturnToBreak {
    rewrote: bool,
}

impl ReturnToBreak {
    fn rewrite(block: &mut Block) -> bool {
        let mut visitor = ReturnToBreak { rewrote: false };
        visitor.visit_block_mut(block);
        visitor.rewrote
    }
}

impl VisitMut for ReturnToBreak {
    fn visit_expr_mut(&mut self, expr: &mut Expr) {
        if let Expr::Return(ret) = expr {
            let brk = ExprBreak {
                attrs: std::mem::take(&mut ret.attrs),
                break_token: Token![break](ret.return_token.span),
                label: Some(body_label()),
                expr: ret.expr.take(),
            };
            *expr = Expr::Break(brk);
            self.rewrote = true;
        }
        visit_mut::visit_expr_mut(self, expr);
    }

    fn visit_expr_closure_mut(&mut self, _: &mut syn::ExprClosure) {}

    fn visit_expr_async_mut(&mut self, _: &mut syn::ExprAsync) {}

    fn visit_item_mut(&mut self, _: &mut Item) {}

    fn visit_macro_mut(&mut self, _: &mut syn::Macro) {}
}

/// Tells the inline macros in a traced body which function they are in (a bang macro cannot
/// see it), by prefixing their input with `@function "name";`.
struct NameInlineMacros<'a> {
    function: &'a str,
}

impl NameInlineMacros<'_> {
    fn apply(block: &mut Block, function: &str) {
        NameInlineMacros { function }.visit_block_mut(block);
    }
}

impl VisitMut for NameInlineMacros<'_> {
    fn visit_macro_mut(&mut self, mac: &mut syn::Macro) {
        let is_inline = mac
            .path
            .segments
            .last()
            .is_some_and(|segment| INLINE_MACROS.iter().any(|name| segment.ident == name));
        let named = mac.tokens.clone().into_iter().next().is_some_and(
            |first| matches!(first, proc_macro2::TokenTree::Punct(punct) if punct.as_char() == '@'),
        );
        if is_inline && !named {
            let function = self.function;
            let tokens = &mac.tokens;
            mac.tokens = quote!(@function #function; #tokens);
        }
    }

    fn visit_item_mut(&mut self, _: &mut Item) {}
}

const INLINE_MACROS: &[&str] = &[
    "trace_tensor",
    "trace_attention_value",
    "trace_logits_value",
];

impl InlineInput {
    fn expand(&self, mac: Macro) -> TokenStream {
        let function = self
            .function
            .as_ref()
            .map_or_else(String::new, LitStr::value);
        let callsite = callsite(
            mac,
            &self.tracepoint_name(mac),
            &function,
            Span::call_site(),
        );
        let value = probe(&self.value);
        let record = match (mac, &self.stage) {
            (Macro::Tensor, Some(stage)) => quote! {
                ::model_trace::__private::record_stage(&__TRACE_CALLSITE, #stage, #value);
            },
            _ => self.record_value(mac, &value),
        };
        quote!({
            #callsite
            if __TRACE_CALLSITE.is_active() {
                #record
            }
        })
    }

    fn record_value(&self, mac: Macro, value: &TokenStream) -> TokenStream {
        let allow_casts = allow_casts();
        let record = if mac == Macro::LogitsValue {
            quote!(record_logits)
        } else {
            quote!(record_attention)
        };
        let layer = cast_arg(self.args.expr(Key::Layer), "usize");
        quote! {
            #allow_casts
            let __trace_layer = #layer;
            ::model_trace::__private::#record(&__TRACE_CALLSITE, __trace_layer, #value);
        }
    }

    /// Never runs, but borrows the arguments so that they count as used, as with tracing on.
    fn compiled_out(&self) -> TokenStream {
        let value = &self.value;
        let layer = self.args.expr(Key::Layer).into_iter();
        quote!({
            if false {
                let _ = &(#value);
                #(let _ = &(#layer);)*
            }
        })
    }

    /// The stage, `name = "..."`, or the traced variable's name (`&self.probs` gives `probs`).
    fn tracepoint_name(&self, mac: Macro) -> String {
        if let Some(stage) = &self.stage {
            return stage.value();
        }
        if let Some(name) = self.args.name() {
            return name.value();
        }
        last_name(&self.value).unwrap_or_else(|| {
            match mac {
                Macro::LogitsValue => "logits",
                _ => "attention",
            }
            .to_owned()
        })
    }
}

fn last_name(expr: &Expr) -> Option<String> {
    match expr {
        Expr::Reference(reference) => last_name(&reference.expr),
        Expr::Paren(paren) => last_name(&paren.expr),
        Expr::Path(path) => path.path.get_ident().map(ToString::to_string),
        Expr::Field(field) => match &field.member {
            syn::Member::Named(ident) => Some(ident.to_string()),
            syn::Member::Unnamed(_) => None,
        },
        _ => None,
    }
}
