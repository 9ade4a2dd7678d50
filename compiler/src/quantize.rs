//! `--quantize TYPE`: stores a model's large matrix weights in a packed type (`mgn_ir::packed`)
//! and reads them through `Op::Dequantize`, as a model that declares `param q4_0[…]` does. A
//! pass over the graph before lowering (before autodiff and the rewrites, and so before the
//! precision policy, which then meets the Dequantize's f32 result like any operand).
//!
//! The rule (LANGUAGE.md, "Quantized weights"): a `param` field is quantized when
//! - this plan does not train it (an inference plan trains nothing; a training plan trains
//!   every `param` not matched by `--freeze`),
//! - it is f32, has at least 2 axes and at least 4096 elements,
//! - every reader is a matrix product's operand (`matmul`, possibly through permutes and through
//!   reshapes that keep the parameter's last axis whole as an axis) or an embedding lookup's
//!   table (`gather` on axis 0 reading the parameter itself): those are the reads a backend can
//!   decode block by block as it stages them, and
//! - its last axis is a whole number of the type's blocks. The k-quants store 256 values a
//!   block, which many hidden sizes (384, 576) are not; such a weight takes the type llama.cpp
//!   falls back to (`q4_k` → `q4_1`, `q6_k` → `q8_0`), whose blocks are 32.
//!
//! Norm weights, biases, convolution weights and other 1-D parameters stay f32, and a
//! parameter the model declares packed keeps its declared type.

use std::fmt;

use crate::graph::{Graph, Node, NodeId, Op, Pin};
use mgn_ir::plan::Plan;
use mgn_ir::DType;

/// Fewer elements than this stay f32: the blocks' scales would cost about what they save.
pub const MIN_ELEMENTS: usize = 4096;

/// The type a weight whose last axis is not whole blocks of `dtype` takes instead, as
/// llama.cpp does: the k-quants' 256-value blocks fall back to 32-value ones of similar size.
pub fn fallback(dtype: DType) -> Option<DType> {
    match dtype {
        DType::Q4_K => Some(DType::Q4_1),
        DType::Q6_K => Some(DType::Q8_0),
        _ => None,
    }
}

/// The type a weight of `shape` takes when quantized to `dtype`: `dtype` where its last axis is
/// whole blocks of it, else the fallback where that fits, else none (it stays as it is).
pub fn packed_type(dtype: DType, shape: &[usize]) -> Option<DType> {
    let fits = |d: &DType| d.packs(shape).is_ok();
    Some(dtype).filter(fits).or(fallback(dtype).filter(fits))
}

/// The parameters of an inference plan of `g` that `--quantize dtype` packs, with the type
/// each takes (`dtype`, or its fallback), in parameter order. `mgnc quantize` calls this to
/// write a checkpoint the plan will read.
pub fn choose(g: &Graph, dtype: DType) -> Vec<(String, DType)> {
    choose_untrained(g, dtype, |_| false)
}

/// As `choose`, for a plan that trains the parameters (by index) `trained` says.
pub fn choose_untrained(
    g: &Graph,
    dtype: DType,
    trained: impl Fn(usize) -> bool,
) -> Vec<(String, DType)> {
    assert!(dtype.is_packed(), "quantize to a packed type");
    let readers = readers(g);
    let mut out = Vec::new();
    for (i, p) in g.params.iter().enumerate() {
        let candidate = p.trainable
            && !trained(i)
            && p.dtype == DType::F32
            && p.shape.len() >= 2
            && p.numel() >= MIN_ELEMENTS
            && !is_result(g, p.node);
        if !candidate || !read_as_weight(g, &readers, p.node, p.shape.len() - 1) {
            continue;
        }
        if let Some(d) = packed_type(dtype, &p.shape) {
            out.push((p.name.clone(), d));
        }
    }
    out
}

/// Gives the chosen parameters their packed types and reads each through a `Dequantize`
/// placed right after its `Param` node; they are no longer trainable. Node ids change.
pub fn apply(g: &mut Graph, chosen: &[(String, DType)]) {
    let packed: Vec<Option<DType>> = (g.params.iter())
        .map(|p| chosen.iter().find(|(n, _)| *n == p.name).map(|(_, d)| *d))
        .collect();
    let old = std::mem::take(&mut g.nodes);
    let mut nodes: Vec<Node> = Vec::with_capacity(old.len() + chosen.len());
    // What each old node's readers now read: a packed parameter's Dequantize.
    let mut map: Vec<NodeId> = Vec::with_capacity(old.len());
    let mut param_node: Vec<Option<NodeId>> = vec![None; g.params.len()];
    for n in old {
        let mut n = Node { inputs: n.inputs.iter().map(|x| map[x.0 as usize]).collect(), ..n };
        if let Op::DropoutGrad { forward, .. } = &mut n.op {
            *forward = map[*forward as usize].0;
        }
        let id = NodeId(nodes.len() as u32);
        let Op::Param { index } = n.op else {
            nodes.push(n);
            map.push(id);
            continue;
        };
        param_node[index] = Some(id);
        let Some(dtype) = packed[index] else {
            nodes.push(n);
            map.push(id);
            continue;
        };
        n.dtype = dtype;
        let read = Node {
            op: Op::Dequantize,
            inputs: vec![id],
            dtype: DType::F32,
            full_precision: Pin::No,
            ..n.clone()
        };
        nodes.push(n);
        nodes.push(read);
        map.push(NodeId(id.0 + 1));
    }
    g.nodes = nodes;
    for (i, p) in g.params.iter_mut().enumerate() {
        p.node = param_node[i].unwrap_or_else(|| map[p.node.0 as usize]);
        if let Some(d) = packed[i] {
            p.dtype = d;
            p.trainable = false;
        }
    }
    let remap = |x: &mut NodeId| *x = map[x.0 as usize];
    g.inputs.iter_mut().for_each(|(_, x)| remap(x));
    g.outputs.iter_mut().for_each(|(_, x)| remap(x));
    g.loss.iter_mut().for_each(remap);
    g.state_writes.iter_mut().for_each(|(_, x)| remap(x));
}

