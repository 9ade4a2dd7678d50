//! ggml's tensor encodings decoded to f32: the plain floats (F32, F16, BF16) and the block
//! quantizations Q8_0, Q4_0, Q4_1 (32 values a block, one or two f16 constants) and the
//! k-quants Q4_K and Q6_K (256 values a block in sub-blocks with quantized scales).
//!
//! Each decoder turns one block's bytes into its values, so a later backend that keeps the
//! weights packed can decode a block where it needs it; `dequantize` is those blocks in order.

use half::{bf16, f16};

/// The ggml type ids this module decodes.
pub const F32: u32 = 0;
pub const F16: u32 = 1;
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q8_0: u32 = 8;
pub const Q4_K: u32 = 12;
pub const Q6_K: u32 = 14;
pub const BF16: u32 = 30;

/// Values per block and bytes per block of a decodable type.
pub fn layout(ggml_type: u32) -> Option<(usize, usize)> {
    Some(match ggml_type {
        F32 => (1, 4),
        F16 | BF16 => (1, 2),
        Q4_0 => (32, 18),
        Q4_1 => (32, 20),
        Q8_0 => (32, 34),
        Q4_K => (256, 144),
        Q6_K => (256, 210),
        _ => return None,
    })
}

/// Decodes `bytes` (whole blocks of `ggml_type`) to f32; None for a type this module does not
/// decode. The caller has checked that `bytes` is a whole number of blocks.
pub fn dequantize(ggml_type: u32, bytes: &[u8]) -> Option<Vec<f32>> {
    let (n, size) = layout(ggml_type)?;
    let decode: fn(&[u8], &mut [f32]) = match ggml_type {
        F32 => |b, out| out[0] = f32::from_le_bytes(b.try_into().expect("4 bytes")),
        F16 => |b, out| out[0] = half(b, 0),
        BF16 => |b, out| out[0] = bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        Q4_0 => block_q4_0,
        Q4_1 => block_q4_1,
        Q8_0 => block_q8_0,
        Q4_K => block_q4_k,
        Q6_K => block_q6_k,
        _ => return None,
    };
    let blocks = bytes.len() / size;
    let mut out = vec![0f32; blocks * n];
    for (block, values) in bytes.chunks_exact(size).zip(out.chunks_exact_mut(n)) {
        decode(block, values);
    }
    Some(out)
}

/// The little-endian f16 at `at`, widened.
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q8_0: scale d (f16), then 32 signed bytes; x = d · q.
pub fn block_q8_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Q4_0: scale d (f16), then 16 bytes of nibbles; the low nibbles are values 0–15 and the high
/// ones 16–31, each stored with an offset of 8: x = d · (q − 8).
pub fn block_q4_0(b: &[u8], out: &mut [f32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        out[j] = d * ((q & 0x0f) as i32 - 8) as f32;
        out[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: scale d and minimum m (f16 each), then 16 bytes of nibbles laid out as Q4_0's;
/// x = d · q + m.
pub fn block_q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..20].iter().enumerate() {
        out[j] = d * (q & 0x0f) as f32 + m;
        out[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0–7) of a Q4_K block, packed in 12 bytes: the
/// first four sub-blocks keep theirs in the low 6 bits of bytes 0–3 (scales) and 4–7 (minima);
/// the last four take 4 bits from bytes 8–11 and their top 2 bits from the spare top bits of
/// bytes 0–7.
fn q4_k_scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// Q4_K: super-block scale d and minimum scale dmin (f16), 12 bytes of 6-bit sub-block scales
/// and minima, then 128 bytes of nibbles. Each 64 values share 32 bytes: the low nibbles are
/// sub-block 2i, the high ones sub-block 2i + 1; x = d · sc · q − dmin · m.
pub fn block_q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
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
pub fn block_q6_k(b: &[u8], out: &mut [f32]) {
    let d = half(b, 208);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_is_scale_times_byte() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b[2] = (-4i8) as u8;
        b[33] = 6;
        let v = dequantize(Q8_0, &b).unwrap();
        assert_eq!((v.len(), v[0], v[1], v[31]), (32, -2.0, 0.0, 3.0));
    }

    #[test]
    fn q4_0_puts_low_nibbles_first() {
        let mut b = vec![0u8; 18];
        b[..2].copy_from_slice(&f16::from_f32(2.0).to_bits().to_le_bytes());
        b[2] = 0x9f; // low 15 → 7 · 2, high 9 → 1 · 2
        let v = dequantize(Q4_0, &b).unwrap();
        assert_eq!((v[0], v[16], v[1]), (14.0, 2.0, -16.0));
    }

    #[test]
    fn unknown_types_are_not_decoded() {
        assert!(dequantize(13, &[0; 176]).is_none());
    }
}
