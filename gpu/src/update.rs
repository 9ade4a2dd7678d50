//! Kernels that update state in place at the end of a training submission: the optimizer (SGD
//! with or without momentum, Adam, AdamW, global-norm clipping) and batch norm's running
//! statistics. They follow `optim.rs` and `cpu::batch_norm_update` (PyTorch's formulas), in f32.
//!
//! Unlike the per-step kernels these take their offsets and sizes from the parameter block, so
//! one pipeline serves every parameter (a model has hundreds) — only the scalars differ.
//!
//! Parameter block (32 words as 8 × vec4<u32>):
//! - update: p[0] = (param, grad, m, v offsets), p[1] = (n, first update of the momentum buffer),
//!   p[2] = f32 (lr, beta1, beta2, eps), p[3] = f32 (lr / bias correction 1, √bias correction 2,
//!   weight decay, momentum).
//! - squared norm: p[0] = (grad offset, n, first partial-sum word).
//!
//! A plan that scales its loss also sums the squares (its global norm tells whether every
//! gradient is finite): the norm kernel writes a verdict word, 0 when one is not, and the
//! updates leave every parameter and its state as they were.
//! - running statistics: p[0] = (x, running mean, running var offsets), p[1] = (batch, channels,
//!   spatial size), p[2].x = f32 momentum.

use mgn_ir::optim::{lr_at, OptimizerKind, OptimizerSpec};

/// Elements each invocation of the squared-norm kernel sums before the workgroup reduction.
pub const NORM_ITEMS: u32 = 16;

fn linear(width: u32) -> String {
    format!("let i = gid.x + (gid.y + gid.z * groups.y) * groups.x * {width}u;")
}

const HEADER: &str =
    "@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>";

/// The update kernel for `spec`'s kind. `scale_word`: where the clipping factor is (None: 1);
/// `verdict_word`: where the global norm's verdict is (the update happens only where it is not
/// 0).
pub fn update_kernel(
    spec: &OptimizerSpec,
    width: u32,
    scale_word: Option<usize>,
    verdict_word: Option<usize>,
) -> String {
    let scale = scale_word.map_or("1.0".to_string(), |w| format!("bitcast<f32>(arena[{w}u])"));
    let skip =
        verdict_word.map_or(String::new(), |w| format!("if (arena[{w}u] == 0u) {{ return; }}"));
    let plain_sgd = matches!(spec.kind, OptimizerKind::Sgd { momentum } if momentum == 0.0);
    let rule = match spec.kind {
        _ if plain_sgd => "w = w - h.x * g;".to_string(),
        OptimizerKind::Sgd { .. } => "var buf = g;
    if (q1.y == 0u) { buf = k.w * bitcast<f32>(arena[q0.z + i]) + g; }
    arena[q0.z + i] = bitcast<u32>(buf);
    w = w - h.x * buf;"
            .to_string(),
        OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => "w = w * (1.0 - h.x * k.z);
    let m = h.y * bitcast<f32>(arena[q0.z + i]) + (1.0 - h.y) * g;
    let v = h.z * bitcast<f32>(arena[q0.w + i]) + (1.0 - h.z) * g * g;
    arena[q0.z + i] = bitcast<u32>(m);
    arena[q0.w + i] = bitcast<u32>(v);
    w = w - k.x * m / (sqrt(v) / k.y + h.w);"
            .to_string(),
    };
    format!(
        "@compute @workgroup_size({width})
fn main({HEADER}) {{
    {lin}
    let q0 = params.p[0];
    let q1 = params.p[1];
    if (i >= q1.x) {{ return; }}
    {skip}
    let h = bitcast<vec4<f32>>(params.p[2]);
    let k = bitcast<vec4<f32>>(params.p[3]);
    let g = bitcast<f32>(arena[q0.y + i]) * {scale};
    var w = bitcast<f32>(arena[q0.x + i]);
    {rule}
    arena[q0.x + i] = bitcast<u32>(w);
}}
",
        lin = linear(width)
    )
}

/// The per-update scalars of the parameter block (words 8..16) for update number `step`.
pub fn update_scalars(spec: &OptimizerSpec, step: u64) -> [f32; 8] {
    let lr = lr_at(spec, step);
    match spec.kind {
        OptimizerKind::Sgd { momentum } => {
            [lr as f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, momentum as f32]
        }
        OptimizerKind::Adam { beta1, beta2, eps }
        | OptimizerKind::AdamW { beta1, beta2, eps, .. } => {
            let wd = match spec.kind {
                OptimizerKind::AdamW { weight_decay, .. } => weight_decay,
                _ => 0.0,
            };
            let bc1 = 1.0 - beta1.powf(step as f64);
            let bc2_sqrt = (1.0 - beta2.powf(step as f64)).sqrt();
            [
                lr as f32,
                beta1 as f32,
                beta2 as f32,
                eps as f32,
                (lr / bc1) as f32,
                bc2_sqrt as f32,
                wd as f32,
                0.0,
            ]
        }
    }
}

