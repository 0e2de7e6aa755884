//! Step 1: parse macro arguments (`key = value, ...`) into one struct per macro, each key an
//! `Option` of its typed value.
//!
//! Every key is a custom keyword so that a misspelt key is reported on its own token, and the
//! parser keeps going after a bad argument so that one expansion reports every mistake at once.

use crate::errors::Errors;
use crate::kind::{InlineMacro, Macro};
use proc_macro2::{Span, TokenStream, TokenTree};
use syn::ext::IdentExt as _;
use syn::parse::{Parse, ParseStream, Parser as _};
use syn::{Expr, ExprLit, ExprPath, Ident, Lit, LitStr, Token};

/// Declares the keys, one custom keyword each: the one list of what any macro accepts.
macro_rules! keys {
    ($($key:ident)*) => {
        pub(crate) mod kw {
            $(syn::custom_keyword!($key);)*
        }
    };
}

keys! { name position tokens index input layer len capacity bytes evictions hit_rate reference quant scoring bias groups }

/// Declares the arguments of one macro: a struct with an `Option` per key, and how a
/// `key = value` is stored in it. The field is named after the key's keyword.
macro_rules! arguments {
    ($(#[$doc:meta])* $name:ident { $($key:ident: $value:ty,)* }) => {
        $(#[$doc])*
        #[derive(Default)]
        pub(crate) struct $name {
            $(pub(crate) $key: Option<$value>,)*
        }

        impl Arguments for $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($key),)*];

            fn parse_one(&mut self, input: ParseStream) -> Option<syn::Result<()>> {
                $(if input.peek(kw::$key) {
                    let key = stringify!($key);
                    return Some(argument::<kw::$key, $value>(input, key, &mut self.$key));
                })*
                None
            }
        }
    };
}

/// The arguments of one macro.
pub(crate) trait Arguments: Default {
    /// The keys it takes, as written.
    const KEYS: &'static [&'static str];

    /// Parses one `key = value` into its field; `None` when the next token is none of its keys.
    fn parse_one(&mut self, input: ParseStream) -> Option<syn::Result<()>>;
}

arguments! {
    /// `#[trace_model(...)]`.
    ModelArgs {
        position: Expr,
        tokens: Expr,
        name: LitStr,
    }
}

arguments! {
    /// `#[trace_layer(...)]`.
    LayerArgs {
        index: Expr,
        input: Expr,
        name: LitStr,
    }
}

arguments! {
    /// `#[trace_attention(...)]`, `#[trace_logits(...)]` and their inline forms.
    ValueArgs {
        layer: Expr,
        name: LitStr,
    }
}

arguments! {
    /// `#[trace_kv_cache(...)]`.
    KvCacheArgs {
        layer: Expr,
        len: Expr,
        capacity: Expr,
        bytes: Expr,
        evictions: Expr,
        hit_rate: Expr,
        name: LitStr,
    }
}

arguments! {
    /// `#[trace_quant(...)]` as written; [`QuantArgs`] once `reference` is known to be there.
    QuantAttrs {
        reference: ExprPath,
        quant: QuantVariant,
        name: LitStr,
    }
}

arguments! {
    /// `#[trace_router(...)]` and `trace_router_value!`.
    RouterArgs {
        scoring: Scoring,
        bias: Expr,
        groups: Groups,
        layer: Expr,
        name: LitStr,
    }
}

/// `#[trace_quant(...)]` with its `reference`: [`QuantAttrs`] once `valid.rs` has checked it.
pub(crate) struct QuantArgs {
    pub(crate) reference: ExprPath,
    /// A name of `valid::QUANT_TYPES`.
    pub(crate) quant: Option<Ident>,
    pub(crate) name: Option<LitStr>,
}

/// `trace_tensor!` takes none.
#[derive(Default)]
pub(crate) struct NoArgs {}

impl Arguments for NoArgs {
    const KEYS: &'static [&'static str] = &[];

    fn parse_one(&mut self, _: ParseStream) -> Option<syn::Result<()>> {
        None
    }
}

/// The value after `key =`, checked for its syntactic form.
pub(crate) trait Value: Sized {
    /// What goes after `=`, shown when the value is missing.
    const PLACEHOLDER: &'static str;

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self>;
}

impl Value for Expr {
    const PLACEHOLDER: &'static str = "EXPR";

    fn from_expr(_: &str, expr: Expr) -> syn::Result<Self> {
        Ok(expr)
    }
}

