//! The quantization formats ggml knows: [`QuantType`], with their names and block layouts.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Declares the formats once: the enum with a doc line per variant, `ALL`, the names and the
/// block layouts all come from this table.
macro_rules! quant_types {
    ($($variant:ident: $elements:literal elements in $bytes:literal bytes, $doc:literal;)*) => {
        /// Tensor formats of ggml/GGUF, with their block layouts.
        ///
        /// Names follow ggml (`Q4_K`, `IQ2_XXS`), which is why the variants are not CamelCase.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum QuantType {
            $(#[doc = $doc] $variant,)*
        }

        impl QuantType {
            /// Every format, in declaration order.
            pub const ALL: &'static [QuantType] = &[$(Self::$variant,)*];

            /// `(elements per block, bytes per block)` of ggml's block struct for this format
            /// (`ggml-common.h`; the byte counts are the sizes its `static_assert`s check).
            pub const fn block_layout(self) -> (u32, u32) {
                match self {
                    $(Self::$variant => ($elements, $bytes),)*
                }
            }

            /// The variant's name as written in Rust and in the macros' `quant = ...` argument
            /// (`"Q4_K"`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => stringify!($variant),)*
                }
            }
        }
    };
}

quant_types! {
    F32: 1 elements in 4 bytes, "32-bit float.";
    F16: 1 elements in 2 bytes, "IEEE half precision.";
    BF16: 1 elements in 2 bytes, "bfloat16.";
    Q4_0: 32 elements in 18 bytes, "4-bit, one f16 scale per 32 (d + 32 nibbles).";
    Q4_1: 32 elements in 20 bytes, "4-bit, f16 scale and minimum per 32.";
    Q5_0: 32 elements in 22 bytes, "5-bit, one scale per 32 (d + 4 bytes of high bits + 32 nibbles).";
    Q5_1: 32 elements in 24 bytes, "5-bit, scale and minimum per 32.";
    Q8_0: 32 elements in 34 bytes, "8-bit, one f16 scale per 32 (d + 32 int8).";
    Q8_1: 32 elements in 36 bytes, "8-bit, scale and sum per 32.";
    Q2_K: 256 elements in 84 bytes, "2-bit k-quant, super-blocks of 256.";
    Q3_K: 256 elements in 110 bytes, "3-bit k-quant.";
    Q4_K: 256 elements in 144 bytes, "4-bit k-quant.";
    Q5_K: 256 elements in 176 bytes, "5-bit k-quant.";
    Q6_K: 256 elements in 210 bytes, "6-bit k-quant.";
    Q8_K: 256 elements in 292 bytes, "8-bit k-quant (d as f32 + 256 int8 + 16 int16 sums).";
    IQ1_S: 256 elements in 50 bytes, "1.5-bit i-quant.";
    IQ1_M: 256 elements in 56 bytes, "1.75-bit i-quant.";
    IQ2_XXS: 256 elements in 66 bytes, "2.06-bit i-quant.";
    IQ2_XS: 256 elements in 74 bytes, "2.31-bit i-quant.";
    IQ2_S: 256 elements in 82 bytes, "2.5-bit i-quant.";
    IQ3_XXS: 256 elements in 98 bytes, "3.06-bit i-quant.";
    IQ3_S: 256 elements in 110 bytes, "3.44-bit i-quant.";
    IQ4_NL: 32 elements in 18 bytes, "4-bit non-linear i-quant, blocks of 32.";
    IQ4_XS: 256 elements in 136 bytes, "4.25-bit non-linear i-quant.";
    TQ1_0: 256 elements in 54 bytes, "ternary, 1.69 bits.";
    TQ2_0: 256 elements in 66 bytes, "ternary, 2.06 bits.";
    MXFP4: 32 elements in 17 bytes, "OCP microscaling fp4 (e8m0 scale + 32 fp4).";
}

