//! Matrix products (`Op::MatMul`): batched, broadcasting leading batch axes and promoting 1-D
//! operands as torch.matmul does, in f32.
//!
//! Three kernels, picked by shape when the plan is compiled:
//! - `tiled`: the general case. One workgroup per output tile; the tile's A and B panels pass
//!   through shared memory `BK` deep at a time, and each invocation keeps a register block of
//!   outputs (8×8, or 4×4 when the big tiles would leave the GPU idle). The next panels are
//!   fetched into registers while the current ones are multiplied.
//! - `few_rows`: at most `SKINNY` rows (one-token decoding, `[1, k] × [k, n]`): invocations
//!   own consecutive columns of B, so every load of B is coalesced, and split k when there are
//!   too few columns to fill the GPU.
//! - `few_cols`: at most `SKINNY` columns (matrix × vector): lanes split each row's k, reading
//!   A along its rows, and reduce in shared memory.
//!
//! Every kernel is one workgroup of `width` invocations per work item, launched as
//! `invocations / width` workgroups (folded into y and z past 65535); workgroups past the end
//! return at once, all together, before any barrier.

use super::{load, store, strides, KernelSource, Operand};

/// About as many workgroups as it takes to fill a large GPU (two per SM of a 132-SM H200):
/// below this, the generators trade work per invocation for more workgroups.
const FILL: u64 = 264;
/// Products with at most this many rows (or columns) take a skinny kernel: a tile of 64 rows
/// would waste most of its work.
const SKINNY: usize = 8;
/// The k depth of one shared-memory stage of the tiled kernel: with 128×128 tiles both
/// panels take 8.25 KiB, far inside the 16 KiB Vulkan guarantees.
const BK: usize = 8;

/// The product's geometry after promotion: `batches` independent `[m, k] × [k, n]` products.
struct Geometry {
    a: Operand,
    b: Operand,
    out: Operand,
    m: usize,
    k: usize,
    n: usize,
    /// The output's batch axes (empty when folded into m).
    batch: Vec<usize>,
    /// B's words hold the `[n, k]` matrix it transposes (a linear layer's weight read in place).
    bt: bool,
    /// The output is stored transposed, `[n, m]` (only for the swapped decode product).
    ot: bool,
    /// Results go through `mgn_epilogue(i, value)` (an `Op::MatMulEpilogue`), which stores them.
    epilogue: bool,
}

impl Geometry {
    fn of(inputs: &[Operand], out: &Operand) -> Result<Geometry, String> {
        let (a0, b0) = (&inputs[0], &inputs[1]);
        if a0.shape.is_empty() || b0.shape.is_empty() {
            return Err("matmul of scalars has no GPU kernel".into());
        }
        if !(a0.dtype.is_float() && b0.dtype.is_float() && out.dtype.is_float()) {
            return Err("matmul of integers has no GPU kernel".into());
        }
        // A 1-D operand is promoted as torch.matmul does ([k] → [1, k] on the left, [k, 1] on
        // the right); the axis it adds has size 1, so the output's element order is unchanged.
        let (mut a, mut b) = (a0.clone(), b0.clone());
        if a.shape.len() == 1 {
            a.shape.insert(0, 1);
        }
        if b.shape.len() == 1 {
            b.shape.push(1);
        }
        let (m, k) = (a.shape[a.shape.len() - 2], a.shape[a.shape.len() - 1]);
        let (k2, n) = (b.shape[b.shape.len() - 2], b.shape[b.shape.len() - 1]);
        if k != k2 {
            return Err(format!("matmul of {:?} by {:?}: inner sizes differ", a0.shape, b0.shape));
        }
        let numel = |s: &[usize]| s.iter().product::<usize>();
        let total = numel(&out.shape);
        let a_batch = &a.shape[..a.shape.len() - 2];
        let b_batch = &b.shape[..b.shape.len() - 2];
        let rank = a_batch.len().max(b_batch.len());
        let mut batch = vec![1; rank];
        for (s, pad) in [(a_batch, rank - a_batch.len()), (b_batch, rank - b_batch.len())] {
            for (j, &d) in s.iter().enumerate() {
                if d != 1 {
                    batch[j + pad] = d;
                }
            }
        }
        if numel(&batch) * m * n != total {
            return Err(format!(
                "matmul of {:?} by {:?} cannot give {:?}",
                a0.shape, b0.shape, out.shape
            ));
        }
        let (a_items, b_items) = (numel(a_batch), numel(b_batch));
        if b0.transposed && (b0.shape.len() != 2 || a0.transposed) {
            return Err("a transposed operand must be a 2-D right operand".into());
        }
        if a0.transposed {
            return Err("a transposed operand must be a 2-D right operand".into());
        }
        let mut g = Geometry {
            a,
            b,
            out: out.clone(),
            m,
            k,
            n,
            batch,
            bt: b0.transposed,
            ot: false,
            epilogue: false,
        };
        // A shared right operand (a weight) under an unbroadcast left one: the batch items of a
        // (and of the output) lie one after another, so they are just more rows.
        if b_items == 1 && a_items == numel(&g.batch) {
            g.m *= numel(&g.batch);
            g.batch.clear();
            g.a.shape = vec![g.m, k];
            g.b.shape = vec![k, n];
        }
        Ok(g)
    }

