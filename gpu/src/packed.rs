//! Packed (quantized) parameters on the GPU: the WGSL that decodes an element of `q8_0` …
//! `q6_k` from the arena's words, bit for bit as `mgn_ir::packed`'s decoders.
//!
//! A packed parameter is uploaded as its bytes (`memory::value_words`), and a dequantize read
//! by kernels that load elements one at a time is a view of those words
//! (`memory::dequantized_views`): each load calls the type's element function (`load`), which
//! finds the element's block (blocks run along the last axis, so flat element `i` is value
//! `i % L` of block `i / L`) and decodes that one value. Blocks of 18, 34 or 210 bytes are not
//! word-aligned, so bytes are read by address, each from its word by a shift.
//!
//! Each type is described once (`value`): the expression of value `j` of a block, given how
//! to read the block's bytes (`Bytes`). The element functions read them from the arena by
//! address with `j` a WGSL variable; the matrix-vector kernel (`kernels::matmul`'s packed rows)
//! reads a whole block into registers as words and asks for each value with `j` a number, so
//! every index, shift and choice of sub-block folds to constants there.

use mgn_ir::DType;

/// An index into a block: a number known when the kernel is written, or a WGSL `u32`
/// expression. Arithmetic on numbers folds, so the matrix-vector kernel's decoding is
/// constant shifts and masks of registers.
#[derive(Clone, Debug)]
pub(crate) enum Ix {
    Lit(usize),
    Var(String),
}

impl Ix {
    fn op(&self, sym: &str, n: usize, f: fn(usize, usize) -> usize) -> Ix {
        match self {
            Ix::Lit(v) => Ix::Lit(f(*v, n)),
            Ix::Var(e) => Ix::Var(format!("({e} {sym} {n}u)")),
        }
    }
    fn div(&self, n: usize) -> Ix {
        self.op("/", n, |a, b| a / b)
    }
    fn rem(&self, n: usize) -> Ix {
        self.op("%", n, |a, b| a % b)
    }
    fn mul(&self, n: usize) -> Ix {
        self.op("*", n, |a, b| a * b)
    }
    fn add(&self, n: usize) -> Ix {
        self.op("+", n, |a, b| a + b)
    }
    fn plus(&self, other: &Ix) -> Ix {
        match (self, other) {
            (Ix::Lit(a), Ix::Lit(b)) => Ix::Lit(a + b),
            _ => Ix::Var(format!("({} + {})", self.wgsl(), other.wgsl())),
        }
    }
    pub(crate) fn wgsl(&self) -> String {
        match self {
            Ix::Lit(v) => format!("{v}u"),
            Ix::Var(e) => e.clone(),
        }
    }
    /// `lo` where this index is below `n`, else `hi`: chosen now for a number.
    fn below(&self, n: usize, lo: String, hi: String) -> String {
        match self {
            Ix::Lit(v) if *v < n => lo,
            Ix::Lit(_) => hi,
            Ix::Var(e) => format!("select({hi}, {lo}, {e} < {n}u)"),
        }
    }
}

/// How a decoder reads its block: byte `k` as a `u32` of 0–255, and the f16 at byte `k` (even:
/// every scale is) as an f32.
pub(crate) trait Bytes {
    fn byte(&self, k: &Ix) -> String;
    fn half(&self, k: usize) -> String;
}

/// Bits `4 · high` on of a byte: its low (0) or high (1) nibble.
fn nibble(byte: String, high: &Ix) -> String {
    match high {
        Ix::Lit(0) => format!("({byte} & 15u)"),
        Ix::Lit(h) => format!("(({byte} >> {}u) & 15u)", 4 * h),
        Ix::Var(e) => format!("(({byte} >> ({e} * 4u)) & 15u)"),
    }
}

/// A byte as the signed 8-bit integer it stores, in f32.
fn signed(byte: String) -> String {
    format!("f32(bitcast<i32>({byte} << 24u) >> 24u)")
}

