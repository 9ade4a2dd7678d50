//! Lowering: each ONNX node becomes `.mgn` statements over the values before it, or a constant
//! when its inputs are constants (shape arithmetic folds away here). Every node's output types
//! are computed as it is lowered, so later nodes know their ranks and sizes.

mod nn;
pub mod patterns;
pub(crate) mod pointwise;
mod reduce;
pub mod shape;

use super::fold;
use super::graph::{Graph, Node};
use super::layers::{Claim, Fields};
use super::provenance::{self, Stmt};
use super::value::{Const, Dt, Run, Sym, Val};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The error of a node whose input could not be translated: the input's problem is the one
/// reported.
const CASCADE: &str = "an input could not be translated";

/// A problem with one node: the caller adds the node's name, op type and opset.
pub type R<T> = Result<T, String>;

pub struct Lower<'g> {
    pub g: &'g Graph,
    pub vals: HashMap<String, Val>,
    /// The forward's statements, in order.
    pub body: Vec<String>,
    pub fields: Fields,
    /// Items used from the standard library, as `module.Item`.
    pub uses: BTreeSet<String>,
    /// Standard layers recognised before lowering, by the index of the node they start at.
    pub claims: HashMap<usize, Claim>,
    /// Nodes a claim absorbed (the `Add` of a `MatMul` + `Add` that became a `Linear`).
    pub absorbed: HashMap<usize, usize>,
    /// Parameter names of the initializers, from the naming pass.
    pub names: HashMap<String, String>,
    taken: HashSet<String>,
    lets: HashSet<String>,
    /// The module path of the node each statement of `body` came from, and the nodes (indices
    /// into the graph's) its comment names: empty where the statement reads as its node.
    pub tags: Vec<(String, Vec<usize>)>,
    /// The nodes each constant computed from nodes (not read from the file) was folded from.
    folded: HashMap<String, Vec<usize>>,
    /// The nodes a pattern recognised at the node being lowered took in.
    pub fused: Vec<usize>,
    /// The module path of the node being lowered.
    cur_scope: String,
    /// The type of each `let` and input, as `.mgn` writes it.
    pub types: HashMap<String, String>,
    pub problems: Vec<String>,
    /// How many nodes (and graph outputs) read each value, and the node making it.
    reads: HashMap<String, usize>,
    pub made_by: HashMap<String, usize>,
    /// `let`s inside recognised patterns, dropped at the end where nothing else reads them.
    pub dropped: HashSet<String>,
}

impl<'g> Lower<'g> {
    pub fn new(
        g: &'g Graph,
        names: HashMap<String, String>,
        claims: HashMap<usize, Claim>,
    ) -> Self {
        let mut absorbed = HashMap::new();
        for (&i, c) in &claims {
            for &j in &c.absorbs {
                absorbed.insert(j, i);
            }
        }
        let mut reads: HashMap<String, usize> = HashMap::new();
        let mut made_by = HashMap::new();
        for (i, n) in g.nodes.iter().enumerate() {
            for v in &n.inputs {
                *reads.entry(v.clone()).or_default() += 1;
            }
            for o in &n.outputs {
                made_by.insert(o.clone(), i);
            }
        }
        Lower {
            g,
            vals: HashMap::new(),
            body: Vec::new(),
            fields: Fields::default(),
            uses: BTreeSet::new(),
            claims,
            absorbed,
            names,
            taken: HashSet::new(),
            lets: HashSet::new(),
            tags: Vec::new(),
            folded: HashMap::new(),
            fused: Vec::new(),
            cur_scope: String::new(),
            types: HashMap::new(),
            problems: Vec::new(),
            reads,
            made_by,
            dropped: HashSet::new(),
        }
    }

