//! What the tiled and cooperative-matrix product kernels share: which elements of the A and B
//! panels each invocation moves, and their loads into registers a panel ahead, zero past the
//! matrices' edges.

use super::Geometry;
use crate::kernels::{fetch_word, zero, Ext, Fetched, Operand};

/// The panels of a product kernel: A's `bm × bk`, B's `bk × bn`, each element moved by one of
/// `width` invocations. Slot `p` of invocation `t` moves panel element `t + p·width`
/// (`ae{p}` of A, `be{p}` of B); the kernel defines the element's row and depth (`ar{p}`,
/// `ak{p}`; `bk{p}`, `bc{p}`) and its word's place before k (`ag{p}`, `bg{p}`).
pub(super) struct Panels {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    /// Panel elements each invocation moves, and whether the last move is partial.
    pub pa: usize,
    pub partial_a: bool,
    pub pb: usize,
    pub partial_b: bool,
    /// Whether the tiles overhang m, n and k.
    pub edge_m: bool,
    pub edge_n: bool,
    pub edge_k: bool,
}

impl Panels {
    pub fn of(g: &Geometry, (bm, bn, bk): (usize, usize, usize), width: usize) -> Panels {
        let slots = |size: usize| (size.div_ceil(width), !size.is_multiple_of(width));
        let ((pa, partial_a), (pb, partial_b)) = (slots(bm * bk), slots(bk * bn));
        let (m, k, n) = (&g.m, &g.k, &g.n);
        Panels {
            bm,
            bn,
            bk,
            pa,
            partial_a,
            pb,
            partial_b,
            // A size that follows the dynamic sizes may overhang at some of them.
            edge_m: !m.is_fixed() || !m.n.is_multiple_of(bm),
            edge_n: !n.is_fixed() || !n.n.is_multiple_of(bn),
            edge_k: !k.is_fixed() || !k.n.is_multiple_of(bk) || g.splits > 1,
        }
    }

    /// Loads of the panels at depth `k0` into registers: each slot's word into `ra{p}` /
    /// `rb{p}`, a half's bit offset into `sa{p}` / `sb{p}`; a word past the matrices' edges is
    /// 0, which is 0.0 in every type.
    pub fn fetch(&self, g: &Geometry, k0: &str) -> String {
        let (m, n) = (&g.m, &g.n);
        // The k this invocation's range holds: all of k, or (split) the range's own.
        let klen = if g.splits > 1 { "klen".to_string() } else { g.k.to_string() };
        // Slot `p` of operand `reg`: zero, then its word where the slot is inside the panel
        // (`size` when the last slot is partial), the matrix's edge along m or n (`edge`) and k.
        let slot = |reg: &str, p: usize, size: Option<usize>, edge: Option<String>, f: Fetched| {
            let mut conds: Vec<String> =
                size.map(|s| format!("{reg}e{p} < {s}u")).into_iter().collect();
            conds.extend(edge);
            if self.edge_k {
                conds.push(format!("{k0} + {reg}k{p} < {klen}"));
            }
            let mut set = format!("r{reg}{p} = {};", f.word);
            if let Some(shift) = f.shift {
                set += &format!(" s{reg}{p} = {shift};");
            }
            if conds.is_empty() {
                format!("        {set}\n")
            } else {
                format!(
                    "        r{reg}{p} = {};\n        if ({}) {{ {set} }}\n",
                    f.zero,
                    conds.join(" && ")
                )
            }
        };
        let mut f = String::new();
        for p in 0..self.pa {
            let size = self.partial_a.then_some(self.bm * self.bk);
            let edge = self.edge_m.then(|| format!("m0 + ar{p} < {m}"));
            let at = if g.at { format!("ag{p} + ({k0}) * {m}") } else { format!("ag{p} + {k0}") };
            f += &slot("a", p, size, edge, fetch_word(&g.a, &at));
        }
        for p in 0..self.pb {
            let size = self.partial_b.then_some(self.bk * self.bn);
            let edge = self.edge_n.then(|| format!("n0 + bc{p} < {n}"));
            let at = if g.bt { format!("bg{p} + {k0}") } else { format!("bg{p} + ({k0}) * {n}") };
            f += &slot("b", p, size, edge, fetch_word(&g.b, &at));
        }
        f
    }
}

/// The registers slot `p` of operand `o` (`a` or `b`) fetches into: its word (an f16 read
/// through the f16 view), and for a value stored as halves the element's bit offset within it.
pub(super) fn registers(name: &str, p: usize, o: &Operand) -> String {
    let shift = if o.halves_in_words() { format!(" var s{name}{p} = 0u;") } else { String::new() };
    format!("var r{name}{p} = {};{shift}", zero(o))
}

/// Slot `p` of operand `x` (`a` or `b`) as slot 0 moved `d` rows along its panel's slow axis:
/// the slow index (`slow`) plus `d`, the fast one (`fast`) the same, the word `d` stored rows of
/// `rows` further on, the staged place `shared` further on. When the workgroup covers whole
/// rows of a panel every slot is one, so an invocation keeps one set of addresses and literal
/// offsets for all its slots rather than a division and a remainder's worth of registers each.
pub(super) fn moved_slot(
    x: &str,
    p: usize,
    (slow, fast): (&str, &str),
    (d, rows): (usize, &Ext),
    shared: usize,
) -> [String; 4] {
    [
        format!("let {slow}{p} = {slow}0 + {d}u;"),
        format!("let {fast}{p} = {fast}0;"),
        format!("let {x}g{p} = {x}g0 + {d}u * {rows};"),
        format!("let {x}s{p} = {x}s0 + {shared}u;"),
    ]
}
