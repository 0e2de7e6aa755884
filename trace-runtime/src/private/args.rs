//! Arguments: one trait per argument that takes a number, so that a value of the wrong type is
//! reported with the argument's name and what it takes. The conversions are `as` casts, as
//! documented on the macros: an index never exceeds `usize`, a hit rate needs no `f64` digits.

/// Declares an argument's trait and implements it for every integer type.
macro_rules! integer_argument {
    ($(#[$doc:meta])* $name:ident, $message:literal) => {
        $(#[$doc])*
        #[diagnostic::on_unimplemented(message = $message, label = "expected an integer")]
        pub trait $name {
            /// The value as the runtime takes it.
            fn convert(self) -> usize;
        }

        integer_argument!(@impls $name: u8 u16 u32 u64 u128 usize i8 i16 i32 i64 i128 isize);
    };
    (@impls $name:ident: $($source:ty)*) => {
        $(impl $name for $source {
            #[inline]
            #[allow(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                clippy::cast_possible_wrap,
                clippy::unnecessary_cast,
                trivial_numeric_casts
            )]
            fn convert(self) -> usize {
                self as usize
            }
        })*
    };
}

integer_argument!(
    /// `position = EXPR` of `#[trace_model]`.
    PositionArg,
    "`position` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `index = EXPR` of `#[trace_layer]`.
    IndexArg,
    "`index` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `layer = EXPR` of `#[trace_attention]`, `#[trace_logits]`, `#[trace_kv_cache]`,
    /// `#[trace_router]` and the inline macros.
    LayerArg,
    "`layer` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `len = EXPR` of `#[trace_kv_cache]`.
    LenArg,
    "`len` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `capacity = EXPR` of `#[trace_kv_cache]`.
    CapacityArg,
    "`capacity` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `bytes = EXPR` of `#[trace_kv_cache]`.
    BytesArg,
    "`bytes` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// `evictions = EXPR` of `#[trace_kv_cache]`.
    EvictionsArg,
    "`evictions` takes an integer (any integer type), not `{Self}`"
);
integer_argument!(
    /// Each of `groups = (GROUPS, TOP_GROUPS)` of `#[trace_router]` and `trace_router_value!`.
    GroupsArg,
    "`groups` takes two integers (any integer type), not `{Self}`"
);

/// `hit_rate = EXPR` of `#[trace_kv_cache]`.
#[diagnostic::on_unimplemented(
    message = "`hit_rate` takes an `f32` or `f64`, not `{Self}`",
    label = "expected an `f32` or `f64`"
)]
pub trait HitRateArg {
    /// The value as the runtime takes it.
    fn convert(self) -> f32;
}

impl HitRateArg for f32 {
    #[inline]
    fn convert(self) -> f32 {
        self
    }
}

impl HitRateArg for f64 {
    #[inline]
    #[allow(clippy::cast_possible_truncation)]
    fn convert(self) -> f32 {
        self as f32
    }
}