    fn batches(&self) -> usize {
        self.batch.iter().product()
    }

    /// The word of B at (`kk`, `col`), past `bbase`.
    fn b_at(&self, kk: &str, col: &str) -> String {
        if self.bt {
            format!("bbase + ({col}) * {}u + ({kk})", self.k)
        } else {
            format!("bbase + ({kk}) * {}u + ({col})", self.n)
        }
    }

    /// Stores `value` at output word `at` (past the output's offset), through the epilogue when
    /// there is one.
    fn store(&self, at: &str, value: &str) -> String {
        if self.epilogue {
            format!("mgn_epilogue({at}, {value});")
        } else {
            store(&self.out, at, value)
        }
    }

    /// The word of the output at (`row`, `col`), past `obase`.
    fn o_at(&self, row: &str, col: &str) -> String {
        if self.ot {
            format!("obase + ({col}) * {}u + ({row})", self.m)
        } else {
            format!("obase + ({row}) * {}u + ({col})", self.n)
        }
    }

    /// The same product computed as its transpose, `Cᵀ = Bᵀ · Aᵀ`: for a few rows times a
    /// transposed weight (one-token decoding through a linear layer), whose columns are then
    /// contiguous rows of the weight that lanes can split along k. Needs no batch axes.
    fn swapped(&self) -> Geometry {
        let mut a = self.b.clone();
        a.shape = vec![self.n, self.k];
        a.transposed = false;
        let mut b = self.a.clone();
        b.shape = vec![self.k, self.m];
        Geometry {
            a,
            b,
            out: self.out.clone(),
            m: self.n,
            k: self.k,
            n: self.m,
            batch: Vec::new(),
            bt: true,
            ot: true,
            epilogue: self.epilogue,
        }
    }

    /// A WGSL expression for the first word (past the operand's offset) of batch item `batch`
    /// of `t` (a or b, whose matrices hold `size` words), broadcasting its batch axes.
    fn batch_base(&self, t: &Operand, size: usize) -> String {
        let tb = &t.shape[..t.shape.len() - 2];
        let ts = strides(tb);
        let bs = strides(&self.batch);
        let r = self.batch.len();
        let mut terms = Vec::new();
        for (j, &d) in tb.iter().enumerate() {
            let ax = j + r - tb.len();
            if d != 1 {
                terms.push(format!(
                    "((batch / {}u) % {}u) * {}u",
                    bs[ax],
                    self.batch[ax],
                    ts[j] * size
                ));
            }
        }
        if terms.is_empty() {
            "0u".into()
        } else {
            terms.join(" + ")
        }
    }

    /// Declarations of `abase`, `bbase` and `obase` for batch item `batch`.
    fn bases(&self) -> String {
        format!(
            "let abase = {};\n    let bbase = {};\n    let obase = batch * {}u;",
            self.batch_base(&self.a, self.m * self.k),
            self.batch_base(&self.b, self.k * self.n),
            self.m * self.n
        )
    }
}

pub(super) fn generate(
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    generate_with(inputs, out, width, None)
}

