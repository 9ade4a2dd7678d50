//! The implicit GEMM on cooperative matrices, for convolutions of f16 operands (the mixed
//! policies' convolutions and both their derivatives): the same loaders stage the same slices
//! as the tiled kernel, as f16 into shared panels, and each subgroup of a grid multiplies a
//! block of the device's `T × T` tiles (`CoopGrid`: by default 2×2 subgroups of 2×2 tiles; see
//! `kernels/matmul/coop.rs`, whose layout this follows). A's slice is staged k-major
//! (`[kk][r]`, read as column-major tiles), B's `[kk][c]` (row-major), so the loaders' fast
//! axes are the tiled kernel's.

use super::{origin, slices, staging, Gemm, Loader};
use crate::kernels::matmul::{subgroup_guard, CoopGrid, NAN};
use crate::kernels::{f16_view_decl, word_half, Coop, KernelSource, Operand, Target};
use mgn_ir::DType;

/// Row strides of the staged panels, in halves: 16-byte aligned rows (the tile loads need it)
/// that start in different banks.
fn strides(bm: usize, bn: usize) -> (usize, usize) {
    (bm + 8, bn + 8)
}

/// Whether the convolution runs on cooperative matrices: asked for everywhere (`MGN_COOP=1`;
/// by shape, convolutions keep the tiled kernels, which were faster on ResNet-50 on an H100:
/// its mixed forward 3.87 ms against 3.37, docs/benchmarks/), both operands f16, a workgroup
/// of the subgroup grid within the target's width that can stage each slice (every fast axis
/// at most a workgroup wide), a K split in whole slices, and the panels within shared memory.
pub(super) fn fits(gm: &Gemm, a: &Loader, b: &Loader, coop: Coop, target: Target) -> bool {
    let grid = CoopGrid::current();
    let (t, w) = (coop.tile as usize, grid.subgroups() * coop.subgroup as usize);
    let (bm, bn, bk) = grid.extents(t);
    let (lda, ldb) = strides(bm, bn);
    let fast = |l: &Loader, rows: usize| if l.k_fast { bk } else { rows };
    let shared = 2 * bk * (lda + ldb) + 4 * grid.subgroups() * t * t;
    coop.everywhere
        && a.operand.dtype == DType::F16
        && b.operand.dtype == DType::F16
        && w <= target.width as usize
        && fast(a, bm) <= w
        && fast(b, bn) <= w
        && gm.split_depth.is_none_or(|d| d.is_multiple_of(bk))
        && shared <= target.shared_bytes as usize
}

/// The kernel of `gm` (which `fits`): `epilogue` stores `acc` for in-group row `m` and column
/// `n` of group `g`, as the tiled kernel's.
pub(super) fn kernel(
    gm: &Gemm,
    a: &Loader,
    b: &Loader,
    epilogue: &str,
    coop: Coop,
) -> KernelSource {
    let (t, sg) = (coop.tile as usize, coop.subgroup as usize);
    let grid = CoopGrid::current();
    let w = grid.subgroups() * sg;
    let (bm, bn, bk) = grid.extents(t);
    let (lda, ldb) = strides(bm, bn);
    let (mtiles, ntiles) = (gm.m.div_ceil(bm), gm.n.div_ceil(bn));
    let nwg = gm.groups * gm.splits() * mtiles * ntiles;
    let ranges = gm.ranges(mtiles * ntiles);
    let sink = |panel: &'static str| {
        move |at: &str, o: &Operand, reg: &str| {
            format!("{panel}[{at}] = {};", word_half(o, reg, &format!("{reg}s")))
        }
    };
    let sa = staging(a, bk, "pa", gm.k, bm, gm.m, "m0", "fa", 0, lda, w, &sink("cm_a"));
    let sb = staging(b, bk, "pb", gm.k, bn, gm.n, "n0", "fb", 0, ldb, w, &sink("cm_b"));
    let (acc, multiply) = multiply(&grid, t, lda, ldb);
    let origin = origin(gm, (bm, bn, bk), a, b);
    let slices = slices(&(ranges.1, ranges.2), bk, &sa, &sb, &multiply);
    let stores = stores(gm, &grid, t, sg, epilogue);
    let tt = t * t;
    let view = f16_view_decl(&[&a.operand, &b.operand]);
    let body = format!(
        "enable f16;
enable wgpu_cooperative_matrix;
{view}var<workgroup> cm_a: array<f16, {a_halves}>;
var<workgroup> cm_b: array<f16, {b_halves}>;
var<workgroup> cm_c: array<f32, {c_words}>;

@compute @workgroup_size({w})
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>, \
         @builtin(local_invocation_index) tid: u32, @builtin(subgroup_id) cm_subgroup: u32, \
         @builtin(subgroup_invocation_id) cm_lane: u32, \
         @builtin(num_subgroups) cm_subgroups: u32) {{
    {origin}
    {guard}
    let cm_wm = cm_sid / {sn}u;
    let cm_wn = cm_sid % {sn}u;
    let cm_scratch = cm_sid * {tt}u;
    {acc}
    {slices}
    {stores}
}}
",
        guard =
            subgroup_guard("cm_subgroup", "cm_subgroups", "cm_sid", "cm_whole", grid.subgroups()),
        sn = grid.sn,
        a_halves = bk * lda,
        b_halves = bk * ldb,
        c_words = grid.subgroups() * tt,
    );
    KernelSource {
        body,
        invocations: nwg as u64 * w as u64,
        dropout_node: None,
        width: Some(w as u32),
    }
}

