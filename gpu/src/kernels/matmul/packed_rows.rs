//! The matrix-vector product of a packed weight (`few_cols`' shape: at most `SKINNY` columns,
//! A's rows a dequantized packed parameter read in place): one-token decoding through a
//! quantized linear layer, `x[1…8, k] @ dequantize(W[n, k])ᵀ` computed as its transpose.
//!
//! The element loads of the dequantized view would read a block's scale again for each of its
//! 32 or 256 values, and a word of quant bits for each value it holds. Here each invocation
//! takes whole blocks of a row instead: it reads the block's bytes once, as whole words
//! (shifted into alignment where a block of 18, 34 or 210 bytes starts mid-word), its f16
//! scales once, and decodes every value from registers with the type's description
//! (`crate::packed::value`, with each value's index a number, so every shift and mask is a
//! constant), each value times the few columns of B. A q4_0 `[576, 576]` weight is read as its
//! 186,624 bytes, against 663,552 for f16 and 1,327,104 for f32. Lanes split a row's blocks and
//! reduce in shared memory, as `few_cols` does.

use super::{pow2_at_least, reduce_lanes, staged_half, Geometry, FILL};
use crate::kernels::{load, KernelSource};
use crate::packed::{scales, value, Bytes, InWords, Ix};

/// `few_cols` for A of packed rows; None where A is not packed (or not whole rows of blocks
/// at fixed sizes).
pub(super) fn packed_rows(g: &Geometry, width: usize) -> Option<KernelSource> {
    let a = &g.a;
    let dtype = a.packed?;
    let (len, bytes) = dtype.block()?;
    let (m, k, n) = (&g.m, &g.k, g.n.n);
    let whole = k.is_fixed() && k.n % len == 0 && a.sliced.is_none() && a.summed <= 1;
    if !whole || a.f16_view {
        return None;
    }
    let blocks = k.n / len;
    let batches = g.batches();
    let mut lanes = width.min(32).min(pow2_at_least(blocks));
    while lanes < width && lanes < blocks && m.n.div_ceil(width / lanes) * batches.n < FILL {
        lanes *= 2;
    }
    let rows = width / lanes;
    let per_batch = m.div_ceil(rows);
    let mut body = format!(
        "let batch = g / {per_batch};\n    \
        let row = (g % {per_batch}) * {rows}u + t / {lanes}u;\n    \
        let lane = t % {lanes}u;\n    {}\n",
        g.bases()
    );
    for j in 0..n {
        body += &format!("    var acc{j} = 0.0;\n");
    }
    // B's few columns (the activations), converted once a workgroup when they are halves.
    let staged = staged_half(&g.b, "mm_b", (k, n), width, |e| {
        g.b_at(&format!("{e} / {n}u"), &format!("{e} % {n}u"))
    });
    if let Some((_, stage)) = &staged {
        body += stage;
    }
    let b_at = |kk: &str, j: usize| match staged {
        Some(_) => format!("mm_b[({kk}) * {n}u + {j}u]"),
        None => load(&g.b, &g.b_at(kk, &format!("{j}u"))),
    };
    body += &format!(
        "    if (row < {m}) {{
        let first = (abase + row * {k}) / {len}u;
        for (var blk = lane; blk < {blocks}u; blk = blk + {lanes}u) {{
            let at = {base} * 4u + (first + blk) * {bytes}u;
{words}",
        base = crate::kernels::base(a),
        words = block_words(bytes),
    );
    for &h in scales(dtype) {
        let bits = InWords.byte(&Ix::Lit(h)).replace("255u", "0xffffu");
        body += &format!("            let h{h} = mgn_f16_value({bits});\n");
    }
    // Values a group of 32 at a time, each group's in a scope of its own.
    for group in 0..len / 32 {
        body += "            {\n";
        for j in 32 * group..32 * group + 32 {
            let v = value(dtype, &Ix::Lit(j), &InWords);
            let v = if a.rounded { crate::halves::round(a.dtype, &v) } else { v };
            body += &format!("                let v{j} = {v};\n");
            for c in 0..n {
                let x = b_at(&format!("blk * {len}u + {j}u"), c);
                body += &format!("                acc{c} = acc{c} + v{j} * {x};\n");
            }
        }
        body += "            }\n";
    }
    body += "        }\n    }\n";
    let mut shared = staged.map(|(decl, _)| decl).unwrap_or_default();
    if lanes > 1 {
        shared += &format!("var<workgroup> mm_red: array<f32, {}>;\n", n * width);
        for j in 0..n {
            body += &format!("    mm_red[{}u + t] = acc{j};\n", j * width);
        }
        reduce_lanes(&mut body, lanes, 1, n, width);
        for j in 0..n {
            body += &format!("    acc{j} = mm_red[{}u + t];\n", j * width);
        }
    }
    body += &format!("    if (lane == 0u && row < {m}) {{\n");
    for j in 0..n {
        let store = g.store(&g.o_at("row", &format!("{j}u")), &format!("acc{j}"));
        body += &format!("        {store}\n");
    }
    body += "    }";
    Some(super::entry(&shared, width, &per_batch.mul(&batches), &body))
}

/// The statements reading the block of `bytes` bytes at byte address `at` into the words
/// `w0`, `w1`, … from its first byte on: read as they lie where blocks are whole words, else
/// one word more, each word shifted down by the block's byte offset and filled from the next.
fn block_words(bytes: usize) -> String {
    let count = bytes.div_ceil(4);
    let mut s = String::from("            let wq = at >> 2u;\n");
    if bytes % 4 == 0 {
        for i in 0..count {
            s += &format!("            let w{i} = arena[wq + {i}u];\n");
        }
        return s;
    }
    s += "            let shift = (at & 3u) * 8u;\n";
    for i in 0..count {
        s += &format!("            let r{i} = arena[wq + {i}u];\n");
    }
    // The word past the block only where the block does not start on a word, so the last
    // block of the arena reads nothing past it.
    s += &format!(
        "            var r{count} = 0u;\n            if (shift != 0u) {{ r{count} = arena[wq + \
         {count}u]; }}\n"
    );
    for i in 0..count {
        // Two shifts, so a shift of 0 moves the next word out altogether.
        s += &format!(
            "            let w{i} = (r{i} >> shift) | ((r{} << (31u - shift)) << 1u);\n",
            i + 1
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::super::{generate_layout, Layout};
    use crate::kernels::{validate, Operand, Target};
    use mgn_ir::DType;

    /// One-token decoding through a packed `[576, 576]` weight read in place takes this kernel
    /// for every type: whole blocks in words (one word past it where blocks are not whole
    /// words), no element loads, and naga accepts it.
    #[test]
    fn a_packed_weight_times_a_vector_reads_whole_blocks() {
        for dtype in mgn_ir::dtype::PACKED {
            let k = if dtype.block().unwrap().0 == 256 { 512 } else { 576 };
            let w = Operand { packed: Some(dtype), ..Operand::at(0, &[576, k], DType::F32) };
            let x = Operand::at(1 << 20, &[1, k], DType::F32);
            let out = Operand::at(2 << 20, &[1, 576], DType::F32);
            let layout = Layout { tb: true, ..Layout::PLAIN };
            let kernel = generate_layout(&[x, w], &out, Target::floor(256), layout).unwrap();
            let body = &kernel.body;
            let bytes = dtype.block().unwrap().1;
            let reads = bytes.div_ceil(4) + usize::from(bytes % 4 != 0);
            assert_eq!(body.matches("arena[wq + ").count(), reads, "{dtype}");
            assert!(!body.contains(&format!("mgn_{}(", dtype.name())), "{dtype}");
            validate(body).unwrap_or_else(|e| panic!("{dtype}: {e}"));
        }
    }
}
