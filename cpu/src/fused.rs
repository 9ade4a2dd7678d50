//! Weights read where they lie: the steps of a plan that the executor runs on a parameter as it
//! is stored, instead of on a copy of it that another step would make first.
//!
//! - A packed parameter (`crate::packed`): `matmul(x, dequantize(W))`, W read as it is or
//!   through a transpose, decodes W block by block as it multiplies, and
//!   `gather(dequantize(E), ids)` decodes only the rows it gathers. [`fusions`] finds the
//!   `Dequantize` steps whose every reader (a product with the weight on the right, possibly
//!   through a transpose of it, or a lookup along its first axis) can read the packed bytes
//!   instead; those steps, and the transposes between, are not computed at all. A `Dequantize`
//!   with any other reader is computed as before, and its readers read its values: decoding it
//!   again for each fused reader would cost more than the copy saves.
//! - A float parameter read transposed (`x @ Wᵀ`, every linear layer): the transpose would copy
//!   W on every run, so where every reader of `permute(W, [1, 0])` is a product with it on the
//!   right, the transpose is not computed and the products read W through its strides
//!   (`crate::matmul::by_weight`).
//!
//! Both equal the unfused steps up to the order of the sums.

use super::{err, matmul, packed, KernelError};
use mgn_ir::op::Op;
use mgn_ir::{DType, Data, Plan, Tensor};

/// How the executor runs one step of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fused {
    /// As usual: [`crate::eval`] on its inputs.
    No,
    /// Not at all: a `Dequantize` (or a transpose of one), or the transpose of a float
    /// parameter, whose readers all read the parameter instead. Nothing reads its value.
    Skip,
    /// `x @ W` (`transposed`: `x @ Wᵀ`), W the parameter `param` (packed, or a float matrix).
    MatMul { x: u32, param: usize, transposed: bool },
    /// Rows `ids` of the packed parameter `param`, along its first axis.
    Gather { param: usize, ids: u32 },
}

/// Each step's [`Fused`], for a validated plan.
pub fn fusions(plan: &Plan) -> Vec<Fused> {
    let steps = &plan.steps;
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (i, s) in steps.iter().enumerate() {
        for &x in &s.inputs {
            readers[x as usize].push(i);
        }
    }
    // Values the plan hands out or keeps are read after the run, by the caller.
    let mut kept = vec![false; steps.len()];
    let results = plan.outputs.iter().map(|(_, v)| *v).chain(plan.loss);
    let results = results.chain(plan.grads.iter().chain(&plan.state_writes).map(|(_, v)| *v));
    results.for_each(|v| kept[v as usize] = true);

    // A product reads W on the right, and not on the left too.
    let product = |r: usize, w: u32| {
        let s = &steps[r];
        matches!(s.op, Op::MatMul) && s.inputs[1] == w && s.inputs[0] != w && !kept[w as usize]
    };
    let mut fused = vec![Fused::No; steps.len()];
    for (d, s) in steps.iter().enumerate() {
        let (Op::Dequantize, [p]) = (&s.op, &s.inputs[..]) else { continue };
        let Op::Param { index: param } = steps[*p as usize].op else { continue };
        if kept[d] || readers[d].is_empty() {
            continue;
        }
        let d32 = d as u32;
        let matrix = s.shape.len() == 2;
        let mut plan_d = Vec::new();
        let all = readers[d].iter().all(|&r| {
            let step = &steps[r];
            if matrix && product(r, d32) {
                let x = step.inputs[0];
                plan_d.push((r, Fused::MatMul { x, param, transposed: false }));
                return true;
            }
            if let (true, Op::Permute { perm }) = (matrix, &step.op) {
                let t = r as u32;
                let fits = perm[..] == [1, 0] && !kept[r] && !readers[r].is_empty();
                if fits && readers[r].iter().all(|&rr| product(rr, t)) {
                    plan_d.push((r, Fused::Skip));
                    for &rr in &readers[r] {
                        let x = steps[rr].inputs[0];
                        plan_d.push((rr, Fused::MatMul { x, param, transposed: true }));
                    }
                    return true;
                }
                return false;
            }
            let lookup = matches!(step.op, Op::Gather { axis: 0 });
            if lookup && step.inputs[0] == d32 && step.inputs[1] != d32 {
                plan_d.push((r, Fused::Gather { param, ids: step.inputs[1] }));
                return true;
            }
            false
        });
        if all {
            fused[d] = Fused::Skip;
            for (r, f) in plan_d {
                fused[r] = f;
            }
        }
    }
    // Transposes of float parameters read only by products.
    for (t, s) in steps.iter().enumerate() {
        let (Op::Permute { perm }, [p]) = (&s.op, &s.inputs[..]) else { continue };
        let p_step = &steps[*p as usize];
        let Op::Param { index: param } = p_step.op else { continue };
        let t32 = t as u32;
        let fits = perm[..] == [1, 0] && p_step.dtype.is_float() && !kept[t];
        if fits && !readers[t].is_empty() && readers[t].iter().all(|&r| product(r, t32)) {
            fused[t] = Fused::Skip;
            for &r in &readers[t] {
                fused[r] = Fused::MatMul { x: steps[r].inputs[0], param, transposed: true };
            }
        }
    }
    fused
}

/// Runs a fused step: `inputs` are `[x, W]` for a product, `[E, ids]` for a lookup, the
/// parameter as it is stored. `dtype` and `shape` are the step's.
pub fn eval_fused(
    fused: &Fused,
    inputs: &[&Tensor],
    dtype: DType,
    shape: &[usize],
) -> Result<Tensor, KernelError> {
    let (what, data) = match fused {
        Fused::MatMul { transposed, .. } => match &inputs[1].data {
            Data::Packed(_) => ("matmul of a packed weight", {
                packed::matmul(inputs[0], inputs[1], *transposed, shape)
            }),
            _ => {
                ("matmul by a weight", matmul::by_weight(inputs[0], inputs[1], *transposed, shape))
            }
        },
        Fused::Gather { .. } => {
            ("gather of a packed weight", packed::gather(inputs[0], inputs[1], shape))
        }
        other => return err(format!("{other:?} is not a fused kernel")),
    };
    let mut data = data.map_err(|e| KernelError(format!("{what}: {}", e.0)))?;
    if dtype.is_half() {
        super::pointwise::round_to_half(&mut data, dtype);
    }
    Ok(Tensor { dtype, shape: shape.to_vec(), data })
}