    /// The node whose output `v` is.
    pub fn producer(&self, v: &str) -> Option<&'g Node> {
        self.made_by.get(v).map(|&i| &self.g.nodes[i])
    }

    /// Whether one node reads `v` and it is no output of the graph.
    pub fn read_once(&self, v: &str) -> bool {
        self.reads.get(v) == Some(&1) && !self.g.outputs.iter().any(|o| o == v)
    }

    /// Reserves a `let` name near `hint` (a valid identifier, not a keyword, not used before).
    pub fn fresh(&mut self, hint: &str) -> String {
        let base = super::emit::ident(hint);
        let mut name = base.clone();
        let mut k = 1;
        while self.taken.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.taken.insert(name.clone());
        name
    }

    /// The name of a model input or argument, kept as the file spells it where it can be.
    pub fn fresh_input(&mut self, name: &str) -> String {
        self.fresh(name)
    }

    pub fn is_let(&self, name: &str) -> bool {
        self.lets.contains(name)
    }

    pub fn mark_lets(&mut self, values: &[Run]) {
        for r in values {
            self.lets.insert(r.expr.clone());
            self.types.insert(r.expr.clone(), r.ty());
        }
    }

    /// Tags the statements written since the last call with `scope`; they name no node.
    pub fn tag(&mut self, scope: &str) {
        let n = self.body.len() - self.tags.len();
        self.tags.extend(std::iter::repeat_n((scope.to_string(), Vec::new()), n));
    }

    /// Tags the statements node `i` wrote: its scope, and the nodes they came from where a
    /// statement does not read as the node itself.
    fn tag_node(&mut self, i: usize, n: &Node, nodes: &[usize]) {
        // A std layer reads as its node when its parameters keep the file's names.
        let layer = self.claims.get(&i).is_some_and(|c| {
            c.inits.iter().flatten().all(|init| self.names.get(init) == Some(init))
        });
        for k in self.tags.len()..self.body.len() {
            let plain = nodes.len() == 1 && provenance::reads_as(&n.op, &self.body[k], layer);
            let named = if plain { Vec::new() } else { nodes.to_vec() };
            self.tags.push((n.scope.clone(), named));
        }
    }

    /// The nodes whose work node `i` stands for, `i` first, the others in graph order: the
    /// nodes a std layer or a pattern absorbed, and those the constants they read were folded
    /// from.
    fn provenance(&mut self, i: usize) -> Vec<usize> {
        let mut direct: BTreeSet<usize> = std::mem::take(&mut self.fused).into_iter().collect();
        direct.extend(self.claims.get(&i).map(|c| c.absorbs.clone()).unwrap_or_default());
        direct.insert(i);
        let mut all = direct.clone();
        for &j in &direct {
            for inp in &self.g.nodes[j].inputs {
                all.extend(self.folded.get(inp).into_iter().flatten());
            }
        }
        all.remove(&i);
        std::iter::once(i).chain(all).collect()
    }

    /// The statements with their scopes and the names of the nodes their comments name.
    pub fn statements(&mut self) -> Vec<Stmt> {
        let tags = std::mem::take(&mut self.tags);
        let body = std::mem::take(&mut self.body);
        body.into_iter()
            .zip(tags)
            .map(|(text, (scope, nodes))| {
                let nodes = nodes
                    .iter()
                    .map(|&j| {
                        let n = &self.g.nodes[j];
                        provenance::label(&n.name, &n.op, j)
                    })
                    .collect();
                Stmt { text, scope, nodes }
            })
            .collect()
    }

    pub fn is_taken(&self, name: &str) -> bool {
        self.taken.contains(name)
    }

    /// Binds `expr` to a new `let` and returns it as a run-time value.
    pub fn bind(&mut self, hint: &str, expr: String, dt: Dt, shape: Vec<Sym>) -> Run {
        let name = self.fresh(hint);
        self.lets.insert(name.clone());
        self.body.push(format!("let {name} = {expr}"));
        let r = Run { expr: name, dt, shape };
        self.types.insert(r.expr.clone(), r.ty());
        r
    }

    pub fn val(&self, name: &str) -> R<&Val> {
        self.vals
            .get(name)
            .ok_or_else(|| format!("input `{name}` is produced by no node before it"))
    }

    /// The constant named `name`, if it is one.
    pub fn konst(&self, name: &str) -> Option<&Const> {
        match self.vals.get(name) {
            Some(Val::Const(c)) => Some(c),
            _ => None,
        }
    }

    /// Input `i` of `n` as a constant, required.
    pub fn konst_in(&self, n: &Node, i: usize, what: &str) -> R<Const> {
        let name = n.input(i).ok_or_else(|| format!("has no {what} input"))?;
        self.konst(name).cloned().ok_or_else(|| {
            format!(
                "its {what} (`{name}`) is computed at run time; mgn needs it known when the \
                 model is built"
            )
        })
    }

    /// Input `i` of `n` as integers known at import time, if given.
    pub fn ints_in(&self, n: &Node, i: usize, what: &str) -> R<Option<Vec<Sym>>> {
        if n.input(i).is_none() {
            return Ok(None);
        }
        let c = self.konst_in(n, i, what)?;
        c.ints().map(|v| Some(v.to_vec())).ok_or_else(|| format!("its {what} is not integers"))
    }

    /// The shape (rank and sizes) of input `i`, whether constant or computed.
    pub fn shape_of(&self, n: &Node, i: usize) -> R<Vec<Sym>> {
        let name = n.input(i).ok_or("a required input is missing")?;
        Ok(match self.val(name)? {
            Val::Const(c) => c.shape_syms(),
            Val::Run(r) => r.shape.clone(),
        })
    }

    /// Input `i` as a run-time tensor: constants become parameters, buffers or literals.
    pub fn run(&mut self, n: &Node, i: usize) -> R<Run> {
        let name = n.input(i).ok_or("a required input is missing")?.to_string();
        match self.val(&name)?.clone() {
            Val::Run(r) => Ok(r),
            Val::Const(c) => self.materialize(&name, &c),
        }
    }

    /// A constant as a run-time tensor: an initializer is its parameter; another constant a
    /// buffer saved with the weights, or, for one element, a filled tensor.
    pub fn materialize(&mut self, name: &str, c: &Const) -> R<Run> {
        let dt = c.dt;
        let ty = dt.mgn().ok_or_else(|| {
            format!("constant `{name}` is {}, which mgn has no tensor type for", dt.onnx_name())
        })?;
        let shape = c.shape_syms();
        if let Some(path) = self.names.get(name).cloned() {
            let expr = self.fields.param(&path, c, dt.is_float());
            return Ok(Run { expr, dt, shape });
        }
        if c.numel() == 1 && c.ints().is_none_or(|v| v.iter().all(Sym::is_static)) {
            let v = c.scalar_text().ok_or_else(|| format!("constant `{name}` is not finite"))?;
            let dims: Vec<String> = shape.iter().map(Sym::text).collect();
            if dt == Dt::Bool {
                // `bool` is no value in mgn: a filled mask is a comparison.
                let op = if v == "true" { "==" } else { "!=" };
                let expr = format!("(full([{}], 0, dtype = i32) {op} 0)", dims.join(", "));
                return Ok(Run { expr, dt, shape });
            }
            let expr = format!("full([{}], {v}, dtype = {ty})", dims.join(", "));
            return Ok(Run { expr, dt, shape });
        }
        if let Some(ints) = c.ints() {
            if c.shape.len() == 1 && ints.iter().any(|s| !s.is_static()) {
                // Sizes that follow the model's arguments: a tensor written out of them.
                let items: Vec<String> =
                    ints.iter().map(|s| format!("full([1], {}, dtype = {ty})", s.text())).collect();
                let expr = format!("concat([{}])", items.join(", "));
                return Ok(Run { expr, dt, shape });
            }
        }
        let leaves: HashSet<String> =
            self.names.values().chain(self.claims.values().map(|c| &c.path)).cloned().collect();
        let path = self.fields.buffer_name(&self.cur_scope.clone(), &leaves);
        self.names.insert(name.to_string(), path.clone());
        let expr = self.fields.param(&path, c, false);
        Ok(Run { expr, dt, shape })
    }

    /// Lowers every node in order, collecting every problem.
    pub fn all(&mut self) {
        for (i, n) in self.g.nodes.iter().enumerate() {
            if self.absorbed.contains_key(&i) {
                continue;
            }
            let scope = n.scope.clone();
            self.cur_scope = scope.clone();
            self.fused.clear();
            match self.node(i, n) {
                Ok(outs) => {
                    let nodes = self.provenance(i);
                    // A constant computed here remembers the nodes it came from, for the
                    // statements that read it; a `Constant` is a literal of the file.
                    if n.op != "Constant" {
                        for (name, v) in n.outputs.iter().zip(&outs) {
                            if matches!(v, Val::Const(_)) && !name.is_empty() {
                                self.folded.insert(name.clone(), nodes.clone());
                            }
                        }
                    }
                    self.tag_node(i, n, &nodes);
                    // A node a claim absorbed (the `Add` of a `Linear`) gives the claim's value.
                    let absorbed: Vec<usize> =
                        self.claims.get(&i).map(|c| c.absorbs.clone()).unwrap_or_default();
                    for j in absorbed {
                        for o in &self.g.nodes[j].outputs {
                            self.vals.insert(o.clone(), outs[0].clone());
                        }
                    }
                    for (name, v) in n.outputs.iter().zip(outs) {
                        if !name.is_empty() {
                            self.vals.insert(name.clone(), v);
                        }
                    }
                }
                Err(e) => {
                    let what = if n.domain.is_empty() || n.domain == "ai.onnx" {
                        n.op.clone()
                    } else {
                        format!("{}.{}", n.domain, n.op)
                    };
                    if e != CASCADE {
                        let opset = self.g.opset;
                        self.problems
                            .push(format!("node `{}` ({what}, opset {opset}): {e}", n.name));
                    }
                    // Later nodes still get lowered: give the outputs a placeholder, so only
                    // the root cause is reported.
                    let absorbed =
                        self.claims.get(&i).map(|c| c.absorbs.clone()).unwrap_or_default();
                    let outs = absorbed.iter().flat_map(|&j| &self.g.nodes[j].outputs);
                    for o in n.outputs.iter().chain(outs) {
                        self.vals.insert(
                            o.clone(),
                            Val::Run(Run { expr: "?".into(), dt: Dt::F32, shape: vec![] }),
                        );
                    }
                    self.tag(&scope);
                }
            }
        }
    }

    fn node(&mut self, i: usize, n: &Node) -> R<Vec<Val>> {
        if !(n.domain.is_empty() || n.domain == "ai.onnx") {
            return Err(format!("ops of the domain `{}` are not supported", n.domain));
        }
        if !supported(&n.op) {
            return Err("mgn has no translation for this op".into());
        }
        for (k, a) in &n.attrs {
            if let super::graph::Attr::Other(kind) = a {
                if !matches!(n.op.as_str(), "Constant") {
                    return Err(format!("attribute `{k}` is a {kind}, which mgn cannot express"));
                }
            }
        }
        for inp in n.inputs.iter().filter(|s| !s.is_empty()) {
            if matches!(self.vals.get(inp.as_str()), Some(Val::Run(r)) if r.expr == "?") {
                return Err(CASCADE.into());
            }
        }
        if let Some(claim) = self.claims.get(&i).cloned() {
            if let Some(v) = nn::claimed(self, n, &claim)? {
                return Ok(vec![Val::Run(v)]);
            }
        }
        if let Some(folded) = fold::fold(self, n)? {
            return Ok(folded);
        }
        if let Some(v) = patterns::fuse(self, n)? {
            return Ok(vec![Val::Run(v)]);
        }
        self.lower(n)
    }

    fn lower(&mut self, n: &Node) -> R<Vec<Val>> {
        let one = |r: Run| Ok(vec![Val::Run(r)]);
        match n.op.as_str() {
            "Identity" | "Dropout" => {
                if n.op == "Dropout" && n.outputs.iter().skip(1).any(|o| !o.is_empty()) {
                    return Err("its mask output is used; mgn's dropout has none".into());
                }
                if n.op == "Dropout" && n.input(2).is_some() {
                    // Inference is the identity; a training-mode dropout is random.
                    let on = self.konst_in(n, 2, "training_mode")?;
                    if !matches!(&on.elems, super::value::Elems::B(v) if v.iter().all(|b| !b)) {
                        return Err("it drops in training mode: the generated model \
                                    computes inference, where dropout is the identity"
                            .into());
                    }
                }
                Ok(vec![self.val(n.input(0).ok_or("no input")?)?.clone()])
            }
            op if pointwise::handles(op) => one(pointwise::lower(self, n)?),
            op if reduce::handles(op) => one(reduce::lower(self, n)?),
            op if shape::handles(op) => shape::lower(self, n),
            op if nn::handles(op) => one(nn::lower(self, n)?),
            _ => Err("mgn has no translation for this op".into()),
        }
    }
}

