//! Dropout with the CPU backend's mask (`mgn_cpu::dropout_keep`), drawn per element from the
//! run's key (in the parameter block) by splitmix64 in 32-bit WGSL arithmetic.

use super::lit;
use crate::kernels::{load, per_element, store, KernelSource, Operand};

fn splitmix64(z: u64) -> u64 {
    let z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// splitmix64 on a u64 held as `vec2(lo, hi)` (WGSL has no 64-bit integers).
const SPLITMIX64: &str = "fn u64_add(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}
fn u64_shr(a: vec2<u32>, k: u32) -> vec2<u32> {
    return vec2<u32>((a.x >> k) | (a.y << (32u - k)), a.y >> k);
}
fn u32_mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u;
    let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((mid << 16u) | (p00 & 0xffffu), \
        p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}
fn u64_mul(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let w = u32_mul_wide(a.x, b.x);
    return vec2<u32>(w.x, w.y + a.x * b.y + a.y * b.x);
}
fn splitmix64(z0: vec2<u32>) -> vec2<u32> {
    var z = u64_add(z0, vec2<u32>(0x7F4A7C15u, 0x9E3779B9u));
    z = u64_mul(z ^ u64_shr(z, 30u), vec2<u32>(0x1CE4E5B9u, 0xBF58476Du));
    z = u64_mul(z ^ u64_shr(z, 27u), vec2<u32>(0x133111EBu, 0x94D049BBu));
    return z ^ u64_shr(z, 31u);
}
";

/// The per-run key of a dropout mask: `splitmix64(splitmix64(seed) ^ node)`, where `seed` is
/// the run's seed and `node` the forward step (the CPU backend's `dropout_keep` recipe). The
/// GPU session puts it in the kernel's parameter block before each run.
pub(crate) fn dropout_key(seed: u64, node: u32) -> u64 {
    splitmix64(splitmix64(seed) ^ node as u64)
}

/// Dropout of `x` (input 0) as the CPU draws it in training (for `DropoutGrad`, applied to `dy`
/// with the forward step's key): element `e` is kept when `(splitmix64(key ^ e) >> 11) / 2^53
/// >= p`, with `key` read from `params.p[0].xy` (see `dropout_key`) and the comparison done
/// exactly in integers: `h >= ceil(p·2^53)·2^11`.
pub(crate) fn dropout(
    x: &Operand,
    out: &Operand,
    p: f64,
    width: u32,
) -> Result<KernelSource, String> {
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability must be in [0, 1), found {p}"));
    }
    let n: usize = out.shape.iter().product();
    if n as u64 > u32::MAX as u64 {
        return Err(format!("{n} elements do not fit a u32 index"));
    }
    let threshold = ((p * (1u64 << 53) as f64).ceil() as u64) << 11;
    let body = format!(
        "let h = splitmix64(vec2<u32>(params.p[0].x ^ i, params.p[0].y));
    let keep = h.y > {thi}u || (h.y == {thi}u && h.x >= {tlo}u);
    {}",
        store(out, "i", &format!("select(0.0, {} * {}, keep)", load(x, "i"), lit(1.0 / (1.0 - p)))),
        tlo = threshold as u32,
        thi = (threshold >> 32) as u32,
    );
    Ok(per_element(out, width, &body, SPLITMIX64))
}
