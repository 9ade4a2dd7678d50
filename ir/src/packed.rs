//! The packed types' bytes (`DType::Q8_0` … `DType::Q6_K`): one block's values from its bytes
//! (`decode_block`), a whole tensor's (`dequantize`, `dequantize_rows`), and the reference
//! quantizers that write them (`quantize`).
//!
//! The layouts are ggml's, byte for byte, so a GGUF file's tensors load as they are and a
//! quantized checkpoint is a GGUF file's tensors. Each decoder is the definition every backend
//! matches: the CPU runs it, and the GPU kernels' element loads are tested against it.
//!
//! The quantizers round to nearest and choose each block's scale from its extremes (ggml's
//! reference rule for the 32-value types). For the k-quants they choose sub-block scales from
//! the extremes as well and quantize the values against the scales as stored, where ggml
//! searches a few candidate scales per sub-block: the bytes are a valid block either way, and
//! `dequantize(quantize(x))` stays within a quantization step of `x` (tested).

use crate::DType;
use half::f16;

/// The values of the packed `dtype` stored in `bytes`, a whole number of its blocks.
///
/// Panics if `dtype` is not packed or `bytes` is not whole blocks: callers check sizes with
/// `DType::bytes_for` first.
pub fn dequantize(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let (len, size) = dtype.block().expect("a packed type");
    assert_eq!(bytes.len() % size, 0, "{} bytes are not whole `{dtype}` blocks", bytes.len());
    let mut out = vec![0f32; bytes.len() / size * len];
    for (block, values) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(len)) {
        decode_block(dtype, block, values);
    }
    out
}

/// Rows `rows` of a packed `[r, n]` matrix (`n` whole blocks), decoded into `out`
/// (`rows.len() · n` values): an embedding lookup reads only the rows it gathers.
pub fn dequantize_rows(dtype: DType, bytes: &[u8], n: usize, rows: &[usize], out: &mut [f32]) {
    let (len, size) = dtype.block().expect("a packed type");
    let row_bytes = n / len * size;
    for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(n)) {
        let src = &bytes[r * row_bytes..(r + 1) * row_bytes];
        for (block, values) in src.chunks_exact(size).zip(dst.chunks_exact_mut(len)) {
            decode_block(dtype, block, values);
        }
    }
}

/// One block's values (`out` is the block's length).
#[inline]
pub fn decode_block(dtype: DType, block: &[u8], out: &mut [f32]) {
    match dtype {
        DType::Q8_0 => decode_q8_0(block, out),
        DType::Q4_0 => decode_q4_0(block, out),
        DType::Q4_1 => decode_q4_1(block, out),
        DType::Q4_K => decode_q4_k(block, out),
        DType::Q6_K => decode_q6_k(block, out),
        other => panic!("`{other}` is not a packed type"),
    }
}

/// `values` (a whole number of blocks) in the packed `dtype`.
pub fn quantize(dtype: DType, values: &[f32]) -> Vec<u8> {
    let (len, size) = dtype.block().expect("a packed type");
    assert_eq!(values.len() % len, 0, "{} values are not whole `{dtype}` blocks", values.len());
    let mut out = vec![0u8; values.len() / len * size];
    for (x, block) in values.chunks_exact(len).zip(out.chunks_exact_mut(size)) {
        match dtype {
            DType::Q8_0 => encode_q8_0(x, block),
            DType::Q4_0 => encode_q4_0(x, block),
            DType::Q4_1 => encode_q4_1(x, block),
            DType::Q4_K => encode_q4_k(x, block),
            DType::Q6_K => encode_q6_k(x, block),
            other => panic!("`{other}` is not a packed type"),
        }
    }
    out
}

