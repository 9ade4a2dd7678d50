//! Where a value lives in the arena (`Operand`: offset, shape, type and how it is viewed) and
//! the WGSL that reads and writes its elements: whole loads (`load`), loads split in two for
//! kernels that prefetch (`fetch_word`, then `word_value` or `word_half`), and stores.

use super::permuted::Permuted;
use super::Ext;
use mgn_ir::dynamic::Poly;
use mgn_ir::DType;

/// Where a value lives: its first word in the arena, and its shape.
#[derive(Clone, Debug)]
pub struct Operand {
    pub offset: usize,
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// When set, the kernel reads the offset from this word of the parameter block instead of
    /// having it baked in, so steps that differ only in where their values live (every layer of
    /// a model) share one pipeline.
    pub slot: Option<usize>,
    /// A 2-D value stored transposed: `shape` is `[k, n]` but the words hold the `[n, k]`
    /// matrix it transposes (`memory::transposed_views`; only matmul's right operand).
    pub transposed: bool,
    /// A half value stored as the f32 words it is rounded from: each load rounds
    /// (`memory::rounded_views`; only contractions' operands).
    pub rounded: bool,
    /// In a dynamic plan, per axis of `shape`, the polynomial of the sizes it follows (empty,
    /// or `None` for an axis, when fixed): what `dim` prints for kernels shared across sizes.
    pub follows: Vec<Option<Poly>>,
    /// An output stored permuted (`GpuOp::PermutedStore`): `store` maps each index.
    pub permuted: Option<Permuted>,
    /// A split product's sum read through (`memory::summed_views`): the words hold this many
    /// partial results of `shape` one after another, and each load adds them up. 0 or 1: none.
    pub summed: usize,
    /// A slice read in place (`memory::sliced_views`): the words hold the value it slices.
    pub sliced: Option<Sliced>,
    /// f16 halves read through the arena's f16 view (`arena_h`, which the kernel declares):
    /// each element loads as an f16, with no conversion. Only cooperative-matrix kernels read
    /// so (their panels are f16, so a load and a store carry the bits, which Vulkan promises
    /// to keep, subnormals included), and only operands: the two bindings alias the arena, so
    /// nothing the same dispatch writes may be read through the view.
    pub f16_view: bool,
    /// A dequantized packed parameter read in place (`memory::dequantized_views`): the words
    /// hold this packed type's blocks (`crate::packed`), and each load decodes its element.
    pub packed: Option<DType>,
}

/// Where a sliced view's elements lie: in the value it slices, whose `axis` is `full` long,
/// from `start` on (the view's other axes are the value's).
#[derive(Clone, Debug)]
pub struct Sliced {
    pub axis: usize,
    pub start: usize,
    pub full: Ext,
}

impl Operand {
    /// Whether the words hold halves, two per word (a half value not read as a rounded view):
    /// an element is read from its word at a bit offset.
    pub fn packs_halves(&self) -> bool {
        self.dtype.is_half() && !self.rounded
    }

    /// Whether an element is read from its word at a bit offset, which a register beside the
    /// word carries: halves in words, not read through the f16 view.
    pub fn halves_in_words(&self) -> bool {
        self.packs_halves() && !self.f16_view
    }

    /// An operand at a baked-in offset.
    pub fn at(offset: usize, shape: &[usize], dtype: DType) -> Operand {
        let shape = shape.to_vec();
        let (transposed, rounded) = (false, false);
        let (slot, follows, permuted, summed) = (None, vec![], None, 0);
        let (sliced, f16_view, packed) = (None, false, None);
        Operand {
            offset,
            shape,
            dtype,
            slot,
            transposed,
            rounded,
            follows,
            permuted,
            summed,
            sliced,
            f16_view,
            packed,
        }
    }

    /// Axis `a`'s size, as a kernel shared across sizes reads it.
    pub fn dim(&self, a: usize) -> Ext {
        Ext::following(self.shape[a], self.follows.get(a).and_then(Option::as_ref))
    }

    /// Every axis's size (`dim`).
    pub fn dims(&self) -> Vec<Ext> {
        (0..self.shape.len()).map(|a| self.dim(a)).collect()
    }

    /// The number of elements (`dim`'s product).
    pub fn numel(&self) -> Ext {
        Ext::product(&self.dims())
    }
}

/// The declaration of the arena's f16 view (`Operand::f16_view`) for a kernel reading
/// `operands`: there where one of them is read through it, else nothing.
pub(crate) fn f16_view_decl(operands: &[&Operand]) -> &'static str {
    if operands.iter().any(|o| o.f16_view) {
        "var<storage, read> arena_h: array<f16>;\n"
    } else {
        ""
    }
}

/// The WGSL expression of an operand's first word.
pub(crate) fn base(o: &Operand) -> String {
    match o.slot {
        Some(w) => format!("params.p[{}].{}", w / 4, ["x", "y", "z", "w"][w % 4]),
        None => format!("{}u", o.offset),
    }
}

