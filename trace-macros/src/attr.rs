//! Step 1: parse macro arguments (`key = value, ...`) into [`Args`].
//!
//! Every key is a custom keyword so that a misspelt key is reported on its own token, and the
//! parser keeps going after a bad argument so that one expansion reports every mistake at once.

use crate::ast::Macro;
use crate::valid::Errors;
use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt as _;
use syn::parse::{ParseStream, Parser as _};
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Token};

/// Declares the keys: one custom keyword each, the [`Key`] enum, and how a key is peeked.
macro_rules! keys {
    ($($variant:ident = $keyword:ident: $placeholder:literal,)*) => {
        pub(crate) mod kw {
            $(syn::custom_keyword!($keyword);)*
            syn::custom_keyword!(function);
        }

        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        pub(crate) enum Key {
            $($variant,)*
        }

        impl Key {
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Key::$variant => stringify!($keyword),)*
                }
            }

            /// What goes after `=`, shown when the value is missing.
            fn placeholder(self) -> &'static str {
                match self {
                    $(Key::$variant => $placeholder,)*
                }
            }

            fn peek(input: ParseStream) -> Option<Self> {
                $(if input.peek(kw::$keyword) {
                    return Some(Key::$variant);
                })*
                None
            }
        }
    };
}

keys! {
    Name = name: "\"...\"",
    Position = position: "EXPR",
    Index = index: "EXPR",
    Input = input: "EXPR",
    Layer = layer: "EXPR",
    Len = len: "EXPR",
    Capacity = capacity: "EXPR",
    Bytes = bytes: "EXPR",
    Evictions = evictions: "EXPR",
    HitRate = hit_rate: "EXPR",
    Reference = reference: "PATH",
    Quant = quant: "Q4_1",
}

/// The value of one argument, already checked for its syntactic form.
pub(crate) enum Value {
    Expr(Expr),
    Str(LitStr),
    Path(ExprPath),
    Variant(Ident),
}

pub(crate) struct Arg {
    pub(crate) key: Key,
    pub(crate) key_span: Span,
    pub(crate) value: Value,
}

/// The arguments of one macro invocation, in the order written.
#[derive(Default)]
pub(crate) struct Args {
    pub(crate) list: Vec<Arg>,
}

impl Args {
    fn get(&self, key: Key) -> Option<&Value> {
        self.list
            .iter()
            .find(|arg| arg.key == key)
            .map(|arg| &arg.value)
    }

    pub(crate) fn expr(&self, key: Key) -> Option<&Expr> {
        match self.get(key)? {
            Value::Expr(expr) => Some(expr),
            _ => None,
        }
    }

    pub(crate) fn name(&self) -> Option<&LitStr> {
        match self.get(Key::Name)? {
            Value::Str(name) => Some(name),
            _ => None,
        }
    }

    pub(crate) fn reference(&self) -> Option<&ExprPath> {
        match self.get(Key::Reference)? {
            Value::Path(path) => Some(path),
            _ => None,
        }
    }

    pub(crate) fn quant(&self) -> Option<&Ident> {
        match self.get(Key::Quant)? {
            Value::Variant(variant) => Some(variant),
            _ => None,
        }
    }
}

/// Parses the arguments of an attribute: `#[trace_layer(index = i, name = "block")]`.
pub(crate) fn parse_args(mac: Macro, tokens: TokenStream) -> syn::Result<Args> {
    (|input: ParseStream| parse_list(mac, input)).parse2(tokens)
}

/// An inline macro: `trace_tensor!("stage", &t)` or `trace_attention_value!(&p, layer = 3)`.
pub(crate) struct InlineInput {
    /// The enclosing function, passed as `@function "name";` by a traced function's expansion.
    pub(crate) function: Option<LitStr>,
    pub(crate) stage: Option<LitStr>,
    pub(crate) value: Expr,
    pub(crate) args: Args,
}

pub(crate) fn parse_inline(mac: Macro, tokens: TokenStream) -> syn::Result<InlineInput> {
    (|input: ParseStream| parse_inline_input(mac, input)).parse2(tokens)
}

fn parse_inline_input(mac: Macro, input: ParseStream) -> syn::Result<InlineInput> {
    let function = parse_function(input)?;
    let stage = if mac == Macro::Tensor {
        let stage = parse_stage(input)?;
        if input.is_empty() {
            return Err(missing_tensor(&stage));
        }
        input.parse::<Token![,]>()?;
        Some(stage)
    } else {
        None
    };
    let value = parse_inline_value(mac, input)?;
    let args = if input.is_empty() {
        Args::default()
    } else {
        input.parse::<Token![,]>()?;
        parse_list(mac, input)?
    };
    Ok(InlineInput {
        function,
        stage,
        value,
        args,
    })
}

fn parse_function(input: ParseStream) -> syn::Result<Option<LitStr>> {
    if !input.peek(Token![@]) {
        return Ok(None);
    }
    input.parse::<Token![@]>()?;
    input.parse::<kw::function>()?;
    let function = input.parse()?;
    input.parse::<Token![;]>()?;
    Ok(Some(function))
}

