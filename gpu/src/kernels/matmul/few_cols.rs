//! The few-columns kernel: at most `SKINNY` columns of B (a matrix times a few vectors, and
//! one-token decoding's products swapped, `Geometry::swapped`). Each row of A is split over
//! `lanes` consecutive invocations that read consecutive k (coalesced along A's rows), summed
//! in shared memory. B's columns may be normed as they are read (`normed_vector`), and a
//! `GpuOp::ProductPair` walks a second weight's rows beside A's against the same B.

use super::{
    entry, fetch_word, k_loop, load, normed_vector, packed_rows, pow2_at_least, reduce_lanes,
    staged_half, store, word_value, Ext, Geometry, KernelSource, FILL,
};

/// The weights whose rows the kernel walks, each with its accumulators' suffix: A, and a
/// `ProductPair`'s second weight.
type Weights<'a> = Vec<(&'a super::Operand, &'static str)>;

/// At most `SKINNY` columns: `rows` rows per workgroup, each split over `lanes` consecutive
/// invocations that read consecutive k (coalesced along A's rows), summed in shared memory.
pub(super) fn few_cols(g: &Geometry, width: usize) -> KernelSource {
    // A packed weight's rows decode whole blocks; a normed product's or a pair's weights are
    // never packed (`normed_vector::takes`, `generate_pair`).
    if g.norm.is_none() && g.pair.is_none() {
        if let Some(k) = packed_rows::packed_rows(g, width) {
            return k;
        }
    }
    let (m, k, n) = (&g.m, &g.k, g.n.n);
    let batches = g.batches();
    // One warp per row reads 128 contiguous bytes per load; more lanes per row (and fewer rows)
    // when the rows alone would leave the GPU idle, but no more lanes than k has elements.
    let kp = pow2_at_least(k.n);
    let mut lanes = width.min(32).min(kp);
    while lanes < width && lanes < kp && m.n.div_ceil(width / lanes) * batches.n < FILL {
        lanes *= 2;
    }
    let rows = width / lanes;
    let per_batch = m.div_ceil(rows);
    let groups = per_batch.mul(&batches);
    let mut body = String::new();
    body.push_str(&format!(
        "let batch = g / {per_batch};\n    \
        let row = (g % {per_batch}) * {rows}u + t / {lanes}u;\n    \
        let lane = t % {lanes}u;\n    "
    ));
    body.push_str(&g.bases());
    body.push('\n');
    let mut weights: Weights = vec![(&g.a, "")];
    if let Some(second) = &g.pair {
        weights.push((second, "b"));
    }
    for (_, w) in &weights {
        for j in 0..n {
            body.push_str(&format!("    var acc{j}{w} = 0.0;\n"));
        }
    }
    // The few columns of B, read by every row: one-token decoding's activation vector by
    // every row of the weight (49,152 for SmolLM2's head).
    let staged = staged_half(&g.b, "mm_b", (k, n), width, |e| {
        g.b_at(&format!("{e} / {n}u"), &format!("{e} % {n}u"))
    });
    let b_at = |kk: &str, j: usize| {
        let v = if staged.is_some() {
            format!("mm_b[({kk}) * {n}u + {j}u]")
        } else {
            load(&g.b, &g.b_at(kk, &format!("{j}u")))
        };
        match &g.norm {
            Some(norm) => normed_vector::normed(norm, &v, kk, j),
            None => v,
        }
    };
    if let Some(norm) = &g.norm {
        body.push_str(&normed_vector::statistics(g, norm, width));
    }
    if let Some((_, stage)) = &staged {
        body.push_str(stage);
    }
    // A of packed halves with rows of whole words (an f16 weight read by one-token decoding):
    // each lane takes a word, both its elements, so a load moves as many elements as an f32
    // kernel's two and the product is as bandwidth-bound as its bytes.
    let words = weights.iter().all(|(a, _)| a.packs_halves()) && k.is_fixed();
    body.push_str(&format!("    if (row < {m}) {{\n        let arow = abase + row * {k};\n"));
    if words && k.n.is_multiple_of(2) {
        let step = |kw: &str, v: &str| step_words(&weights, n, &b_at, kw, v);
        body.push_str(&k_loop(&Ext::lit(k.n / 2), lanes, step));
    } else {
        let step = |kk: &str, v: &str| step_elements(&weights, n, &b_at, kk, v);
        body.push_str(&k_loop(k, lanes, step));
    }
    body.push_str("    }\n");
    let mut shared = staged.map(|(decl, _)| decl).unwrap_or_default();
    shared += &reduce_and_store(&mut body, g, &weights, lanes, width);
    entry(&shared, width, &groups, &body)
}

