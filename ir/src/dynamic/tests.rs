//! Dynamic plans from plans made at probe points, as the compiler makes them: which numbers
//! become sites, the plan at other sizes, and the errors a run's inputs get.

use super::*;
use crate::dtype::DType;
use crate::op::{Op, ReduceOp};
use crate::plan::{Mode, SourceLoc};

fn var(name: &str, min: usize, max: usize) -> SizeVar {
    SizeVar { name: name.into(), min, max }
}

/// x: [B, T, 4] → reshape [B·T, 4] → slice rows 0..T → sum over axis 1 → y [T]; ids: [B, T].
fn plan_at(b: usize, t: usize) -> Plan {
    let f = DType::F32;
    let step = |op, inputs: Vec<u32>, dtype, shape: Vec<usize>| Step {
        op,
        inputs,
        dtype,
        shape,
        loc: SourceLoc { file: "m.mgn".into(), line: 7, column: 1 },
    };
    let steps = vec![
        step(Op::Input { name: "x".into() }, vec![], f, vec![b, t, 4]),
        step(Op::Reshape, vec![0], f, vec![b * t, 4]),
        step(Op::Slice { axis: 0, start: 0, end: t }, vec![1], f, vec![t, 4]),
        step(Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keepdim: false }, vec![2], f, vec![t]),
        step(Op::Input { name: "ids".into() }, vec![], DType::I32, vec![b, t]),
    ];
    let inputs = vec![("x".into(), 0), ("ids".into(), 4)];
    Plan::of_steps(Mode::Infer, steps, inputs, vec![("y".into(), 3)])
}

fn fitted(sizes: &[SizeVar]) -> Plan {
    let probes = Probes::new(sizes);
    let plans: Vec<Plan> = probes.points.iter().map(|p| plan_at(p[0], p[1])).collect();
    let d = Dynamic::fit(sizes, &probes, &plans).expect("the plans fit");
    Plan { dynamic: Some(d), ..plans[0].clone() }
}

#[test]
fn probes_are_the_corners_then_two_spread_points() {
    let p = Probes::new(&[var("B", 1, 8), var("T", 4, 100)]);
    assert_eq!(p.bound(), &[8, 100]);
    assert_eq!(&p.points[..4], &[vec![8, 100], vec![7, 100], vec![8, 99], vec![7, 99]]);
    assert_eq!(&p.points[4..], &[vec![2, 4], vec![5, 52]]);
    // A range of two values has no other point to check.
    assert_eq!(Probes::new(&[var("T", 1, 2)]).points, vec![vec![2], vec![1]]);
}

#[test]
fn numbers_that_follow_the_sizes_become_sites_with_their_polynomials() {
    let plan = fitted(&[var("B", 1, 8), var("T", 1, 100)]);
    plan.validate().expect("a valid dynamic plan");
    let d = plan.dynamic.as_ref().unwrap();
    let names = d.names();
    let shown: Vec<String> = (d.sites.iter())
        .map(|s| format!("{}{} = {}", s.step, s.at, s.size.display(&names)))
        .collect();
    assert_eq!(
        shown,
        [
            "0/shape/0 = B",
            "0/shape/1 = T",
            "1/shape/0 = B·T",
            "2/op/Slice/end = T",
            "2/shape/0 = T",
            "3/shape/0 = T",
            "4/shape/0 = B",
            "4/shape/1 = T",
        ]
    );
    assert_eq!(d.describe_shape(&plan, 1), "[B·T, 4]");
    // Round trip through the file format.
    let back = Plan::from_bytes(&plan.to_bytes(), "p.mgnplan").expect("reads back");
    assert_eq!(back, plan);
}

#[test]
fn the_plan_at_other_sizes_is_the_plan_built_there() {
    let plan = fitted(&[var("B", 1, 8), var("T", 1, 100)]);
    for (b, t) in [(1, 1), (3, 17), (8, 100), (5, 2)] {
        let at = plan.at(&[b, t]).expect("valid at every size in range");
        assert_eq!(at, plan_at(b, t), "at B = {b}, T = {t}");
    }
    let e = plan.at(&[9, 4]).unwrap_err();
    assert!(e.contains("`B` = 9 is outside 1..8"), "{e}");
}

#[test]
fn sizes_are_read_off_the_inputs_and_disagreements_named() {
    let plan = fitted(&[var("B", 1, 8), var("T", 2, 100)]);
    let d = plan.dynamic.as_ref().unwrap();
    let sizes = d.sizes_of(&plan, &[("x", &[3, 9, 4]), ("ids", &[3, 9])]);
    assert_eq!(sizes, Ok(vec![3, 9]));
    let e = d.sizes_of(&plan, &[("x", &[3, 101, 4]), ("ids", &[3, 101])]).unwrap_err();
    assert!(e.contains("input `x` has shape [3, 101, 4]: its axis 1 is `T`"), "{e}");
    assert!(e.contains("from 2 to 100"), "{e}");
    let e = d.sizes_of(&plan, &[("x", &[3, 9, 4]), ("ids", &[3, 10])]).unwrap_err();
    assert!(e.contains("input `ids` has shape [3, 10], but the plan takes [B, T] = [3, 9]"), "{e}");
    assert!(e.contains("at B = 3, T = 9 (`B` from `x`, `T` from `x`)"), "{e}");
    let e = d.sizes_of(&plan, &[("x", &[3, 9, 5]), ("ids", &[3, 9])]).unwrap_err();
    assert!(e.contains("[B, T, 4] = [3, 9, 4]"), "{e}");
}

