//! The names ops and dtypes have in the e-graph, both ways: `"sigmoid"`, `"mul"`, `"f32"`.

use mgn_ir::op::{BinaryOp, UnaryOp};
use mgn_ir::DType;

pub(super) fn unary_name(u: UnaryOp) -> String {
    format!("{u:?}").to_lowercase()
}

pub(super) fn unary_of(name: &str) -> Option<UnaryOp> {
    UnaryOp::ALL.into_iter().find(|&u| unary_name(u) == name)
}

const BINARY: [(BinaryOp, &str); 6] = [
    (BinaryOp::Add, "add"),
    (BinaryOp::Sub, "sub"),
    (BinaryOp::Mul, "mul"),
    (BinaryOp::Div, "div"),
    (BinaryOp::Maximum, "maximum"),
    (BinaryOp::Minimum, "minimum"),
];

pub(super) fn binary_name(b: BinaryOp) -> &'static str {
    BINARY.iter().find(|(op, _)| *op == b).map_or("", |(_, n)| n)
}

pub(super) fn binary_of(name: &str) -> Option<BinaryOp> {
    BINARY.iter().find(|(_, n)| *n == name).map(|(op, _)| *op)
}

const DTYPES: [DType; 7] =
    [DType::F32, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::Bool];

pub(super) fn dtype_of(name: &str) -> Option<DType> {
    DTYPES.into_iter().find(|d| d.name() == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for u in UnaryOp::ALL {
            assert_eq!(unary_of(&unary_name(u)), Some(u));
        }
        for (b, _) in BINARY {
            assert_eq!(binary_of(binary_name(b)), Some(b));
        }
        for d in DTYPES {
            assert_eq!(dtype_of(d.name()), Some(d));
        }
    }
}