/// One k of the loop: each weight's element of its row, times B's element of each column.
fn step_elements(
    weights: &Weights,
    n: usize,
    b_at: &dyn Fn(&str, usize) -> String,
    kk: &str,
    v: &str,
) -> String {
    let mut s = String::new();
    for (a, w) in weights {
        s.push_str(&format!("            let {v}{w} = {};\n", load(a, &format!("arow + {kk}"))));
    }
    for j in 0..n {
        s.push_str(&format!("            let {v}_b{j} = {};\n", b_at(kk, j)));
        for (_, w) in weights {
            s.push_str(&format!("            acc{j}{w} = acc{j}{w} + {v}{w} * {v}_b{j};\n"));
        }
    }
    s
}

/// One word of packed halves of each weight's row (two k), times B's two elements.
fn step_words(
    weights: &Weights,
    n: usize,
    b_at: &dyn Fn(&str, usize) -> String,
    kw: &str,
    v: &str,
) -> String {
    let mut s = String::new();
    for (a, w) in weights {
        let f = fetch_word(a, &format!("arow + 2u * {kw}"));
        let word = format!("{v}{w}w");
        s.push_str(&format!("            let {word} = {};\n", f.word));
        s.push_str(&format!("            let {v}{w}0 = {};\n", word_value(a, &word, "0u")));
        s.push_str(&format!("            let {v}{w}1 = {};\n", word_value(a, &word, "16u")));
    }
    for j in 0..n {
        let (b0, b1) = (b_at(&format!("2u * {kw}"), j), b_at(&format!("2u * {kw} + 1u"), j));
        s.push_str(&format!("            let {v}_b{j}0 = {b0};\n"));
        s.push_str(&format!("            let {v}_b{j}1 = {b1};\n"));
        for (_, w) in weights {
            s.push_str(&format!(
                "            acc{j}{w} = acc{j}{w} + {v}{w}0 * {v}_b{j}0 + {v}{w}1 * {v}_b{j}1;\n"
            ));
        }
    }
    s
}

/// The lanes' sums met in shared memory, then each row's results stored (a pair's through its
/// epilogue of both sums); the shared declaration it needs.
fn reduce_and_store(
    body: &mut String,
    g: &Geometry,
    weights: &Weights,
    lanes: usize,
    width: usize,
) -> String {
    let (m, n) = (&g.m, g.n.n);
    let mut shared = String::new();
    // The norm's statistics use them before the loop.
    if lanes > 1 || g.norm.is_some() {
        shared = format!("var<workgroup> mm_red: array<f32, {}>;\n", n * width);
    }
    if lanes > 1 {
        // One weight's sums at a time: a pair's second round reuses the first's shared memory
        // (8 columns of 256 invocations already take 8 KiB of the 16 every device has).
        for (round, (_, w)) in weights.iter().enumerate() {
            if round > 0 {
                // Every invocation has read the first round's sums before any overwrites them.
                body.push_str("    workgroupBarrier();\n");
            }
            for j in 0..n {
                body.push_str(&format!("    mm_red[{}u + t] = acc{j}{w};\n", j * width));
            }
            reduce_lanes(body, lanes, 1, n, width);
            for j in 0..n {
                body.push_str(&format!("    acc{j}{w} = mm_red[{}u + t];\n", j * width));
            }
        }
    }
    body.push_str(&format!("    if (lane == 0u && row < {m}) {{\n"));
    for j in 0..n {
        let at = g.o_at("row", &format!("{j}u"));
        let stored = if g.pair.is_some() {
            // The pair's epilogue takes both products (`fused::product_pair`).
            store(&g.out, &at, &format!("mgn_epilogue({at}, acc{j}, acc{j}b)"))
        } else {
            g.store(&at, &format!("acc{j}"))
        };
        body.push_str(&format!("        {stored}\n"));
    }
    body.push_str("    }");
    shared
}
