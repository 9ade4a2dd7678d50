//! Element-wise fusion: a float element-wise step (unary, binary, unary derivative, power,
//! `where`, and a comparison of floats feeding a `where`) whose only reader is another
//! element-wise step of the same shape is computed inside that reader's
//! kernel instead of by a dispatch of its own, so the chain runs as one `GpuOp::Fused` step —
//! one dispatch, and its intermediate values never touch memory.
//!
//! Same shape matters: the reader's output element `i` then needs exactly element `i` of the
//! fused step, and the fused step's own inputs broadcast to the reader's shape as they did to
//! its own. A step that is a result (output, loss, gradient) or is read twice by different steps
//! keeps its own dispatch. A matrix product or a convolution whose only reader is such a chain
//! becomes the head of it (`GpuOp::MatMulEpilogue`, `GpuOp::ConvEpilogue`): the chain — a bias,
//! an inference batch norm, a residual, an activation — runs on each result as the product's
//! kernel stores it. So does a layer, RMS or group norm, and a training plan's batch norm
//! (`GpuOp::NormEpilogue`: the U-Net's SiLU after each group norm, ResNet-50's ReLU after
//! each batch norm but those of the residual sums). Where a sum could take either of two
//! products as its head, the deeper one takes it (`Fusion::heads_first`), so the other — a
//! residual block's shortcut — runs levels earlier, beside the path it is added to.
//!
//! The decisions need the program's def-use in execution order, so fusion reads a dense
//! snapshot of the program ([`GpuPlan`]); its edits go back to the program by step id.

use crate::program::{Elem, GpuOp, GpuPlan, Program, Step, StepId};
use mgn_ir::analysis::DefUse;
use mgn_ir::op::Op;
use mgn_ir::DType;

/// The node a fusable step contributes, given the nodes of its inputs.
fn node(op: &GpuOp, args: &[u32]) -> Option<Elem> {
    Some(match (op.plan_op()?, args) {
        (Op::Unary(u), [a]) => Elem::Unary(*u, *a),
        (Op::UnaryGrad(u), [a, b]) => Elem::UnaryGrad(*u, *a, *b),
        (Op::Binary(o), [a, b]) => Elem::Binary(*o, *a, *b),
        (Op::Pow { exponent }, [a]) => Elem::Pow(*exponent, *a),
        (Op::Compare(c), [a, b]) => Elem::Compare(*c, *a, *b),
        (Op::Where, [c, a, b]) => Elem::Where(*c, *a, *b),
        _ => return None,
    })
}

/// An f32 element-wise step; or a comparison of floats, which is only ever inlined into the
/// `where` that reads it (its `bool` result is no float chain's value); or an `arange` cast to
/// f32 (`index_cast`). Half-typed steps stay apart: each rounds its own result, as the CPU
/// reference does.
fn fusable(view: &GpuPlan, def_use: &DefUse, i: usize) -> bool {
    let s = &view.steps[i];
    let float = matches!(
        s.op.plan_op(),
        Some(Op::Unary(_) | Op::UnaryGrad(_) | Op::Binary(_) | Op::Pow { .. } | Op::Where)
    );
    let floats = s.inputs.iter().all(|&x| view.steps[x as usize].dtype.is_float());
    (s.dtype == mgn_ir::DType::F32 && float)
        || (matches!(s.op.plan_op(), Some(Op::Compare(_))) && floats)
        || index_cast(view, def_use, i).is_some()
}

/// The `arange` that `s` casts to f32 when `s` is its only reader: the chain computes each
/// element's value from its index (`Elem::Index`), and neither step is dispatched. The
/// sinusoidal embeddings of the U-Net's and SmolVLA's timesteps start so, two levels ahead of
/// their first product.
fn index_cast(view: &GpuPlan, def_use: &DefUse, i: usize) -> Option<u32> {
    let s = &view.steps[i];
    let (GpuOp::Plan(Op::Cast), &[x]) = (&s.op, s.inputs.as_slice()) else { return None };
    let arange = &view.steps[x as usize];
    let counts = arange.op == GpuOp::Plan(Op::Arange) && arange.shape == s.shape;
    let only = def_use.only_reader(x as usize) == Some(i) && !def_use.result[x as usize];
    (s.dtype == DType::F32 && counts && only && s.shape.len() == 1).then_some(x)
}

/// The value of an f32 constant step, which a chain writes into its program (`Elem::Const`)
/// instead of reading it.
fn constant(s: &Step<u32>) -> Option<f64> {
    match s.op.plan_op() {
        Some(Op::Constant { value }) if s.dtype == DType::F32 => Some(*value),
        _ => None,
    }
}

