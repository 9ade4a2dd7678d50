//! `broadcast_at`: the index of an operand broadcast against a kernel's output, with and
//! without its shortcut for operands that are a suffix of the output's shape.

use super::index_eval::eval;
use super::{broadcast_at, Ext};

#[test]
fn broadcast_indices_match_numpy_with_and_without_the_shortcut() {
    let lits = |s: &[usize]| s.iter().map(|&n| Ext::lit(n)).collect::<Vec<_>>();
    let out = [2, 3, 5];
    for (input, shortcut) in [
        (&[2, 3, 5][..], Some("(i)")),
        (&[1, 3, 5][..], Some("((i) % 15u)")),
        (&[5][..], Some("((i) % 5u)")),
        (&[1, 1, 5][..], Some("((i) % 5u)")),
        (&[1][..], Some("0u")),
        (&[][..], Some("0u")),
        (&[3, 1][..], None),
        (&[2, 1, 5][..], None),
        (&[2, 3, 1][..], None),
    ] {
        let expr = broadcast_at("i", &lits(&out), &lits(input));
        if let Some(want) = shortcut {
            assert_eq!(expr, want, "{input:?}");
        } else {
            assert!(expr.contains('/'), "{input:?}: {expr}");
        }
        // NumPy: each output coordinate, clamped to 0 along the input's axes of size 1.
        let pad = out.len() - input.len();
        for i in 0..out.iter().product::<usize>() {
            let (mut rest, mut want, mut stride) = (i, 0, 1);
            for a in (0..out.len()).rev() {
                let c = rest % out[a];
                rest /= out[a];
                if a >= pad {
                    let n = input[a - pad];
                    want += if n == 1 { 0 } else { c * stride };
                    stride *= n;
                }
            }
            let got = eval(&expr.replace('i', &i.to_string()));
            assert_eq!(got, want as u64, "{input:?} at {i}: {expr}");
        }
    }
}
