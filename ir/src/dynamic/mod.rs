//! Plans over dynamic sizes: one plan that runs at any value of some of its model's `dim`
//! arguments within a range (`mgnc build --dynamic B=32,T=512`), without being rebuilt.
//!
//! A dynamic plan is the plan at its bound (every dynamic size at its largest: the memory a
//! backend plans for) plus, for every number of its steps that depends on the sizes, that
//! number as a polynomial in them (`Site`). The compiler finds the sites by building the plan
//! at several probe points and fitting (`fit`), so every op keeps its concrete typing rule;
//! a backend makes the plan at the sizes of a run by writing the sites' values (`Plan::at`),
//! and that plan is validated like any other, so sizes where the model does not type (an odd
//! length for a stride-2 model) are refused with the step and model line.
//!
//! The sizes of a run are read off its inputs: every dynamic size is an axis of some input
//! by itself (`Dynamic::sizes_of`).

mod fit;
mod poly;
#[cfg(test)]
mod tests;

pub use fit::{fit, patch, Misfit, Probes};
pub use poly::Poly;

use crate::plan::{Plan, Step};
use serde::{Deserialize, Serialize};

/// The most dynamic sizes one plan may have (the GPU's parameter block carries them; the
/// compiler builds the plan at `2^n + 2` points).
pub const MAX_SIZES: usize = 4;

/// A dynamic size: a `dim` argument of the model and the values a run may give it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeVar {
    pub name: String,
    pub min: usize,
    pub max: usize,
}

impl SizeVar {
    /// `NAME=MAX` (from 1) or `NAME=MIN..MAX`, as `--dynamic` takes them.
    pub fn parse(s: &str) -> Result<SizeVar, String> {
        let bad = || format!("expected `NAME=MAX` or `NAME=MIN..MAX`, found `{s}`");
        let (name, range) = s.split_once('=').ok_or_else(bad)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(bad());
        }
        let num = |t: &str| t.trim().parse::<usize>().map_err(|_| bad());
        let (min, max) = match range.split_once("..") {
            Some((lo, hi)) => (num(lo)?, num(hi.strip_prefix('=').unwrap_or(hi))?),
            None => (1, num(range)?),
        };
        Ok(SizeVar { name: name.to_string(), min, max })
    }
}

impl std::str::FromStr for SizeVar {
    type Err = String;
    fn from_str(s: &str) -> Result<SizeVar, String> {
        SizeVar::parse(s)
    }
}

impl std::fmt::Display for SizeVar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} from {} to {}", self.name, self.min, self.max)
    }
}

/// One number of a step that depends on the sizes: the JSON pointer of the number within the
/// step as the plan file writes it (`/shape/1`, `/op/Slice/end`), and its polynomial.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Site {
    pub step: u32,
    pub at: String,
    pub size: Poly,
}

/// A plan's dynamic sizes and the numbers that depend on them (see the module header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dynamic {
    pub sizes: Vec<SizeVar>,
    /// In step order.
    pub sites: Vec<Site>,
}

/// Why plans made at the probe points are not one dynamic plan.
#[derive(Clone, Debug, PartialEq)]
pub enum FitError {
    /// Step `step` (of the plan at the bound) differs as `misfit` says.
    Step { step: usize, misfit: Misfit },
    /// The plans differ outside their steps: in their number of steps, or in `part`
    /// (a parameter's shape, the inputs), which a dynamic plan must keep fixed.
    Plan { part: String },
}

/// Checks a list of dynamic sizes on its own: at most `MAX_SIZES`, distinct names, each a
/// range of at least two values from 1 up.
pub fn check_sizes(sizes: &[SizeVar]) -> Result<(), String> {
    if sizes.is_empty() || sizes.len() > MAX_SIZES {
        return Err(format!("a plan has 1 to {MAX_SIZES} dynamic sizes, not {}", sizes.len()));
    }
    for (k, v) in sizes.iter().enumerate() {
        if sizes[..k].iter().any(|o| o.name == v.name) {
            return Err(format!("the dynamic size `{}` is given twice", v.name));
        }
        if v.min == 0 || v.min >= v.max {
            return Err(format!(
                "the dynamic size `{}` needs a range of at least two values from 1 up \
                 (given {}..{})",
                v.name, v.min, v.max
            ));
        }
    }
    Ok(())
}

