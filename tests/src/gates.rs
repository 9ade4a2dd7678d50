//! The forward and backward gates of `bench/compare.py`, ported so that the workload fixtures
//! (`tests/workloads.rs`) are judged in CI, where there is no Python with numpy, exactly as
//! `bench/validate.sh` judges a full run. Keep the two in step: the limits, the zero-gradient
//! rule and what counts as a failure are compare.py's.
//!
//! Both sides are maps from the names `mgnc run --grads` writes (`output.<name>`, `loss`,
//! `grad.<param>`) to values widened to f64, as compare.py loads them.

use mgn_ir::tensor::Tensor;
use std::collections::BTreeMap;
use std::fmt::Write;

pub const FORWARD_LIMIT: f64 = 0.01;
pub const LOSS_LIMIT: f64 = 0.01;
pub const GRAD_NORM_LIMIT: f64 = 0.05;
pub const GRAD_VECTOR_LIMIT: f64 = 0.05;
pub const COSINE_LIMIT: f64 = 0.99;
/// A reference gradient at most this fraction of the total reference norm is zero up to f32
/// roundoff (BERT's pooler, its attention key biases): it has no direction to compare …
pub const ZERO_GRAD: f64 = 1e-6;
/// … and then ours passes when it is at most this fraction of the total reference norm.
pub const ZERO_GRAD_ACTUAL: f64 = 1e-5;

/// One named result: its shape and its elements in f64.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Array {
    pub fn new(shape: Vec<usize>, data: Vec<f64>) -> Array {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "shape and element count differ");
        Array { shape, data }
    }

    pub fn from_tensor(t: &Tensor) -> Array {
        Array { shape: t.shape.clone(), data: t.to_f64_vec() }
    }

    fn finite(&self) -> bool {
        self.data.iter().all(|x| x.is_finite())
    }
}

pub type Results = BTreeMap<String, Array>;

/// Named tensors (a loaded safetensors file, or a run's results under `mgnc run`'s names).
pub fn results<'a>(tensors: impl IntoIterator<Item = (String, &'a Tensor)>) -> Results {
    tensors.into_iter().map(|(n, t)| (n, Array::from_tensor(t))).collect()
}

