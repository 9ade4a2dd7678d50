//! Matrix products (`Op::MatMul`, and `GpuOp::MatMulEpilogue` with its element-wise epilogue):
//! batched, broadcasting leading batch axes and promoting 1-D operands as torch.matmul does, in
//! f32.
//!
//! Four kernels, picked by shape (and the operands' type) when the plan is compiled:
//! - `coop`: f16 operands (the mixed policies' products) on a device with cooperative-matrix
//!   units, unless the product is skinny.
//! - `tiled`: the general case. One workgroup per output tile; the tile's A and B panels pass
//!   through shared memory `BK` deep at a time, and each invocation keeps a register block of
//!   outputs (8×8, or 4×4 with panels `2 · BK` deep when the big tiles would leave the GPU
//!   idle). The next panels are
//!   fetched into registers while the current ones are multiplied.
//! - `few_rows`: at most `SKINNY` rows (one-token decoding, `[1, k] × [k, n]`): invocations
//!   own consecutive columns of B, so every load of B is coalesced, and split k when there are
//!   too few columns to fill the GPU.
//! - `few_cols`: at most `SKINNY` columns (matrix × vector): lanes split each row's k, reading
//!   A along its rows, and reduce in shared memory.
//!
//! A few_cols product whose A is a packed weight read in place decodes it whole blocks at a
//! time (`packed_rows`).
//!
//! The skinny kernels convert a half operand that every invocation reads whole (the vector of
//! a decoding step, rounded by the mixed policy) once a workgroup into shared memory
//! (`staged_half`), and few_cols reads rows of packed halves a word — two elements — at a time.
//!
//! Every kernel is one workgroup of `width` invocations per work item, launched as
//! `invocations / width` workgroups (folded into y and z past 65535); workgroups past the end
//! return at once, all together, before any barrier.

mod coop;
mod few_cols;
mod normed_vector;
mod packed_rows;
mod panel_stats;
mod panels;
mod row_norm;
pub(super) use coop::{subgroup_guard, CoopGrid, NAN};
#[cfg(test)]
mod tests;
mod tiled;

use super::{fetch_word, load, store, word_value, Ext, KernelSource, Operand, Target, FILL};
use few_cols::few_cols;
use mgn_ir::DType;
use tiled::tiled;

/// Products with at most this many rows (or columns) take a skinny kernel: a tile of 64 rows
/// would waste most of its work.
pub(crate) const SKINNY: usize = 8;
/// The k depth of one shared-memory stage of the tiled kernel: with 128×128 tiles both
/// panels take 8.25 KiB, far inside the 16 KiB Vulkan guarantees.
const BK: usize = 8;

/// The product's geometry after promotion: `batches` independent `[m, k] × [k, n]` products.
/// Sizes are `Ext`s: in a dynamic plan the kernel reads those that follow the sizes from its
/// parameter block, and its choices (which kernel, which tile) take their values now.
#[derive(Clone)]
struct Geometry {
    a: Operand,
    b: Operand,
    out: Operand,
    m: Ext,
    k: Ext,
    n: Ext,
    /// The output's batch axes (empty when folded into m).
    batch: Vec<Ext>,
    /// A's and B's own batch axes (broadcast to `batch`).
    a_batch: Vec<Ext>,
    b_batch: Vec<Ext>,
    /// A's words hold the `[k, m]` matrix it transposes (`GpuOp::MatMulT`).
    at: bool,
    /// B's words hold the `[n, k]` matrix it transposes (a linear layer's weight read in place).
    bt: bool,
    /// The output is stored transposed, `[n, m]` (only for the swapped decode product).
    ot: bool,
    /// Results go through `mgn_epilogue(i, value)` (a `GpuOp::MatMulEpilogue`), which gives
    /// the value to store.
    epilogue: bool,
    /// Every result is multiplied by this before it is stored.
    alpha: f64,
    /// Ranges of k computed apart (`Layout::splits`); 1 for a whole product.
    splits: usize,
    /// A's rows normed as they are staged (`GpuOp::NormedProduct`; only the tiled kernel).
    norm: Option<RowNorm>,
    /// A `GpuOp::ProductPair`'s second weight, stored as B is (transposed) before the product
    /// is swapped and as A is after: only the few-columns kernel, swapped.
    pair: Option<Operand>,
}