/// Programs longer than this stay split: a kernel's registers and compile time grow with it.
const MAX_NODES: usize = 48;

/// An element-wise chain of at most this many elements that several element-wise steps read
/// is computed again by each of them, and goes when all do: its own dispatch would cost a
/// level (about 4 µs on the H200), while computing it again costs each reader a few loads of
/// its leaves per element — a timestep embedding's `t · ω` read by its `sin` and its `cos`.
const SMALL: usize = 1 << 16;

/// What fusion makes of one element-wise step: the values it reads (`leaves`, positions), its
/// program over them, and the matrix product it absorbed (one of the leaves), if any.
#[derive(Clone, Default)]
struct Chain {
    leaves: Vec<u32>,
    program: Vec<Elem>,
    head: Option<u32>,
}

impl Chain {
    /// The node reading `x` as a leaf (the index of `x` among the leaves, added when new).
    fn leaf(&mut self, x: u32) -> u32 {
        let k = match self.leaves.iter().position(|&l| l == x) {
            Some(k) => k,
            None => {
                self.leaves.push(x);
                self.leaves.len() - 1
            }
        };
        self.push(Elem::Input(k as u32))
    }

    /// Appends `e`; its node index.
    fn push(&mut self, e: Elem) -> u32 {
        self.program.push(e);
        self.program.len() as u32 - 1
    }

    /// Appends `other`'s program, its leaves mapped to this chain's; the node of its result.
    fn inline(&mut self, other: &Chain) -> u32 {
        let base = self.program.len() as u32;
        for e in &other.program {
            let e = match e {
                Elem::Input(k) => {
                    self.leaf(other.leaves[*k as usize]);
                    continue;
                }
                Elem::Unary(u, a) => Elem::Unary(*u, a + base),
                Elem::UnaryGrad(u, a, b) => Elem::UnaryGrad(*u, a + base, b + base),
                Elem::Binary(o, a, b) => Elem::Binary(*o, a + base, b + base),
                Elem::Pow(e, a) => Elem::Pow(*e, a + base),
                Elem::Compare(c, a, b) => Elem::Compare(*c, a + base, b + base),
                Elem::Where(c, a, b) => Elem::Where(c + base, a + base, b + base),
                Elem::Const(_) | Elem::Index => e.clone(),
            };
            self.push(e);
        }
        self.program.len() as u32 - 1
    }

    /// The fused op and its inputs (positions). With a head, the product (or convolution) is
    /// input 0 of the epilogue, the head's operands come first, and the other leaves follow.
    fn into_step(self, view: &GpuPlan) -> (GpuOp, Vec<u32>) {
        let Some(mm) = self.head else {
            return (GpuOp::Fused { program: self.program }, self.leaves);
        };
        let pos = self.leaves.iter().position(|&l| l == mm).expect("the head is a leaf") as u32;
        let order = |k: u32| match k.cmp(&pos) {
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Less => k + 1,
            std::cmp::Ordering::Greater => k,
        };
        let program = self
            .program
            .into_iter()
            .map(|e| if let Elem::Input(k) = e { Elem::Input(order(k)) } else { e })
            .collect();
        let head = &view.steps[mm as usize];
        let mut inputs = head.inputs.clone();
        inputs.extend(self.leaves.iter().filter(|&&l| l != mm));
        let op = match head.op.plan_op() {
            Some(conv @ Op::Conv { .. }) => GpuOp::ConvEpilogue { conv: conv.clone(), program },
            Some(norm) if crate::program::norm_operands(norm).is_ok() => {
                GpuOp::NormEpilogue { norm: norm.clone(), program }
            }
            _ => GpuOp::MatMulEpilogue { program, ta: false, tb: false },
        };
        (op, inputs)
    }
}

/// Fusion's state over a snapshot of the program, by position.
struct Fusion<'a> {
    view: &'a GpuPlan,
    def_use: DefUse,
    /// Per fusable step: its chain so far.
    chains: Vec<Option<Chain>>,
    /// Steps computed inside their reader's chain (removed from the program).
    absorbed: Vec<bool>,
    /// Steps whose chain absorbed another step (their op becomes the chain).
    grew: Vec<bool>,
    /// Per constant, and per small chain with several readers (`SMALL`): how many readers
    /// compute it themselves.
    copies: Vec<usize>,
    /// Per step: its depth in dispatches (`depths`, for `heads_first`).
    depth: Vec<usize>,
}