impl QuantType {
    /// Elements per block.
    pub const fn block_elements(self) -> u32 {
        self.block_layout().0
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> u32 {
        self.block_layout().1
    }

    /// Storage cost per weight including the block's scales, e.g. Q4_0 = 18·8/32 = 4.5.
    #[allow(clippy::cast_precision_loss)]
    pub fn bits_per_element(self) -> f32 {
        let (elements, bytes) = self.block_layout();
        (bytes * 8) as f32 / elements as f32
    }

    /// Size reduction against F32 (`32 / bits_per_element`), e.g. Q4_K ≈ 7.1.
    pub fn compression_ratio(self) -> f32 {
        32.0 / self.bits_per_element()
    }

    /// The format named `name`, case-insensitively, so ggml's own spelling (`"q4_K"`,
    /// `"iq2_xxs"`) and GGUF tooling's (`"Q4_K"`) both work.
    pub fn from_name(name: &str) -> Option<QuantType> {
        Self::ALL
            .iter()
            .copied()
            .find(|q| q.name().eq_ignore_ascii_case(name))
    }

    /// Whether values are stored in blocks with shared scales (everything but F32/F16/BF16).
    pub const fn is_quantized(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's bits per weight, written out independently of `block_layout`.
    const EXPECTED_BITS: &[(QuantType, f32)] = &[
        (QuantType::F32, 32.0),
        (QuantType::F16, 16.0),
        (QuantType::BF16, 16.0),
        (QuantType::Q4_0, 4.5),
        (QuantType::Q4_1, 5.0),
        (QuantType::Q5_0, 5.5),
        (QuantType::Q5_1, 6.0),
        (QuantType::Q8_0, 8.5),
        (QuantType::Q8_1, 9.0),
        (QuantType::Q2_K, 2.625),
        (QuantType::Q3_K, 3.4375),
        (QuantType::Q4_K, 4.5),
        (QuantType::Q5_K, 5.5),
        (QuantType::Q6_K, 6.5625),
        (QuantType::Q8_K, 9.125),
        (QuantType::IQ1_S, 1.5625),
        (QuantType::IQ1_M, 1.75),
        (QuantType::IQ2_XXS, 2.0625),
        (QuantType::IQ2_XS, 2.3125),
        (QuantType::IQ2_S, 2.5625),
        (QuantType::IQ3_XXS, 3.0625),
        (QuantType::IQ3_S, 3.4375),
        (QuantType::IQ4_NL, 4.5),
        (QuantType::IQ4_XS, 4.25),
        (QuantType::TQ1_0, 1.6875),
        (QuantType::TQ2_0, 2.0625),
        (QuantType::MXFP4, 4.25),
    ];

    #[test]
    fn bits_per_element_of_every_variant() {
        assert_eq!(EXPECTED_BITS.len(), QuantType::ALL.len());
        for (&q, &(expected_q, bits)) in QuantType::ALL.iter().zip(EXPECTED_BITS) {
            assert_eq!(q, expected_q);
            assert_eq!(q.bits_per_element(), bits, "{q}");
            assert_eq!(q.compression_ratio(), 32.0 / bits, "{q}");
        }
        assert!((QuantType::Q4_K.compression_ratio() - 7.111).abs() < 1e-3);
    }

    #[test]
    fn names_round_trip() {
        for &q in QuantType::ALL {
            assert_eq!(QuantType::from_name(q.name()), Some(q));
            assert_eq!(QuantType::from_name(&q.name().to_lowercase()), Some(q));
            assert_eq!(q.to_string(), q.name());
            let json = serde_json::to_string(&q).unwrap();
            assert_eq!(json, format!("\"{}\"", q.name()));
        }
        assert_eq!(QuantType::from_name("q4_K"), Some(QuantType::Q4_K));
        assert_eq!(QuantType::from_name("Q4_K_M"), None);
        assert_eq!(QuantType::from_name(""), None);
        assert!(!QuantType::BF16.is_quantized() && QuantType::IQ1_S.is_quantized());
    }
}