fn norm(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// ‖a − e‖ / ‖e‖; 0 when both are zero, ∞ when only e is.
fn rel(a: &[f64], e: &[f64]) -> f64 {
    let d = a.iter().zip(e).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    let n = norm(e);
    if n == 0.0 {
        return if d == 0.0 { 0.0 } else { f64::INFINITY };
    }
    d / n
}

/// |a − e| / |e| with compare.py's conventions for a zero reference.
fn rel_scalar(a: f64, e: f64) -> f64 {
    if e != 0.0 {
        (a - e).abs() / e.abs()
    } else if a == 0.0 {
        0.0
    } else {
        f64::INFINITY
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub name: String,
    pub value: f64,
    pub limit: String,
    pub passed: bool,
    pub detail: String,
}

/// One parameter's gradient against the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    /// The parameter name (without `grad.`).
    pub name: String,
    /// Cosine similarity; 1 or −∞ for a zero reference gradient; −∞ when ours is unusable.
    pub cosine: f64,
    /// |‖a‖ − ‖e‖| / ‖e‖.
    pub norm_err: f64,
    pub expected_norm: f64,
    pub actual_norm: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub passed: bool,
    pub gates: Vec<Gate>,
    /// Missing results, shapes that differ, NaN or infinite values: each fails the run.
    pub problems: Vec<String>,
    /// Gradients ours has and the reference lacks (listed, not a failure).
    pub extra_grads: Vec<String>,
    pub params: Vec<Param>,
    /// How many parameters the zero-gradient rule judged.
    pub negligible: usize,
}

/// NaN sorts as the worst cosine, so a broken gradient is never hidden behind a good one.
fn cosine_key(c: f64) -> f64 {
    if c.is_nan() {
        f64::NEG_INFINITY
    } else {
        c
    }
}

impl Verdict {
    pub fn failed(&self) -> impl Iterator<Item = &Gate> {
        self.gates.iter().filter(|g| !g.passed)
    }

    /// The parameters with the lowest cosine, worst first.
    pub fn worst_by_cosine(&self, n: usize) -> Vec<&Param> {
        let mut v: Vec<&Param> = self.params.iter().collect();
        v.sort_by(|a, b| cosine_key(a.cosine).total_cmp(&cosine_key(b.cosine)));
        v.truncate(n);
        v
    }

    /// The parameters with the largest gradient-norm error, worst first.
    pub fn worst_by_norm(&self, n: usize) -> Vec<&Param> {
        let mut v: Vec<&Param> = self.params.iter().collect();
        let key = |p: &Param| if p.norm_err.is_nan() { f64::INFINITY } else { p.norm_err };
        v.sort_by(|a, b| key(b).total_cmp(&key(a)));
        v.truncate(n);
        v
    }

    /// The verdict table of compare.py: every gate, the worst parameters, the problems.
    pub fn report(&self, worst: usize) -> String {
        let mut s = String::new();
        let rows: Vec<[String; 5]> = self
            .gates
            .iter()
            .map(|g| {
                let value = if g.name == "grad min cosine" && g.value.is_finite() {
                    format!("{:.6}", g.value)
                } else {
                    fmt(g.value)
                };
                [
                    g.name.clone(),
                    value,
                    g.limit.clone(),
                    if g.passed { "PASS" } else { "FAIL" }.to_string(),
                    g.detail.clone(),
                ]
            })
            .collect();
        let width = |i: usize| rows.iter().map(|r| r[i].len()).max().unwrap_or(0);
        let (w0, w1, w2) = (width(0), width(1), width(2));
        for r in &rows {
            let _ = writeln!(s, "  {:w0$}  {:w1$}  {:w2$}  {}  {}", r[0], r[1], r[2], r[3], r[4]);
        }
        if !self.params.is_empty() {
            let _ = writeln!(s, "  worst parameters by cosine:");
            for p in self.worst_by_cosine(worst) {
                let _ = writeln!(
                    s,
                    "    {:50} cos {:.6}  |g| ref {:.3e} ours {:.3e}",
                    p.name, p.cosine, p.expected_norm, p.actual_norm
                );
            }
            let _ = writeln!(s, "  worst parameters by gradient-norm error:");
            for p in self.worst_by_norm(worst) {
                let _ = writeln!(
                    s,
                    "    {:50} rel {}  |g| ref {:.3e} ours {:.3e}",
                    p.name,
                    fmt(p.norm_err),
                    p.expected_norm,
                    p.actual_norm
                );
            }
        }
        for p in &self.problems {
            let _ = writeln!(s, "  problem: {p}");
        }
        if !self.extra_grads.is_empty() {
            let _ = writeln!(
                s,
                "  note: gradients the reference does not have: {}",
                self.extra_grads.join(", ")
            );
        }
        let _ = write!(s, "  VERDICT: {}", if self.passed { "PASS" } else { "FAIL" });
        s
    }
}

fn fmt(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.3e}")
    } else {
        format!("{x}")
    }
}

/// compare.py's `compare`: the gates of ARCHITECTURE.md for one run against its reference.
pub fn compare(expected: &Results, actual: &Results) -> Verdict {
    let mut gates = Vec::new();
    let mut problems = Vec::new();
    forward_gates(expected, actual, &mut gates, &mut problems);
    let extra_grads: Vec<String> = actual
        .keys()
        .filter(|k| k.starts_with("grad.") && !expected.contains_key(*k))
        .map(|k| k[5..].to_string())
        .collect();
    let (params, negligible) = backward_gates(expected, actual, &mut gates, &mut problems);

    // compare.py fails a run on a failed gate or on a missing, misshapen or non-finite result;
    // every problem recorded here is one of those.
    let passed = gates.iter().all(|g| g.passed) && problems.is_empty();
    Verdict { passed, gates, problems, extra_grads, params, negligible }
}