/// `generate`, with every result passed to the WGSL function `epilogue` defines
/// (`fn mgn_epilogue(i: u32, p: f32)`, which stores element `i`) instead of stored.
pub(super) fn generate_with(
    inputs: &[Operand],
    out: &Operand,
    width: u32,
    epilogue: Option<&str>,
) -> Result<KernelSource, String> {
    let mut g = Geometry::of(inputs, out)?;
    g.epilogue = epilogue.is_some();
    let mut k = generate_for(g, width)?;
    if let Some(e) = epilogue {
        k.body = format!("{e}{}", k.body);
    }
    Ok(k)
}

fn generate_for(g: Geometry, width: u32) -> Result<KernelSource, String> {
    let width = width.max(1) as usize;
    if g.m == 0 || g.n == 0 || g.batches() == 0 {
        return Ok(super::elementwise(0, width as u32, "", ""));
    }
    Ok(if g.n <= SKINNY {
        few_cols(&g, width)
    } else if g.m <= SKINNY && g.bt && g.batch.is_empty() {
        few_cols(&g.swapped(), width)
    } else if g.m <= SKINNY {
        few_rows(&g, width)
    } else {
        tiled(&g, width)
    })
}

/// The kernel's entry point: `g` is the linear workgroup index, `t` the invocation within it;
/// workgroups past `groups` (the grid is folded and may hold more) leave together.
fn entry(shared: &str, width: usize, groups: usize, body: &str) -> KernelSource {
    KernelSource {
        body: format!(
            "{shared}@compute @workgroup_size({width})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) grid: vec3<u32>, @builtin(local_invocation_index) t: u32) {{
    let g = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (g >= {groups}u) {{ return; }}
    {body}
}}
"
        ),
        invocations: groups as u64 * width as u64,
        dropout_node: None,
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
fn k_loop(k: usize, lanes: usize, step: impl Fn(&str, &str) -> String) -> String {
    let mut s = format!("        var kk = lane;\n        while (kk + {}u < {k}u) {{\n", 3 * lanes);
    for u in 0..4 {
        s.push_str(&step(&format!("(kk + {}u)", u * lanes), &format!("x{u}")));
    }
    s.push_str(&format!(
        "            kk = kk + {}u;\n        }}\n        while (kk < {k}u) {{\n",
        4 * lanes
    ));
    s.push_str(&step("kk", "x"));
    s.push_str(&format!("            kk = kk + {lanes}u;\n        }}\n"));
    s
}

fn pow2_at_least(x: usize) -> usize {
    x.max(1).next_power_of_two()
}

/// At most `SKINNY` columns: `rows` rows per workgroup, each split over `lanes` consecutive
/// invocations that read consecutive k (coalesced along A's rows), summed in shared memory.
fn few_cols(g: &Geometry, width: usize) -> KernelSource {
    let (m, k, n) = (g.m, g.k, g.n);
    let batches = g.batches();
    // One warp per row reads 128 contiguous bytes per load; more lanes per row (and fewer rows)
    // when the rows alone would leave the GPU idle, but no more lanes than k has elements.
    let mut lanes = width.min(32).min(pow2_at_least(k));
    while lanes < width
        && lanes < pow2_at_least(k)
        && ((m.div_ceil(width / lanes) * batches) as u64) < FILL
    {
        lanes *= 2;
    }
    let rows = width / lanes;
    let per_batch = m.div_ceil(rows);
    let groups = per_batch * batches;
    let mut body = String::new();
    body.push_str(&format!("let batch = g / {per_batch}u;\n    let row = (g % {per_batch}u) * {rows}u + t / {lanes}u;\n    let lane = t % {lanes}u;\n    "));
    body.push_str(&g.bases());
    body.push('\n');
    for j in 0..n {
        body.push_str(&format!("    var acc{j} = 0.0;\n"));
    }
    // Rows past the end still take part in the reduction's barriers; they just add nothing.
    let step = |kk: &str, v: &str| {
        let mut s = format!("            let {v} = {};\n", load(&g.a, &format!("arow + {kk}")));
        for j in 0..n {
            s.push_str(&format!(
                "            acc{j} = acc{j} + {v} * {};\n",
                load(&g.b, &g.b_at(kk, &format!("{j}u")))
            ));
        }
        s
    };
    body.push_str(&format!("    if (row < {m}u) {{\n        let arow = abase + row * {k}u;\n"));
    body.push_str(&k_loop(k, lanes, step));
    body.push_str("    }\n");
    let mut shared = String::new();
    if lanes > 1 {
        shared = format!("var<workgroup> mm_red: array<f32, {}>;\n", n * width);
        for j in 0..n {
            body.push_str(&format!("    mm_red[{}u + t] = acc{j};\n", j * width));
        }
        reduce_lanes(&mut body, lanes, 1, n, width);
        for j in 0..n {
            body.push_str(&format!("    acc{j} = mm_red[{}u + t];\n", j * width));
        }
    }
    body.push_str(&format!("    if (lane == 0u && row < {m}u) {{\n"));
    for j in 0..n {
        body.push_str(&format!(
            "        {}\n",
            g.store(&g.o_at("row", &format!("{j}u")), &format!("acc{j}"))
        ));
    }
    body.push_str("    }");
    entry(&shared, width, groups, &body)
}