/// Whether the kind keeps a first (m) and second (v) moment buffer per parameter.
pub fn buffers(spec: &OptimizerSpec) -> (bool, bool) {
    match spec.kind {
        OptimizerKind::Sgd { momentum } => (momentum != 0.0, false),
        OptimizerKind::Adam { .. } | OptimizerKind::AdamW { .. } => (true, true),
    }
}

/// Workgroups the squared-norm kernel needs for `n` elements.
pub fn norm_groups(n: usize, width: u32) -> usize {
    n.div_ceil((width * NORM_ITEMS) as usize).max(1)
}

/// Sums the squares of one gradient: each workgroup writes one partial sum.
pub fn sum_squares_kernel(width: u32) -> String {
    format!(
        "var<workgroup> part: array<f32, {width}>;
@compute @workgroup_size({width})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, \
    @builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
    let q = params.p[0];
    let group = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    let base = group * {chunk}u + lid.x;
    var acc = 0.0;
    for (var t = 0u; t < {items}u; t = t + 1u) {{
        let e = base + t * {width}u;
        if (e < q.y) {{
            let g = bitcast<f32>(arena[q.x + e]);
            acc = acc + g * g;
        }}
    }}
    part[lid.x] = acc;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid.x < s && lid.x + s < {width}u) {{ part[lid.x] = part[lid.x] + part[lid.x + s]; }}
        workgroupBarrier();
    }}
    let groups_needed = (q.y + {chunk}u - 1u) / {chunk}u;
    if (lid.x == 0u && group < groups_needed) {{ arena[q.z + group] = bitcast<u32>(part[0]); }}
}}
",
        chunk = width * NORM_ITEMS,
        items = NORM_ITEMS,
        half = width.next_power_of_two() / 2,
    )
}

/// Where the global norm's kernel finds and leaves its words.
pub struct NormWords {
    /// The first of the partial sums of squares.
    pub partials: usize,
    /// Where the factor every gradient is multiplied by goes.
    pub factor: usize,
    /// Where the verdict goes (loss scaling): 1 when every gradient is finite, else 0.
    pub verdict: Option<usize>,
    /// The loss scale the gradients carry (loss scaling): the factor divides it out.
    pub scale: Option<usize>,
}

/// One workgroup: sums `count` partial sums, writes the factor `min(1, clip / (norm + 1e-6)) /
/// S` (without `clip`, `1 / S`; without a loss scale, S = 1) of the gradients' true norm
/// `norm = √Σ / S`, and the verdict. A sum of squares overflows f32 only past gradients of
/// about 1e19, which count as not finite too.
pub fn clip_scale_kernel(width: u32, count: usize, clip: Option<f64>, w: &NormWords) -> String {
    let scale = w.scale.map_or("1.0".to_string(), |s| format!("bitcast<f32>(arena[{s}u])"));
    let factor = match clip {
        Some(c) => format!("min(1.0, {:?} / (sqrt(part[0]) / s + 1e-6)) / s", c as f32),
        None => "1.0 / s".to_string(),
    };
    // Finite when the exponent's bits are not all ones (no isinf or isnan in WGSL).
    let verdict = w.verdict.map_or(String::new(), |v| {
        format!(
            "arena[{v}u] = select(0u, 1u, (bitcast<u32>(part[0]) & 0x7f800000u) != 0x7f800000u);"
        )
    });
    let (partials, scale_word) = (w.partials, w.factor);
    format!(
        "var<workgroup> part: array<f32, {width}>;
@compute @workgroup_size({width})
fn main(@builtin(local_invocation_id) lid: vec3<u32>) {{
    var acc = 0.0;
    for (var e = lid.x; e < {count}u; e = e + {width}u) {{
        acc = acc + bitcast<f32>(arena[{partials}u + e]);
    }}
    part[lid.x] = acc;
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid.x < s && lid.x + s < {width}u) {{ part[lid.x] = part[lid.x] + part[lid.x + s]; }}
        workgroupBarrier();
    }}
    if (lid.x == 0u) {{
        let s = {scale};
        arena[{scale_word}u] = bitcast<u32>({factor});
        {verdict}
    }}
}}
",
        half = width.next_power_of_two() / 2,
    )
}

