//! Step 2: the annotated function as the expansion sees it: its parts, which parameters can be
//! probed, what it returns, and the arguments it was given.
//!
//! The body is read last and may fail to parse while the user is still typing it: then the
//! item goes back to the compiler untouched, so that its own error is the only one.

use crate::attr::FnArgs;
use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use syn::ext::IdentExt as _;
use syn::parse::{ParseStream, Parser as _};
use syn::visit::Visit;
use syn::{
    token, Attribute, Block, FnArg, Ident, Pat, ReturnType, Signature, Stmt, Token, Type,
    Visibility,
};

/// The annotated item, as far as it parses.
pub(crate) enum MaybeFn {
    Parsed(Box<FnParts>),
    /// A function the compiler will reject (a syntax error in its signature or body).
    Unparsed,
}

/// A function with a body that parses.
pub(crate) struct FnParts {
    pub(crate) attrs: Vec<Attribute>,
    pub(crate) vis: Visibility,
    pub(crate) sig: Signature,
    pub(crate) inner_attrs: Vec<Attribute>,
    /// The statements as the user wrote them, token for token.
    pub(crate) stmts_tokens: TokenStream,
    /// The same statements, parsed, in their braces.
    pub(crate) block: Block,
}

impl FnParts {
    /// The closing brace of the body.
    pub(crate) fn close_span(&self) -> Span {
        self.block.brace_token.span.close()
    }

    /// A token at or after the body's last inline macro: its last identifier, looking inside
    /// groups, whose span survives being printed again. A closing brace does not (a group
    /// printed by another macro, such as an attribute around this function, has one span, on
    /// its first line), and a literal would lend its text to `line!()`'s literal, which lints
    /// such as `clippy::zero_prefixed_literal` then read.
    pub(crate) fn last_line_span(&self) -> Span {
        last_ident(self.stmts_tokens.clone()).unwrap_or_else(|| self.sig.ident.span())
    }
}

fn last_ident(tokens: TokenStream) -> Option<Span> {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    trees.into_iter().rev().find_map(|tree| match tree {
        TokenTree::Ident(ident) => Some(ident.span()),
        TokenTree::Group(group) => last_ident(group.stream()),
        TokenTree::Punct(_) | TokenTree::Literal(_) => None,
    })
}

/// Parses the annotated item. Anything but a function with a body is an error; a function
/// that does not parse is [`MaybeFn::Unparsed`].
pub(crate) fn parse_fn(display: &str, item: &TokenStream) -> syn::Result<MaybeFn> {
    let (attrs, vis, rest) = fn_prefix.parse2(item.clone())?;
    check_fn_with_body(display, &rest)?;
    let Ok((sig, body)) = signature_and_body.parse2(rest) else {
        return Ok(MaybeFn::Unparsed);
    };
    let Ok((inner_attrs, stmts_tokens, stmts)) = parse_body(&body) else {
        return Ok(MaybeFn::Unparsed);
    };
    let brace_token = token::Brace {
        span: body.delim_span(),
    };
    Ok(MaybeFn::Parsed(Box::new(FnParts {
        attrs,
        vis,
        sig,
        inner_attrs,
        stmts_tokens,
        block: Block { brace_token, stmts },
    })))
}

/// The outer attributes, the visibility, and what follows them.
fn fn_prefix(input: ParseStream) -> syn::Result<(Vec<Attribute>, Visibility, TokenStream)> {
    Ok((
        input.call(Attribute::parse_outer)?,
        input.parse()?,
        input.parse()?,
    ))
}

/// `rest`, what follows the attributes and the visibility, must be a function with a body; if
/// not, the error is on its first token, the item's keyword.
fn check_fn_with_body(display: &str, rest: &TokenStream) -> syn::Result<()> {
    if starts_fn(rest) && ends_in_body(rest) {
        return Ok(());
    }
    let keyword = rest.clone().into_iter().next();
    Err(syn::Error::new(
        keyword.map_or_else(Span::call_site, |token| token.span()),
        format!("`{display}` can only be applied to a function with a body"),
    ))
}

fn ends_in_body(tokens: &TokenStream) -> bool {
    match tokens.clone().into_iter().last() {
        Some(TokenTree::Group(body)) => body.delimiter() == Delimiter::Brace,
        _ => false,
    }
}

fn signature_and_body(input: ParseStream) -> syn::Result<(Signature, Group)> {
    let sig = input.parse()?;
    let body = input.parse()?;
    Ok((sig, body))
}

/// Whether the tokens start with a function's qualifiers and `fn`: `const`, `async`,
/// `unsafe`, `safe`, `extern "C"`.
fn starts_fn(tokens: &TokenStream) -> bool {
    for tree in tokens.clone() {
        match tree {
            TokenTree::Ident(ident) if ident == "fn" => return true,
            TokenTree::Ident(ident)
                if ["const", "async", "unsafe", "safe", "extern", "default"]
                    .iter()
                    .any(|qualifier| ident == qualifier) => {}
            TokenTree::Literal(_) => {}
            _ => return false,
        }
    }
    false
}