/// At most `SKINNY` rows: `cols` consecutive columns per workgroup, one per invocation, so each
/// load of B is coalesced; k split over `lanes` groups of them when the columns alone would
/// leave the GPU idle. Each load of A's few rows serves a whole group of `cols` invocations.
fn few_rows(g: &Geometry, width: usize) -> KernelSource {
    let (m, k, n) = (g.m, g.k, g.n);
    // A transposed B would make these loads strided: `generate` swaps those products instead.
    debug_assert!(!g.bt && !g.ot);
    let bcol_at =
        |kk: &str| if g.bt { format!("bcol + {kk}") } else { format!("bcol + ({kk}) * {n}u") };
    let batches = g.batches();
    // Eight consecutive columns still use whole 32-byte sectors of B; fewer columns per
    // workgroup (more lanes splitting k) when the columns alone would leave the GPU idle.
    let mut cols = width;
    while cols > 8
        && ((n.div_ceil(cols) * batches) as u64) < FILL
        && width / cols < pow2_at_least(k)
    {
        cols /= 2;
    }
    let lanes = width / cols;
    let per_batch = n.div_ceil(cols);
    let groups = per_batch * batches;
    let mut body = String::new();
    body.push_str(&format!("let batch = g / {per_batch}u;\n    let col = (g % {per_batch}u) * {cols}u + t % {cols}u;\n    let lane = t / {cols}u;\n    "));
    body.push_str(&g.bases());
    body.push('\n');
    for i in 0..m {
        body.push_str(&format!("    var acc{i} = 0.0;\n"));
    }
    let step = |kk: &str, v: &str| {
        let mut s = format!("            let {v} = {};\n", load(&g.b, &bcol_at(kk)));
        for i in 0..m {
            s.push_str(&format!(
                "            acc{i} = acc{i} + {} * {v};\n",
                load(&g.a, &format!("abase + {}u + {kk}", i * k))
            ));
        }
        s
    };
    body.push_str(&format!(
        "    if (col < {n}u) {{\n        let bcol = bbase + col{};\n",
        if g.bt { format!(" * {k}u") } else { String::new() }
    ));
    body.push_str(&k_loop(k, lanes, step));
    body.push_str("    }\n");
    let mut shared = String::new();
    if lanes > 1 {
        shared = format!("var<workgroup> mm_red: array<f32, {}>;\n", m * width);
        for i in 0..m {
            body.push_str(&format!("    mm_red[{}u + t] = acc{i};\n", i * width));
        }
        reduce_lanes(&mut body, lanes, cols, m, width);
        for i in 0..m {
            body.push_str(&format!("    acc{i} = mm_red[{}u + t];\n", i * width));
        }
    }
    body.push_str(&format!("    if (lane == 0u && col < {n}u) {{\n"));
    for i in 0..m {
        body.push_str(&format!(
            "        {}\n",
            g.store(&format!("obase + {}u + col", i * n), &format!("acc{i}"))
        ));
    }
    body.push_str("    }");
    entry(&shared, width, groups, &body)
}