/// The accumulators' declarations, and one slice's tile loads and multiply-adds.
fn multiply(grid: &CoopGrid, t: usize, lda: usize, ldb: usize) -> (String, String) {
    let (ma, mb, mc) = (
        format!("coop_mat{t}x{t}<f16,A>"),
        format!("coop_mat{t}x{t}<f16,B>"),
        format!("coop_mat{t}x{t}<f32,C>"),
    );
    let mut acc = String::new();
    let mut multiply = String::new();
    let CoopGrid { rm, rn, depth, .. } = *grid;
    for i in 0..rm {
        for j in 0..rn {
            acc += &format!("var c{i}_{j} = {mc}();\n    ");
        }
    }
    // The slice is `depth` tiles deep.
    for ks in 0..depth {
        for i in 0..rm {
            let at = format!("{}u + cm_wm * {}u + {}u", ks * t * lda, rm * t, i * t);
            multiply += &format!("let a{ks}_{i} = coopLoad<{ma}>(&cm_a[{at}], {lda}u);\n        ");
        }
        for j in 0..rn {
            let at = format!("{}u + cm_wn * {}u + {}u", ks * t * ldb, rn * t, j * t);
            multiply += &format!("let b{ks}_{j} = coopLoadT<{mb}>(&cm_b[{at}], {ldb}u);\n        ");
        }
        for i in 0..rm {
            for j in 0..rn {
                multiply += &format!(
                    "c{i}_{j} = coopMultiplyAdd(a{ks}_{i}, b{ks}_{j}, c{i}_{j});\n        "
                );
            }
        }
    }
    (acc, multiply)
}

/// Each accumulator through the subgroup's scratch, then out element by element through
/// `epilogue`; every subgroup stores its tile (i, j) together, so the whole workgroup reaches
/// the barriers.
fn stores(gm: &Gemm, grid: &CoopGrid, t: usize, sg: usize, epilogue: &str) -> String {
    let tt = t * t;
    let mut stores = String::new();
    for i in 0..grid.rm {
        for j in 0..grid.rn {
            stores += &format!(
                "coopStoreT(c{i}_{j}, &cm_c[cm_scratch], {t}u);
    workgroupBarrier();
    for (var cm_e = cm_lane; cm_e < {tt}u; cm_e = cm_e + {sg}u) {{
        let m = m0 + cm_wm * {rm}u + {i0}u + cm_e / {t}u;
        let n = n0 + cm_wn * {rn}u + {j0}u + cm_e % {t}u;
        if (m < {mm}u && n < {nn}u) {{
            let acc = select({nan}, cm_c[cm_scratch + cm_e], cm_whole);
            {epilogue}
        }}
    }}
    workgroupBarrier();
    ",
                rm = grid.rm * t,
                rn = grid.rn * t,
                i0 = i * t,
                j0 = j * t,
                mm = gm.m,
                nn = gm.n,
                nan = NAN,
            );
        }
    }
    stores
}