impl Dynamic {
    /// The dynamic plan of `plans`, made at `probes.points` in order: `plans[0]` (the bound)
    /// with the sites where the others differ from it.
    pub fn fit(sizes: &[SizeVar], probes: &Probes, plans: &[Plan]) -> Result<Dynamic, FitError> {
        let bound = &plans[0];
        if plans.iter().any(|p| p.steps.len() != bound.steps.len()) {
            let counts: Vec<String> = plans.iter().map(|p| p.steps.len().to_string()).collect();
            return Err(FitError::Plan {
                part: format!("the number of steps ({})", counts.join(", ")),
            });
        }
        for p in &plans[1..] {
            if p.params.len() != bound.params.len() {
                return Err(FitError::Plan { part: "the number of parameters".into() });
            }
            if let Some(k) = (0..bound.params.len()).find(|&k| p.params[k] != bound.params[k]) {
                let part = format!("parameter `{}`", bound.params[k].name);
                return Err(FitError::Plan { part });
            }
            let same = p.inputs == bound.inputs
                && p.outputs == bound.outputs
                && p.loss == bound.loss
                && p.grads == bound.grads
                && p.state_writes == bound.state_writes;
            if !same {
                return Err(FitError::Plan { part: "the list of inputs or results".into() });
            }
        }
        let mut sites = Vec::new();
        for i in 0..bound.steps.len() {
            let values: Vec<serde_json::Value> =
                plans.iter().map(|p| step_json(&p.steps[i])).collect();
            let refs: Vec<&serde_json::Value> = values.iter().collect();
            let found = fit(probes, &refs, &size_field)
                .map_err(|misfit| FitError::Step { step: i, misfit })?;
            sites.extend(found.into_iter().map(|(at, size)| Site { step: i as u32, at, size }));
        }
        Ok(Dynamic { sizes: sizes.to_vec(), sites })
    }

    pub fn names(&self) -> Vec<&str> {
        self.sizes.iter().map(|v| v.name.as_str()).collect()
    }

    /// Every size at its largest: the sizes the plan itself is made at.
    pub fn bound(&self) -> Vec<usize> {
        self.sizes.iter().map(|v| v.max).collect()
    }

    /// The axes of step `i`'s shape that depend on the sizes, with their polynomials.
    pub fn shape_of(&self, i: usize) -> Vec<(usize, &Poly)> {
        self.sites_of(i)
            .iter()
            .filter_map(|s| Some((s.at.strip_prefix("/shape/")?.parse().ok()?, &s.size)))
            .collect()
    }

    /// The sites of step `i` (a slice of `sites`, which are in step order).
    pub fn sites_of(&self, i: usize) -> &[Site] {
        sites_of(&self.sites, i)
    }

    /// A step's shape as people read it: `[B, T, 384]`.
    pub fn describe_shape(&self, plan: &Plan, i: usize) -> String {
        let names = self.names();
        let dyn_axes = self.shape_of(i);
        let axes: Vec<String> = (plan.steps[i].shape.iter().enumerate())
            .map(|(a, n)| match dyn_axes.iter().find(|(k, _)| *k == a) {
                Some((_, p)) => p.display(&names).to_string(),
                None => n.to_string(),
            })
            .collect();
        format!("[{}]", axes.join(", "))
    }

    /// `B = 2, T = 12`.
    pub fn describe_sizes(&self, sizes: &[usize]) -> String {
        let each: Vec<String> =
            self.sizes.iter().zip(sizes).map(|(v, n)| format!("{} = {n}", v.name)).collect();
        each.join(", ")
    }