impl Fusion<'_> {
    /// The chain of the fusable step `i`, over its inputs' chains.
    fn chain(&mut self, i: usize) -> Chain {
        let view = self.view;
        let s = &view.steps[i];
        let mut c = Chain::default();
        if let Some(arange) = index_cast(view, &self.def_use, i) {
            (self.absorbed[arange as usize], self.grew[i]) = (true, true);
            c.push(Elem::Index);
            return c;
        }
        let mut args = vec![0; s.inputs.len()];
        // An input read twice (x · x) is inlined once and its node reused.
        let mut done: Vec<(u32, u32)> = Vec::new();
        // A comparison's chain absorbs nothing: it is kept only when a `where` inlines it.
        let compare = matches!(s.op.plan_op(), Some(Op::Compare(_)));
        for k in self.heads_first(i) {
            let x = s.inputs[k];
            let at = match done.iter().find(|(v, _)| *v == x) {
                Some(&(_, node)) => node,
                None if compare => c.leaf(x),
                None => self.input_node(i, x, &mut c),
            };
            done.push((x, at));
            args[k] = at;
        }
        c.push(node(&s.op, &args).expect("fusable steps have a node"));
        c
    }

    /// The positions of step `i`'s inputs in the order `chain` takes them: those that could
    /// head its chain (a product, a norm, or a chain headed by one) deepest first, then the
    /// rest as they come. The first to qualify heads, and the others are read as values. So
    /// the product that the sum waits for longest stores it, and a shallower one (a residual
    /// block's shortcut convolution, `shortcut + h`) runs levels earlier beside the deep
    /// path instead of after it: each such sum is one level fewer.
    fn heads_first(&self, i: usize) -> Vec<usize> {
        let view = self.view;
        let depth_of_head = |x: u32| -> Option<usize> {
            let xi = x as usize;
            let head = match &self.chains[xi] {
                _ if can_head(view, &view.steps[xi]) => Some(xi),
                Some(chain) => chain.head.map(|h| h as usize),
                None => None,
            };
            head.map(|h| self.depth[h])
        };
        let mut order: Vec<usize> = (0..view.steps[i].inputs.len()).collect();
        let depths: Vec<Option<usize>> =
            view.steps[i].inputs.iter().map(|&x| depth_of_head(x)).collect();
        // Stable: inputs of equal depth, and those that cannot head, keep their order.
        order.sort_by_key(|&k| std::cmp::Reverse(depths[k]));
        order
    }

    /// The node of `c` holding input `x` of step `i`: when `i` is `x`'s only reader and has its
    /// shape, a matrix product becomes the chain's head and an element-wise chain is inlined;
    /// anything else is a leaf.
    fn input_node(&mut self, i: usize, x: u32, c: &mut Chain) -> u32 {
        let (xi, view) = (x as usize, self.view);
        let xs = &view.steps[xi];
        if let Some(value) = constant(xs) {
            // Written back even if it absorbs nothing else: it no longer reads the constant.
            self.grew[i] = true;
            self.copies[xi] += 1;
            return c.push(Elem::Const(value));
        }
        let only = self.def_use.only_reader(xi) == Some(i);
        let only_reader = only && xs.shape == view.steps[i].shape;
        let small = xs.shape.iter().product::<usize>() <= SMALL && !self.def_use.result[xi];
        // One of several readers of a small chain computes it again (`SMALL`).
        let copy = !only && small;
        // A chain of a smaller shape that broadcasts to its reader's is computed at each of the
        // reader's elements: its leaves broadcast to the reader's shape as they did to its own.
        let broadcast = (only || copy)
            && mgn_ir::shape::broadcast_strides(&xs.shape, &view.steps[i].shape).is_ok();
        let same_shape = (only || copy) && xs.shape == view.steps[i].shape;
        if only_reader && c.head.is_none() && can_head(view, xs) {
            c.head = Some(x);
            (self.absorbed[xi], self.grew[i]) = (true, true);
            return c.leaf(x);
        }
        // A chain headed by a product stays at the product's shape: its kernel computes one
        // epilogue per product element.
        // An index is its own element's: a chain holding one is inlined only at its shape.
        // A product's epilogue is never computed twice.
        let inline = self.chains[xi].as_ref().filter(|xc| {
            let indexed = xc.program.contains(&Elem::Index);
            let reach = match (xc.head.is_some(), indexed) {
                (true, _) => only_reader,
                (false, true) => same_shape,
                (false, false) => broadcast,
            };
            reach
                && c.program.len() + xc.program.len() < MAX_NODES
                && !(xc.head.is_some() && c.head.is_some())
        });
        let Some(xc) = inline else { return c.leaf(x) };
        if xc.head.is_some() {
            c.head = xc.head;
        }
        let at = c.inline(xc);
        if only {
            self.absorbed[xi] = true;
        } else {
            self.copies[xi] += 1;
        }
        self.grew[i] = true;
        at
    }
}

