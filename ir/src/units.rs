//! Sizes for people: one formatter for every report of bytes (memory errors, `mgnc bench`).

/// Bytes in binary units to three significant digits: `512 B`, `1.38 MiB`, `18.6 MiB`,
/// `513 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = n as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    match u {
        0 => format!("{n} B"),
        _ if x >= 100.0 => format!("{x:.0} {}", UNITS[u]),
        _ if x >= 10.0 => format!("{x:.1} {}", UNITS[u]),
        _ => format!("{x:.2} {}", UNITS[u]),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn three_significant_digits() {
        assert_eq!(super::bytes(512), "512 B");
        assert_eq!(super::bytes(1447034), "1.38 MiB");
        assert_eq!(super::bytes(19_503_513), "18.6 MiB");
        assert_eq!(super::bytes(537_919_488), "513 MiB");
        assert_eq!(super::bytes(u64::MAX), "16.0 EiB");
    }
}
