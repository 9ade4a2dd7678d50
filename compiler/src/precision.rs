//! The mixed precision policy (`--precision mixed`, `mixed-bf16`; `mgn_ir::precision`): the
//! last pass over a graph, after autodiff and the rewrites, so it sees every contraction the
//! plan computes — forward and backward — once.
//!
//! Each contraction (`Op::is_contraction`) with f32 operands and an f32 result reads its
//! operands rounded to the half type instead, and keeps its f32 accumulation as its result;
//! nothing else changes, so norms, softmax, losses, gradients' sums and the optimizer stay f32
//! and every parameter's master copy is f32. A value rounded for several contractions (a weight
//! read by its forward product and by its input derivative, an activation read by the next
//! layer and by its weight derivative) is rounded once; a transposed or reshaped operand is
//! rounded before the transpose, so a weight's transpose stays a view of its half copy.
//! Nodes made inside `full_precision(…)`, and their derivatives, keep f32 operands; inside
//! `full_precision(…, derivatives = false)` only the nodes it makes do.
//!
//! `f16` training also scales its loss (`loss_scale_param`, `autodiff::GradOptions`): f16's
//! range ends at 65,504 and its normal numbers at 6e-5, so the incoming gradients that backward
//! contractions round to f16 would underflow without it.

use std::collections::HashMap;

use crate::graph::{Graph, InitSpec, Node, NodeId, Op, ParamInfo, Pin};
use mgn_ir::precision::LossScaling;
use mgn_ir::DType;

/// Rounds the operands of `g`'s contractions to `half`. `extra` are further results to keep
/// pointing at the same values (gradients), renumbered in place.
pub fn apply(g: &mut Graph, half: DType, extra: &mut [NodeId]) {
    debug_assert!(half.is_half());
    let old = std::mem::take(&mut g.nodes);
    let mut b = Rebuild { nodes: Vec::with_capacity(old.len() * 5 / 4), halves: HashMap::new() };
    let mut map: Vec<NodeId> = Vec::with_capacity(old.len());
    for n in old {
        let mut n = Node { inputs: n.inputs.iter().map(|x| map[x.0 as usize]).collect(), ..n };
        // A dropout derivative names its forward step by node, like an input.
        if let Op::DropoutGrad { forward, .. } = &mut n.op {
            *forward = map[*forward as usize].0;
        }
        if in_policy(&n, &b.nodes) {
            for k in operands(&n.op) {
                n.inputs[k] = b.half_of(n.inputs[k], half);
            }
        }
        map.push(b.push(n));
    }
    g.nodes = b.nodes;
    let remap = |x: &mut NodeId| *x = map[x.0 as usize];
    g.inputs.iter_mut().for_each(|(_, x)| remap(x));
    g.outputs.iter_mut().for_each(|(_, x)| remap(x));
    g.loss.iter_mut().for_each(remap);
    g.params.iter_mut().for_each(|p| remap(&mut p.node));
    g.state_writes.iter_mut().for_each(|(_, x)| remap(x));
    extra.iter_mut().for_each(remap);
}

/// A contraction the policy rounds: f32 operands and result, not kept in full precision.
fn in_policy(n: &Node, nodes: &[Node]) -> bool {
    n.op.is_contraction()
        && n.full_precision == Pin::No
        && n.dtype == DType::F32
        && operands(&n.op).all(|k| nodes[n.inputs[k].0 as usize].dtype == DType::F32)
}

/// The operands a contraction multiplies: not a convolution's bias (added to the f32
/// accumulator), an attention's mask (added to f32 scores) or its derivative's incoming
/// gradient (the probabilities' derivative is formed in f32).
fn operands(op: &Op) -> std::ops::Range<usize> {
    match op {
        Op::Attention { .. } | Op::AttentionGrad { .. } => 0..3,
        _ => 0..2,
    }
}

struct Rebuild {
    nodes: Vec<Node>,
    /// The half copy of each value rounded so far.
    halves: HashMap<NodeId, NodeId>,
}

impl Rebuild {
    fn push(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        NodeId(self.nodes.len() as u32 - 1)
    }