pub(crate) fn load(o: &Operand, index: &str) -> String {
    if let Some(sl) = &o.sliced {
        // Element i of the view: (outer, a, inner) → (outer, start + a, inner) in the value.
        let dims = o.dims();
        let inner = Ext::product(&dims[sl.axis + 1..]);
        let len = &dims[sl.axis];
        let at = format!(
            "((({index}) / {span}) * {full_span} + (({index}) / {inner}) % {len} * {inner} \
             + {offset} + ({index}) % {inner})",
            span = len.mul(&inner),
            full_span = sl.full.mul(&inner),
            offset = inner.times(sl.start),
        );
        return load(&Operand { sliced: None, ..o.clone() }, &at);
    }
    if o.summed > 1 {
        // Partial `s` of element `i` is at `s · numel + i`.
        let (n, one) = (o.numel(), Operand { summed: 0, ..o.clone() });
        let terms: Vec<String> =
            (0..o.summed).map(|s| load(&one, &format!("{} + ({index})", n.times(s)))).collect();
        return format!("({})", terms.join(" + "));
    }
    if let Some(p) = o.packed {
        // A rounded view of a dequantized one rounds the decoded value.
        let f = crate::packed::load(p, &base(o), index);
        return if o.rounded { crate::halves::round(o.dtype, &f) } else { f };
    }
    if !o.dtype.is_float() {
        return format!("bitcast<i32>(arena[{} + {index}])", base(o));
    }
    let f = fetch_word(o, index);
    word_value(o, &f.word, f.shift.as_deref().unwrap_or("0u"))
}

/// A load split in two, for kernels that prefetch the next panel into registers while they
/// multiply the current one: `word` is the arena word holding the element, and nothing is
/// computed from it until `word_value` turns it into the f32 when the panel is staged. A
/// conversion (rounding a rounded view, unpacking a half) applied as the word arrives would
/// make the invocation wait for the load right there, before the products that should hide it.
pub(crate) struct Fetched {
    /// The u32 word expression.
    pub word: String,
    /// For a half value: the expression of the bit offset of the element within its word (it
    /// depends on the index alone, not on the load).
    pub shift: Option<String>,
    /// The register's value past the matrices' edges: 0 of the register's type.
    pub zero: &'static str,
}

/// The word holding element `index` of the float operand `o` (see `Fetched`).
pub(crate) fn fetch_word(o: &Operand, index: &str) -> Fetched {
    debug_assert!(o.summed <= 1, "a summed view is read only through `load`");
    debug_assert!(o.sliced.is_none(), "a sliced view is read only through `load`");
    debug_assert!(!(o.f16_view && o.packed.is_some()), "packed words are no f16 view");
    if let Some(p) = o.packed {
        // A packed element is decoded as it is fetched: its scale and its bits lie in
        // different words, so the register holds the f32 (a rounded view's, before rounding).
        let word = format!("bitcast<u32>({})", crate::packed::load(p, &base(o), index));
        Fetched { word, shift: None, zero: zero(o) }
    } else if o.f16_view {
        let word = format!("arena_h[2u * {} + ({index})]", base(o));
        Fetched { word, shift: None, zero: zero(o) }
    } else if o.packs_halves() {
        Fetched {
            word: format!("arena[{} + (({index}) >> 1u)]", base(o)),
            shift: Some(format!("((({index}) & 1u) * 16u)")),
            zero: zero(o),
        }
    } else {
        Fetched { word: format!("arena[{} + {index}]", base(o)), shift: None, zero: zero(o) }
    }
}

/// 0 in the type of the register `fetch_word` fills for `o` (0.0 in every float type).
pub(crate) fn zero(o: &Operand) -> &'static str {
    if o.f16_view {
        "0.0h"
    } else {
        "0u"
    }
}

/// The f32 value of a word `fetch_word` gave for `o`, held in `word` (and its bit offset in
/// `shift`, for a half value): what `load` of the same element gives (`load` is the two
/// halves together).
pub(crate) fn word_value(o: &Operand, word: &str, shift: &str) -> String {
    if o.f16_view {
        return format!("f32({word})");
    }
    match o.dtype {
        d if d.is_half() && o.rounded => crate::halves::round(d, &format!("bitcast<f32>({word})")),
        d if d.is_half() => crate::halves::value(d, &format!("({word} >> {shift})")),
        _ => format!("bitcast<f32>({word})"),
    }
}

/// `word_value` as an f16 (an f16 kernel's staged panel element): an element of the f16 view
/// as it came, an f16 rounded view's f32 rounded straight to f16 (`halves::staged_f16`), any
/// other converted.
pub(crate) fn word_half(o: &Operand, word: &str, shift: &str) -> String {
    if o.f16_view {
        word.to_string()
    } else if o.rounded && o.dtype == DType::F16 {
        crate::halves::staged_f16(&format!("bitcast<f32>({word})"))
    } else {
        format!("f16({})", word_value(o, word, shift))
    }
}

/// The statement storing `value` as element `index` of `out`. A half result is stored only by
/// the per-element kernels of `per_element`, a word at a time (`crate::halves`).
pub(crate) fn store(out: &Operand, index: &str, value: &str) -> String {
    let mapped;
    let index = match &out.permuted {
        Some(p) => {
            mapped = p.index(index);
            &mapped
        }
        None => index,
    };
    match out.dtype {
        d if d.is_half() => crate::halves::store(index, value),
        d if d.is_float() => {
            format!("arena[{} + {index}] = bitcast<u32>(f32({value}));", base(out))
        }
        _ => format!("arena[{} + {index}] = bitcast<u32>(i32({value}));", base(out)),
    }
}
