//! The softmax family: `Op::Softmax`, `Op::SoftmaxGrad` and `GpuOp::AttentionProbs`. Each row
//! of the softmax axis belongs to `lanes` invocations of one workgroup, several rows to a
//! workgroup when rows are short: attention's rows of 128 keys on a workgroup each left half of
//! it idle behind two 8-step reduction trees, and read every score three times from memory.
//! A row of at most `HELD_MAX` elements a lane is read once into registers and reduced by trees
//! over its own lanes; a longer row (or one whose length follows a dynamic plan's sizes) is
//! walked once per pass.

use super::{broadcast_at, load, store, Ext, KernelSource, Operand};

/// Elements a lane aims to hold: rows short enough to need fewer lanes than the workgroup get
/// `len / HELD_AIM` lanes (a power of two), so that a workgroup holds several rows.
const HELD_AIM: usize = 4;
/// The most elements a lane holds in registers; a longer row is walked in loops.
const HELD_MAX: usize = 16;

/// How a kernel covers one row: its lanes, and the elements each lane holds (0 when it walks
/// the row in loops instead).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    lanes: usize,
    held: usize,
}

impl Spread {
    fn of(len: &Ext, width: usize) -> Spread {
        if !len.is_fixed() {
            // One source at every size: the row is walked, a workgroup to a row.
            return Spread { lanes: width, held: 0 };
        }
        let lanes = len.n.div_ceil(HELD_AIM).max(1).next_power_of_two().min(width);
        let held = len.n.div_ceil(lanes);
        if held > HELD_MAX {
            Spread { lanes: width, held: 0 }
        } else {
            Spread { lanes, held }
        }
    }
}

/// One row's walk: its elements `t < len` lie at `base + t · stride`, and `values` are read at
/// each of them (a name and an expression of the element's index `e`).
struct Walk<'a> {
    spread: Spread,
    len: &'a Ext,
    stride: &'a Ext,
    values: Vec<(&'static str, String)>,
}

impl Walk<'_> {
    /// Reads the held values (nothing when the row is walked in loops).
    fn hold(&self) -> String {
        let mut s = String::new();
        for j in 0..self.spread.held {
            s += &format!(
                "let t{j} = lane + {}u;\n    let e{j} = base + t{j} * {};\n    ",
                j * self.spread.lanes,
                self.stride
            );
            for (name, expr) in &self.values {
                let read = expr.replace("{e}", &format!("e{j}"));
                if self.in_range(j) {
                    s += &format!("let {name}{j} = {read};\n    ");
                } else {
                    s += &format!(
                        "var {name}{j} = 0.0;\n    if (t{j} < {}) {{ {name}{j} = {read}; }}\n    ",
                        self.len
                    );
                }
            }
        }
        s
    }

    /// Whether held element `j` is inside every row (its guard can go).
    fn in_range(&self, j: usize) -> bool {
        (j + 1) * self.spread.lanes <= self.len.n
    }

    /// `body` at each of this lane's elements, given the element's position `t`, its index `e`
    /// and its values (held registers, or loads).
    fn each(&self, body: impl Fn(&str, &str, &[String]) -> String) -> String {
        if self.spread.held == 0 {
            let vals: Vec<String> =
                self.values.iter().map(|(_, expr)| expr.replace("{e}", "e")).collect();
            return format!(
                "for (var t = lane; t < {len}; t = t + {l}u) {{\n        \
                 let e = base + t * {stride};\n        {}\n    }}\n    ",
                body("t", "e", &vals),
                len = self.len,
                l = self.spread.lanes,
                stride = self.stride,
            );
        }
        let mut s = String::new();
        for j in 0..self.spread.held {
            let vals: Vec<String> =
                self.values.iter().map(|(name, _)| format!("{name}{j}")).collect();
            let b = body(&format!("t{j}"), &format!("e{j}"), &vals);
            if self.in_range(j) {
                s += &format!("{b}\n    ");
            } else {
                s += &format!("if (t{j} < {}) {{ {b} }}\n    ", self.len);
            }
        }
        s
    }
}