/// The inner attributes, the statements' tokens, and the statements parsed.
fn parse_body(body: &Group) -> syn::Result<(Vec<Attribute>, TokenStream, Vec<Stmt>)> {
    let parser = |input: ParseStream| {
        let inner_attrs = input.call(Attribute::parse_inner)?;
        let stmts_tokens: TokenStream = input.fork().parse()?;
        let stmts = input.call(Block::parse_within)?;
        Ok((inner_attrs, stmts_tokens, stmts))
    };
    parser.parse2(body.stream())
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
    pub(crate) args: FnArgs,
    pub(crate) func: FnParts,
    pub(crate) params: Vec<Param>,
    pub(crate) output: Output,
}

impl TracedFn {
    pub(crate) fn new(args: FnArgs, func: FnParts) -> Self {
        let params = func.sig.inputs.iter().map(param).collect();
        let output = output(&func.sig.output);
        TracedFn {
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

    /// The type of `self` when the method takes it by value (`self`, `mut self`,
    /// `self: Box<Self>`), not through a reference.
    pub(crate) fn self_by_value(&self) -> Option<&Type> {
        self.func.sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Receiver(receiver)
                if receiver.reference.is_none() && !matches!(&*receiver.ty, Type::Reference(_)) =>
            {
                Some(&*receiver.ty)
            }
            _ => None,
        })
    }

    /// The declared type of the parameter `ident`, where a path can name it (not an
    /// `impl Trait`).
    pub(crate) fn nameable_type(&self, ident: &Ident) -> Option<&Type> {
        self.func.sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(binding)
                    if binding.ident == *ident && !contains_impl_trait(&typed.ty) =>
                {
                    Some(&*typed.ty)
                }
                _ => None,
            },
            FnArg::Receiver(_) => None,
        })
    }

    /// How an intervention can change the parameter `ident`, if at all: an owned value in
    /// place, a shared reference through a copy of its own that the parameter is shadowed
    /// with. Not a `&mut` (the caller's tensor would change), nor a `ref` binding, nor a
    /// reference when the output may borrow from it (a reference to the copy could not be
    /// returned).
    pub(crate) fn passing(&self, ident: &Ident) -> Option<Passing> {
        let typed = self.func.sig.inputs.iter().find_map(|arg| match arg {
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(binding) if binding.ident == *ident => Some((binding, &*typed.ty)),
                _ => None,
            },
            FnArg::Receiver(_) => None,
        });
        let (binding, ty) = typed?;
        if binding.by_ref.is_some() || binding.subpat.is_some() {
            return None;
        }
        match strip_parens(ty) {
            Type::Reference(reference) if reference.mutability.is_none() => {
                let output_may_borrow = match &self.func.sig.output {
                    ReturnType::Default => false,
                    ReturnType::Type(_, ty) => may_borrow(ty),
                };
                (!output_may_borrow).then_some(Passing::Borrowed)
            }
            Type::Reference(_) => None,
            _ => Some(Passing::Owned {
                mutable: binding.mutability.is_some(),
            }),
        }
    }
}

/// How a parameter that an intervention changes is passed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Passing {
    /// `x: T`: changed in place (the expansion rebinds it `mut` unless it is).
    Owned { mutable: bool },
    /// `x: &T`: shadowed with a reference to a changed copy.
    Borrowed,
}

fn strip_parens(ty: &Type) -> &Type {
    match ty {
        Type::Paren(inner) => strip_parens(&inner.elem),
        Type::Group(inner) => strip_parens(&inner.elem),
        other => other,
    }
}

/// Whether a value of `ty` may hold a borrow: it names a reference, a lifetime or an `impl`
/// type (which may capture one).
fn may_borrow(ty: &Type) -> bool {
    struct Finder(bool);
    impl Visit<'_> for Finder {
        fn visit_type_reference(&mut self, _: &syn::TypeReference) {
            self.0 = true;
        }
        fn visit_lifetime(&mut self, _: &syn::Lifetime) {
            self.0 = true;
        }
        fn visit_type_impl_trait(&mut self, _: &syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    finder.visit_type(ty);
    finder.0
}

pub(crate) fn param(arg: &FnArg) -> Param {
    match arg {
        FnArg::Receiver(receiver) => Param::Receiver(receiver.self_token),
        FnArg::Typed(typed) => match &*typed.pat {
            Pat::Ident(binding) => Param::Named(binding.ident.clone()),
            other => Param::Unnamed(Box::new(other.clone())),
        },
    }
}

pub(crate) fn output(ret: &ReturnType) -> Output {
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