/// The tiled kernel. Invocations form a `tx_n × ty_n` grid; invocation (tx, ty) owns the
/// output rows `i4 * ty_n * 4 + ty * 4 + 0..4` and columns `j4 * tx_n * 4 + tx * 4 + 0..4` of the
/// tile, so that its reads from shared memory are whole vec4s and neighbouring invocations
/// read neighbouring vec4s (no bank conflicts).
fn tiled(g: &Geometry, width: usize) -> KernelSource {
    let (m, k, n) = (g.m, g.k, g.n);
    let batches = g.batches();
    let tx_n = 1usize << (width.trailing_zeros().div_ceil(2));
    let ty_n = width / tx_n;
    // 8×8 outputs per invocation when that still gives enough tiles, else 4×4.
    let big = (m.div_ceil(ty_n * 8) * n.div_ceil(tx_n * 8) * batches) as u64 >= FILL;
    let (tm, tn) = if big { (8, 8) } else { (4, 4) };
    let (bm, bn) = (ty_n * tm, tx_n * tn);
    let (tiles_m, tiles_n) = (m.div_ceil(bm), n.div_ceil(bn));
    let per_batch = tiles_m * tiles_n;
    let groups = per_batch * batches;
    let kt = k.div_ceil(BK);
    // A's panel is stored transposed (k-major) so invocations read their rows as vec4s; 4
    // padding floats per k row spread the transposing stores over every bank.
    let sa = (bm + 4) / 4;
    let sb = bn / 4;
    let shared = format!(
        "var<workgroup> mm_a: array<vec4<f32>, {}>;\nvar<workgroup> mm_b: array<vec4<f32>, {}>;\n",
        BK * sa,
        BK * sb
    );
    let (edge_m, edge_n, edge_k) = (m % bm != 0, n % bn != 0, k % BK != 0);
    let mut s = String::new();
    let mut line = |x: String| {
        s.push_str("    ");
        s.push_str(&x);
        s.push('\n');
    };
    line(format!("let batch = g / {per_batch}u;"));
    line(format!("let tile = g % {per_batch}u;"));
    line(format!("let m0 = (tile / {tiles_n}u) * {bm}u;"));
    line(format!("let n0 = (tile % {tiles_n}u) * {bn}u;"));
    for l in g.bases().lines() {
        line(l.trim().to_string());
    }
    line(format!("let tx = t % {tx_n}u;"));
    line(format!("let ty = t / {tx_n}u;"));
    // Which panel elements this invocation moves: element e of A's bm×BK panel is (e / BK,
    // e % BK) and of B's BK×bn panel (e / bn, e % bn), so consecutive invocations read
    // consecutive words of a row of A or of B.
    let slots = |size: usize| (size.div_ceil(width), size % width != 0);
    let (pa, partial_a) = slots(bm * BK);
    let (pb, partial_b) = slots(BK * bn);
    for p in 0..pa {
        line(format!("let ae{p} = t + {}u;", p * width));
        line(format!("let ar{p} = ae{p} / {BK}u;"));
        line(format!("let ak{p} = ae{p} % {BK}u;"));
        line(format!("let ag{p} = abase + (m0 + ar{p}) * {k}u + ak{p};"));
        line(format!("let as{p} = ak{p} * {sa}u + ar{p} / 4u;"));
        line(format!("let ac{p} = ar{p} % 4u;"));
        line(format!("var ra{p} = 0.0;"));
    }
    for p in 0..pb {
        line(format!("let be{p} = t + {}u;", p * width));
        if g.bt {
            // B is stored [n, k]: consecutive invocations walk k within a column, which is
            // contiguous there, as A's panel walks k within a row.
            line(format!("let bk{p} = be{p} % {BK}u;"));
            line(format!("let bc{p} = be{p} / {BK}u;"));
            line(format!("let bg{p} = bbase + (n0 + bc{p}) * {k}u + bk{p};"));
        } else {
            line(format!("let bk{p} = be{p} / {bn}u;"));
            line(format!("let bc{p} = be{p} % {bn}u;"));
            line(format!("let bg{p} = bbase + bk{p} * {n}u + n0 + bc{p};"));
        }
        line(format!("let bs{p} = bk{p} * {sb}u + bc{p} / 4u;"));
        line(format!("let bq{p} = bc{p} % 4u;"));
        line(format!("var rb{p} = 0.0;"));
    }
    // Loads of the panels at depth k0 into registers, zero past the matrices' edges.
    let fetch = |k0: &str| {
        let mut f = String::new();
        let guarded = |conds: Vec<String>, target: String, value: String| {
            if conds.is_empty() {
                format!("        {target} = {value};\n")
            } else {
                format!(
                    "        {target} = 0.0;\n        if ({}) {{ {target} = {value}; }}\n",
                    conds.join(" && ")
                )
            }
        };
        for p in 0..pa {
            let mut c = Vec::new();
            if partial_a {
                c.push(format!("ae{p} < {}u", bm * BK));
            }
            if edge_m {
                c.push(format!("m0 + ar{p} < {m}u"));
            }
            if edge_k {
                c.push(format!("{k0} + ak{p} < {k}u"));
            }
            f.push_str(&guarded(c, format!("ra{p}"), load(&g.a, &format!("ag{p} + {k0}"))));
        }
        for p in 0..pb {
            let mut c = Vec::new();
            if partial_b {
                c.push(format!("be{p} < {}u", BK * bn));
            }
            if edge_n {
                c.push(format!("n0 + bc{p} < {n}u"));
            }
            if edge_k {
                c.push(format!("{k0} + bk{p} < {k}u"));
            }
            let at = if g.bt { format!("bg{p} + {k0}") } else { format!("bg{p} + ({k0}) * {n}u") };
            f.push_str(&guarded(c, format!("rb{p}"), load(&g.b, &at)));
        }
        f
    };
    for i in 0..tm {
        for j4 in 0..tn / 4 {
            line(format!("var c{i}_{j4} = vec4<f32>(0.0);"));
        }
    }
    let mut s = s;
    if kt > 0 {
        s.push_str("    {\n");
        s.push_str(&fetch("0u"));
        s.push_str("    }\n");
    }
    s.push_str(&format!("    for (var kt = 0u; kt < {kt}u; kt = kt + 1u) {{\n"));
    // Everyone has finished reading the previous panels before they are overwritten.
    s.push_str("        workgroupBarrier();\n");
    for p in 0..pa {
        let st = format!("mm_a[as{p}][ac{p}] = ra{p};");
        s.push_str(&if partial_a {
            format!("        if (ae{p} < {}u) {{ {st} }}\n", bm * BK)
        } else {
            format!("        {st}\n")
        });
    }
    for p in 0..pb {
        let st = format!("mm_b[bs{p}][bq{p}] = rb{p};");
        s.push_str(&if partial_b {
            format!("        if (be{p} < {}u) {{ {st} }}\n", BK * bn)
        } else {
            format!("        {st}\n")
        });
    }
    s.push_str("        workgroupBarrier();\n");
    // The next panels' loads are in flight while this one is multiplied.
    s.push_str(&format!("        if (kt + 1u < {kt}u) {{\n        let k1 = (kt + 1u) * {BK}u;\n"));
    s.push_str(&fetch("k1"));
    s.push_str("        }\n");
    for kk in 0..BK {
        for i4 in 0..tm / 4 {
            s.push_str(&format!("        let a{kk}_{i4} = mm_a[{}u + ty];\n", kk * sa + i4 * ty_n));
        }
        for j4 in 0..tn / 4 {
            s.push_str(&format!("        let b{kk}_{j4} = mm_b[{}u + tx];\n", kk * sb + j4 * tx_n));
        }
        for i in 0..tm {
            let comp = ["x", "y", "z", "w"][i % 4];
            for j4 in 0..tn / 4 {
                s.push_str(&format!(
                    "        c{i}_{j4} = c{i}_{j4} + a{kk}_{}.{comp} * b{kk}_{j4};\n",
                    i / 4
                ));
            }
        }
    }
    s.push_str("    }\n");
    // Row i of the register block is tile row (i / 4) * ty_n * 4 + ty * 4 + i % 4.
    s.push_str("    let r0 = m0 + ty * 4u;\n    let q0 = n0 + tx * 4u;\n");
    for i in 0..tm {
        let dr = (i / 4) * ty_n * 4 + i % 4;
        let mut row = String::new();
        for j4 in 0..tn / 4 {
            for (jj, comp) in ["x", "y", "z", "w"].iter().enumerate() {
                let dc = j4 * tx_n * 4 + jj;
                let st = g.store(&format!("orow + {dc}u"), &format!("c{i}_{j4}.{comp}"));
                if edge_n {
                    row.push_str(&format!("        if (q0 + {dc}u < {n}u) {{ {st} }}\n"));
                } else {
                    row.push_str(&format!("        {st}\n"));
                }
            }
        }
        let cond = if edge_m { format!("r0 + {dr}u < {m}u") } else { "true".into() };
        s.push_str(&format!("    if ({cond}) {{\n        let orow = obase + (r0 + {dr}u) * {n}u + q0;\n{row}    }}\n"));
    }
    entry(&shared, width, groups, s.trim_start())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mgn_ir::DType;

    fn operand(offset: usize, shape: &[usize]) -> Operand {
        Operand::at(offset, shape, DType::F32)
    }

    /// naga's verdict on a kernel, as `kernels::check_plan` gives it (bindings assigned).
    fn validate(body: &str) -> Result<(), String> {
        let full = format!("{}{body}", crate::device::PRELUDE);
        let mut m = naga::front::wgsl::parse_str(&full).map_err(|e| e.emit_to_string(&full))?;
        for (k, (_, g)) in m.global_variables.iter_mut().enumerate() {
            if g.binding.is_none()
                && matches!(
                    g.space,
                    naga::AddressSpace::Storage { .. } | naga::AddressSpace::Uniform
                )
            {
                g.binding = Some(naga::ResourceBinding { group: 0, binding: k as u32 });
            }
        }
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::default(),
        )
        .validate(&m)
        .map(|_| ())
        .map_err(|e| format!("{e:?}"))
    }

    /// Bytes of workgroup memory the kernel declares.
    fn shared_bytes(body: &str) -> usize {
        body.lines()
            .filter(|l| l.starts_with("var<workgroup>"))
            .map(|l| {
                let count: usize =
                    l.rsplit(", ").next().unwrap().trim_end_matches(">;").parse().unwrap();
                count * if l.contains("vec4<f32>") { 16 } else { 4 }
            })
            .sum()
    }

    #[test]
    fn each_shape_takes_its_kernel_and_every_kernel_validates_within_the_floor() {
        let cases: [(&[usize], &[usize], &[usize], &str); 9] = [
            (&[130, 70], &[70, 129], &[130, 129], "mm_a"),
            (&[4, 256, 512], &[512, 1024], &[4, 256, 1024], "mm_a"),
            (&[2, 132, 9, 10], &[132, 10, 9], &[2, 132, 9, 9], "mm_a"),
            (&[1, 576], &[576, 1536], &[1, 1536], "let col"),
            (&[576], &[576, 49152], &[49152], "let col"),
            (&[3, 1, 7], &[7, 20], &[3, 1, 20], "let col"),
            (&[50, 300], &[300], &[50], "let row"),
            (&[300], &[300], &[], "let row"),
            (&[2, 3, 5, 7], &[2, 1, 7, 2], &[2, 3, 5, 2], "let row"),
        ];
        for width in [64, 128, 256] {
            for (a, b, out, marker) in cases {
                let what = format!("{a:?} × {b:?} at width {width}");
                let src = generate(
                    &[operand(3, a), operand(100_000, b)],
                    &operand(7_000_000, out),
                    width,
                )
                .unwrap();
                assert!(src.body.contains(marker), "{what}: expected the kernel with `{marker}`");
                assert!(src.body.contains(&format!("@workgroup_size({width})")), "{what}");
                assert_eq!(src.invocations % width as u64, 0, "{what}");
                assert!(
                    src.body.contains(&format!(
                        "if (g >= {}u) {{ return; }}",
                        src.invocations / width as u64
                    )),
                    "{what}"
                );
                assert!(
                    shared_bytes(&src.body) <= 16 * 1024,
                    "{what}: {} bytes of shared memory",
                    shared_bytes(&src.body)
                );
                validate(&src.body).unwrap_or_else(|e| panic!("{what}: {e}\n{}", src.body));
            }
        }
    }

    #[test]
    fn integer_and_scalar_operands_are_refused() {
        let ints = Operand { dtype: DType::I32, ..operand(0, &[2, 2]) };
        assert!(generate(&[ints.clone(), ints.clone()], &ints, 256).is_err());
        assert!(generate(&[operand(0, &[]), operand(1, &[3])], &operand(4, &[3]), 256).is_err());
    }
}
