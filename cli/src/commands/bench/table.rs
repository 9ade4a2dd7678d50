//! The report as a text table: the timings, GPU setup, memory per plan, profiles and notes.

use super::inputs::describe;
use super::measure::Timing;
use super::results::{timing_basis, Memory, Profiled, Report, Setup};
use super::BenchArgs;
use mgn_ir::units::bytes;

/// Milliseconds to four or five significant digits.
fn ms(x: f64) -> String {
    match x {
        x if x >= 100.0 => format!("{x:.1}"),
        x if x >= 1.0 => format!("{x:.3}"),
        x => format!("{x:.4}"),
    }
}

/// The whole report: what was measured where, the timings, GPU setup, memory, profiles and
/// notes.
pub(super) fn table(r: &Report, a: &BenchArgs) -> String {
    let mut out = header(r, a);
    let (timings, w) = timings(r);
    out += &timings;
    if let Some(s) = &r.setup {
        out += &gpu_setup(s);
    }
    // The memory table's first column lines up with the timings' above it.
    out += &memory(r, w);
    for (plan, p) in &r.profile {
        out += &profile(plan, p, a.peaks());
    }
    if !r.notes.is_empty() {
        out += "\nnotes:\n";
        for n in &r.notes {
            out += &format!("  - {n}\n");
        }
    }
    out
}

/// The model, where it ran, its config and how the times were taken; then a blank line.
fn header(r: &Report, a: &BenchArgs) -> String {
    let mut out = String::new();
    let config = r.config.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ");
    out += &format!(
        "{} ({}, {}) on {}, backend {}, precision {}\n",
        r.model,
        a.file.display(),
        r.counts.describe(),
        r.device,
        r.backend,
        mgn_ir::precision::Precision::from(a.precision)
    );
    out += &format!("config: {config}\n");
    out += &format!(
        "wall-clock ms per call: median and interquartile range (p25–p75) of {} calls after {} \
         warm-up calls\n",
        a.samples, a.warmup
    );
    if r.backend != "cpu" {
        out += &format!(
            "GPU timing: {}\n",
            timing_basis(r.backend).trim_start_matches("wall clock around each call: ")
        );
    }
    out += "\n";
    out
}

/// One row per measurement (a dash for those not taken), and the width of the name column.
fn timings(r: &Report) -> (String, usize) {
    let mut out = String::new();
    let mut rows: Vec<(String, Option<Timing>)> = vec![
        ("compile (check, elaborate, lower)".into(), Some(r.compile)),
        ("compile, training plan (+ autodiff)".into(), r.compile_train),
        ("forward".into(), Some(r.forward)),
    ];
    match &r.minimal {
        Some((s, t, _)) => rows.push((format!("forward at {}", describe(s)), Some(*t))),
        None => rows.push(("forward, minimal shape".into(), None)),
    }
    rows.push(("forward + loss + backward".into(), r.forward_backward));
    rows.push((format!("training step ({})", r.optimizer), r.train_step));
    let w = rows.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0).max(12);
    out += &format!("{:<w$}  {:>10}  {:>10}  {:>10}\n", "measurement", "median", "p25", "p75");
    for (name, t) in &rows {
        match t {
            Some(t) => {
                out += &format!(
                    "{name:<w$}  {:>10}  {:>10}  {:>10}\n",
                    ms(t.median_ms),
                    ms(t.p25_ms),
                    ms(t.p75_ms)
                )
            }
            None => out += &format!("{name:<w$}  {:>10}  {:>10}  {:>10}\n", "—", "", ""),
        }
    }
    (out, w)
}

fn gpu_setup(s: &Setup) -> String {
    let mut parts = vec![format!("inference {} ms", ms(s.inference))];
    parts.extend(s.minimal.map(|m| format!("minimal {} ms", ms(m))));
    parts.extend(s.training.map(|m| format!("training {} ms", ms(m))));
    format!(
        "\nGPU session setup (kernels, arena, parameter upload; one call each): {}\n",
        parts.join(", ")
    )
}

/// A row of the memory table: its label, and its value from one plan's memory and optimizer
/// state (none where the row does not apply).
type MemoryLine<'a> = (&'a str, &'a dyn Fn(&Memory, Option<u64>) -> Option<u64>);