/// The little-endian f16 at `at`, widened.
fn half_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Writes `x` as an f16 at `at` and gives back the value stored (what a decoder will read).
fn put_half(b: &mut [u8], at: usize, x: f32) -> f32 {
    let h = f16::from_f32(x);
    b[at..at + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

/// Q8_0: scale d (f16), then 32 signed bytes; x = d · q.
fn decode_q8_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Q4_0: scale d (f16), then 16 bytes of nibbles; the low nibbles are values 0–15 and the high
/// ones 16–31, each stored with an offset of 8: x = d · (q − 8).
fn decode_q4_0(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 0);
    // Both halves and the bytes as slices of 16: no bounds checks in the loop, which the CPU's
    // decoding matrix-vector product runs for every value of a weight.
    let (lo, hi) = out[..32].split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[2..18]) {
        *l = d * ((q & 0x0f) as i32 - 8) as f32;
        *h = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: scale d and minimum m (f16 each), then 16 bytes of nibbles laid out as Q4_0's;
/// x = d · q + m.
fn decode_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half_at(b, 0), half_at(b, 2));
    let (lo, hi) = out[..32].split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(&b[4..20]) {
        *l = d * (q & 0x0f) as f32 + m;
        *h = d * (q >> 4) as f32 + m;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0–7) of a Q4_K block, packed in 12 bytes: the
/// first four sub-blocks keep theirs in the low 6 bits of bytes 0–3 (scales) and 4–7 (minima);
/// the last four take 4 bits from bytes 8–11 and their top 2 bits from the spare top bits of
/// bytes 0–7.
pub fn q4_k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Q4_K: super-block scale d and minimum scale dmin (f16), 12 bytes of 6-bit sub-block scales
/// and minima, then 128 bytes of nibbles. Each 64 values share 32 bytes: the low nibbles are
/// sub-block 2i, the high ones sub-block 2i + 1; x = d · sc · q − dmin · m.
fn decode_q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for chunk in 0..4 {
        let (sc1, m1) = q4_k_scale_min(2 * chunk, scales);
        let (sc2, m2) = q4_k_scale_min(2 * chunk + 1, scales);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, min2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * chunk..32 * chunk + 32];
        let y = &mut out[64 * chunk..64 * chunk + 64];
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - min1;
            y[l + 32] = d2 * (q[l] >> 4) as f32 - min2;
        }
    }
}

/// Q6_K: 128 bytes of low nibbles (ql), 64 bytes of high 2-bit pairs (qh), 16 signed 8-bit
/// sub-block scales (one per 16 values), then the super-block scale d (f16). Each half of 128
/// values takes 64 bytes of ql and 32 of qh: value l + 32·k of the half combines a nibble of
/// ql (low nibbles of bytes l and l + 32 for k = 0, 1; high ones for k = 2, 3) with bits
/// 2k…2k+1 of qh[l], stored with an offset of 32: x = d · scale · (q − 32).
fn decode_q6_k(b: &[u8], out: &mut [f32]) {
    let d = half_at(b, 208);
    for half_block in 0..2 {
        let ql = &b[64 * half_block..64 * half_block + 64];
        let qh = &b[128 + 32 * half_block..128 + 32 * half_block + 32];
        let sc = &b[192 + 8 * half_block..192 + 8 * half_block + 8];
        let y = &mut out[128 * half_block..128 * half_block + 128];
        for l in 0..32 {
            let is = l / 16;
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let scale = sc[is + 2 * k] as i8 as f32;
                y[l + 32 * k] = d * scale * (q as i32 - 32) as f32;
            }
        }
    }
}

/// 1/d, or 0 for a block of zeros (whose values all quantize to the zero point).
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Q8_0: d = max|x| / 127, q = round(x / d).
fn encode_q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let id = inverse(put_half(b, 0, amax / 127.0));
    for (o, v) in b[2..34].iter_mut().zip(x) {
        *o = ((v * id).round().clamp(-127.0, 127.0) as i8) as u8;
    }
}