    /// `x` rounded to `half`, made once. A reshape of some value, and a swap of its last two
    /// axes, is rebuilt over that value's half copy: backends read both in place (a product
    /// reads an operand transposed, and so a weight's or an activation's transpose is no copy).
    /// Any other permute is a copy either way, and is rounded after it.
    fn half_of(&mut self, x: NodeId, half: DType) -> NodeId {
        if let Some(&h) = self.halves.get(&x) {
            return h;
        }
        let n = &self.nodes[x.0 as usize];
        let in_place = match &n.op {
            Op::Reshape => true,
            Op::Permute { perm } => swaps_last_two(perm),
            _ => false,
        };
        let view = n.inputs.len() == 1 && in_place;
        let h = if view && self.nodes[n.inputs[0].0 as usize].dtype == DType::F32 {
            let (op, source) = (n.op.clone(), n.inputs[0]);
            let over = self.half_of(source, half);
            let n = &self.nodes[x.0 as usize];
            self.push(Node { op, inputs: vec![over], dtype: half, ..n.clone() })
        } else {
            self.push(Node { op: Op::Cast, inputs: vec![x], dtype: half, ..n.clone() })
        };
        self.halves.insert(x, h);
        h
    }
}

/// `[0, 1, …, r−1, r−2]`: a transpose of the last two axes.
fn swaps_last_two(perm: &[usize]) -> bool {
    let r = perm.len();
    r >= 2
        && perm[..r - 2].iter().enumerate().all(|(i, &p)| p == i)
        && perm[r - 2..] == [r - 1, r - 2]
}

