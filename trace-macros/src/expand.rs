//! Step 4: generate code.
//!
//! Without the `enabled` feature a function comes back as it was written, with at most one
//! statement added in front of its body: a closure that is never called and holds the
//! arguments' expressions, converted as the traced build converts them, so that they are
//! type-checked and count as uses in both builds while no code is generated for them. Inline
//! macros become an `if false` block doing the same.
//!
//! With `enabled`, a function keeps its signature and its body: the body moves into a block
//! (labeled when a `return` had to become a `break`), preceded by a static callsite and a guard,
//! followed by the recording of the output. Nothing is wrapped in a closure. The function also
//! registers the lines it spans, from which the inline macros inside it learn its name.

use crate::ast::{parse_fn, MaybeFn, Output, Param, Passing, TracedFn};
use crate::attr::{FnArgs, Inline, InlineInput, KvCacheArgs, RouterArgs};
use crate::errors::both;
use crate::kind::{InlineMacro, Kind, Macro};
use crate::valid::{check_fn, QUANT_TYPES, RESERVED_STAGES};
use proc_macro2::{Delimiter, Group, Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::spanned::Spanned as _;
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, ExprBreak, ExprPath, Ident, Item, Lifetime, LitStr, Token};

const ENABLED: bool = cfg!(feature = "enabled");

/// An attribute macro: check, then return the traced function or the function as written
/// (its arguments checked in a closure). A body that does not parse is left to the compiler.
pub(crate) fn attribute(
    mac: Macro,
    args: TokenStream,
    item: &TokenStream,
) -> syn::Result<TokenStream> {
    let args = FnArgs::parse(mac, args);
    let func = parse_fn(mac.display(), item).and_then(|func| match func {
        MaybeFn::Parsed(func) => check_fn(mac, &func).map(|()| Some(func)),
        MaybeFn::Unparsed => Ok(None),
    });
    let (args, func) = both(args, func)?;
    let Some(func) = func else {
        return Ok(item.clone());
    };
    let traced = TracedFn::new(args, *func);
    if ENABLED {
        return Ok(traced.expand());
    }
    Ok(traced.compiled_out().unwrap_or_else(|| item.clone()))
}

/// The errors and the untouched item, so that the item's other uses raise no second error.
pub(crate) fn with_item(error: syn::Error, item: TokenStream) -> TokenStream {
    let mut tokens = error.into_compile_error();
    tokens.extend(item);
    tokens
}

/// An inline macro: check, then trace the value, or only type-check it.
pub(crate) fn inline(mac: InlineMacro, tokens: TokenStream) -> syn::Result<TokenStream> {
    let input = InlineInput::parse(mac, tokens)?;
    input.validate()?;
    if ENABLED {
        return Ok(input.expand());
    }
    Ok(input.compiled_out())
}