/// The forward gates: every output the reference has, then the loss.
fn forward_gates(
    expected: &Results,
    actual: &Results,
    gates: &mut Vec<Gate>,
    problems: &mut Vec<String>,
) {
    for (name, e) in expected.iter().filter(|(k, _)| k.starts_with("output.")) {
        let err = match actual.get(name) {
            None => {
                problems.push(format!("{name}: missing from the actual results"));
                f64::INFINITY
            }
            Some(a) if a.shape != e.shape => {
                problems.push(format!("{name}: shape {:?}, expected {:?}", a.shape, e.shape));
                f64::INFINITY
            }
            Some(a) if !a.finite() => {
                problems.push(format!("{name}: has NaN or infinite values"));
                f64::INFINITY
            }
            Some(a) => rel(&a.data, &e.data),
        };
        gates.push(Gate {
            name: format!("forward {name} rel L2"),
            value: err,
            limit: format!("< {FORWARD_LIMIT}"),
            passed: err < FORWARD_LIMIT,
            detail: String::new(),
        });
    }
    if let Some(e) = expected.get("loss") {
        gates.push(loss_gate(e, actual, problems));
    }
}

fn loss_gate(expected: &Array, actual: &Results, problems: &mut Vec<String>) -> Gate {
    let e = expected.data.first().copied().unwrap_or(f64::NAN);
    match actual.get("loss").and_then(|a| a.data.first().copied()) {
        None => {
            problems.push("loss: missing from the actual results".to_string());
            Gate {
                name: "loss rel err".into(),
                value: f64::INFINITY,
                limit: format!("< {LOSS_LIMIT}"),
                passed: false,
                detail: String::new(),
            }
        }
        Some(a) => {
            let err = rel_scalar(a, e);
            Gate {
                name: "loss rel err".into(),
                value: err,
                limit: format!("< {LOSS_LIMIT}"),
                passed: err < LOSS_LIMIT && a.is_finite(),
                detail: format!("expected {e:.6}, got {a:.6}"),
            }
        }
    }
}

/// The backward gates (total norm, norm vector, minimum cosine) over the gradients the
/// reference has, with every parameter's scores and how many the zero-gradient rule judged.
/// No gates when the reference has no gradients.
fn backward_gates(
    expected: &Results,
    actual: &Results,
    gates: &mut Vec<Gate>,
    problems: &mut Vec<String>,
) -> (Vec<Param>, usize) {
    let grads: Vec<(&String, &Array)> =
        expected.iter().filter(|(k, _)| k.starts_with("grad.")).collect();
    let mut params = Vec::new();
    let mut negligible = 0;
    if grads.is_empty() {
        return (params, negligible);
    }
    let total_e = grads.iter().map(|(_, e)| norm(&e.data).powi(2)).sum::<f64>().sqrt();
    let (mut ne, mut na) = (Vec::new(), Vec::new());
    for (k, e) in &grads {
        let (param, an) = grad_param(k, e, actual, total_e, problems, &mut negligible);
        ne.push(param.expected_norm);
        na.push(an);
        params.push(param);
    }
    let all_finite = na.iter().all(|x| x.is_finite());
    let total_a = if all_finite { norm(&na) } else { f64::INFINITY };
    let total_err = rel_scalar(total_a, total_e);
    let vec_err = if all_finite { rel(&na, &ne) } else { f64::INFINITY };
    gates.push(Gate {
        name: "grad total-norm rel err".into(),
        value: total_err,
        limit: format!("< {GRAD_NORM_LIMIT}"),
        passed: total_err < GRAD_NORM_LIMIT,
        detail: format!("expected {total_e:.6}, got {total_a:.6}"),
    });
    gates.push(Gate {
        name: "grad norm-vector rel err".into(),
        value: vec_err,
        limit: format!("< {GRAD_VECTOR_LIMIT}"),
        passed: vec_err < GRAD_VECTOR_LIMIT,
        detail: format!("{} parameters", grads.len()),
    });
    gates.push(min_cosine_gate(&params, negligible));
    (params, negligible)
}