impl Value for LitStr {
    const PLACEHOLDER: &'static str = "\"...\"";

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self> {
        match expr {
            Expr::Lit(ExprLit {
                lit: Lit::Str(name),
                ..
            }) => Ok(name),
            other => Err(syn::Error::new_spanned(
                other,
                format!("expected a string literal for `{key}`, such as `{key} = \"attn\"`"),
            )),
        }
    }
}

impl Value for ExprPath {
    const PLACEHOLDER: &'static str = "PATH";

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self> {
        match expr {
            Expr::Path(path) => Ok(path),
            other => Err(syn::Error::new_spanned(
                other,
                format!(
                    "expected a path to a function for `{key}`, such as \
                     `{key} = Self::forward_f32`"
                ),
            )),
        }
    }
}

/// `quant = Q4_1` or `quant = QuantType::Q4_1`: the variant's name, checked in `valid.rs`.
pub(crate) struct QuantVariant(pub(crate) Ident);

impl Value for QuantVariant {
    const PLACEHOLDER: &'static str = "Q4_1";

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self> {
        let variant = match &expr {
            Expr::Path(path) if path.qself.is_none() => path.path.segments.last(),
            _ => None,
        };
        match variant {
            Some(segment) if segment.arguments.is_none() => Ok(Self(segment.ident.clone())),
            _ => Err(syn::Error::new_spanned(
                expr,
                format!("expected a QuantType variant for `{key}`, such as `{key} = Q4_1`"),
            )),
        }
    }
}

/// What `scoring = ...` accepts, with the `RouterScoring` variant each names.
pub(crate) const SCORINGS: &[(&str, &str)] = &[("softmax", "Softmax"), ("sigmoid", "Sigmoid")];

/// `scoring = softmax` or `scoring = sigmoid`: a name of [`SCORINGS`], checked here so that
/// its mistake is reported with the other arguments'.
pub(crate) struct Scoring(pub(crate) Ident);

impl Scoring {
    /// The `RouterScoring` variant it names.
    pub(crate) fn variant(&self) -> &'static str {
        let name = self.0.to_string();
        SCORINGS
            .iter()
            .find(|(known, _)| *known == name)
            .map_or("Softmax", |(_, variant)| variant)
    }
}

impl Value for Scoring {
    const PLACEHOLDER: &'static str = "softmax";

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self> {
        let ident = match &expr {
            Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
            _ => None,
        };
        let Some(ident) = ident else {
            return Err(syn::Error::new_spanned(
                expr,
                format!("expected `softmax` or `sigmoid` for `{key}`, such as `{key} = sigmoid`"),
            ));
        };
        let name = ident.to_string();
        if !SCORINGS.iter().any(|(known, _)| *known == name) {
            return Err(syn::Error::new(
                ident.span(),
                format!("unknown scoring `{name}`; expected `softmax` or `sigmoid`"),
            ));
        }
        Ok(Self(ident.clone()))
    }
}

/// `groups = (GROUPS, TOP_GROUPS)`: grouped top-k, two integer expressions; written as
/// literals, at least one group and 1 to `GROUPS` of them chosen.
pub(crate) struct Groups {
    pub(crate) groups: Expr,
    pub(crate) top_groups: Expr,
}

impl Value for Groups {
    const PLACEHOLDER: &'static str = "(GROUPS, TOP_GROUPS)";

    fn from_expr(key: &str, expr: Expr) -> syn::Result<Self> {
        let pair = match &expr {
            Expr::Tuple(tuple) if tuple.elems.len() == 2 => {
                Some((tuple.elems[0].clone(), tuple.elems[1].clone()))
            }
            _ => None,
        };
        let Some((groups, top_groups)) = pair else {
            return Err(syn::Error::new_spanned(
                expr,
                format!(
                    "expected `{key} = (GROUPS, TOP_GROUPS)`: how many groups the experts split \
                     into and how many are chosen, such as `{key} = (8, 4)`"
                ),
            ));
        };
        let groups = Self { groups, top_groups };
        groups.check_literals(key)?;
        Ok(groups)
    }
}

impl Groups {
    fn check_literals(&self, key: &str) -> syn::Result<()> {
        let literal = |expr: &Expr| match expr {
            Expr::Lit(ExprLit {
                lit: Lit::Int(int), ..
            }) => int.base10_parse::<u64>().ok(),
            _ => None,
        };
        let error = |expr: &Expr, message: String| Err(syn::Error::new_spanned(expr, message));
        match (literal(&self.groups), literal(&self.top_groups)) {
            (Some(0), _) => error(&self.groups, format!("`{key}` needs at least one group")),
            (_, Some(0)) => error(
                &self.top_groups,
                format!("`{key}` must choose at least one group"),
            ),
            (Some(count), Some(top)) if top > count => error(
                &self.top_groups,
                format!("`{key}` chooses {top} of {count} groups; choose at most {count}"),
            ),
            _ => Ok(()),
        }
    }
}