/// The WGSL f32 of value `j` of a block of the packed `dtype`, reading its bytes through `b`:
/// `mgn_ir::packed`'s decoders, with their products in their order.
pub(crate) fn value(dtype: DType, j: &Ix, b: &dyn Bytes) -> String {
    match dtype {
        // d · q, q a signed byte.
        DType::Q8_0 => format!("{} * {}", b.half(0), signed(b.byte(&j.add(2)))),
        // d · (q − 8): values 0–15 in the low nibbles of bytes 2–17, 16–31 in the high ones.
        DType::Q4_0 => {
            let q = nibble(b.byte(&j.rem(16).add(2)), &j.div(16));
            format!("{} * f32(i32({q}) - 8)", b.half(0))
        }
        // d · q + m, the nibbles laid out as q4_0's from byte 4.
        DType::Q4_1 => {
            let q = nibble(b.byte(&j.rem(16).add(4)), &j.div(16));
            format!("{} * f32({q}) + {}", b.half(0), b.half(2))
        }
        DType::Q4_K => q4_k(j, b),
        DType::Q6_K => q6_k(j, b),
        other => unreachable!("`{other}` is not a packed type"),
    }
}

/// q4_k: (d · sc) · q − dmin · m, sub-block `j / 32`'s 6-bit scale sc and minimum m from bytes
/// 4–15 (`mgn_ir::packed::q4_k_scale_min`), q the low (even sub-block) or high nibble of byte
/// `16 + 32 · (j / 64) + j % 32`.
fn q4_k(j: &Ix, b: &dyn Bytes) -> String {
    let sub = j.div(32);
    let q = nibble(b.byte(&j.div(64).mul(32).add(16).plus(&j.rem(32))), &sub.rem(2));
    // Sub-blocks 0–3 keep 6 bits in bytes 4 + sub (scale) and 8 + sub (minimum); 4–7 take 4
    // bits of byte 8 + sub and their top two from the spare bits of bytes sub and 4 + sub.
    let (s0, s4, s8) = (b.byte(&sub), b.byte(&sub.add(4)), b.byte(&sub.add(8)));
    let sc =
        sub.below(4, format!("({s4} & 63u)"), format!("(({s8} & 15u) | (({s0} >> 6u) << 4u))"));
    let m = sub.below(4, format!("({s8} & 63u)"), format!("(({s8} >> 4u) | (({s4} >> 6u) << 4u))"));
    format!("({} * f32({sc})) * f32({q}) - {} * f32({m})", b.half(0), b.half(2))
}

/// q6_k: (d · scale) · (q − 32). In half `h = j / 128`, value `l + 32 · k` (l < 32) takes a
/// nibble of ql byte `64h + l + 32 · (k % 2)` (low for k < 2), bits 2k… of qh byte
/// `128 + 32h + l` as its top two bits, and the signed scale byte `192 + 8h + l / 16 + 2k`.
fn q6_k(j: &Ix, b: &dyn Bytes) -> String {
    let (h, k, l) = (j.div(128), j.rem(128).div(32), j.rem(32));
    let low = nibble(b.byte(&h.mul(64).plus(&l).plus(&k.rem(2).mul(32))), &k.div(2));
    let qh = b.byte(&h.mul(32).add(128).plus(&l));
    let top = match &k {
        Ix::Lit(k) => format!("(({qh} >> {}u) & 3u)", 2 * k),
        Ix::Var(e) => format!("(({qh} >> ({e} * 2u)) & 3u)"),
    };
    let scale = signed(b.byte(&h.mul(8).add(192).plus(&l.div(16)).plus(&k.mul(2))));
    format!("({} * {scale}) * f32(i32({low} | ({top} << 4u)) - 32)", b.half(208))
}

