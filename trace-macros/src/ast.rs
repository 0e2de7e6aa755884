//! Step 2: the annotated function as the expansion sees it: which parameters can be probed,
//! what the function returns, and which macro was applied.

use crate::attr::{Args, Key};
use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt as _;
use syn::parse::{ParseStream, Parser as _};
use syn::visit::Visit;
use syn::{Attribute, FnArg, Ident, Item, ItemFn, Pat, ReturnType, Token, Type, Visibility};

/// One of the nine macros: it decides the allowed keys and the tracepoint kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Macro {
    Model,
    Layer,
    Attention,
    Logits,
    KvCache,
    Quant,
    Tensor,
    AttentionValue,
    LogitsValue,
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
            Macro::Tensor => "trace_tensor!",
            Macro::AttentionValue => "trace_attention_value!",
            Macro::LogitsValue => "trace_logits_value!",
        }
    }

    pub(crate) fn keys(self) -> &'static [Key] {
        match self {
            Macro::Model => &[Key::Position, Key::Name],
            Macro::Layer => &[Key::Index, Key::Input, Key::Name],
            Macro::Attention | Macro::Logits | Macro::AttentionValue | Macro::LogitsValue => {
                &[Key::Layer, Key::Name]
            }
            Macro::KvCache => &[
                Key::Layer,
                Key::Len,
                Key::Capacity,
                Key::Bytes,
                Key::Evictions,
                Key::HitRate,
                Key::Name,
            ],
            Macro::Quant => &[Key::Reference, Key::Quant, Key::Name],
            Macro::Tensor => &[],
        }
    }

    /// The `TracepointKind` variant the callsite registers as.
    pub(crate) fn tracepoint_kind(self) -> &'static str {
        match self {
            Macro::Model => "Model",
            Macro::Layer => "Layer",
            Macro::Attention | Macro::AttentionValue => "Attention",
            Macro::Logits | Macro::LogitsValue => "Logits",
            Macro::KvCache => "KvCache",
            Macro::Quant => "Quant",
            Macro::Tensor => "Tensor",
        }
    }
}

/// A parameter as far as probing cares: only named bindings can be read again.
pub(crate) enum Param {
    Receiver(Token![self]),
    Named(Ident),
    Unnamed(Box<Pat>),
}

/// What the function returns; `()` and `!` count as nothing.
pub(crate) enum Output {
    Nothing,
    /// `annotate` is false when the type holds an `impl Trait`, which a `let` cannot name.
    Value {
        ty: Box<Type>,
        annotate: bool,
    },
}

pub(crate) struct TracedFn {
    pub(crate) mac: Macro,
    pub(crate) args: Args,
    pub(crate) func: ItemFn,
    pub(crate) params: Vec<Param>,
    pub(crate) output: Output,
}

impl TracedFn {
    pub(crate) fn new(mac: Macro, args: Args, func: ItemFn) -> Self {
        let params = func.sig.inputs.iter().map(param).collect();
        let output = output(&func.sig.output);
        TracedFn {
            mac,
            args,
            func,
            params,
            output,
        }
    }

    /// `name = "..."` or the function's name.
    pub(crate) fn tracepoint_name(&self) -> String {
        self.args
            .name()
            .map_or_else(|| self.function_name(), syn::LitStr::value)
    }

    pub(crate) fn function_name(&self) -> String {
        self.func.sig.ident.unraw().to_string()
    }

    /// Parameters that may hold the input, in order: never `self`, nor one named `_x`, which
    /// its author declared unused.
    pub(crate) fn input_candidates(&self) -> impl Iterator<Item = &Ident> {
        self.params.iter().filter_map(|param| match param {
            Param::Named(ident) if !ident.unraw().to_string().starts_with('_') => Some(ident),
            _ => None,
        })
    }
}

/// Parses the annotated item; anything but a function with a body is an error.
pub(crate) fn parse_fn(mac: Macro, item: &TokenStream) -> syn::Result<ItemFn> {
    match syn::parse2::<Item>(item.clone()) {
        Ok(Item::Fn(func)) => Ok(func),
        _ => Err(syn::Error::new(
            keyword_span(item),
            format!(
                "`{}` can only be applied to a function with a body",
                mac.display()
            ),
        )),
    }
}

/// The span of the item's keyword (`struct`, `fn`, ...), after its attributes and visibility.
fn keyword_span(item: &TokenStream) -> Span {
    let parser = |input: ParseStream| {
        input.call(Attribute::parse_outer)?;
        input.parse::<Visibility>()?;
        let span = input.span();
        input.parse::<TokenStream>()?;
        Ok(span)
    };
    parser
        .parse2(item.clone())
        .unwrap_or_else(|_| Span::call_site())
}

fn param(arg: &FnArg) -> Param {
    match arg {
        FnArg::Receiver(receiver) => Param::Receiver(receiver.self_token),
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(binding) => Param::Named(binding.ident.clone()),
            other => Param::Unnamed(Box::new(other.clone())),
        },
    }
}

fn output(ret: &ReturnType) -> Output {
    match ret {
        ReturnType::Type(_, ty) if !returns_nothing(ty) => Output::Value {
            ty: ty.clone(),
            annotate: !contains_impl_trait(ty),
        },
        _ => Output::Nothing,
    }
}

fn returns_nothing(ty: &Type) -> bool {
    match ty {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Never(_) => true,
        Type::Paren(inner) => returns_nothing(&inner.elem),
        _ => false,
    }
}

fn contains_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl Visit<'_> for Finder {
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}