/// Q4_0: the value of largest magnitude maps to −8 (d = max / −8), q = x / d + 8 rounded.
fn encode_q4_0(x: &[f32], b: &mut [u8]) {
    let max = x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let id = inverse(put_half(b, 0, max / -8.0));
    let q = |v: f32| ((v * id + 8.5).clamp(0.0, 15.0)) as u8;
    for j in 0..16 {
        b[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Q4_1: m = min x, d = (max − min) / 15, q = (x − m) / d rounded.
fn encode_q4_1(x: &[f32], b: &mut [u8]) {
    let (min, max) = x.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let id = inverse(put_half(b, 0, (max - min) / 15.0));
    let m = put_half(b, 2, min);
    let q = |v: f32| (((v - m) * id + 0.5).clamp(0.0, 15.0)) as u8;
    for j in 0..16 {
        b[4 + j] = q(x[j]) | (q(x[j + 16]) << 4);
    }
}

/// Q4_K: each 32-value sub-block's range [min(0, lo), hi] in 15 steps; its step and −min are
/// quantized to 6 bits against the block's largest (d, dmin), and the values are quantized
/// against the steps as stored.
fn encode_q4_k(x: &[f32], b: &mut [u8]) {
    let mut steps = [0f32; 8];
    let mut mins = [0f32; 8];
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let lo = sub.iter().fold(0f32, |m, &v| m.min(v));
        let hi = sub.iter().fold(f32::MIN, |m, &v| m.max(v));
        steps[j] = (hi - lo).max(0.0) / 15.0;
        mins[j] = -lo;
    }
    let max_step = steps.iter().fold(0f32, |m, &v| m.max(v));
    let max_min = mins.iter().fold(0f32, |m, &v| m.max(v));
    let d = put_half(b, 0, max_step / 63.0);
    let dmin = put_half(b, 2, max_min / 63.0);
    let six = |v: f32, unit: f32| (v * inverse(unit)).round().clamp(0.0, 63.0) as u8;
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        // The step rounds up, so the stored range still reaches the sub-block's top.
        ls[j] = (steps[j] * inverse(d)).ceil().clamp(0.0, 63.0) as u8;
        lm[j] = six(mins[j], dmin);
    }
    let s = &mut b[4..16];
    s.fill(0);
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    let q = |v: f32, j: usize| -> u8 {
        let (step, m) = (d * ls[j] as f32, dmin * lm[j] as f32);
        ((v + m) * inverse(step)).round().clamp(0.0, 15.0) as u8
    };
    for chunk in 0..4 {
        for l in 0..32 {
            let lo = q(x[64 * chunk + l], 2 * chunk);
            let hi = q(x[64 * chunk + 32 + l], 2 * chunk + 1);
            b[16 + 32 * chunk + l] = lo | (hi << 4);
        }
    }
}

/// Q6_K: each 16-value sub-block's scale is max|x| / 31 (values in −32…31), quantized to a
/// signed byte against the block's largest (d), and the values are quantized against the
/// scales as stored.
fn encode_q6_k(x: &[f32], b: &mut [u8]) {
    let mut scales = [0f32; 16];
    for (j, sub) in x.chunks_exact(16).enumerate() {
        scales[j] = sub.iter().fold(0f32, |m, v| m.max(v.abs())) / 31.0;
    }
    let max_scale = scales.iter().fold(0f32, |m, &v| m.max(v));
    let d = put_half(b, 208, max_scale / 127.0);
    let mut sc = [0i8; 16];
    for j in 0..16 {
        // Rounded up, so the sub-block's largest value stays within 31 steps.
        sc[j] = (scales[j] * inverse(d)).ceil().clamp(0.0, 127.0) as i8;
    }
    let q = |v: f32, j: usize| -> u8 {
        let step = d * sc[j] as f32;
        ((v * inverse(step)).round().clamp(-32.0, 31.0) + 32.0) as u8
    };
    b[..208].fill(0);
    for half_block in 0..2 {
        let y = &x[128 * half_block..128 * half_block + 128];
        for l in 0..32 {
            let is = l / 16;
            let v: Vec<u8> =
                (0..4).map(|k| q(y[l + 32 * k], 8 * half_block + is + 2 * k)).collect();
            let ql = 64 * half_block;
            b[ql + l] = (v[0] & 0x0f) | ((v[2] & 0x0f) << 4);
            b[ql + l + 32] = (v[1] & 0x0f) | ((v[3] & 0x0f) << 4);
            b[128 + 32 * half_block + l] =
                (v[0] >> 4) | ((v[1] >> 4) << 2) | ((v[2] >> 4) << 4) | ((v[3] >> 4) << 6);
        }
        for (k, s) in sc[8 * half_block..8 * half_block + 8].iter().enumerate() {
            b[192 + 8 * half_block + k] = *s as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::PACKED;

    /// Deterministic values with a spread of magnitudes and signs, and an all-zero block.
    fn values(n: usize) -> Vec<f32> {
        let mut state = 0x2545f491u32;
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let u = state as f32 / u32::MAX as f32 - 0.5;
                if i < 256 {
                    0.0
                } else {
                    u * (1 + (i / 256) % 5) as f32
                }
            })
            .collect()
    }

    #[test]
    fn q8_0_is_scale_times_byte() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = (-4i8) as u8;
        b[33] = 6;
        let v = dequantize(DType::Q8_0, &b);
        assert_eq!((v.len(), v[0], v[1], v[31]), (32, -2.0, 0.0, 3.0));
    }

    #[test]
    fn q4_0_puts_low_nibbles_first() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        b[2] = 0x9f; // low 15 → 7 · 2, high 9 → 1 · 2
        let v = dequantize(DType::Q4_0, &b);
        assert_eq!((v[0], v[16], v[1]), (14.0, 2.0, -16.0));
    }

    #[test]
    fn quantized_values_are_within_a_step_of_the_originals() {
        let x = values(256 * 12);
        for dtype in PACKED {
            let (len, _) = dtype.block().unwrap();
            let bytes = quantize(dtype, &x);
            assert_eq!(Some(bytes.len()), dtype.bytes_for(x.len()));
            let y = dequantize(dtype, &bytes);
            // A block's step: its range over the levels it has. Rounding is within half a step;
            // Q4_0 clamps the side opposite its largest value to 7 steps (a whole step off),
            // and the k-quants' 6- and 8-bit sub-scales round their steps up: one step bounds
            // them all.
            let levels = match dtype {
                DType::Q8_0 => 254.0,
                DType::Q6_K => 62.0,
                DType::Q4_0 => 16.0,
                _ => 15.0,
            };
            for (xb, yb) in x.chunks(len).zip(y.chunks(len)) {
                let range = xb.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
                let step = range / levels;
                let worst = xb.iter().zip(yb).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
                assert!(worst <= step * 1.01 + 1e-6, "{dtype}: error {worst} past step {step}");
            }
            // Zeros stay exactly zero.
            assert!(y[..256].iter().all(|&v| v == 0.0), "{dtype}");
            // Decoding is a function of the bytes: quantizing what was decoded gives values
            // no further away than the first rounding did.
            let again = dequantize(dtype, &quantize(dtype, &y));
            let drift: f32 = y.iter().zip(&again).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(drift <= 0.2, "{dtype}: requantizing moved a value by {drift}");
        }
    }

    #[test]
    fn rows_decode_as_the_whole_matrix_does() {
        let x = values(4 * 512);
        for dtype in PACKED {
            let bytes = quantize(dtype, &x);
            let all = dequantize(dtype, &bytes);
            let mut two = vec![0f32; 2 * 512];
            dequantize_rows(dtype, &bytes, 512, &[3, 1], &mut two);
            assert_eq!(two[..512], all[3 * 512..]);
            assert_eq!(two[512..], all[512..1024]);
        }
    }
}