#[test]
fn numbers_no_polynomial_gives_are_misfits_at_their_place() {
    let sizes = [var("T", 1, 64)];
    let probes = Probes::new(&sizes);
    // A stride-2 length, ⌈T / 2⌉: a line through 64 and 63 misses it at 2 and 33.
    let plans: Vec<Plan> = (probes.points.iter())
        .map(|p| {
            let mut plan = plan_at(2, p[0]);
            plan.steps[3].shape = vec![p[0].div_ceil(2)];
            plan
        })
        .collect();
    let e = Dynamic::fit(&sizes, &probes, &plans).unwrap_err();
    assert_eq!(
        e,
        FitError::Step {
            step: 3,
            misfit: Misfit::NotPolynomial { at: "/shape/0".into(), values: vec![32, 32, 1, 17] }
        }
    );
    // A step that is another op at one of the points.
    let mut other = plans.clone();
    other[2].steps[3].op = Op::Reduce { op: ReduceOp::Max, axes: vec![1], keepdim: false };
    let e = Dynamic::fit(&sizes, &probes, &other).unwrap_err();
    assert_eq!(
        e,
        FitError::Step { step: 3, misfit: Misfit::Structure { at: "/op/Reduce/op".into() } }
    );
}

#[test]
fn products_of_sizes_and_squares_fit_or_are_refused() {
    let probes = Probes::new(&[var("B", 1, 8), var("T", 1, 30)]);
    let f = |g: &dyn Fn(i64, i64) -> i64| {
        let values: Vec<serde_json::Value> = (probes.points.iter())
            .map(|p| serde_json::json!({ "n": g(p[0] as i64, p[1] as i64) }))
            .collect();
        fit(&probes, &values.iter().collect::<Vec<_>>(), &|_| true)
    };
    let sites = f(&|b, t| 3 * b * t - t + 7).expect("multilinear");
    assert_eq!(sites[0].1.display(&["B", "T"]).to_string(), "3·B·T - T + 7");
    assert!(matches!(f(&|_, t| t * t), Err(Misfit::NotPolynomial { .. })), "T² is not multilinear");
    // Only numbers that are sizes may vary: an axis, an input's index or a column may not.
    for (at, ok) in [("/shape/2", true), ("/op/Slice/end", true), ("/op/Pad/widths", true)] {
        assert_eq!(size_field(at), ok, "{at}");
    }
    for at in ["/op/Slice/axis", "/inputs/0", "/loc/column", "/shape", "/op/Permute/perm"] {
        assert!(!size_field(at), "{at}");
    }
}

/// A way to break a dynamic section, and what the refusal says.
type Breakage = (fn(&mut Dynamic), &'static str);

#[test]
fn broken_dynamic_sections_are_refused() {
    let good = fitted(&[var("B", 1, 8), var("T", 1, 100)]);
    let cases: Vec<Breakage> = vec![
        (|d| d.sizes[1].min = 200, "needs a range of at least two values"),
        (|d| d.sizes[1].name = "B".into(), "`B` is given twice"),
        (|d| d.sites.last_mut().unwrap().step = 99, "names step 99"),
        (|d| d.sites[2].size = Poly::var(1), "does not hold its size at the bound"),
        (|d| d.sites.swap(0, 3), "not in step order"),
        (|d| d.sites[0].size = Poly::var(3), "unknown size"),
        (
            |d| d.sites.retain(|s| !(s.step == 0 || s.step == 4) || s.at != "/shape/1"),
            "`T` is no input's axis",
        ),
    ];
    for (edit, words) in cases {
        let mut p = good.clone();
        edit(p.dynamic.as_mut().unwrap());
        let e = p.validate().unwrap_err();
        assert!(e.contains(words), "expected {words:?} in: {e}");
    }
}

#[test]
fn sizes_parse_as_max_or_a_range() {
    assert_eq!(SizeVar::parse("T=512"), Ok(var("T", 1, 512)));
    assert_eq!(SizeVar::parse(" B = 4..32"), Ok(var("B", 4, 32)));
    assert_eq!(SizeVar::parse("B=4..=32"), Ok(var("B", 4, 32)));
    for bad in ["T", "=4", "T=x", "T=4..", "T=-1"] {
        assert!(SizeVar::parse(bad).is_err(), "{bad}");
    }
    assert!(check_sizes(&[]).is_err());
    assert!(check_sizes(&[var("T", 0, 4)]).is_err());
}