/// One column per plan measured, one line per figure; the name column at least `w` wide.
fn memory(r: &Report, w: usize) -> String {
    let mut out = String::new();
    let mut cols: Vec<(String, Memory, Option<u64>)> = vec![("inference".into(), r.memory, None)];
    if let Some((_, _, m)) = &r.minimal {
        cols.push(("minimal".into(), *m, None));
    }
    if let Some((m, o)) = &r.memory_train {
        cols.push(("training".into(), *m, Some(*o)));
    }
    let lines: [MemoryLine; 10] = [
        ("parameters", &|m, _| Some(m.plan.param_bytes)),
        ("inputs", &|m, _| Some(m.plan.input_bytes)),
        ("logical (every step's value, no reuse)", &|m, _| Some(m.plan.logical_bytes)),
        ("planned arena, inputs and values (reused)", &|m, _| Some(m.arena_values_bytes)),
        ("peak live (free after last use), the lower bound", &|m, _| Some(m.plan.peak_live_bytes)),
        ("planned arena, total (parameters included)", &|m, _| Some(m.arena_bytes)),
        ("optimizer state", &|_, o| o),
        ("GPU arena as run: parameters as held", &|m, _| m.gpu.map(|g| g.params)),
        ("GPU arena as run: inputs and values", &|m, _| m.gpu.map(|g| g.values)),
        ("GPU arena as run: total (optimizer state included)", &|m, _| m.gpu.map(|g| g.total)),
    ];
    let w = lines.iter().map(|(n, _)| n.chars().count()).max().unwrap_or(0).max(w);
    out += &format!("\n{:<w$}", "memory");
    for (c, _, _) in &cols {
        out += &format!("  {c:>10}");
    }
    out += "\n";
    for (name, get) in lines {
        if name == "optimizer state" && r.memory_train.is_none() {
            continue;
        }
        if name.starts_with("GPU arena") && cols.iter().all(|(_, m, _)| m.gpu.is_none()) {
            continue;
        }
        out += &format!("{name:<w$}");
        for (_, m, o) in &cols {
            out += &format!("  {:>10}", get(m, *o).map_or("—".into(), bytes));
        }
        out += "\n";
    }
    out
}

/// `--profile`: one plan's GPU time per op family (the 12 largest) with the rates they reach
/// and, given the device's (`peaks`, FLOP/s and bytes/s), how far each is above its floor;
/// then the plan's 8 slowest dispatches.
fn profile(plan: &str, p: &Profiled, peaks: Option<(f64, f64)>) -> String {
    let mut out = String::new();
    let total: f64 = p.by_op.iter().map(|(_, _, ms)| ms).sum();
    out += &format!(
        "\nGPU time by op, {plan} (one run, timestamps around each dispatch in its own pass; \
         total {total:.2} ms):\n"
    );
    out += &format!(
        "  {:<48}{:>9}{:>11}{:>10}{:>9}{}\n",
        "op family",
        "GPU ms",
        "share",
        "TFLOP/s",
        "GB/s",
        if peaks.is_some() {
            format!("{:>11}{:>10}", "floor ms", "of floor")
        } else {
            String::new()
        }
    );
    let floors = peaks.map(|pk| p.floor_ms_by_op(pk));
    for (i, ((op, n, ms), w)) in p.by_op.iter().zip(p.work_by_op()).enumerate().take(12) {
        let s = ms / 1e3;
        out += &format!(
            "  {op:<28} {n:>6} dispatches  {ms:>9.3} ms  {:>5.1}%  {:>8.2} {:>8.0}",
            100.0 * ms / total.max(1e-12),
            w.flops / s.max(1e-12) / 1e12,
            w.bytes / s.max(1e-12) / 1e9,
        );
        if let Some(floor) = floors.as_ref().map(|f| f[i]) {
            out += &format!("  {floor:>9.3}  {:>7.1}%", 100.0 * floor / ms.max(1e-12));
        }
        out += "\n";
    }
    if let Some(f) = &floors {
        let floor: f64 = f.iter().sum();
        out += &format!(
            "  the plan's floor {floor:.3} ms: {:.1}% of its profiled time\n",
            100.0 * floor / total.max(1e-12)
        );
    }
    out += &format!("slowest dispatches, {plan}:\n");
    for (step, ms) in p.slowest.iter().take(8) {
        out += &format!("  {ms:>9.3} ms  {step}\n");
    }
    out
}