/// One gradient (`k` is its `grad.` name) against the reference `e`: the parameter's scores,
/// and the norm it adds to the norm vector (∞ when ours is missing, misshapen or not finite,
/// which is also a problem). Counts in `negligible` a reference the zero-gradient rule judges.
fn grad_param(
    k: &str,
    e: &Array,
    actual: &Results,
    total_e: f64,
    problems: &mut Vec<String>,
    negligible: &mut usize,
) -> (Param, f64) {
    let en = norm(&e.data);
    let name = k[5..].to_string();
    let a = match actual.get(k) {
        None => Err("missing"),
        Some(a) if a.shape != e.shape => Err("shape differs"),
        Some(a) if !a.finite() => Err("NaN/inf"),
        Some(a) => Ok(a),
    };
    let a = match a {
        Ok(a) => a,
        Err(why) => {
            problems.push(format!("{k}: {why}"));
            let param = Param {
                name,
                cosine: f64::NEG_INFINITY,
                norm_err: f64::INFINITY,
                expected_norm: en,
                actual_norm: f64::NAN,
            };
            return (param, f64::INFINITY);
        }
    };
    let an = norm(&a.data);
    let cosine = if en <= ZERO_GRAD * total_e {
        *negligible += 1;
        if an <= ZERO_GRAD_ACTUAL * total_e {
            1.0
        } else {
            f64::NEG_INFINITY
        }
    } else if an == 0.0 {
        0.0
    } else {
        a.data.iter().zip(&e.data).map(|(x, y)| x * y).sum::<f64>() / (an * en)
    };
    let param =
        Param { name, cosine, norm_err: rel_scalar(an, en), expected_norm: en, actual_norm: an };
    (param, an)
}