/// What an attribute macro was given, one variant per macro; `FnArgs::parse` in `valid.rs`
/// builds it, as `#[trace_quant]`'s arguments are checked on the way.
pub(crate) enum FnArgs {
    Model(ModelArgs),
    Layer(LayerArgs),
    Attention(ValueArgs),
    Logits(ValueArgs),
    KvCache(Box<KvCacheArgs>),
    Quant(QuantArgs),
    Router(Box<RouterArgs>),
}

impl FnArgs {
    pub(crate) fn mac(&self) -> Macro {
        match self {
            FnArgs::Model(_) => Macro::Model,
            FnArgs::Layer(_) => Macro::Layer,
            FnArgs::Attention(_) => Macro::Attention,
            FnArgs::Logits(_) => Macro::Logits,
            FnArgs::KvCache(_) => Macro::KvCache,
            FnArgs::Quant(_) => Macro::Quant,
            FnArgs::Router(_) => Macro::Router,
        }
    }

    /// `name = "..."`, whichever macro it is.
    pub(crate) fn name(&self) -> Option<&LitStr> {
        match self {
            FnArgs::Model(args) => args.name.as_ref(),
            FnArgs::Layer(args) => args.name.as_ref(),
            FnArgs::Attention(args) | FnArgs::Logits(args) => args.name.as_ref(),
            FnArgs::KvCache(args) => args.name.as_ref(),
            FnArgs::Quant(args) => args.name.as_ref(),
            FnArgs::Router(args) => args.name.as_ref(),
        }
    }
}

pub(crate) fn parse_args<A: Arguments>(display: &str, tokens: TokenStream) -> syn::Result<A> {
    (|input: ParseStream| parse_list(display, input)).parse2(tokens)
}

/// An inline macro: `trace_tensor!("stage", &t)` or `trace_attention_value!(&p, layer = 3)`.
pub(crate) struct InlineInput {
    pub(crate) value: Expr,
    pub(crate) what: Inline,
}

/// What an inline macro records, with its arguments.
pub(crate) enum Inline {
    Tensor(LitStr),
    /// `trace_stage!`: a stage that returns its value, which an intervention may change.
    Stage(LitStr),
    Attention(ValueArgs),
    Logits(ValueArgs),
    /// `trace_router_value!`: `value` is the logits.
    Router(Box<RouterValues>),
}

/// The rest of `trace_router_value!(&logits, &weights, &experts, ...)`.
pub(crate) struct RouterValues {
    pub(crate) weights: Expr,
    pub(crate) experts: Expr,
    pub(crate) args: RouterArgs,
}

impl InlineInput {
    pub(crate) fn parse(mac: InlineMacro, tokens: TokenStream) -> syn::Result<Self> {
        (|input: ParseStream| parse_inline_input(mac, input)).parse2(tokens)
    }
}

fn parse_inline_input(mac: InlineMacro, input: ParseStream) -> syn::Result<InlineInput> {
    let display = mac.display();
    let (value, what) = match mac {
        InlineMacro::Tensor => {
            let stage = parse_stage(input)?;
            let (value, NoArgs {}) = value_then_args(display, input)?;
            (value, Inline::Tensor(stage))
        }
        InlineMacro::Stage => {
            let stage = parse_stage(input)?;
            let (value, NoArgs {}) = value_then_args(display, input)?;
            (value, Inline::Stage(stage))
        }
        InlineMacro::AttentionValue => {
            let (value, args) = value_then_args(display, input)?;
            (value, Inline::Attention(args))
        }
        InlineMacro::LogitsValue => {
            let (value, args) = value_then_args(display, input)?;
            (value, Inline::Logits(args))
        }
        InlineMacro::RouterValue => {
            let [logits, weights, experts] = router_values(display, input)?;
            let args = parse_list(display, input)?;
            let values = RouterValues {
                weights,
                experts,
                args,
            };
            (logits, Inline::Router(Box::new(values)))
        }
    };
    Ok(InlineInput { value, what })
}

/// `&value` then, after a comma, the arguments.
fn value_then_args<A: Arguments>(display: &str, input: ParseStream) -> syn::Result<(Expr, A)> {
    let value = parse_inline_value(display, input)?;
    if !input.is_empty() {
        input.parse::<Token![,]>()?;
    }
    Ok((value, parse_list(display, input)?))
}