/// A norm over the rows of a product's A (its k axis), computed by the product's kernel
/// (`GpuOp::NormedProduct`): a whole product sums its rows as it stages them and norms its
/// results (`panel_stats`); a split one finds its rows' statistics first, then stages
/// `(a − mean) · rstd · weight + bias` in place of `a` (`row_norm`).
#[derive(Clone, Debug)]
pub(crate) struct RowNorm {
    pub eps: f64,
    /// A layer norm subtracts the mean; an RMS norm does not.
    pub center: bool,
    pub weight: Option<Operand>,
    pub bias: Option<Operand>,
    /// The normed value is rounded to this half type before the product reads it (a mixed
    /// policy's cast; only `normed_vector`).
    pub rounded: Option<DType>,
}

impl RowNorm {
    /// The row norm of a layer norm or RMS norm whose weight and bias (those it has) are
    /// `params`.
    pub(crate) fn of(norm: &mgn_ir::op::Op, params: &[Operand]) -> Result<RowNorm, String> {
        use mgn_ir::op::Op;
        let (eps, center, has_weight, has_bias) = match norm {
            Op::LayerNorm { eps, has_weight, has_bias } => (*eps, true, *has_weight, *has_bias),
            Op::RmsNorm { eps, has_weight } => (*eps, false, *has_weight, false),
            op => return Err(format!("`{}` is not a norm over rows", op.describe())),
        };
        let mut params = params.iter().cloned();
        let weight = if has_weight { Some(params.next().ok_or("no norm weight")?) } else { None };
        let bias = if has_bias { Some(params.next().ok_or("no norm bias")?) } else { None };
        if params.next().is_some() {
            return Err("more norm parameters than the norm has".into());
        }
        Ok(RowNorm { eps, center, weight, bias, rounded: None })
    }
}

/// How a product reads its operands and scales its result: `GpuOp::MatMulT`'s attributes
/// (`Layout::PLAIN` for `Op::MatMul`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Layout {
    /// A's words hold `[.., k, m]` (its transpose).
    pub ta: bool,
    /// B's words hold `[.., n, k]`.
    pub tb: bool,
    /// Every result is multiplied by this.
    pub alpha: f64,
    /// k split into this many ranges, each product stored apart: the output is `[splits, ..]`
    /// (see `split_k`).
    pub splits: usize,
}

impl Layout {
    pub const PLAIN: Layout = Layout { ta: false, tb: false, alpha: 1.0, splits: 1 };
}

/// How deep each of `splits` ranges of `k` is: a whole number of panels, and together at least
/// `k` (the last range may be shorter, or empty).
pub(crate) fn split_depth(k: usize, splits: usize) -> usize {
    k.div_ceil(splits.max(1)).div_ceil(BK) * BK
}

/// `split_depth` of a size as a kernel reads it.
fn split_depth_of(k: &Ext, splits: usize) -> Ext {
    k.div_ceil(splits.max(1)).div_ceil(BK).times(BK)
}

impl Geometry {
    fn of(inputs: &[Operand], out: &Operand) -> Result<Geometry, String> {
        let (a0, b0) = (&inputs[0], &inputs[1]);
        if a0.transposed || b0.transposed && b0.shape.len() != 2 {
            return Err("a transposed operand must be a 2-D right operand".into());
        }
        Geometry::of_layout(inputs, out, Layout { tb: b0.transposed, ..Layout::PLAIN })
    }

