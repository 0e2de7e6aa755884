//! Every `QuantType` name that `quant = ...` accepts exists in the runtime, and the runtime has
//! no variant the macro would reject.
#![deny(warnings)]

use model_trace::{trace_quant, QuantType};

fn reference(x: &[f32]) -> Vec<f32> {
    x.to_vec()
}

macro_rules! sites {
    ($($variant:ident)*) => {
        $(
            #[allow(non_snake_case)]
            #[trace_quant(reference = reference, quant = $variant)]
            fn $variant(x: &[f32]) -> Vec<f32> {
                x.to_vec()
            }
        )*
        const ACCEPTED: &[&str] = &[$(stringify!($variant)),*];
        fn call_all() {
            $(assert_eq!($variant(&[1.0]), vec![1.0]);)*
        }
    };
}

sites! {
    F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q8_1 Q2_K Q3_K Q4_K Q5_K Q6_K Q8_K
    IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS TQ1_0 TQ2_0 MXFP4
}

fn main() {
    call_all();
    let runtime: Vec<&str> = QuantType::ALL.iter().map(|q| q.name()).collect();
    assert_eq!(ACCEPTED, runtime.as_slice());
}