/// Adds the parameter holding the loss scale of `f16` training and its node (after every
/// forward node, before the backward pass that reads it); returns the node.
pub fn loss_scale_param(g: &mut Graph) -> NodeId {
    let index = g.params.len();
    let node = NodeId(g.nodes.len() as u32);
    let loss = g.loss.map(|l| g.node(l).clone());
    let (span, user_span) = loss.map(|l| (l.span, l.user_span)).unwrap_or_default();
    g.nodes.push(Node {
        op: Op::Param { index },
        inputs: vec![],
        dtype: DType::F32,
        shape: vec![],
        span,
        user_span,
        full_precision: Pin::No,
    });
    g.params.push(ParamInfo {
        name: LossScaling::PARAM.into(),
        dtype: DType::F32,
        shape: vec![],
        init: InitSpec::Constant(LossScaling::INIT),
        trainable: false,
        persistent: false,
        state: false,
        node,
        span,
    });
    g.loss_scaling = Some(LossScaling {
        param: index,
        init: LossScaling::INIT,
        growth_interval: LossScaling::GROWTH_INTERVAL,
    });
    node
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{check_text, Models};
    use crate::lower::{lower, PlanOptions};
    use crate::source::Origin;
    use mgn_ir::optim::OptimizerSpec;
    use mgn_ir::plan::Plan;
    use mgn_ir::precision::Precision;

    const MLP: &str = "
use std.nn.{Linear}
use std.loss.{cross_entropy}
model M(batch: dim = 4) {
    input x: f32[batch, 8]
    input y: i32[batch]
    fc1 = Linear(8, 16)
    fc2 = Linear(16, 3)
    forward {
        let h = relu(fc1(x))
        let logits = fc2(h)
        output logits
        loss cross_entropy(logits, y)
    }
}
";

    fn plan(text: &str, train: bool, precision: Precision) -> Plan {
        let mut out =
            check_text("m.mgn".into(), Origin::Memory("m.mgn".into()), text.into(), Models::All);
        assert!(out.ok(), "{:?}", out.diagnostics);
        let g = out.graphs.pop().expect("a graph");
        let opts = if train {
            PlanOptions::train(&[], OptimizerSpec::default())
        } else {
            PlanOptions::infer()
        };
        let opts = PlanOptions { precision, ..opts };
        lower(g, &out.program.sources, &opts).unwrap_or_else(|d| panic!("{}", d.message))
    }

    fn contractions(p: &Plan) -> Vec<(String, Vec<DType>, DType)> {
        let ty = |v: u32| p.steps[v as usize].dtype;
        (p.steps.iter())
            .filter(|s| s.op.is_contraction())
            .map(|s| (s.op.describe(), s.inputs.iter().map(|&v| ty(v)).collect(), s.dtype))
            .collect()
    }

    #[test]
    fn every_contraction_reads_half_operands_and_keeps_f32() {
        for (precision, half) in
            [(Precision::MixedF16, DType::F16), (Precision::MixedBf16, DType::BF16)]
        {
            let p = plan(MLP, true, precision);
            assert_eq!(p.precision, precision);
            let c = contractions(&p);
            // Two forward products, two weight derivatives, one input derivative.
            assert_eq!(c.len(), 5, "{c:?}");
            for (op, inputs, out) in &c {
                assert_eq!((inputs.as_slice(), *out), (&[half, half][..], DType::F32), "{op}");
            }
            // Everything else is f32: parameters, norms of the loss, gradients.
            for s in &p.steps {
                let cast_to_half = matches!(s.op, Op::Cast) || s.op.is_contraction();
                assert!(
                    s.dtype != half
                        || cast_to_half
                        || matches!(s.op, Op::Permute { .. } | Op::Reshape),
                    "{} is {}",
                    s.op.describe(),
                    s.dtype
                );
            }
            for &(_, g) in &p.grads {
                assert_eq!(p.steps[g as usize].dtype, DType::F32);
            }
        }
    }

    #[test]
    fn each_value_is_rounded_once_and_transposes_stay_views() {
        let p = plan(MLP, true, Precision::MixedBf16);
        let casts: Vec<u32> =
            (p.steps.iter()).filter(|s| s.op == Op::Cast).flat_map(|s| s.inputs.clone()).collect();
        let mut unique = casts.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(casts.len(), unique.len(), "a value was rounded twice");
        // A weight is rounded, not its transpose: the product reads a permute of the cast.
        for s in p.steps.iter().filter(|s| s.op == Op::MatMul) {
            let b = &p.steps[s.inputs[1] as usize];
            if let Op::Permute { .. } = b.op {
                assert_eq!(p.steps[b.inputs[0] as usize].op, Op::Cast);
            }
        }
    }

    #[test]
    fn full_precision_keeps_its_contractions_and_their_derivatives_in_f32() {
        let pinned = MLP.replace("let logits = fc2(h)", "let logits = full_precision(fc2(h))");
        let p = plan(&pinned, true, Precision::MixedF16);
        let f32_ones = contractions(&p).iter().filter(|(_, i, _)| i[0] == DType::F32).count();
        // fc2's product, its weight derivative and its input derivative.
        assert_eq!(f32_ones, 3, "{:?}", contractions(&p));
        // Without a mixed policy it changes nothing (but the columns of the steps' lines).
        let types = |p: Plan| -> Vec<_> {
            p.steps.into_iter().map(|s| (s.op, s.inputs, s.dtype, s.shape)).collect()
        };
        assert_eq!(
            types(plan(&pinned, true, Precision::F32)),
            types(plan(MLP, true, Precision::F32))
        );
    }

    #[test]
    fn full_precision_without_derivatives_keeps_only_its_forward_in_f32() {
        let forward = "let logits = full_precision(fc2(h), derivatives = false)";
        let pinned = MLP.replace("let logits = fc2(h)", forward);
        let p = plan(&pinned, true, Precision::MixedF16);
        let c = contractions(&p);
        let f32_ones: Vec<_> = c.iter().filter(|(_, i, _)| i[0] == DType::F32).collect();
        // fc2's product alone; its weight and input derivatives round as every other one.
        assert_eq!(f32_ones.len(), 1, "{c:?}");
        assert_eq!(c.len(), 5);
        // Given positionally, and `true` (the default), it pins the derivatives too.
        let both = MLP.replace("let logits = fc2(h)", "let logits = full_precision(fc2(h), true)");
        let p = plan(&both, true, Precision::MixedF16);
        assert_eq!(contractions(&p).iter().filter(|(_, i, _)| i[0] == DType::F32).count(), 3);
    }

    #[test]
    fn f16_training_scales_its_loss_and_bf16_does_not() {
        let p = plan(MLP, true, Precision::MixedF16);
        let ls = p.loss_scaling.clone().expect("f16 training scales its loss");
        let spec = &p.params[ls.param];
        assert_eq!(
            (spec.name.as_str(), spec.persistent, spec.trainable),
            (LossScaling::PARAM, false, false)
        );
        // The backward pass starts from the scale, read once, in place of a constant 1; the
        // gradients carry it (backends divide it out) and no step divides.
        let scale_step =
            p.steps.iter().position(|s| s.op == Op::Param { index: ls.param }).unwrap();
        assert!(p.steps.iter().any(|s| s.inputs.contains(&(scale_step as u32))));
        assert!(!p.steps.iter().any(|s| s.op == Op::Binary(crate::graph::BinaryOp::Div)));
        assert!(!p.steps.iter().any(|s| s.op == Op::Constant { value: 1.0 }));
        assert!(plan(MLP, true, Precision::MixedBf16).loss_scaling.is_none());
        assert!(plan(MLP, false, Precision::MixedF16).loss_scaling.is_none());
        // An f16 inference plan has no backward pass to scale.
        assert!(plan(MLP, false, Precision::MixedF16).params.iter().all(|p| p.persistent));
    }
}