/// Batch norm's running statistics, one workgroup per channel: the batch mean and the unbiased
/// batch variance, blended by momentum. Parameters: words `x, running_mean, running_var,
/// chunk`, then `n, c, spatial size, chunks`. With no chunks, from x itself (shifted by the
/// channel's first element for accuracy); with chunks, from x's `GpuOp::BatchMoments` (the
/// first word then names them), combined as the norm combines them.
pub fn running_stats_kernel(width: u32) -> String {
    format!(
        "var<workgroup> s1: array<f32, {width}>;
var<workgroup> s2: array<f32, {width}>;
fn reduce(lid: u32) {{
    workgroupBarrier();
    for (var s = {half}u; s > 0u; s = s >> 1u) {{
        if (lid < s && lid + s < {width}u) {{
            s1[lid] = s1[lid] + s1[lid + s];
            s2[lid] = s2[lid] + s2[lid + s];
        }}
        workgroupBarrier();
    }}
}}
@compute @workgroup_size({width})
fn main(@builtin(local_invocation_id) lid: vec3<u32>, \
    @builtin(workgroup_id) wg: vec3<u32>, \
    @builtin(num_workgroups) groups: vec3<u32>) {{
    let q0 = params.p[0];
    let q1 = params.p[1];
    let c = wg.x + (wg.y + wg.z * groups.y) * groups.x;
    if (c >= q1.y) {{ return; }}
    let count = q1.x * q1.z;
    let cnt = f32(count);
    var mean = 0.0;
    var var_b = 0.0;
    if (q1.w == 0u) {{
        let shift = bitcast<f32>(arena[q0.x + c * q1.z]);
        var a = 0.0;
        var b = 0.0;
        for (var j = lid.x; j < count; j = j + {width}u) {{
            let n = j / q1.z;
            let d = bitcast<f32>(arena[q0.x + (n * q1.y + c) * q1.z + j % q1.z]) - shift;
            a = a + d;
            b = b + d * d;
        }}
        s1[lid.x] = a;
        s2[lid.x] = b;
        reduce(lid.x);
        let mean_d = s1[0] / cnt;
        mean = shift + mean_d;
        var_b = max(s2[0] / cnt - mean_d * mean_d, 0.0);
    }} else {{
        // Chunk j holds (its mean, its Σ(x − mean)²) over min(chunk, count − j·chunk) values.
        let at = q0.x + c * q1.w * 2u;
        var a = 0.0;
        for (var j = lid.x; j < q1.w; j = j + {width}u) {{
            a = a + f32(min(q0.w, count - j * q0.w)) * bitcast<f32>(arena[at + 2u * j]);
        }}
        s1[lid.x] = a;
        s2[lid.x] = 0.0;
        reduce(lid.x);
        mean = s1[0] / cnt;
        workgroupBarrier();
        var b = 0.0;
        for (var j = lid.x; j < q1.w; j = j + {width}u) {{
            let d = bitcast<f32>(arena[at + 2u * j]) - mean;
            let nj = f32(min(q0.w, count - j * q0.w));
            b = b + bitcast<f32>(arena[at + 2u * j + 1u]) + nj * d * d;
        }}
        s1[lid.x] = 0.0;
        s2[lid.x] = b;
        reduce(lid.x);
        var_b = s2[0] / cnt;
    }}
    if (lid.x == 0u) {{
        var unbiased = var_b;
        if (count > 1u) {{ unbiased = var_b * cnt / (cnt - 1.0); }}
        let mom = bitcast<f32>(params.p[2].x);
        let rm = bitcast<f32>(arena[q0.y + c]);
        let rv = bitcast<f32>(arena[q0.z + c]);
        arena[q0.y + c] = bitcast<u32>((1.0 - mom) * rm + mom * mean);
        arena[q0.z + c] = bitcast<u32>((1.0 - mom) * rv + mom * unbiased);
    }}
}}
",
        half = width.next_power_of_two() / 2,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validate(body: &str) {
        crate::kernels::validate(body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    }

    #[test]
    fn every_update_kernel_is_valid_wgsl() {
        for kind in [
            OptimizerKind::Sgd { momentum: 0.0 },
            OptimizerKind::Sgd { momentum: 0.9 },
            OptimizerKind::Adam { beta1: 0.9, beta2: 0.999, eps: 1e-8 },
            OptimizerKind::AdamW { beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1 },
        ] {
            let spec = OptimizerSpec { kind, ..Default::default() };
            for width in [64, 128, 256] {
                validate(&update_kernel(&spec, width, None, None));
                validate(&update_kernel(&spec, width, Some(12), None));
                validate(&update_kernel(&spec, width, Some(12), Some(13)));
            }
        }
        for width in [64, 100, 128, 256] {
            validate(&sum_squares_kernel(width));
            let plain = NormWords { partials: 40, factor: 3, verdict: None, scale: None };
            validate(&clip_scale_kernel(width, 7, Some(1.0), &plain));
            let scaled = NormWords { verdict: Some(4), scale: Some(5), ..plain };
            validate(&clip_scale_kernel(width, 7, Some(1.0), &scaled));
            validate(&clip_scale_kernel(width, 7, None, &scaled));
            validate(&running_stats_kernel(width));
        }
    }
}