/// Each node's readers, by node.
fn readers(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut r = vec![Vec::new(); g.nodes.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for x in &n.inputs {
            r[x.0 as usize].push(NodeId(i as u32));
        }
    }
    r
}

/// Whether a value is an output, the loss or a state write: a result stays f32 as declared.
fn is_result(g: &Graph, id: NodeId) -> bool {
    g.outputs.iter().any(|(_, x)| *x == id)
        || g.loss == Some(id)
        || g.state_writes.iter().any(|(_, x)| *x == id)
}

/// Whether `id` (whose axis `last` holds the parameter's last axis) is read, and read only, by
/// products and lookups, possibly through permutes and reshapes that keep that axis whole.
fn read_as_weight(g: &Graph, readers: &[Vec<NodeId>], id: NodeId, last: usize) -> bool {
    let users = &readers[id.0 as usize];
    !users.is_empty()
        && users.iter().all(|&u| {
            let n = g.node(u);
            match &n.op {
                Op::MatMul => true,
                // The table, read by row: a lookup of the parameter itself.
                Op::Gather { axis: 0 } => n.inputs[0] == id && n.inputs[1] != id && last > 0,
                Op::Permute { perm } => {
                    let moved = perm.iter().position(|&a| a == last);
                    !is_result(g, u) && moved.is_some_and(|l| read_as_weight(g, readers, u, l))
                }
                Op::Reshape => {
                    let kept = kept_axis(&g.node(id).shape, &n.shape, last);
                    !is_result(g, u) && kept.is_some_and(|l| read_as_weight(g, readers, u, l))
                }
                _ => false,
            }
        })
}

/// Where axis `axis` of `from` is in `to`, when a reshape keeps it whole: the axes before it
/// hold as many elements in both, and it has the same length.
fn kept_axis(from: &[usize], to: &[usize], axis: usize) -> Option<usize> {
    let before: usize = from[..axis].iter().product();
    let mut acc = 1;
    for (j, &d) in to.iter().enumerate() {
        if acc == before && d == from[axis] {
            return Some(j);
        }
        acc *= d;
        if acc > before {
            return None;
        }
    }
    None
}

/// What `--quantize` did, for the line the CLI prints.
pub struct Summary {
    pub asked: DType,
    /// (parameter, its packed type).
    pub chosen: Vec<(String, DType)>,
    /// Bytes of every parameter before and after.
    pub bytes: (usize, usize),
}

impl Summary {
    /// What `--quantize asked` made of `plan`: its parameters of the asked type or its
    /// fallback (a parameter the model declares so is counted too; it is stored so as well),
    /// against the same parameters in f32.
    pub fn of_plan(plan: &Plan, asked: DType) -> Summary {
        let size = |d: DType, n: usize| d.stored_bytes(n);
        let (mut before, mut after, mut chosen) = (0, 0, Vec::new());
        for p in &plan.params {
            let n = p.numel();
            after += size(p.dtype, n);
            if p.dtype == asked || Some(p.dtype) == fallback(asked) {
                chosen.push((p.name.clone(), p.dtype));
                before += size(DType::F32, n);
            } else {
                before += size(p.dtype, n);
            }
        }
        Summary { asked, chosen, bytes: (before, after) }
    }
}

/// `quantized 211 weights to q4_1 (3 fell back from q4_k: last axis not a multiple of 256):
/// 513 MiB → 136 MiB of parameters`.
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fell = self.chosen.iter().filter(|(_, d)| *d != self.asked).count();
        let n = self.chosen.len() - fell;
        write!(f, "quantized {n} weight{} to {}", if n == 1 { "" } else { "s" }, self.asked)?;
        if let (Some(to), true) = (fallback(self.asked), fell > 0) {
            let (len, _) = self.asked.block().expect("a packed type");
            write!(
                f,
                ", {fell} to {to} (fell back from {}: last axis not a multiple of {len})",
                self.asked
            )?;
        }
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        write!(f, ": {:.1} MiB → {:.1} MiB of parameters", mib(self.bytes.0), mib(self.bytes.1))
    }
}

#[cfg(test)]
mod tests;