/// `let {name}` = the combination (`max` or `+`) of `value` over this row's lanes, for every
/// lane. Runs in uniform control flow (it has barriers).
fn across(name: &str, value: &str, max: bool, lanes: usize) -> String {
    let merge =
        |a: &str, b: &str| if max { format!("max({a}, {b})") } else { format!("{a} + {b}") };
    let mut s = format!("red[lid] = {value};\n    workgroupBarrier();\n    ");
    let mut half = lanes / 2;
    while half >= 1 {
        s += &format!(
            "if (lane < {half}u) {{ red[lid] = {}; }}\n    workgroupBarrier();\n    ",
            merge("red[lid]", &format!("red[lid + {half}u]"))
        );
        half /= 2;
    }
    // The barrier after the read: the next combination overwrites `red`.
    s += &format!("let {name} = red[lid - lane];\n    workgroupBarrier();\n    ");
    s
}

/// The kernel of `rows` rows, `width / lanes` to a workgroup: `r` is this lane's row (the
/// last one for lanes past the end, which compute it again and store nothing: `live`), and
/// workgroups holding no row leave together, before any barrier.
fn kernel(rows: &Ext, spread: Spread, width: usize, body: &str) -> KernelSource {
    let per = width / spread.lanes;
    let groups = rows.n.div_ceil(per);
    KernelSource {
        body: format!(
            "var<workgroup> red: array<f32, {width}>;
@compute @workgroup_size({width})
fn main(@builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) grid: vec3<u32>, \
    @builtin(local_invocation_index) lid: u32) {{
    let g = wg.x + (wg.y + wg.z * grid.y) * grid.x;
    if (g * {per}u >= {rows}) {{ return; }}
    let lane = lid % {lanes}u;
    let row = g * {per}u + lid / {lanes}u;
    let live = row < {rows};
    let r = min(row, {rows} - 1u);
    {body}
}}
",
            lanes = spread.lanes,
        ),
        invocations: groups as u64 * width as u64,
        dropout_node: None,
        width: None,
    }
}

/// The first element of row `r` along `axis`, the row length and the stride between elements.
fn row_of(shape: &[Ext], axis: usize) -> (String, Ext, Ext) {
    let stride = Ext::strides(shape)[axis].clone();
    let len = shape[axis].clone();
    // Rows are numbered outer-major: r = outer · stride + inner.
    (format!("(r / {stride}) * {} + r % {stride}", len.mul(&stride)), len, stride)
}

/// The number of rows along `axis`: the product of the other axes.
fn rows_of(shape: &[Ext], axis: usize) -> Ext {
    Ext::product(shape.iter().enumerate().filter(|(a, _)| *a != axis).map(|(_, d)| d))
}

/// `m`, the row's greatest `z` among its elements where `counted` holds, and `s`, the sum of
/// `exp(z − m)` over them.
fn max_and_sum(
    w: &Walk,
    z: &dyn Fn(&[String]) -> String,
    counted: &dyn Fn(&str) -> String,
) -> String {
    let lanes = w.spread.lanes;
    let mut s = String::from("var mi = -3.4028235e38;\n    ");
    s += &w.each(|t, _, v| format!("if ({}) {{ mi = max(mi, {}); }}", counted(t), z(v)));
    s += &across("m", "mi", true, lanes);
    s += "var si = 0.0;\n    ";
    s += &w.each(|t, _, v| format!("if ({}) {{ si = si + exp({} - m); }}", counted(t), z(v)));
    s += &across("s", "si", false, lanes);
    s
}

pub(super) fn softmax(
    axis: usize,
    log: bool,
    x: &Operand,
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let dims = x.dims();
    let (base, len, stride) = row_of(&dims, axis);
    let width = width as usize;
    let spread = Spread::of(&len, width);
    let w = Walk { spread, len: &len, stride: &stride, values: vec![("x", load(x, "{e}"))] };
    let z = |v: &[String]| v[0].clone();
    let mut body = format!("let base = {base};\n    {}", w.hold());
    body += &max_and_sum(&w, &z, &|_| "true".into());
    body += "if (live) {\n    ";
    body += &w.each(|_, e, v| {
        let result =
            if log { format!("{} - m - log(s)", v[0]) } else { format!("exp({} - m) / s", v[0]) };
        store(out, e, &result)
    });
    body += "}";
    Ok(kernel(&rows_of(&dims, axis), spread, width, &body))
}