/// Each step's depth in dispatches: how many kernels lie on the longest chain from the plan's
/// inputs to it, itself included, as fusion will make them. A fusable step inlined into its
/// reader adds none, nor does the end of a chain a product or a norm heads (it runs in that
/// kernel), so two products whose paths differ only in steps fused away are equally deep.
/// Fusion's own limits (`MAX_NODES`, `SMALL` chains computed again) are not modelled: the
/// depths only order the candidates for a head (`heads_first`).
fn depths(view: &GpuPlan, def_use: &DefUse, fuses: &[bool]) -> Vec<usize> {
    let n = view.steps.len();
    let (mut depth, mut headed) = (vec![0; n], vec![false; n]);
    for (i, s) in view.steps.iter().enumerate() {
        // x is computed inside step i's kernel: i is its only reader, at its shape.
        let inside = |x: usize| def_use.only_reader(x) == Some(i) && view.steps[x].shape == s.shape;
        headed[i] = fuses[i]
            && s.inputs
                .iter()
                .map(|&x| x as usize)
                .any(|x| inside(x) && (can_head(view, &view.steps[x]) || (fuses[x] && headed[x])));
        let inlined = fuses[i]
            && def_use.only_reader(i).is_some_and(|r| fuses[r] && view.steps[r].shape == s.shape);
        let own = usize::from(!fuses[i] || !(inlined || headed[i]));
        depth[i] = s.inputs.iter().map(|&x| depth[x as usize]).max().unwrap_or(0) + own;
    }
    depth
}

/// Whether step `s` of `view` can head an element-wise chain: a float product or convolution,
/// or an f32 norm.
fn can_head(view: &GpuPlan, s: &Step<u32>) -> bool {
    let product = matches!(s.op, GpuOp::Plan(Op::MatMul | Op::Conv { .. }));
    // A batch norm with batch statistics (a training plan's: an inference plan's are
    // element-wise, `running_norms`) runs the same row kernel.
    let training = view.mode == mgn_ir::plan::Mode::Train;
    let norm = match &s.op {
        GpuOp::Plan(Op::BatchNorm { .. }) => training,
        GpuOp::Plan(op) => crate::program::norm_operands(op).is_ok(),
        _ => false,
    };
    (product && s.dtype.is_float()) || (norm && s.dtype == DType::F32)
}

/// Fuses every element-wise chain of `program` (see the module header).
pub(super) fn fuse_elementwise(program: &mut Program) {
    let view = program.to_gpu_plan();
    let n = view.steps.len();
    let def_use = DefUse::of(&view);
    let fuses: Vec<bool> = (0..n).map(|i| fusable(&view, &def_use, i)).collect();
    let depth = depths(&view, &def_use, &fuses);
    let mut f = Fusion {
        view: &view,
        def_use,
        chains: vec![None; n],
        absorbed: vec![false; n],
        grew: vec![false; n],
        copies: vec![0; n],
        depth,
    };
    for (i, &fuses) in fuses.iter().enumerate() {
        if fuses {
            f.chains[i] = Some(f.chain(i));
        }
    }
    // A constant or a small chain that every reader computes itself is no longer read (a
    // comparison reads its operands as leaves, so their constants stay).
    for i in 0..n {
        let copies = f.copies[i];
        if copies > 0 && copies == f.def_use.readers[i].len() && !f.def_use.result[i] {
            f.absorbed[i] = true;
        }
    }
    let id = |pos: u32| view.ids[pos as usize];
    for (i, chain) in f.chains.into_iter().enumerate() {
        let Some(chain) = chain.filter(|_| f.grew[i] && !f.absorbed[i]) else { continue };
        let (op, inputs) = chain.into_step(&view);
        let step = program.step_mut(view.ids[i]);
        step.op = op;
        step.inputs = inputs.into_iter().map(id).collect();
    }
    let absorbed: Vec<StepId> = (0..n).filter(|&i| f.absorbed[i]).map(|i| view.ids[i]).collect();
    program.remove(&absorbed);
}

#[cfg(test)]
mod tests;