/// Several `compile_error!`s are statements, so they go in a block to stand as one expression.
pub(crate) fn inline_errors(error: syn::Error) -> TokenStream {
    let errors = error.into_compile_error();
    quote!({ #errors })
}

/// What the hidden `__*!()` macros list, for `tests/macro_lists.rs`.
#[derive(Clone, Copy)]
pub(crate) enum List {
    TracepointKinds,
    QuantTypes,
    ReservedStages,
}

/// `&["...", ...]`: the names the macros know, as a list a test can compare with the runtime.
pub(crate) fn list(list: List, input: TokenStream) -> syn::Result<TokenStream> {
    if let Some(token) = input.into_iter().next() {
        return Err(syn::Error::new(token.span(), "this macro takes no input"));
    }
    let names: Vec<&str> = match list {
        List::TracepointKinds => Kind::registered().into_iter().map(Kind::name).collect(),
        List::QuantTypes => QUANT_TYPES.to_vec(),
        List::ReservedStages => RESERVED_STAGES.to_vec(),
    };
    Ok(quote!(&[#(#names),*]))
}

/// The `__private` trait that converts one argument. One per argument, so that a value of the
/// wrong type is reported with the argument's name and what it takes.
#[derive(Clone, Copy)]
enum Conversion {
    Position,
    /// Through the public `PassTokens`, which users may implement.
    Tokens,
    Index,
    Layer,
    Len,
    Capacity,
    Bytes,
    Evictions,
    HitRate,
    Groups,
}

impl Conversion {
    /// `Trait::convert(expr)`, spanned on the user's expression so that a type error lands
    /// there.
    fn apply(self, expr: &Expr) -> TokenStream {
        let span = expr.span();
        let private = private_at(span);
        let (name, method) = match self {
            Conversion::Position => ("PositionArg", "convert"),
            Conversion::Tokens => ("PassTokens", "token_ids"),
            Conversion::Index => ("IndexArg", "convert"),
            Conversion::Layer => ("LayerArg", "convert"),
            Conversion::Len => ("LenArg", "convert"),
            Conversion::Capacity => ("CapacityArg", "convert"),
            Conversion::Bytes => ("BytesArg", "convert"),
            Conversion::Evictions => ("EvictionsArg", "convert"),
            Conversion::HitRate => ("HitRateArg", "convert"),
            Conversion::Groups => ("GroupsArg", "convert"),
        };
        let (name, method) = (Ident::new(name, span), Ident::new(method, span));
        quote_spanned!(span=> #private::#name::#method(#expr))
    }

    /// `Some(converted)`, or `None` when the argument was not given.
    fn option(self, expr: Option<&Expr>) -> TokenStream {
        match expr {
            Some(expr) => {
                let converted = self.apply(expr);
                quote!(::core::option::Option::Some(#converted))
            }
            None => quote!(::core::option::Option::None),
        }
    }
}

impl TracedFn {
    /// The function as written, plus a closure that is never called holding its arguments;
    /// `None` when there is no argument to hold.
    fn compiled_out(&self) -> Option<TokenStream> {
        let uses = self.argument_uses();
        if uses.is_empty() {
            return None;
        }
        let func = &self.func;
        let (attrs, vis, sig, inner) = (&func.attrs, &func.vis, &func.sig, &func.inner_attrs);
        let stmts = &func.stmts_tokens;
        let body = braces(
            func.close_span(),
            quote! {
                #(#inner)*
                let _ = || {
                    #(#uses)*
                };
                #stmts
            },
        );
        Some(quote!(#(#attrs)* #vis #sig #body))
    }

    /// One statement per argument, evaluating it as the traced build does.
    fn argument_uses(&self) -> Vec<TokenStream> {
        let converted = |conversion: Conversion, expr: &Option<Expr>| {
            expr.as_ref().map(|expr| {
                let converted = conversion.apply(expr);
                quote!(let _ = #converted;)
            })
        };
        match &self.args {
            FnArgs::Model(args) => [
                converted(Conversion::Position, &args.position),
                converted(Conversion::Tokens, &args.tokens),
            ]
            .into_iter()
            .flatten()
            .collect(),
            FnArgs::Layer(args) => {
                let input = args.input.as_ref().map(|input| quote!(let _ = &(#input);));
                converted(Conversion::Index, &args.index)
                    .into_iter()
                    .chain(input)
                    .collect()
            }
            FnArgs::Attention(args) | FnArgs::Logits(args) => {
                converted(Conversion::Layer, &args.layer)
                    .into_iter()
                    .collect()
            }
            FnArgs::KvCache(args) => [
                converted(Conversion::Layer, &args.layer),
                converted(Conversion::Len, &args.len),
                converted(Conversion::Capacity, &args.capacity),
                converted(Conversion::Bytes, &args.bytes),
                converted(Conversion::Evictions, &args.evictions),
                converted(Conversion::HitRate, &args.hit_rate),
            ]
            .into_iter()
            .flatten()
            .collect(),
            FnArgs::Router(args) => router_uses(args),
            FnArgs::Quant(args) => {
                let call = self.reference_call(&args.reference);
                vec![quote! {
                    #[allow(clippy::used_underscore_binding, clippy::clone_on_copy, clippy::redundant_clone)]
                    let _ = #call;
                }]
            }
        }
    }

    fn expand(&self) -> TokenStream {
        let func = &self.func;
        let (attrs, vis, sig, inner) = (&func.attrs, &func.vis, &func.sig, &func.inner_attrs);
        let mac = self.args.mac();
        let function = self.function_name();
        let callsite = callsite(
            mac.kind(),
            &self.tracepoint_name(),
            &function,
            sig.ident.span(),
        );
        let span = function_span(&function, sig.fn_token.span, func.last_line_span());
        let prologue = self.prologue();
        let epilogue = self.epilogue();
        let body = self.body(epilogue.is_some());
        let body = braces(
            func.close_span(),
            quote! {
                #(#inner)*
                #callsite
                #span
                #prologue
                #body
                #epilogue
            },
        );
        quote!(#(#attrs)* #vis #sig #body)
    }

    /// The user's statements. When code follows them, returns become breaks out of the block
    /// and the value is kept in `__trace_out`, annotated with the return type so that tail
    /// expressions such as `.collect()` still infer.
    fn body(&self, code_follows: bool) -> TokenStream {
        let mut block = self.func.block.clone();
        if !code_follows {
            // The statements in braces of ours: the user's own one-line braces as the tail of
            // our block would draw rustc's `unused_braces` warning (with a suggestion that does
            // not compile), which the untraced build does not have. Braces of the expansion are
            // not linted; a block they keep (not the bare statements) keeps the items of a
            // stacked attribute's expansion apart from ours.
            let stmts = &block.stmts;
            return quote!({ #(#stmts)* });
        }
        let label = ReturnToBreak::rewrite(&mut block).then(|| {
            let label = body_label();
            quote!(#label:)
        });
        // A layer's output can be changed by an intervention.
        let mutability = matches!(self.args, FnArgs::Layer(_)).then(|| quote!(mut));
        match &self.output {
            Output::Nothing => quote!(#label #block),
            Output::Value { ty, annotate: true } => {
                quote!(let #mutability __trace_out: #ty = #label #block;)
            }
            Output::Value {
                annotate: false, ..
            } => quote!(let #mutability __trace_out = #label #block;),
        }
    }

    fn prologue(&self) -> TokenStream {
        match &self.args {
            FnArgs::Model(args) => model_guard(args.position.as_ref(), args.tokens.as_ref()),
            FnArgs::Layer(args) => self.layer_guard(args.index.as_ref(), args.input.as_ref()),
            FnArgs::Quant(args) => {
                let call = self.reference_call(&args.reference);
                quote! {
                    #[allow(clippy::used_underscore_binding, clippy::clone_on_copy, clippy::redundant_clone)]
                    let __trace_reference = if __TRACE_CALLSITE.is_active() {
                        ::core::option::Option::Some(#call)
                    } else {
                        ::core::option::Option::None
                    };
                }
            }
            FnArgs::Attention(_) | FnArgs::Logits(_) | FnArgs::KvCache(_) | FnArgs::Router(_) => {
                TokenStream::new()
            }
        }
    }

    /// What runs after the body; `None` when nothing does, so the body stays as it was.
    fn epilogue(&self) -> Option<TokenStream> {
        let has_output = matches!(self.output, Output::Value { .. });
        match &self.args {
            FnArgs::Model(_) => None,
            FnArgs::Layer(_) => has_output.then(layer_output),
            FnArgs::Attention(args) => Some(record_output("record_attention", args.layer.as_ref())),
            FnArgs::Logits(args) => Some(record_output("record_logits", args.layer.as_ref())),
            FnArgs::KvCache(args) => Some(kv_cache_step(args, has_output)),
            FnArgs::Quant(args) => Some(quant_record(args.quant.as_ref())),
            FnArgs::Router(args) => {
                let private = private();
                let record = router_record(args, &quote!(#private::probe_router!(&__trace_out)));
                Some(quote! {
                    if __TRACE_CALLSITE.is_active() {
                        #record
                    }
                    __trace_out
                })
            }
        }
    }

    fn layer_guard(&self, index: Option<&Expr>, input: Option<&Expr>) -> TokenStream {
        let private = private();
        let index = Conversion::Index.option(index);
        let candidates: Vec<&Ident> = match input {
            None => self.input_candidates().collect(),
            // `input = x` or `input = &x` naming a parameter can be replaced as that parameter.
            Some(expr) => param_named(expr)
                .and_then(|name| self.input_candidates().find(|ident| **ident == name))
                .into_iter()
                .collect(),
        };
        let probe_input = input.map_or_else(|| first_tensor(&candidates), probe);
        let mutability = matches!(self.output, Output::Value { .. }).then(|| quote!(mut));
        let guard = quote! {
            let __trace_active = __TRACE_CALLSITE.is_active();
            let #mutability __trace_guard = if __trace_active {
                let __trace_index = #index;
                #private::LayerGuard::enter(
                    &__TRACE_CALLSITE, __trace_index, ::core::option::Option::None)
            } else {
                #private::LayerGuard::inactive()
            };
        };
        if candidates.is_empty() && input.is_none() {
            return guard;
        }
        let replace = self.replace_input(&candidates);
        quote! {
            #guard
            #replace
            if __trace_active {
                __trace_guard.input(#probe_input);
            }
        }
    }

    /// What lets an intervention change the input: which candidate is the input (the first
    /// that is a tensor, as the probe decides), then each candidate that can be changed
    /// rebound to its changed value when it is the one. A candidate that cannot be changed
    /// (see [`TracedFn::passing`]) reports so when it is the input and one asks.
    fn replace_input(&self, candidates: &[&Ident]) -> TokenStream {
        let private = private();
        let passing: Vec<Option<Passing>> =
            candidates.iter().map(|ident| self.passing(ident)).collect();
        let cannot = quote!({
            __trace_guard.replace_input(::core::option::Option::None);
            usize::MAX
        });
        let which = candidates.iter().zip(&passing).enumerate().rev().fold(
            cannot.clone(),
            |otherwise, (at, (ident, passing))| {
                let this = if passing.is_some() {
                    quote!(#at)
                } else {
                    cannot.clone()
                };
                quote! {
                    if #private::probe!(&#ident).is_some() { #this } else { #otherwise }
                }
            },
        );
        let rebinds =
            candidates
                .iter()
                .zip(&passing)
                .enumerate()
                .filter_map(|(at, (ident, passing))| {
                    let copy = format_ident!("__trace_copy_{}", at);
                    Some(match (*passing)? {
                        Passing::Owned { mutable } => {
                            let rebind = (!mutable).then(|| quote!(let mut #ident = #ident;));
                            quote! {
                            #rebind
                            if __trace_input_at == #at {
                                __trace_guard.replace_input(
                                    #private::probe_mut!(&mut #ident));
                            }
                            }
                        }
                        Passing::Borrowed => quote! {
                            let #copy;
                            let #ident = if __trace_input_at == #at {
                                #[allow(unused_imports)]
                                use #private::{
                                    ReplaceBorrowedOther as _, ReplaceBorrowedTensor as _,
                                };
                                #copy = (&&#private::Probe(#ident))
                                    .__model_trace_replace_borrowed(&__trace_guard);
                                match &#copy {
                                    ::core::option::Option::Some(copy) => &**copy,
                                    ::core::option::Option::None => #ident,
                                }
                            } else {
                                #ident
                            };
                        },
                    })
                });
        quote! {
            let __trace_input_at: usize = if __trace_guard.replaces_input() {
                #which
            } else {
                usize::MAX
            };
            #(#rebinds)*
        }
    }

    /// `reference(args...)` with the function's own arguments. It runs before the body, so
    /// what the body takes by value (a burn tensor, `self`) is given as a clone, of the
    /// parameter's own type where it can be named (a reference taking `&T` where the function
    /// takes `T` is then the plain mismatch of `T` with `&T`); a parameter whose type is not
    /// `Clone` is a compile error on its name.
    fn reference_call(&self, reference: &ExprPath) -> TokenStream {
        let clone = |value: TokenStream, ty: Option<&syn::Type>, span: Span| match ty {
            Some(ty) => quote_spanned!(span=> <#ty as ::core::clone::Clone>::clone(&#value)),
            None => quote_spanned!(span=> ::core::clone::Clone::clone(&#value)),
        };
        let args = self.params.iter().filter_map(|param| match param {
            Param::Receiver(self_token) => Some(match self.self_by_value() {
                Some(ty) => clone(self_token.to_token_stream(), Some(ty), self_token.span),
                None => self_token.to_token_stream(),
            }),
            Param::Named(ident) if matches!(self.passing(ident), Some(Passing::Owned { .. })) => {
                let ty = self.nameable_type(ident);
                Some(clone(ident.to_token_stream(), ty, ident.span()))
            }
            Param::Named(ident) => Some(ident.to_token_stream()),
            Param::Unnamed(_) => None,
        });
        quote!(#reference(#(#args),*))
    }
}

/// The pass's guard; `position` and `tokens` are evaluated only when the pass is traced.
fn model_guard(position: Option<&Expr>, tokens: Option<&Expr>) -> TokenStream {
    let private = private();
    let position = Conversion::Position.option(position);
    let tokens = Conversion::Tokens.option(tokens);
    quote! {
        let __trace_guard = if __TRACE_CALLSITE.is_active() {
            let __trace_position = #position;
            let __trace_tokens = #tokens;
            #private::ModelGuard::enter(
                &__TRACE_CALLSITE, __trace_position, __trace_tokens)
        } else {
            #private::ModelGuard::inactive()
        };
    }
}

fn layer_output() -> TokenStream {
    let private = private();
    quote! {
        if __trace_active {
            if __trace_guard.replaces_output() {
                __trace_guard.replace_output(
                    #private::probe_mut!(&mut __trace_out));
            }
            __trace_guard.output(#private::probe!(&__trace_out));
        }
        __trace_out
    }
}

/// The parameter that `input = x` or `input = &x` names.
fn param_named(expr: &Expr) -> Option<Ident> {
    match expr {
        Expr::Reference(reference) if reference.mutability.is_none() => {
            param_named(&reference.expr)
        }
        Expr::Paren(paren) => param_named(&paren.expr),
        Expr::Path(path) => path.path.get_ident().cloned(),
        _ => None,
    }
}

fn record_output(record: &str, layer: Option<&Expr>) -> TokenStream {
    let private = private();
    let record = Ident::new(record, Span::call_site());
    let layer = Conversion::Layer.option(layer);
    quote! {
        if __TRACE_CALLSITE.is_active() {
            let __trace_layer = #layer;
            #private::#record(
                &__TRACE_CALLSITE,
                __trace_layer,
                #private::probe!(&__trace_out),
            );
        }
        __trace_out
    }
}

fn kv_cache_step(args: &KvCacheArgs, has_output: bool) -> TokenStream {
    let private = private();
    let layer = Conversion::Layer.option(args.layer.as_ref());
    let len = Conversion::Len.option(args.len.as_ref());
    let capacity = Conversion::Capacity.option(args.capacity.as_ref());
    let bytes = Conversion::Bytes.option(args.bytes.as_ref());
    let evictions = Conversion::Evictions.option(args.evictions.as_ref());
    let hit_rate = Conversion::HitRate.option(args.hit_rate.as_ref());
    let tail = has_output.then(|| quote!(__trace_out));
    quote! {
        if __TRACE_CALLSITE.is_active() {
            let __trace_step = #private::KvCacheStep {
                layer: #layer,
                len: #len,
                capacity: #capacity,
                bytes: #bytes,
                evictions: #evictions,
                hit_rate: #hit_rate,
            };
            #private::record_kv_cache(&__TRACE_CALLSITE, __trace_step);
        }
        #tail
    }
}

/// What the compiled-out build keeps of a router's arguments: each evaluated as the traced
/// build evaluates it.
fn router_uses(args: &RouterArgs) -> Vec<TokenStream> {
    let layer = args.layer.as_ref().map(|layer| {
        let layer = Conversion::Layer.apply(layer);
        quote!(let _ = #layer;)
    });
    let bias = args.bias.as_ref().map(|bias| quote!(let _ = &(#bias);));
    let groups = args.groups.as_ref().map(|groups| {
        let count = Conversion::Groups.apply(&groups.groups);
        let top = Conversion::Groups.apply(&groups.top_groups);
        quote!(let _ = (#count, #top);)
    });
    layer.into_iter().chain(bias).chain(groups).collect()
}

/// `record_router(...)` of a router's `parts` (a `RouterParts`), in one statement so that the
/// temporaries of `bias` live through the call.
fn router_record(args: &RouterArgs, parts: &TokenStream) -> TokenStream {
    let private = private();
    let layer = Conversion::Layer.option(args.layer.as_ref());
    let variant = args.scoring.as_ref().map_or("Softmax", |s| s.variant());
    let variant = Ident::new(variant, Span::call_site());
    let groups = args.groups.as_ref().map_or_else(
        || quote!(::core::option::Option::None),
        |groups| {
            let count = Conversion::Groups.apply(&groups.groups);
            let top = Conversion::Groups.apply(&groups.top_groups);
            quote!(::core::option::Option::Some((#count, #top)))
        },
    );
    let bias = args.bias.as_ref().map_or_else(
        || quote!(::core::option::Option::None),
        |bias| {
            let bias = probe(bias);
            quote!(::core::option::Option::Some(#bias))
        },
    );
    quote! {
        #private::record_router(
            &__TRACE_CALLSITE,
            #private::RouterArgs {
                layer: #layer,
                scoring: #private::RouterScoring::#variant,
                groups: #groups,
                bias: #bias,
            },
            #parts,
        );
    }
}

fn quant_record(quant: Option<&Ident>) -> TokenStream {
    let private = private();
    let quant = quant.map_or_else(
        || quote!(::core::option::Option::None),
        |variant| {
            let private = private_at(variant.span());
            quote_spanned!(variant.span()=>
                ::core::option::Option::Some(#private::QuantType::#variant))
        },
    );
    quote! {
        if let ::core::option::Option::Some(__trace_reference) = __trace_reference {
            #private::record_quant(
                &__TRACE_CALLSITE,
                #quant,
                #private::probe!(&__trace_out),
                #private::probe!(&__trace_reference),
            );
        }
        __trace_out
    }
}

/// A function body: `tokens` in braces spanned on the original closing brace, so that the
/// compiler's messages about the body point at the body.
fn braces(close: Span, tokens: TokenStream) -> Group {
    let mut group = Group::new(Delimiter::Brace, tokens);
    group.set_span(close);
    group
}

/// The static tracepoint and its registration. `line!()` carries the function name's span so
/// the tracepoint points at the `fn` line rather than at the attribute. An inline macro's
/// `function` is empty: the runtime finds it from the registered [`function_span`]s.
fn callsite(kind: Kind, name: &str, function: &str, line_span: Span) -> TokenStream {
    let private = private();
    let kind = kind.ident();
    let line = quote_spanned!(line_span=> ::core::line!());
    quote! {
        static __TRACE_CALLSITE: #private::Callsite =
            #private::Callsite::new(
                #private::TracepointKind::#kind,
                #name,
                #function,
                ::core::module_path!(),
                ::core::file!(),
                #line,
            );
        #private::inventory::submit! {
            #private::Registered(&__TRACE_CALLSITE)
        }
    }
}

/// Registers the lines from `fn` to the body's last identifier under the function's name.
fn function_span(name: &str, first: Span, last: Span) -> TokenStream {
    let private = private();
    let first = quote_spanned!(first=> ::core::line!());
    let last = quote_spanned!(last=> ::core::line!());
    quote! {
        #private::inventory::submit! {
            #private::FunctionSpan::new(
                #name,
                ::core::module_path!(),
                ::core::file!(),
                #first,
                #last,
            )
        }
    }
}

/// `::model_trace::__private`, the facade's hidden module that the generated code calls into:
/// the one place that names the facade crate.
fn private() -> TokenStream {
    private_at(Span::call_site())
}

/// The same, spanned at `span` (a path inside `quote_spanned!` takes the span it is given, so
/// that an error in the user's expression lands on the expression).
fn private_at(span: Span) -> TokenStream {
    quote_spanned!(span=> ::model_trace::__private)
}

/// `probe!(&value)`, or the user's own `&value` as it is.
fn probe(expr: &Expr) -> TokenStream {
    let private = private();
    match expr {
        Expr::Reference(reference) if reference.mutability.is_none() => {
            quote!(#private::probe!(#expr))
        }
        _ => quote!(#private::probe!(&(#expr))),
    }
}

/// The first parameter that reads as a tensor; each probe only builds a reference.
fn first_tensor(params: &[&Ident]) -> TokenStream {
    let private = private();
    let mut probes = params.iter().map(|ident| quote!(#private::probe!(&#ident)));
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

impl InlineInput {
    fn expand(&self) -> TokenStream {
        let private = private();
        let callsite = callsite(self.kind(), &self.tracepoint_name(), "", Span::call_site());
        let value = probe(&self.value);
        let record = match &self.what {
            Inline::Tensor(stage) => quote! {
                #private::record_stage(&__TRACE_CALLSITE, #stage, #value);
            },
            Inline::Stage(stage) => return stage_expand(&callsite, stage, &self.value),
            Inline::Attention(args) => {
                record_value("record_attention", args.layer.as_ref(), &value)
            }
            Inline::Logits(args) => record_value("record_logits", args.layer.as_ref(), &value),
            Inline::Router(values) => {
                let (weights, experts) = (probe(&values.weights), probe(&values.experts));
                let parts = quote!(#private::RouterParts::Values([#value, #weights, #experts]));
                router_record(&values.args, &parts)
            }
        };
        quote!({
            #callsite
            if __TRACE_CALLSITE.is_active() {
                #record
            }
        })
    }

    /// Never runs, but uses the arguments as the traced build does, so that they are
    /// type-checked and count as used. `trace_stage!` is its value.
    fn compiled_out(&self) -> TokenStream {
        let private = private();
        let value = &self.value;
        let layer = match &self.what {
            Inline::Tensor(_) => None,
            Inline::Stage(_) => return quote!(#private::keep(#value)),
            Inline::Attention(args) | Inline::Logits(args) => args.layer.as_ref(),
            Inline::Router(values) => {
                let (weights, experts) = (&values.weights, &values.experts);
                let uses = router_uses(&values.args);
                return quote!({
                    if false {
                        let _ = &(#value);
                        let _ = &(#weights);
                        let _ = &(#experts);
                        #(#uses)*
                    }
                });
            }
        };
        let layer = layer
            .map(|layer| Conversion::Layer.apply(layer))
            .into_iter();
        quote!({
            if false {
                let _ = &(#value);
                #(let _ = #layer;)*
            }
        })
    }

    fn kind(&self) -> Kind {
        match &self.what {
            Inline::Tensor(_) | Inline::Stage(_) => Kind::Tensor,
            Inline::Attention(_) => Kind::Attention,
            Inline::Logits(_) => Kind::Logits,
            Inline::Router(_) => Kind::Router,
        }
    }

    /// The stage, `name = "..."`, or the traced variable's name (`&self.probs` gives `probs`);
    /// a router's is `router` unless named.
    fn tracepoint_name(&self) -> String {
        let (name, default) = match &self.what {
            Inline::Tensor(stage) | Inline::Stage(stage) => return stage.value(),
            Inline::Router(values) => {
                return values
                    .args
                    .name
                    .as_ref()
                    .map_or_else(|| "router".to_owned(), LitStr::value)
            }
            Inline::Attention(args) => (args.name.as_ref(), "attention"),
            Inline::Logits(args) => (args.name.as_ref(), "logits"),
        };
        name.map(LitStr::value)
            .or_else(|| last_name(&self.value))
            .unwrap_or_else(|| default.to_owned())
    }
}

/// `trace_stage!`: the value, changed by the session's interventions on the stage, recorded
/// as it is then, and returned.
fn stage_expand(callsite: &TokenStream, stage: &LitStr, value: &Expr) -> TokenStream {
    let private = private();
    quote!({
        #callsite
        let mut __trace_value = #value;
        if __TRACE_CALLSITE.is_active() {
            #private::replace_stage(
                &__TRACE_CALLSITE,
                #stage,
                #private::probe_mut!(&mut __trace_value),
            );
            #private::record_stage(
                &__TRACE_CALLSITE,
                #stage,
                #private::probe!(&__trace_value),
            );
        }
        #private::keep(__trace_value)
    })
}

fn record_value(record: &str, layer: Option<&Expr>, value: &TokenStream) -> TokenStream {
    let private = private();
    let record = Ident::new(record, Span::call_site());
    let layer = Conversion::Layer.option(layer);
    quote! {
        let __trace_layer = #layer;
        #private::#record(&__TRACE_CALLSITE, __trace_layer, #value);
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