    /// The geometry of `alpha · op(a) · op(b)`, the operands' shapes as stored: a transposed
    /// one holds its last two axes swapped.
    fn of_layout(inputs: &[Operand], out: &Operand, layout: Layout) -> Result<Geometry, String> {
        let (a0, b0) = (&inputs[0], &inputs[1]);
        if a0.shape.is_empty() || b0.shape.is_empty() {
            return Err("matmul of scalars has no GPU kernel".into());
        }
        if !(a0.dtype.is_float() && b0.dtype.is_float() && out.dtype.is_float()) {
            return Err("matmul of integers has no GPU kernel".into());
        }
        // A 1-D operand is promoted as torch.matmul does ([k] → [1, k] on the left, [k, 1] on
        // the right); the axis it adds has size 1, so the output's element order is unchanged.
        let (mut ad, mut bd) = (a0.dims(), b0.dims());
        if ad.len() == 1 {
            ad.insert(0, Ext::lit(1));
        }
        if bd.len() == 1 {
            bd.push(Ext::lit(1));
        }
        // Logical shapes from here on (the flags say how the words lie).
        let swap_last = |s: &mut Vec<Ext>, on: bool| {
            let r = s.len();
            if on && r >= 2 {
                s.swap(r - 2, r - 1);
            }
        };
        if !b0.transposed {
            // A transposed view already carries its logical shape.
            swap_last(&mut bd, layout.tb);
        }
        swap_last(&mut ad, layout.ta);
        let (mut a, mut b) = (a0.clone(), b0.clone());
        a.transposed = false;
        b.transposed = false;
        let (m, k) = (ad[ad.len() - 2].clone(), ad[ad.len() - 1].clone());
        let (k2, n) = (&bd[bd.len() - 2], bd[bd.len() - 1].clone());
        if k.n != k2.n {
            return Err(format!("matmul of {:?} by {:?}: inner sizes differ", a0.shape, b0.shape));
        }
        let total: usize = out.shape.iter().product();
        let a_batch = ad[..ad.len() - 2].to_vec();
        let b_batch = bd[..bd.len() - 2].to_vec();
        let rank = a_batch.len().max(b_batch.len());
        let mut batch = vec![Ext::lit(1); rank];
        for (s, pad) in [(&a_batch, rank - a_batch.len()), (&b_batch, rank - b_batch.len())] {
            for (j, d) in s.iter().enumerate() {
                if d.n != 1 || !d.is_fixed() {
                    batch[j + pad] = d.clone();
                }
            }
        }
        if Ext::product(&batch).n * m.n * n.n * layout.splits.max(1) != total {
            return Err(format!(
                "matmul of {:?} by {:?} cannot give {:?}",
                a0.shape, b0.shape, out.shape
            ));
        }
        let (a_items, b_items) = (Ext::product(&a_batch).n, Ext::product(&b_batch).n);
        a.shape = ad.iter().map(|d| d.n).collect();
        b.shape = bd.iter().map(|d| d.n).collect();
        let mut g = Geometry {
            a,
            b,
            out: out.clone(),
            m,
            k,
            n,
            batch,
            a_batch,
            b_batch,
            at: layout.ta,
            bt: layout.tb,
            ot: false,
            epilogue: false,
            alpha: layout.alpha,
            splits: layout.splits.max(1),
            norm: None,
            pair: None,
        };
        // A shared right operand (a weight) under an unbroadcast left one: the batch items of a
        // (and of the output) lie one after another, so they are just more rows — unless A is
        // stored transposed, when its rows are not.
        let fixed_b = g.b_batch.iter().all(|d| d.is_fixed());
        if b_items == 1 && fixed_b && a_items == g.batches().n && !g.at {
            g.m = g.m.mul(&g.batches());
            g.batch.clear();
            g.a_batch.clear();
            g.b_batch.clear();
        }
        Ok(g)
    }

    fn batches(&self) -> Ext {
        Ext::product(&self.batch)
    }

    /// The word of B at (`kk`, `col`), past `bbase`.
    fn b_at(&self, kk: &str, col: &str) -> String {
        if self.bt {
            format!("bbase + ({col}) * {} + ({kk})", self.k)
        } else {
            format!("bbase + ({kk}) * {} + ({col})", self.n)
        }
    }

