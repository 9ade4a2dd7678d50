//! Steps that read a weight where it lies (`mgn_cpu::fused`): a product or lookup whose weight
//! is a dequantized parameter reads the parameter's packed bytes, and the dequantize (and any
//! transpose between) is not computed (`Fused::Skip`); a product by the transpose of a float
//! parameter reads the parameter through its strides, and the transpose is not computed.

use super::*;
use cpu::fused::Fused;
use mgn_ir::plan::Step;

/// A step's operands: its inputs' values, or for a fused step the value it multiplies or
/// indexes and the packed parameter itself (the dequantize between holds nothing).
pub(super) fn operands<'a>(
    fused: &Fused,
    step: &Step,
    get: impl Fn(u32) -> &'a Tensor,
    params: &'a [Tensor],
) -> Vec<&'a Tensor> {
    match fused {
        Fused::MatMul { x, param, .. } => vec![get(*x), &params[*param]],
        Fused::Gather { param, ids } => vec![&params[*param], get(*ids)],
        Fused::No | Fused::Skip => step.inputs.iter().map(|&x| get(x)).collect(),
    }
}

/// Runs a step on its `operands`.
pub(super) fn eval(
    fused: &Fused,
    step: &Step,
    args: &[&Tensor],
    ctx: &cpu::Ctx,
) -> Result<Tensor, cpu::KernelError> {
    match fused {
        Fused::No | Fused::Skip => cpu::eval(&step.op, args, step.dtype, &step.shape, ctx),
        f => cpu::fused::eval_fused(f, args, step.dtype, &step.shape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::plan::{InitSpec, ParamSpec, SourceLoc};
    use mgn_ir::DType;

    fn step(op: Op, inputs: Vec<u32>, dtype: DType, shape: &[usize]) -> Step {
        Step { op, inputs, dtype, shape: shape.to_vec(), loc: SourceLoc::default() }
    }

    fn param(name: &str, dtype: DType, shape: &[usize]) -> ParamSpec {
        let init = InitSpec::Normal { mean: 0.0, std: 0.5 };
        let (trainable, frozen, persistent) = (false, true, true);
        ParamSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            init,
            trainable,
            frozen,
            persistent,
        }
    }

    /// `y = x @ Wᵀ` and `e = E[ids]` with W and E packed; `keep` makes the dequantized W an
    /// output too, which a fused product would not compute.
    fn plan(keep: bool) -> Plan {
        let f = DType::F32;
        let steps = vec![
            step(Op::Input { name: "x".into() }, vec![], f, &[2, 3, 256]),
            step(Op::Param { index: 0 }, vec![], DType::Q4_K, &[40, 256]),
            step(Op::Dequantize, vec![1], f, &[40, 256]),
            step(Op::Permute { perm: vec![1, 0] }, vec![2], f, &[256, 40]),
            step(Op::MatMul, vec![0, 3], f, &[2, 3, 40]),
            step(Op::Input { name: "ids".into() }, vec![], DType::I32, &[4]),
            step(Op::Param { index: 1 }, vec![], DType::Q8_0, &[9, 64]),
            step(Op::Dequantize, vec![6], f, &[9, 64]),
            step(Op::Gather { axis: 0 }, vec![7, 5], f, &[4, 64]),
        ];
        let mut outputs = vec![("y".to_string(), 4), ("e".to_string(), 8)];
        if keep {
            outputs.push(("w".into(), 2));
        }
        let inputs = vec![("x".to_string(), 0), ("ids".to_string(), 5)];
        Plan {
            params: vec![param("w", DType::Q4_K, &[40, 256]), param("e", DType::Q8_0, &[9, 64])],
            ..Plan::of_steps(Mode::Infer, steps, inputs, outputs)
        }
    }

    #[test]
    fn a_session_reads_packed_weights_where_they_are_used() {
        let x = Tensor::f32(vec![2, 3, 256], (0..1536).map(|i| (i % 17) as f32 / 9.0).collect());
        let ids = Tensor::i32(vec![4], vec![8, 0, 8, 3]);
        let inputs = [("x", &x), ("ids", &ids)];
        let mut fused = Session::try_new(plan(false), 7).unwrap();
        assert_eq!(fused.fused.iter().filter(|f| **f == Fused::Skip).count(), 3);
        let mut plain = Session::try_new(plan(true), 7).unwrap();
        assert_eq!(plain.fused[4], Fused::No);
        assert_eq!(fused.params, plain.params);
        assert!(fused.params[0].as_packed().is_some());
        let (a, b) = (fused.run(&inputs).unwrap(), plain.run(&inputs).unwrap());
        assert_eq!(a.outputs[1], b.outputs[1]);
        let (ya, yb) = (a.outputs[0].1.to_f64_vec(), b.outputs[0].1.to_f64_vec());
        for (p, q) in ya.iter().zip(&yb) {
            assert!((p - q).abs() < 1e-4, "{p} vs {q}");
        }
    }
}
