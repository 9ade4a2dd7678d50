//! Half-precision values (`f16`, `bf16`) in the arena: their layout, the host's packing, and
//! how kernels read and write them.
//!
//! Layout: two elements per 32-bit word, element `2k` in the low 16 bits of word `k` and
//! `2k + 1` in the high 16 bits (little-endian, as a safetensors file lays them out). A value of
//! `n` elements takes `⌈n / 2⌉` words (`memory::value_words`).
//!
//! Reads work everywhere: every kernel reads its operands through `kernels::load`, which
//! unpacks the element it names (`load`). Writes are word-sized, so two invocations must never
//! write the halves of one word: only the per-element kernels of `kernels::plan_op` write a half
//! result, one invocation per word (`elementwise`, `store`), and the GPU's last pass
//! (`rewrite::halves`) gives every other step with a half result an f32 result and a cast.
//!
//! Rounding is the CPU reference's, bit for bit: to nearest, ties to even; f16 overflows to
//! infinity from 65,520 on and keeps its subnormals; NaN stays NaN. WGSL's `pack2x16float`
//! leaves rounding and overflow to the implementation, so the rounding is written out here; the
//! device's own conversion replaces it only where `device::rounding`'s probe proved it the same
//! (`F16Rounding`, `conversions`).

use crate::kernels::{base, Ext, Operand};
use mgn_ir::DType;

/// `values` rounded to `dtype` (a half type) and packed two to a word.
pub fn pack(values: &[f64], dtype: DType) -> Vec<u32> {
    let bits = |x: f64| -> u32 {
        match dtype {
            DType::F16 => half::f16::from_f64(x).to_bits() as u32,
            _ => half::bf16::from_f64(x).to_bits() as u32,
        }
    };
    values.chunks(2).map(|p| bits(p[0]) | p.get(1).map_or(0, |&y| bits(y) << 16)).collect()
}

/// The first `n` elements of `dtype` (a half type) packed in `words`, as f32s.
pub fn unpack(words: &[u32], n: usize, dtype: DType) -> Vec<f32> {
    let value = |h: u16| -> f32 {
        match dtype {
            DType::F16 => half::f16::from_bits(h).to_f32(),
            _ => half::bf16::from_bits(h).to_f32(),
        }
    };
    (0..n).map(|i| value((words[i / 2] >> (16 * (i % 2))) as u16)).collect()
}

/// The f32 value of the half of type `dtype` in the low 16 bits of the u32 expression `bits`
/// (the high bits may hold anything).
pub(crate) fn value(dtype: DType, bits: &str) -> String {
    match dtype {
        DType::F16 => format!("mgn_f16_value({bits} & 0xffffu)"),
        _ => format!("bitcast<f32>({bits} << 16u)"),
    }
}

/// A WGSL f32 expression of `value` (an f32 expression) rounded to the half type `dtype`: the
/// value a cast stores and a load of it gives back (`memory::rounded_views`). An f16 rounds
/// through `mgn_f16_rounded`, which the compiler defines for the device (`conversions`).
pub(crate) fn round(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F16 => format!("mgn_f16_rounded({value})"),
        _ => format!("bitcast<f32>(mgn_bf16({value}) << 16u)"),
    }
}

/// A WGSL f16 expression of `value` (an f32 expression) rounded to f16: a rounded view's
/// element staged into an f16 panel (`kernels::word_half`). Only kernels that enable f16 use
/// it.
pub(crate) fn staged_f16(value: &str) -> String {
    format!("mgn_f16_staged({value})")
}

/// How kernels round an f32 to f16 on a device (`device::rounding` decides): each of the two
/// ways a kernel rounds takes the device's conversion instruction, `f16(x)`, where a probe of
/// this device showed that way gives the CPU's result in every rounding case, and the
/// arithmetic of `FUNCTIONS` (`mgn_f16_round`, about a dozen integer operations) elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F16Rounding {
    /// Into an f16 (`mgn_f16_staged`: a rounded view's element staged into an f16 panel).
    pub staged: bool,
    /// To the f16's value, kept as an f32 (`mgn_f16_rounded`: a rounded view read by an f32
    /// kernel). Apart from `staged` because a compiler may fold `f32(f16(x))` into `x` (Mesa
    /// 25's lavapipe does) where it cannot fold a store of the f16.
    pub rounded: bool,
}

impl F16Rounding {
    /// Every rounding in software: devices without f16, and `MGN_MIN_SPEC=1`.
    pub const SOFTWARE: F16Rounding = F16Rounding { staged: false, rounded: false };
}

/// Whether a kernel body rounds to f16 through the functions `conversions` defines.
pub fn rounds_to_f16(body: &str) -> bool {
    body.contains("mgn_f16_rounded(") || body.contains("mgn_f16_staged(")
}

/// The definitions of the rounding functions a kernel body calls, for `rounding`, and whether
/// they need `enable f16` (which the body of an f32 kernel does not have): `mgn_f16_rounded`
/// where the body calls it, and `mgn_f16_staged` (in f16 kernels only) where it calls that.
/// An f16 of a value already rounded to one is exact on every device, so the software staging
/// converts after rounding.
pub fn conversions(body: &str, rounding: F16Rounding) -> (String, bool) {
    let (rounded, staged) = (body.contains("mgn_f16_rounded("), body.contains("mgn_f16_staged("));
    let mut defs = String::new();
    if rounded {
        let def = if rounding.rounded { "f32(f16(x))" } else { "mgn_f16_round(x)" };
        defs += &format!("fn mgn_f16_rounded(x: f32) -> f32 {{ return {def}; }}\n");
    }
    if staged {
        let def = if rounding.staged { "f16(x)" } else { "f16(mgn_f16_round(x))" };
        defs += &format!("fn mgn_f16_staged(x: f32) -> f16 {{ return {def}; }}\n");
    }
    (defs, rounded && rounding.rounded)
}