    /// Stores `value` at output word `at` (past the output's offset), through the epilogue when
    /// there is one.
    fn store(&self, at: &str, value: &str) -> String {
        store(&self.out, at, &self.result(at, value))
    }

    /// The value a result `value` at output word `at` is stored as: through the epilogue, when
    /// there is one, and scaled.
    fn result(&self, at: &str, value: &str) -> String {
        let scaled = if self.alpha == 1.0 {
            value.to_string()
        } else {
            format!("({value}) * {:?}", self.alpha as f32)
        };
        if self.epilogue {
            format!("mgn_epilogue({at}, {scaled})")
        } else {
            scaled
        }
    }

    /// The word of the output at (`row`, `col`), past `obase`.
    fn o_at(&self, row: &str, col: &str) -> String {
        if self.ot {
            format!("obase + ({col}) * {} + ({row})", self.m)
        } else {
            format!("obase + ({row}) * {} + ({col})", self.n)
        }
    }

    /// The same product computed as its transpose, `Cᵀ = Bᵀ · Aᵀ`: for a few rows times a
    /// transposed weight (one-token decoding through a linear layer), whose columns are then
    /// contiguous rows of the weight that lanes can split along k. Needs no batch axes.
    fn swapped(&self) -> Geometry {
        let mut a = self.b.clone();
        a.shape = vec![self.n.n, self.k.n];
        a.transposed = false;
        let mut b = self.a.clone();
        b.shape = vec![self.k.n, self.m.n];
        Geometry {
            a,
            b,
            out: self.out.clone(),
            m: self.n.clone(),
            k: self.k.clone(),
            n: self.m.clone(),
            batch: Vec::new(),
            a_batch: Vec::new(),
            b_batch: Vec::new(),
            at: false,
            bt: true,
            ot: true,
            epilogue: self.epilogue,
            alpha: self.alpha,
            splits: 1,
            // The norm is over A's rows, which are now B's columns (`normed_vector`).
            norm: self.norm.clone(),
            pair: self.pair.clone(),
        }
    }

    /// A WGSL expression for the first word (past the operand's offset) of batch item `batch`
    /// of an operand with batch axes `tb` (whose matrices hold `size` words), broadcasting its
    /// batch axes.
    fn batch_base(&self, tb: &[Ext], size: &Ext) -> String {
        let ts = Ext::strides(tb);
        let bs = Ext::strides(&self.batch);
        let r = self.batch.len();
        let mut terms = Vec::new();
        for (j, d) in tb.iter().enumerate() {
            let ax = j + r - tb.len();
            if d.n != 1 || !d.is_fixed() {
                terms.push(format!(
                    "((batch / {}) % {}) * {}",
                    bs[ax],
                    self.batch[ax],
                    ts[j].mul(size)
                ));
            }
        }
        if terms.is_empty() {
            "0u".into()
        } else {
            terms.join(" + ")
        }
    }

    /// Declarations of `abase`, `bbase` and `obase` for batch item `batch` (and k range
    /// `split`, whose product is stored after the earlier ranges').
    fn bases(&self) -> String {
        let mn = self.m.mul(&self.n);
        let split = if self.splits > 1 {
            format!(" + split * {}", self.batches().mul(&mn))
        } else {
            String::new()
        };
        format!(
            "let abase = {};\n    let bbase = {};\n    let obase = batch * {mn}{split};",
            self.batch_base(&self.a_batch, &self.m.mul(&self.k)),
            self.batch_base(&self.b_batch, &self.k.mul(&self.n)),
        )
    }
}

pub(super) fn generate(
    inputs: &[Operand],
    out: &Operand,
    target: Target,
) -> Result<KernelSource, String> {
    generate_with(inputs, out, target, None, Layout::PLAIN, None)
}

/// `GpuOp::MatMulT`: `alpha · op(a) · op(b)` with either operand read transposed in place.
pub(super) fn generate_layout(
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    layout: Layout,
) -> Result<KernelSource, String> {
    generate_with(inputs, out, target, None, layout, None)
}