    /// The sizes of a run of `plan` given inputs of these shapes (by input name), each read
    /// off the first input that has it as an axis; an error names the input, the axis and the
    /// allowed range, or the input whose shape disagrees with the sizes the others gave.
    pub fn sizes_of(&self, plan: &Plan, shapes: &[(&str, &[usize])]) -> Result<Vec<usize>, String> {
        let given = |name: &str| shapes.iter().find(|(n, _)| *n == name).map(|(_, s)| *s);
        let mut sizes = vec![None; self.sizes.len()];
        let mut source: Vec<&str> = vec![""; self.sizes.len()];
        for (name, v) in &plan.inputs {
            let Some(shape) = given(name) else { continue };
            for (axis, poly) in self.shape_of(*v as usize) {
                let (Some(j), Some(&n)) = (poly.as_var(), shape.get(axis)) else { continue };
                if sizes[j].is_some() {
                    continue;
                }
                let var = &self.sizes[j];
                if n < var.min || n > var.max {
                    return Err(format!(
                        "input `{name}` has shape {shape:?}: its axis {axis} is `{}`, which \
                         this plan takes from {} to {}",
                        var.name, var.min, var.max
                    ));
                }
                sizes[j] = Some(n);
                source[j] = name;
            }
        }
        let sizes: Vec<usize> = match sizes.iter().position(Option::is_none) {
            Some(j) => {
                return Err(format!(
                    "no input gives the dynamic size `{}` (it is an axis of no input given)",
                    self.sizes[j].name
                ))
            }
            None => sizes.into_iter().flatten().collect(),
        };
        for (name, v) in &plan.inputs {
            let Some(shape) = given(name) else { continue };
            let want = self.shape_at(plan, *v as usize, &sizes)?;
            if shape != want.as_slice() {
                let from: Vec<String> = (self.sizes.iter().zip(&source))
                    .map(|(var, src)| format!("`{}` from `{src}`", var.name))
                    .collect();
                return Err(format!(
                    "input `{name}` has shape {shape:?}, but the plan takes {} = {want:?} at {} \
                     ({})",
                    self.describe_shape(plan, *v as usize),
                    self.describe_sizes(&sizes),
                    from.join(", ")
                ));
            }
        }
        Ok(sizes)
    }

    /// Step `i`'s shape at `sizes`.
    pub fn shape_at(&self, plan: &Plan, i: usize, sizes: &[usize]) -> Result<Vec<usize>, String> {
        let mut shape = plan.steps[i].shape.clone();
        for (axis, poly) in self.shape_of(i) {
            let n = poly.eval(sizes).filter(|&n| n >= 0);
            let slot = shape.get_mut(axis).ok_or_else(|| format!("step {i} has no axis {axis}"))?;
            *slot = n.ok_or_else(|| format!("step {i}'s axis {axis} is negative"))? as usize;
        }
        Ok(shape)
    }

    /// Checks what a backend relies on (`valid` calls it): well-formed sizes, sites that name
    /// integers of existing steps, equal to their polynomials at the bound, over known sizes,
    /// and every size an input's axis by itself.
    pub fn validate(&self, plan: &Plan) -> Result<(), String> {
        check_sizes(&self.sizes)?;
        let bound = self.bound();
        if !self.sites.windows(2).all(|w| w[0].step <= w[1].step) {
            return Err("the dynamic sites are not in step order".into());
        }
        let mut last: Option<(u32, serde_json::Value)> = None;
        for site in &self.sites {
            let step = plan.steps.get(site.step as usize).ok_or_else(|| {
                format!(
                    "a dynamic site names step {}, but there are {}",
                    site.step,
                    plan.steps.len()
                )
            })?;
            if site.size.arity() > self.sizes.len() {
                return Err(format!("step {}'s dynamic site names an unknown size", site.step));
            }
            if last.as_ref().map(|l| l.0) != Some(site.step) {
                last = Some((site.step, step_json(step)));
            }
            let json = &last.as_ref().expect("just set").1;
            let here = json.pointer(&site.at).and_then(|v| v.as_u64());
            if here.map(|n| n as i64) != site.size.eval(&bound) {
                return Err(format!(
                    "step {}'s dynamic site {} does not hold its size at the bound",
                    site.step, site.at
                ));
            }
        }
        for (j, var) in self.sizes.iter().enumerate() {
            let is_axis = plan.inputs.iter().any(|(_, v)| {
                self.shape_of(*v as usize).iter().any(|(_, p)| p.as_var() == Some(j))
            });
            if !is_axis {
                return Err(format!(
                    "the dynamic size `{}` is no input's axis, so no run could give it",
                    var.name
                ));
            }
        }
        Ok(())
    }
}

