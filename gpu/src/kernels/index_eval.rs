//! For tests: the value of a kernel's index expression (`broadcast_at`, a permuted store's
//! index) at one index, to compare with the layout it claims to compute.

/// The value of an index expression over `u32` literals, `+ * / %` and parentheses.
pub fn eval(e: &str) -> u64 {
    fn sum(t: &[u8], at: &mut usize) -> u64 {
        let mut v = product(t, at);
        while t.get(*at) == Some(&b'+') {
            *at += 1;
            v += product(t, at);
        }
        v
    }
    fn product(t: &[u8], at: &mut usize) -> u64 {
        let mut v = atom(t, at);
        while let Some(&op @ (b'*' | b'/' | b'%')) = t.get(*at) {
            *at += 1;
            let w = atom(t, at);
            v = match op {
                b'*' => v * w,
                b'/' => v / w,
                _ => v % w,
            };
        }
        v
    }
    fn atom(t: &[u8], at: &mut usize) -> u64 {
        if t[*at] == b'(' {
            *at += 1;
            let v = sum(t, at);
            assert_eq!(t[*at], b')');
            *at += 1;
            return v;
        }
        let start = *at;
        while t[*at].is_ascii_digit() {
            *at += 1;
        }
        let v = std::str::from_utf8(&t[start..*at]).unwrap().parse().unwrap();
        if t.get(*at) == Some(&b'u') {
            *at += 1;
        }
        v
    }
    let t: Vec<u8> = e.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let mut at = 0;
    let v = sum(&t, &mut at);
    assert_eq!(at, t.len(), "{e}");
    v
}