/// `generate_with` of the product of `norm(a)` by b, where `norm` is over A's rows: the tiled
/// kernel, which is the one that stages A (`GpuOp::NormedProduct`).
pub(super) fn generate_normed(
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    epilogue: Option<&str>,
    layout: Layout,
    norm: RowNorm,
) -> Result<KernelSource, String> {
    generate_with(inputs, out, target, epilogue, layout, Some(norm))
}

/// A `GpuOp::ProductPair`: the few rows `inputs[0]` by the transposed weights `inputs[1]` and
/// `inputs[2]` (of `norm(a)`, where given), both results passed to `epilogue`'s
/// `fn mgn_epilogue(i: u32, p: f32, q: f32) -> f32`. Only the few-columns kernel, swapped.
pub(super) fn generate_pair(
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    epilogue: &str,
    norm: Option<RowNorm>,
) -> Result<KernelSource, String> {
    let width = target.width.max(1) as usize;
    let layout = Layout { tb: true, ..Layout::PLAIN };
    let mut g = Geometry::of_layout(&inputs[..2], out, layout)?;
    let second = Geometry::of_layout(&[inputs[0].clone(), inputs[2].clone()], out, layout)?;
    let fits = g.m.n <= SKINNY && g.n.n > SKINNY && g.batch.is_empty() && g.k.is_fixed();
    let packed = inputs[..3].iter().any(|o| o.dtype.is_packed() || o.transposed);
    if !fits || packed || second.n.n != g.n.n || second.k.n != g.k.n {
        return Err(format!(
            "a pair of products of {:?} by {:?}",
            inputs[0].shape, inputs[1].shape
        ));
    }
    g.norm = norm;
    g.pair = Some(second.b);
    let mut k = few_cols(&g.swapped(), width);
    k.body = format!("{epilogue}{}", k.body);
    Ok(k)
}

/// The product `layout` describes, with every result passed to the WGSL function `epilogue`
/// defines (`fn mgn_epilogue(i: u32, p: f32) -> f32`, the value element `i` is stored as).
pub(super) fn generate_with(
    inputs: &[Operand],
    out: &Operand,
    target: Target,
    epilogue: Option<&str>,
    layout: Layout,
    norm: Option<RowNorm>,
) -> Result<KernelSource, String> {
    let flagged = layout.ta || layout.tb || layout.splits > 1;
    if flagged && inputs.iter().take(2).any(|o| o.transposed) {
        return Err("a product reads an operand transposed both by flag and as a view".into());
    }
    let mut g = if flagged || layout.alpha != 1.0 {
        Geometry::of_layout(inputs, out, layout)?
    } else {
        Geometry::of(inputs, out)?
    };
    g.epilogue = epilogue.is_some();
    g.norm = norm;
    let mut k = generate_for(g, target)?;
    if let Some(e) = epilogue {
        k.body = format!("{e}{}", k.body);
    }
    Ok(k)
}

fn generate_for(g: Geometry, target: Target) -> Result<KernelSource, String> {
    let width = target.width.max(1) as usize;
    let shared = target.shared_bytes as usize;
    let (m, n) = (g.m.n, g.n.n);
    if m == 0 || n == 0 || g.batches().n == 0 {
        return Ok(super::elementwise(0, width as u32, "", ""));
    }
    let skinny = m <= SKINNY || n <= SKINNY;
    if g.norm.is_some() {
        // A few normed rows by a transposed weight (one-token decoding): the few-columns
        // kernel, swapped, finds its columns' statistics first (`normed_vector`).
        if normed_vector::takes(&g) {
            return Ok(few_cols(&g.swapped(), width));
        }
        // Otherwise only the tiled kernel stages A, and only a whole matrix of rows: the
        // rewrite makes normed products of weights that every row shares.
        let rounded = g.norm.as_ref().is_some_and(|n| n.rounded.is_some());
        if skinny || rounded || g.at || !g.batch.is_empty() || g.a.dtype != DType::F32 {
            return Err(format!("a product of normed rows needs the tiled kernel ({m}×{n})"));
        }
        return Ok(tiled(&g, width, shared));
    }
    let coop = target.coop.filter(|_| !skinny);
    if let Some((c, grid)) = coop.and_then(|c| Some((c, coop::grid_for(&g, c, width, shared)?))) {
        return Ok(coop::coop_with(&g, c, grid));
    }
    Ok(if g.at || g.splits > 1 || (g.bt && !g.batch.is_empty() && m <= SKINNY) {
        // Transposed operands of batched products: only the tiled kernel reads them in
        // panels, coalesced either way.
        tiled(&g, width, shared)
    } else if n <= SKINNY {
        few_cols(&g, width)
    } else if m <= SKINNY && g.bt && g.batch.is_empty() {
        few_cols(&g.swapped(), width)
    } else if m <= SKINNY {
        few_rows(&g, width)
    } else {
        tiled(&g, width, shared)
    })
}

