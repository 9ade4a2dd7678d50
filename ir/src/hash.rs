//! A hash that is the same across builds, platforms and Rust versions (the standard library's
//! is not promised to be): for what is written to disk or must not change with the toolchain,
//! such as parameter initialisation seeds and the keys of measured kernels.

/// FNV-1a's 64-bit offset basis: the hash of nothing.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// 64-bit FNV-1a of `bytes`, continuing from `h` (`FNV_OFFSET` to start).
pub fn fnv1a64_from(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_from(FNV_OFFSET, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_gives_the_published_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c); // the published FNV-1a test vector
        assert_eq!(fnv1a64_from(fnv1a64(b"a"), b"b"), fnv1a64(b"ab"));
    }
}