pub(super) fn softmax_grad(
    axis: usize,
    log: bool,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let (y, dy) = (&inputs[0], &inputs[1]);
    let dims = y.dims();
    let (base, len, stride) = row_of(&dims, axis);
    let width = width as usize;
    let spread = Spread::of(&len, width);
    let values = vec![("y", load(y, "{e}")), ("dy", load(dy, "{e}"))];
    let w = Walk { spread, len: &len, stride: &stride, values };
    // log: dx = dy − softmax(x)·Σdy with softmax(x) = exp(y); else dx = y·(dy − Σ dy·y).
    let term = |v: &[String]| if log { v[1].clone() } else { format!("{} * {}", v[1], v[0]) };
    let mut body = format!("let base = {base};\n    {}var si = 0.0;\n    ", w.hold());
    body += &w.each(|_, _, v| format!("si = si + {};", term(v)));
    body += &across("s", "si", false, spread.lanes);
    body += "if (live) {\n    ";
    body += &w.each(|_, e, v| {
        let result = if log {
            format!("{} - exp({}) * s", v[1], v[0])
        } else {
            format!("{} * ({} - s)", v[0], v[1])
        };
        store(out, e, &result)
    });
    body += "}";
    Ok(kernel(&rows_of(&dims, axis), spread, width, &body))
}

/// `GpuOp::AttentionProbs`: rows of scaled scores `[..B, H, Tq, Tk]`, the mask broadcast to
/// them; keys hidden by `causal` take no probability and a row that sees no key (all hidden,
/// or all `-inf`) is all zeros, as `Op::Attention` has it on the CPU.
pub(super) fn attention_probs(
    causal: bool,
    inputs: &[Operand],
    out: &Operand,
    width: u32,
) -> Result<KernelSource, String> {
    let scores = &inputs[0];
    let r = scores.shape.len();
    if r < 2 || out.shape != scores.shape {
        return Err(format!("attention probabilities of {:?} as {:?}", scores.shape, out.shape));
    }
    let dims = scores.dims();
    let (tq, tk) = (&dims[r - 2], &dims[r - 1]);
    let mut z = load(scores, "{e}");
    if let Some(mask) = inputs.get(1) {
        mgn_ir::shape::broadcast_strides(&mask.shape, &scores.shape)
            .map_err(|e| format!("attention mask: {e}"))?;
        z = format!("({z} + {})", load(mask, &broadcast_at("{e}", &dims, &mask.dims())));
    }
    let width = width as usize;
    let spread = Spread::of(tk, width);
    let one = Ext::lit(1);
    let w = Walk { spread, len: tk, stride: &one, values: vec![("z", z)] };
    // Key t is visible to query i when t + Tq <= i + Tk (causal keys end-aligned).
    let visible = |t: &str| {
        if causal {
            format!("{t} + {tq} <= r % {tq} + {tk}")
        } else {
            "true".into()
        }
    };
    let mut body = format!("let base = r * {tk};\n    {}", w.hold());
    body += &max_and_sum(&w, &|v| v[0].clone(), &visible);
    body += "if (live) {\n    ";
    body += &w.each(|t, e, v| {
        let p = format!("select(0.0, exp({} - m) / s, ({}) && s > 0.0)", v[0], visible(t));
        store(out, e, &p)
    });
    body += "}";
    Ok(kernel(&rows_of(&dims, r - 1), spread, width, &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_share_a_workgroup_and_long_ones_are_walked() {
        let s = |len: usize| Spread::of(&Ext::lit(len), 256);
        // Attention's 128 keys: 32 lanes of 4, eight rows a workgroup.
        assert_eq!(s(128), Spread { lanes: 32, held: 4 });
        assert_eq!(s(1), Spread { lanes: 1, held: 1 });
        assert_eq!(s(5), Spread { lanes: 2, held: 3 });
        // Whisper's 1,500: the whole workgroup, six each.
        assert_eq!(s(1500), Spread { lanes: 256, held: 6 });
        assert_eq!(s(4096), Spread { lanes: 256, held: 16 });
        assert_eq!(s(4097), Spread { lanes: 256, held: 0 });
        assert_eq!(Spread::of(&Ext::lit(300), 128), Spread { lanes: 128, held: 3 });
    }
}