/// The kernel's entry point: `g` is the linear workgroup index, `t` the invocation within it;
/// workgroups past `groups` (the grid is folded and may hold more) leave together.
fn entry(shared: &str, width: usize, groups: &Ext, body: &str) -> KernelSource {
    KernelSource {
        body: format!(
            "{shared}@compute @workgroup_size({width})
fn main(@builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) t: u32) {{
    let g = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (g >= {groups}) {{ return; }}
    {body}
}}
"
        ),
        invocations: groups.n as u64 * width as u64,
        dropout_node: None,
        width: None,
    }
}

/// Emits a tree reduction over `lanes` lanes (`lane` the invocation's), `stride` invocations
/// apart, of the `count` shared arrays `mm_red[j * width + t]`, into lane 0.
fn reduce_lanes(out: &mut String, lanes: usize, stride: usize, count: usize, width: usize) {
    let mut half = lanes / 2;
    while half > 0 {
        // Each level reads what the previous one wrote, in other invocations.
        out.push_str("    workgroupBarrier();\n");
        out.push_str(&format!("    if (lane < {half}u) {{\n"));
        for j in 0..count {
            out.push_str(&format!(
                "        mm_red[{o}u + t] = mm_red[{o}u + t] + mm_red[{o}u + t + {d}u];\n",
                o = j * width,
                d = half * stride
            ));
        }
        out.push_str("    }\n");
        half /= 2;
    }
}

/// The loop over this lane's k (`lane`, `lane + lanes`, ...) with `step(kk, name)` the body for
/// one k: four k per iteration keep four independent loads in flight, then the remainder.
fn k_loop(k: &Ext, lanes: usize, step: impl Fn(&str, &str) -> String) -> String {
    let mut s = format!("        var kk = lane;\n        while (kk + {}u < {k}) {{\n", 3 * lanes);
    for u in 0..4 {
        s.push_str(&step(&format!("(kk + {}u)", u * lanes), &format!("x{u}")));
    }
    s.push_str(&format!(
        "            kk = kk + {}u;\n        }}\n        while (kk < {k}) {{\n",
        4 * lanes
    ));
    s.push_str(&step("kk", "x"));
    s.push_str(&format!("            kk = kk + {lanes}u;\n        }}\n"));
    s
}

fn pow2_at_least(x: usize) -> usize {
    x.max(1).next_power_of_two()
}

/// The most shared memory a skinny kernel spends on its staged operand (`staged_half`): with
/// the reduction's 8 KiB at 256 invocations, within the 16 KiB every device has.
const STAGED_BYTES: usize = 6 << 10;

/// A skinny product's operand that every invocation of a workgroup reads whole (few columns'
/// B, few rows' A: `per_k` elements for each of the `k`), when it is rounded (a rounded view)
/// or unpacked as it loads: converted once a workgroup into the shared array `name` of f32s,
/// not once per row or column that reads it — where k is fixed and it fits in
/// `STAGED_BYTES`. `at(e)` is the operand's element index of staged element `e`. The
/// declaration, and the staging loop with its barrier.
fn staged_half(
    o: &Operand,
    name: &str,
    (k, per_k): (&Ext, usize),
    width: usize,
    at: impl Fn(&str) -> String,
) -> Option<(String, String)> {
    let count = k.n * per_k;
    (o.dtype.is_half() && k.is_fixed() && count * 4 <= STAGED_BYTES).then(|| {
        (
            format!("var<workgroup> {name}: array<f32, {count}>;\n"),
            format!(
                "    for (var e = t; e < {count}u; e = e + {width}u) {{\n        \
                 {name}[e] = {};\n    }}\n    workgroupBarrier();\n",
                load(o, &at("e"))
            ),
        )
    })
}