/// `&logits, &weights, &experts` then a comma or the end: the three values come first, so an
/// argument in their place (`scoring = sigmoid` read as an assignment) says so.
fn router_values(display: &str, input: ParseStream) -> syn::Result<[Expr; 3]> {
    let mut values = Vec::with_capacity(3);
    for what in ["logits", "weights", "experts"] {
        let message = || {
            format!(
                "`{display}` needs the router's logits, weights and experts first, then its \
                 arguments: `{display}(&logits, &weights, &experts, scoring = sigmoid)`; \
                 expected the {what} here"
            )
        };
        if input.is_empty() {
            return Err(syn::Error::new(Span::call_site(), message()));
        }
        let value: Expr = input.parse()?;
        if let Expr::Assign(assign) = &value {
            if matches!(&*assign.left, Expr::Path(path) if path.path.get_ident().is_some()) {
                return Err(syn::Error::new_spanned(value, message()));
            }
        }
        values.push(value);
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    values
        .try_into()
        .map_err(|_| syn::Error::new(Span::call_site(), format!("`{display}` takes three values")))
}

/// `"stage",` at the start of `trace_tensor!`.
fn parse_stage(input: ParseStream) -> syn::Result<LitStr> {
    if !input.peek(LitStr) {
        let message = "expected the stage name as a string literal, such as \"attn_out\"";
        return Err(match input.parse::<Expr>() {
            Ok(other) => syn::Error::new_spanned(other, message),
            Err(error) => syn::Error::new(error.span(), message),
        });
    }
    let stage: LitStr = input.parse()?;
    if input.is_empty() {
        return Err(missing_tensor(&stage));
    }
    input.parse::<Token![,]>()?;
    Ok(stage)
}

fn missing_tensor(literal: &LitStr) -> syn::Error {
    let stage = literal.value();
    syn::Error::new(
        literal.span(),
        format!("missing the tensor of stage \"{stage}\": `trace_tensor!(\"{stage}\", &x)`"),
    )
}

fn parse_inline_value(display: &str, input: ParseStream) -> syn::Result<Expr> {
    if input.is_empty() {
        let message = format!("`{display}` needs the value to trace, such as `&x`");
        return Err(syn::Error::new(Span::call_site(), message));
    }
    input.parse()
}

/// Parses `key = value` pairs separated by commas, collecting every error before giving up:
/// an unknown key here, a missing value or a repeated key in [`argument`].
fn parse_list<A: Arguments>(display: &str, input: ParseStream) -> syn::Result<A> {
    let mut args = A::default();
    let mut errors = Errors::default();
    while !input.is_empty() {
        let parsed = args
            .parse_one(input)
            .unwrap_or_else(|| Err(unknown_argument::<A>(display, input)));
        if let Err(error) = parsed {
            errors.push(error);
            skip_to_comma(input)?;
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

/// `key = value` into `slot`: the value must be there, in its form, and the key not repeated.
fn argument<K: Parse, V: Value>(
    input: ParseStream,
    key: &str,
    slot: &mut Option<V>,
) -> syn::Result<()> {
    let key_span = input.span();
    input.parse::<K>()?;
    let missing_value = || {
        syn::Error::new(
            key_span,
            format!(
                "argument `{key}` needs a value: `{key} = {}`",
                V::PLACEHOLDER
            ),
        )
    };
    if input.parse::<Option<Token![=]>>()?.is_none() || input.is_empty() || input.peek(Token![,]) {
        return Err(missing_value());
    }
    let value = V::from_expr(key, input.parse()?)?;
    if slot.is_some() {
        return Err(syn::Error::new(
            key_span,
            format!("duplicate argument `{key}`"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

fn unknown_argument<A: Arguments>(display: &str, input: ParseStream) -> syn::Error {
    let expected = expected_keys(A::KEYS);
    match input.call(Ident::parse_any) {
        Ok(ident) => syn::Error::new(
            ident.span(),
            format!("unknown argument `{ident}` for `{display}`; {expected}"),
        ),
        Err(_) => input.error(format!("expected an argument of `{display}`; {expected}")),
    }
}

fn expected_keys(keys: &[&str]) -> String {
    let keys: Vec<String> = keys.iter().map(|key| format!("`{key}`")).collect();
    match keys.as_slice() {
        [] => "it takes no arguments".to_owned(),
        [only] => format!("expected {only}"),
        [init @ .., last] => format!("expected one of {}, {last}", init.join(", ")),
    }
}

/// Recovery after a bad argument: drop tokens up to the next top-level comma.
fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    while !input.is_empty() && !input.peek(Token![,]) {
        input.parse::<TokenTree>()?;
    }
    Ok(())
}