/// The statement giving element `index` of a half result its value: a lane of the word being
/// assembled by `elementwise` (the only kernel that writes halves).
pub(crate) fn store(index: &str, value: &str) -> String {
    format!("pair[({index}) & 1u] = f32({value});")
}

/// WGSL functions of every kernel that calls one (`device::source`): an f16's value from its bits
/// (`mgn_f16_value`: exact, subnormals included, where `unpack2x16float` needs a capability
/// naga does not grant by default), and an f32 rounded to the bits of a half type (`mgn_f16`,
/// `mgn_bf16`).
///
/// `mgn_f16_round` is `mgn_f16_value(mgn_f16(x))`. Both are written without branches: each
/// computes its few cases (normal numbers, where rounding is an add and a mask on the f32's own
/// bits; subnormals; infinities and NaN) and selects one. Products stage one of these per
/// operand element (the mixed policy's rounded views), and a branchy conversion inlined at each
/// of a kernel's 24–64 staged elements made cooperative-matrix kernels of 130–300 KB of code
/// and 170–255 registers on an H100 (`MGN_PIPELINE_STATS=1`), which ran 3× slower than the
/// same kernel converting with one instruction.
pub const FUNCTIONS: &str = "fn mgn_f16_value(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let e = h & 0x7c00u;
    let m = h & 0x3ffu;
    let normal = sign | (((h & 0x7fffu) << 13u) + 0x38000000u);
    let subnormal = sign | bitcast<u32>(f32(m) * bitcast<f32>(0x33800000u));
    let special = sign | 0x7f800000u | (m << 13u);
    return bitcast<f32>(select(select(normal, subnormal, e == 0u), special, e == 0x7c00u));
}
fn mgn_f16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a > 0x7f800000u) { return sign | 0x7e00u; }
    if (a >= 0x477ff000u) { return sign | 0x7c00u; }
    if (a < 0x38800000u) { return sign | u32(round(bitcast<f32>(a) * 16777216.0)); }
    return sign | ((a + 0xfffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u);
}
fn mgn_f16_round(x: f32) -> f32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    let normal = (b + 0xfffu + ((b >> 13u) & 1u)) & 0xffffe000u;
    let steps = round(bitcast<f32>(a) * 16777216.0);
    let tiny = (b & 0x80000000u) | bitcast<u32>(steps * bitcast<f32>(0x33800000u));
    let huge = (b & 0x80000000u) | select(0x7f800000u, 0x7fc00000u, a > 0x7f800000u);
    return bitcast<f32>(select(select(normal, tiny, a < 0x38800000u), huge, a >= 0x477ff000u));
}
fn mgn_bf16(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    if ((b & 0x7fffffffu) > 0x7f800000u) { return (b >> 16u) | 0x40u; }
    return (b + 0x7fffu + ((b >> 16u) & 1u)) >> 16u;
}
";

/// Whether WGSL `text` calls one of `FUNCTIONS`.
pub fn calls_functions(text: &str) -> bool {
    ["mgn_f16_value(", "mgn_f16(", "mgn_f16_round(", "mgn_bf16("].iter().any(|f| text.contains(f))
}

/// A per-element body (`i` the element, `n` the count; its `store`s fill `pair`) run for both
/// elements of each word of the half result `out`: one invocation per word, `⌈n / 2⌉` of them.
pub(crate) fn elementwise(out: &Operand, n: Ext, width: u32, body: &str, helpers: &str) -> String {
    let round = if out.dtype == DType::F16 { "mgn_f16" } else { "mgn_bf16" };
    format!(
        "{helpers}@compute @workgroup_size({width})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
    let w = gid.x + (gid.y + gid.z * groups.y) * groups.x * {width}u;
    if (w >= ({n} + 1u) / 2u) {{ return; }}
    var pair = vec2<f32>(0.0, 0.0);
    for (var e = 0u; e < 2u; e = e + 1u) {{
        let i = 2u * w + e;
        if (i < {n}) {{
            {body}
        }}
    }}
    arena[{out} + w] = {round}(pair.x) | ({round}(pair.y) << 16u);
}}
",
        out = base(out),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_puts_the_even_element_low_and_rounds_to_nearest_even() {
        let words = pack(&[1.0, -2.0, 0.5], DType::F16);
        assert_eq!(words, vec![0x3c00 | (0xc000 << 16), 0x3800]);
        assert_eq!(unpack(&words, 3, DType::F16), vec![1.0, -2.0, 0.5]);
        // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie, to the even 1; 1 + 3·2^-8 → 1 + 2^-6.
        let b = pack(&[1.0 + 2f64.powi(-8), 1.0 + 3.0 * 2f64.powi(-8)], DType::BF16);
        assert_eq!(unpack(&b, 2, DType::BF16), vec![1.0, 1.0 + 2f32.powi(-6)]);
        // f16's range and subnormals.
        let h = pack(&[70000.0, 2f64.powi(-24), -0.0], DType::F16);
        assert_eq!(unpack(&h, 3, DType::F16), vec![f32::INFINITY, 2f32.powi(-24), -0.0]);
    }
}