/// Whether some path (lowering or folding) knows the op at all.
fn supported(op: &str) -> bool {
    matches!(op, "Identity" | "Dropout")
        || pointwise::handles(op)
        || reduce::handles(op)
        || shape::handles(op)
        || nn::handles(op)
        || fold::handles(op)
}

/// `axis` (maybe negative) as an index into `rank` axes.
pub fn norm_axis(axis: i64, rank: usize) -> R<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is outside a tensor of rank {rank}"))
    }
}

/// NumPy broadcasting of two shapes.
pub fn broadcast(a: &[Sym], b: &[Sym]) -> R<Vec<Sym>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let x = (k + a.len()).checked_sub(n).map(|i| &a[i]);
        let y = (k + b.len()).checked_sub(n).map(|i| &b[i]);
        out.push(match (x, y) {
            (Some(x), Some(y)) if x.v == y.v => {
                if x.is_static() {
                    y.clone()
                } else {
                    x.clone()
                }
            }
            (Some(x), Some(y)) if x.v == 1 => y.clone(),
            (Some(x), Some(y)) if y.v == 1 => x.clone(),
            (Some(x), None) | (None, Some(x)) => x.clone(),
            _ => return Err(format!("shapes {} and {} do not broadcast", dims(a), dims(b))),
        });
    }
    Ok(out)
}

pub fn dims(s: &[Sym]) -> String {
    let v: Vec<String> = s.iter().map(Sym::text).collect();
    format!("[{}]", v.join(", "))
}

/// Symbolic product of sizes.
pub fn product(s: &[Sym]) -> Sym {
    s.iter().fold(Sym::lit(1), |acc, d| {
        if acc.v == 1 && acc.is_static() {
            d.clone()
        } else {
            acc.op(d, '*').unwrap_or(Sym::lit(0))
        }
    })
}