fn parse_stage(input: ParseStream) -> syn::Result<LitStr> {
    match input.parse::<Expr>()? {
        Expr::Lit(ExprLit {
            lit: Lit::Str(stage),
            ..
        }) => Ok(stage),
        other => Err(syn::Error::new_spanned(
            other,
            "expected the stage name as a string literal, such as \"post_attn\"",
        )),
    }
}

fn missing_tensor(literal: &LitStr) -> syn::Error {
    let stage = literal.value();
    syn::Error::new(
        literal.span(),
        format!("missing the tensor of stage \"{stage}\": `trace_tensor!(\"{stage}\", &x)`"),
    )
}

fn parse_inline_value(mac: Macro, input: ParseStream) -> syn::Result<Expr> {
    if input.is_empty() {
        let message = format!("`{}` needs the value to trace, such as `&x`", mac.display());
        return Err(syn::Error::new(Span::call_site(), message));
    }
    input.parse()
}

/// Parses `key = value` pairs separated by commas, collecting every error before giving up.
fn parse_list(mac: Macro, input: ParseStream) -> syn::Result<Args> {
    let mut args = Args::default();
    let mut errors = Errors::default();
    while !input.is_empty() {
        match parse_arg(mac, input) {
            Ok(arg) => args.list.push(arg),
            Err(error) => {
                errors.push(error);
                skip_to_comma(input)?;
            }
        }
        if !input.is_empty() {
            if let Err(error) = input.parse::<Token![,]>() {
                errors.push(error);
                skip_to_comma(input)?;
                input.parse::<Option<Token![,]>>()?;
            }
        }
    }
    errors.finish()?;
    Ok(args)
}

fn parse_arg(mac: Macro, input: ParseStream) -> syn::Result<Arg> {
    let key_span = input.span();
    let key = match Key::peek(input) {
        Some(key) if mac.keys().contains(&key) => key,
        _ => return Err(unknown_argument(mac, input)),
    };
    input.call(Ident::parse_any)?;
    if !input.peek(Token![=]) {
        return Err(missing_value(key, key_span));
    }
    input.parse::<Token![=]>()?;
    if input.is_empty() || input.peek(Token![,]) {
        return Err(missing_value(key, key_span));
    }
    let value = parse_value(key, input)?;
    Ok(Arg {
        key,
        key_span,
        value,
    })
}

fn parse_value(key: Key, input: ParseStream) -> syn::Result<Value> {
    let expr: Expr = input.parse()?;
    match key {
        Key::Name => string_literal(expr).map(Value::Str),
        Key::Reference => function_path(expr).map(Value::Path),
        Key::Quant => quant_variant(expr).map(Value::Variant),
        _ => Ok(Value::Expr(expr)),
    }
}

fn string_literal(expr: Expr) -> syn::Result<LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(name),
            ..
        }) => Ok(name),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a string literal for `name`, such as `name = \"attn\"`",
        )),
    }
}

fn function_path(expr: Expr) -> syn::Result<ExprPath> {
    match expr {
        Expr::Path(path) => Ok(path),
        other => Err(syn::Error::new_spanned(
            other,
            "expected a path to a function for `reference`, such as `reference = Self::forward_f32`",
        )),
    }
}

/// Accepts `Q4_1` and `QuantType::Q4_1`; the variant name is checked in `valid.rs`.
fn quant_variant(expr: Expr) -> syn::Result<Ident> {
    let variant = match &expr {
        Expr::Path(path) if path.qself.is_none() => path.path.segments.last(),
        _ => None,
    };
    match variant {
        Some(segment) if segment.arguments.is_none() => Ok(segment.ident.clone()),
        _ => Err(syn::Error::new_spanned(
            expr,
            "expected a QuantType variant for `quant`, such as `quant = Q4_1`",
        )),
    }
}

fn unknown_argument(mac: Macro, input: ParseStream) -> syn::Error {
    let expected = expected_keys(mac);
    match input.call(Ident::parse_any) {
        Ok(ident) => syn::Error::new(
            ident.span(),
            format!(
                "unknown argument `{ident}` for `{}`; {expected}",
                mac.display()
            ),
        ),
        Err(_) => input.error(format!(
            "expected an argument of `{}`; {expected}",
            mac.display()
        )),
    }
}

fn expected_keys(mac: Macro) -> String {
    let keys: Vec<String> = mac
        .keys()
        .iter()
        .map(|key| format!("`{}`", key.as_str()))
        .collect();
    match keys.as_slice() {
        [] => "it takes no arguments".to_owned(),
        [only] => format!("expected {only}"),
        [init @ .., last] => format!("expected one of {}, {last}", init.join(", ")),
    }
}

fn missing_value(key: Key, span: Span) -> syn::Error {
    let placeholder = key.placeholder();
    let key = key.as_str();
    syn::Error::new(
        span,
        format!("argument `{key}` needs a value: `{key} = {placeholder}`"),
    )
}

/// Recovery after a bad argument: drop tokens up to the next top-level comma.
fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}