/// At most `SKINNY` rows: `cols` consecutive columns per workgroup, one per invocation, so each
/// load of B is coalesced; k split over `lanes` groups of them when the columns alone would
/// leave the GPU idle. Each load of A's few rows serves a whole group of `cols` invocations.
fn few_rows(g: &Geometry, width: usize) -> KernelSource {
    let (m, k, n) = (g.m.n, &g.k, &g.n);
    // A transposed B would make these loads strided: `generate` swaps those products instead.
    debug_assert!(!g.bt && !g.ot);
    let bcol_at =
        |kk: &str| if g.bt { format!("bcol + {kk}") } else { format!("bcol + ({kk}) * {n}") };
    let batches = g.batches();
    // Eight consecutive columns still use whole 32-byte sectors of B; fewer columns per
    // workgroup (more lanes splitting k) when the columns alone would leave the GPU idle.
    let mut cols = width;
    while cols > 8 && n.n.div_ceil(cols) * batches.n < FILL && width / cols < pow2_at_least(k.n) {
        cols /= 2;
    }
    let lanes = width / cols;
    let per_batch = n.div_ceil(cols);
    let groups = per_batch.mul(&batches);
    let mut body = String::new();
    body.push_str(&format!(
        "let batch = g / {per_batch};\n    \
        let col = (g % {per_batch}) * {cols}u + t % {cols}u;\n    \
        let lane = t / {cols}u;\n    "
    ));
    body.push_str(&g.bases());
    body.push('\n');
    for i in 0..m {
        body.push_str(&format!("    var acc{i} = 0.0;\n"));
    }
    // The few rows of A, read by every column.
    let staged = staged_half(&g.a, "mm_a", (k, m), width, |e| format!("abase + {e}"));
    if let Some((_, stage)) = &staged {
        body.push_str(stage);
    }
    let a_at = |i: usize, kk: &str| {
        if staged.is_some() {
            format!("mm_a[{}u + {kk}]", i * k.n)
        } else {
            load(&g.a, &format!("abase + {} + {kk}", k.times(i)))
        }
    };
    let step = |kk: &str, v: &str| {
        let mut s = format!("            let {v} = {};\n", load(&g.b, &bcol_at(kk)));
        for i in 0..m {
            s.push_str(&format!("            acc{i} = acc{i} + {} * {v};\n", a_at(i, kk)));
        }
        s
    };
    body.push_str(&format!(
        "    if (col < {n}) {{\n        let bcol = bbase + col{};\n",
        if g.bt { format!(" * {k}") } else { String::new() }
    ));
    body.push_str(&k_loop(k, lanes, step));
    body.push_str("    }\n");
    let mut shared = staged.map(|(decl, _)| decl).unwrap_or_default();
    if lanes > 1 {
        shared += &format!("var<workgroup> mm_red: array<f32, {}>;\n", m * width);
        for i in 0..m {
            body.push_str(&format!("    mm_red[{}u + t] = acc{i};\n", i * width));
        }
        reduce_lanes(&mut body, lanes, cols, m, width);
        for i in 0..m {
            body.push_str(&format!("    acc{i} = mm_red[{}u + t];\n", i * width));
        }
    }
    body.push_str(&format!("    if (lane == 0u && col < {n}) {{\n"));
    for i in 0..m {
        body.push_str(&format!(
            "        {}\n",
            g.store(&format!("obase + {} + col", n.times(i)), &format!("acc{i}"))
        ));
    }
    body.push_str("    }");
    entry(&shared, width, &groups, &body)
}