/// The numbers of a step (as JSON) that may follow the sizes: its shape, and the op
/// attributes that are lengths or positions. Axes, indices, strides and source places may not.
pub fn size_field(at: &str) -> bool {
    const LENGTHS: [&str; 7] = ["start", "end", "len", "offset", "k", "size", "widths"];
    let mut parts = at.split('/').skip(1);
    match (parts.next(), parts.next(), parts.next()) {
        (Some("shape"), Some(_), None) => true,
        (Some("op"), Some(_), Some(field)) => LENGTHS.contains(&field),
        _ => false,
    }
}

/// The sites of step `i` among `sites` (in step order).
pub fn sites_of(sites: &[Site], i: usize) -> &[Site] {
    let from = sites.partition_point(|s| (s.step as usize) < i);
    let to = sites.partition_point(|s| (s.step as usize) <= i);
    &sites[from..to]
}

/// Writes each site's value at `sizes` into the step it names (of a plan, or of a backend's
/// program made at the bound), through the step's JSON; an error names the step.
pub fn patch_steps<S>(steps: &mut [S], sites: &[Site], sizes: &[usize]) -> Result<(), String>
where
    S: serde::Serialize + serde::de::DeserializeOwned,
{
    let mut i = 0;
    while i < sites.len() {
        let step = sites[i].step as usize;
        let here = sites_of(sites, step);
        let slot = steps.get_mut(step).ok_or_else(|| format!("there is no step {step}"))?;
        let mut json = serde_json::to_value(&*slot).expect("steps always serialize");
        let at: Vec<(&str, &Poly)> = here.iter().map(|s| (s.at.as_str(), &s.size)).collect();
        patch(&mut json, &at, sizes).map_err(|e| format!("step {step}: {e}"))?;
        *slot = serde_json::from_value(json).map_err(|e| format!("step {step}: {e}"))?;
        i += here.len();
    }
    Ok(())
}

fn step_json(step: &Step) -> serde_json::Value {
    serde_json::to_value(step).expect("steps always serialize")
}

impl Plan {
    /// The plan at these dynamic sizes: its sites written, without the dynamic section,
    /// validated. A static plan is returned as it is.
    pub fn at(&self, sizes: &[usize]) -> Result<Plan, String> {
        let Some(d) = &self.dynamic else {
            return Ok(self.clone());
        };
        let describe = || d.describe_sizes(sizes);
        if sizes.len() != d.sizes.len() {
            return Err(format!("{} sizes given for {} dynamic sizes", sizes.len(), d.sizes.len()));
        }
        if let Some((v, n)) = d.sizes.iter().zip(sizes).find(|(v, &n)| n < v.min || n > v.max) {
            return Err(format!("`{}` = {n} is outside {}..{}", v.name, v.min, v.max));
        }
        let mut plan = Plan { dynamic: None, ..self.clone() };
        patch_steps(&mut plan.steps, &d.sites, sizes)
            .map_err(|e| format!("at {}: {e}", describe()))?;
        for (name, value) in &mut plan.config {
            if let Some(k) = d.sizes.iter().position(|v| &v.name == name) {
                *value = sizes[k].to_string();
            }
        }
        plan.validate().map_err(|e| format!("at {}: {e}", describe()))?;
        Ok(plan)
    }
}