/// The bytes of each block of `dtype` that hold f16 scales (`Bytes::half`).
pub(crate) fn scales(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q8_0 | DType::Q4_0 => &[0],
        DType::Q4_1 | DType::Q4_K => &[0, 2],
        DType::Q6_K => &[208],
        other => unreachable!("`{other}` is not a packed type"),
    }
}

/// A block held in registers as the words `w0`, `w1`, … from its first byte on, its scales as
/// `h0`, `h2`, … (`scales`): what the matrix-vector kernel decodes, a value at a time, `j`
/// a number.
pub(crate) struct InWords;

impl Bytes for InWords {
    fn byte(&self, k: &Ix) -> String {
        let Ix::Lit(k) = k else { unreachable!("a block in words is read at known bytes") };
        match k % 4 {
            0 => format!("(w{} & 255u)", k / 4),
            s => format!("((w{} >> {}u) & 255u)", k / 4, 8 * s),
        }
    }
    fn half(&self, k: usize) -> String {
        format!("h{k}")
    }
}

/// Byte `k` of a block at byte address `at` of the arena: `mgn_byte` and `mgn_half`.
struct InArena;

impl Bytes for InArena {
    fn byte(&self, k: &Ix) -> String {
        format!("mgn_byte(at + {})", k.wgsl())
    }
    fn half(&self, k: usize) -> String {
        format!("mgn_half(at + {k}u)")
    }
}

/// The name of the WGSL function giving element `i` of a `dtype` value whose first word is `a`.
fn function(dtype: DType) -> String {
    format!("mgn_{}", dtype.name())
}

/// The WGSL f32 of element `index` of a value of the packed `dtype` whose first word is `base`.
pub(crate) fn load(dtype: DType, base: &str, index: &str) -> String {
    format!("{}({base}, {index})", function(dtype))
}

/// The element functions `body` calls, with the byte readers they share (which call
/// `halves::FUNCTIONS`' `mgn_f16_value`), or nothing.
pub fn functions(body: &str) -> String {
    let used: Vec<DType> = mgn_ir::dtype::PACKED
        .into_iter()
        .filter(|&d| body.contains(&format!("{}(", function(d))))
        .collect();
    if used.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "fn mgn_byte(a: u32) -> u32 { return (arena[a >> 2u] >> ((a & 3u) * 8u)) & 255u; }
fn mgn_half(a: u32) -> f32 { return mgn_f16_value((arena[a >> 2u] >> ((a & 2u) * 8u)) & 0xffffu); }
",
    );
    for d in used {
        let (len, bytes) = d.block().expect("a packed type");
        s += &format!(
            "fn {f}(a: u32, i: u32) -> f32 {{
    let at = a * 4u + (i / {len}u) * {bytes}u;
    let j = i % {len}u;
    return {v};
}}
",
            f = function(d),
            v = value(d, &Ix::Var("j".into()), &InArena),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes from a host block, for evaluating the descriptions with numbers.
    struct Host<'a>(&'a [u8]);
    impl Bytes for Host<'_> {
        fn byte(&self, k: &Ix) -> String {
            let Ix::Lit(k) = k else { panic!("a number") };
            self.0[*k].to_string()
        }
        fn half(&self, k: usize) -> String {
            format!("h{}", self.0[k])
        }
    }

    #[test]
    fn descriptions_fold_to_constants_for_numbered_values() {
        let b = vec![7u8; 210];
        for d in mgn_ir::dtype::PACKED {
            let (len, _) = d.block().unwrap();
            for j in [0, 1, 17, len - 1] {
                let e = value(d, &Ix::Lit(j), &Host(&b[..]));
                assert!(!e.contains("select") && !e.contains('j'), "{d} {j}: {e}");
            }
        }
    }

    #[test]
    fn element_functions_are_emitted_only_for_types_called() {
        assert_eq!(functions("x = 1.0;"), "");
        let f = functions("let v = mgn_q4_k(3u, i);");
        assert!(f.contains("fn mgn_q4_k(") && !f.contains("fn mgn_q8_0("));
    }
}