/// The worst cosine of all parameters (at least one), naming it and counting those below.
fn min_cosine_gate(params: &[Param], negligible: usize) -> Gate {
    let worst = params
        .iter()
        .min_by(|a, b| cosine_key(a.cosine).total_cmp(&cosine_key(b.cosine)))
        .expect("at least one gradient");
    // A NaN cosine counts as below the limit.
    let below = params
        .iter()
        .filter(|p| p.cosine.partial_cmp(&COSINE_LIMIT).is_none_or(|o| o.is_lt()))
        .count();
    let zero_note = if negligible > 0 {
        format!("; {negligible} with a zero reference gradient")
    } else {
        String::new()
    };
    Gate {
        name: "grad min cosine".into(),
        value: worst.cosine,
        limit: format!(">= {COSINE_LIMIT}"),
        passed: worst.cosine >= COSINE_LIMIT,
        detail: format!("{}; {below} of {} below{zero_note}", worst.name, params.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic reference: two outputs, a loss and four gradients of different
    /// sizes (one of them zero, like BERT's key bias), values from a fixed LCG.
    fn reference() -> Results {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 11) as f64) / ((1u64 << 53) as f64) * 2.0 - 1.0
        };
        let mut arr = |shape: Vec<usize>| {
            let n = shape.iter().product();
            Array::new(shape, (0..n).map(|_| next()).collect())
        };
        let mut r = Results::new();
        r.insert("output.logits".into(), arr(vec![2, 3, 5]));
        r.insert("output.hidden".into(), arr(vec![4, 8]));
        r.insert("loss".into(), Array::new(vec![], vec![2.25]));
        r.insert("grad.w1".into(), arr(vec![8, 4]));
        r.insert("grad.b1".into(), arr(vec![8]));
        r.insert("grad.w2".into(), arr(vec![3, 8]));
        r.insert("grad.key_bias".into(), Array::new(vec![4], vec![1e-13, -2e-13, 0.0, 5e-14]));
        r
    }

    fn gate<'a>(v: &'a Verdict, name: &str) -> &'a Gate {
        v.gates
            .iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no gate {name}: {:?}", v.gates))
    }

    fn failed(v: &Verdict) -> Vec<&str> {
        v.failed().map(|g| g.name.as_str()).collect()
    }

    #[test]
    fn identical_results_pass_every_gate() {
        let e = reference();
        let v = compare(&e, &e.clone());
        assert!(v.passed, "{}", v.report(5));
        // Two outputs, the loss, and the three backward gates.
        assert_eq!(v.gates.len(), 6);
        assert!(v.gates.iter().all(|g| g.value == 0.0 || g.name == "grad min cosine"));
        assert!((gate(&v, "grad min cosine").value - 1.0).abs() < 1e-12);
        assert_eq!(
            v.negligible, 1,
            "the zero key-bias gradient is judged by the zero-gradient rule"
        );
    }

    #[test]
    fn f32_roundoff_passes() {
        let e = reference();
        let mut a = e.clone();
        for (k, t) in a.iter_mut() {
            if k != "grad.key_bias" {
                t.data.iter_mut().for_each(|x| *x = (*x as f32 * (1.0 + 1e-6)) as f64);
            }
        }
        let v = compare(&e, &a);
        assert!(v.passed, "{}", v.report(5));
    }

    #[test]
    fn a_flipped_gradient_fails_only_the_cosine_gate_and_is_named() {
        let e = reference();
        let mut a = e.clone();
        a.get_mut("grad.b1").unwrap().data.iter_mut().for_each(|x| *x = -*x);
        let v = compare(&e, &a);
        assert!(!v.passed);
        // Norms cannot see a sign: only the cosine gate fails, and it names the parameter.
        assert_eq!(failed(&v), ["grad min cosine"]);
        let g = gate(&v, "grad min cosine");
        assert!((g.value + 1.0).abs() < 1e-12, "{}", g.value);
        assert!(g.detail.starts_with("b1;"), "{}", g.detail);
        assert_eq!(v.worst_by_cosine(1)[0].name, "b1");
        assert!(v.report(3).contains("VERDICT: FAIL"));
    }

    #[test]
    fn a_perturbed_gradient_fails_the_cosine_gate() {
        let e = reference();
        let mut a = e.clone();
        // Swap two elements of one gradient: same norm, a different direction.
        let w = &mut a.get_mut("grad.w2").unwrap().data;
        w.swap(0, 5);
        w.swap(1, 7);
        let v = compare(&e, &a);
        assert_eq!(failed(&v), ["grad min cosine"], "{}", v.report(5));
        assert_eq!(v.worst_by_cosine(1)[0].name, "w2");
    }

    #[test]
    fn scaled_gradients_fail_the_norm_gates_but_not_the_cosine() {
        let e = reference();
        let mut a = e.clone();
        for (k, t) in a.iter_mut() {
            if k.starts_with("grad.") {
                t.data.iter_mut().for_each(|x| *x *= 1.1);
            }
        }
        let v = compare(&e, &a);
        assert_eq!(
            failed(&v),
            ["grad total-norm rel err", "grad norm-vector rel err"],
            "{}",
            v.report(5)
        );
        assert!((gate(&v, "grad total-norm rel err").value - 0.1).abs() < 1e-9);
        // Just under the limit passes.
        let mut a = e.clone();
        a.iter_mut()
            .filter(|(k, _)| k.starts_with("grad."))
            .for_each(|(_, t)| t.data.iter_mut().for_each(|x| *x *= 1.049));
        assert!(compare(&e, &a).passed);
    }

    #[test]
    fn a_wrong_loss_or_output_fails_the_forward_gates() {
        let e = reference();
        let mut a = e.clone();
        a.get_mut("loss").unwrap().data[0] *= 1.02;
        let v = compare(&e, &a);
        assert_eq!(failed(&v), ["loss rel err"]);
        assert!(gate(&v, "loss rel err").detail.contains("expected 2.25"));

        let mut a = e.clone();
        a.get_mut("output.hidden").unwrap().data.iter_mut().for_each(|x| *x *= 0.98);
        let v = compare(&e, &a);
        assert_eq!(failed(&v), ["forward output.hidden rel L2"]);
        assert!((gate(&v, "forward output.hidden rel L2").value - 0.02).abs() < 1e-9);
    }

    #[test]
    fn the_zero_gradient_rule_accepts_roundoff_and_rejects_a_real_gradient() {
        let e = reference();
        let total = e
            .iter()
            .filter(|(k, _)| k.starts_with("grad."))
            .map(|(_, t)| norm(&t.data).powi(2))
            .sum::<f64>()
            .sqrt();
        // Roundoff of another direction and size: no cosine to compare, and it is negligible.
        let mut a = e.clone();
        a.get_mut("grad.key_bias").unwrap().data = vec![0.0, 3e-7 * total, 0.0, -3e-7 * total];
        assert!(compare(&e, &a).passed);
        // A gradient above 1e-5 of the total where the reference has none fails the cosine gate.
        a.get_mut("grad.key_bias").unwrap().data = vec![0.0, 2e-5 * total, 0.0, 0.0];
        let v = compare(&e, &a);
        assert_eq!(failed(&v), ["grad min cosine"]);
        assert_eq!(v.worst_by_cosine(1)[0].name, "key_bias");
        assert_eq!(v.worst_by_cosine(1)[0].cosine, f64::NEG_INFINITY);
        // A real reference gradient that ours drops entirely has cosine 0.
        let mut a = e.clone();
        a.get_mut("grad.b1").unwrap().data.iter_mut().for_each(|x| *x = 0.0);
        let v = compare(&e, &a);
        assert!(!v.passed);
        assert_eq!(v.worst_by_cosine(1)[0].cosine, 0.0);
    }

    #[test]
    fn missing_misshapen_and_non_finite_results_fail() {
        let e = reference();
        let mut a = e.clone();
        a.remove("grad.w1");
        let v = compare(&e, &a);
        assert!(!v.passed);
        assert!(v.problems.iter().any(|p| p == "grad.w1: missing"), "{:?}", v.problems);
        assert_eq!(gate(&v, "grad total-norm rel err").value, f64::INFINITY);

        let mut a = e.clone();
        a.remove("output.logits");
        a.remove("loss");
        let v = compare(&e, &a);
        assert_eq!(failed(&v), ["forward output.logits rel L2", "loss rel err"]);

        let mut a = e.clone();
        a.insert("output.logits".into(), Array::new(vec![6, 5], e["output.logits"].data.clone()));
        assert_eq!(failed(&compare(&e, &a)), ["forward output.logits rel L2"]);

        let mut a = e.clone();
        a.get_mut("grad.w2").unwrap().data[3] = f64::NAN;
        let v = compare(&e, &a);
        assert!(!v.passed);
        assert!(v.problems.iter().any(|p| p == "grad.w2: NaN/inf"));

        let mut a = e.clone();
        a.get_mut("output.hidden").unwrap().data[0] = f64::INFINITY;
        assert!(!compare(&e, &a).passed);
    }

    #[test]
    fn gradients_beyond_the_reference_are_listed_not_failed() {
        let e = reference();
        let mut a = e.clone();
        a.insert("grad.lm_head.weight".into(), Array::new(vec![2], vec![1.0, 2.0]));
        let v = compare(&e, &a);
        assert!(v.passed);
        assert_eq!(v.extra_grads, ["lm_head.weight"]);
        assert!(v.report(5).contains("lm_head.weight"));
    }
}
