//! Structure: the parameter names the source declares (from the initializers' names, or, for
//! an exporter's `onnx::Conv_497`, from the module path of the node that reads it), the std
//! layers recognised from how initializers are used (a `Conv` reading a weight is a `Conv2d`),
//! and the fields those names make: nested layers as the dotted names say.

use super::graph::Graph;
use super::value::{Const, Dt, Elems};
use std::collections::{BTreeMap, HashMap, HashSet};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Conv,
    Linear,
    BatchNorm,
    LayerNorm,
    Embedding,
}

/// A std layer recognised at a node: the module path it becomes and the initializers it owns
/// (in the layer's order: weight, bias, running mean, running variance).
#[derive(Clone, Debug)]
pub struct Claim {
    pub kind: Kind,
    pub path: String,
    pub inits: Vec<Option<String>>,
    /// Nodes folded into this one (the `Add` after a `MatMul`).
    pub absorbs: Vec<usize>,
    /// The weight is stored transposed in the file (`MatMul` by `[in, out]`).
    pub transposed: bool,
}

/// Finds the std layers and names every initializer.
pub fn plan(g: &Graph) -> (HashMap<String, String>, HashMap<usize, Claim>) {
    let mut uses: HashMap<&str, Vec<(usize, usize)>> = HashMap::new();
    for (i, n) in g.nodes.iter().enumerate() {
        for (k, inp) in n.inputs.iter().enumerate() {
            uses.entry(inp.as_str()).or_default().push((i, k));
        }
    }
    let single =
        |name: &str| g.inits.contains_key(name) && uses.get(name).is_some_and(|u| u.len() == 1);
    let mut claims = HashMap::new();
    for i in 0..g.nodes.len() {
        if let Some(c) = claim(g, i, &uses, &single) {
            claims.insert(i, c);
        }
    }
    let mut names: HashMap<String, String> = HashMap::new();
    let mut taken: HashSet<String> = HashSet::new();
    // Real names first: they are the checkpoint names upstream code knows.
    let mut order: Vec<&String> = g.inits.keys().collect();
    order.sort();
    for name in &order {
        if let Some(p) = clean_path(name) {
            taken.insert(p.clone());
            names.insert((*name).clone(), p);
        }
    }
    let roles: [&[&str]; 5] = [
        &["weight", "bias"],
        &["weight", "bias"],
        &["weight", "bias", "running_mean", "running_var"],
        &["weight", "bias"],
        &["weight"],
    ];
    let mut by_index: Vec<usize> = claims.keys().copied().collect();
    by_index.sort_unstable();
    for i in by_index {
        let c = claims.get_mut(&i).expect("listed");
        let role = roles[c.kind as usize];
        let known = c.inits.iter().zip(role.iter()).find_map(|(init, r)| {
            let p = names.get(init.as_deref()?)?;
            p.strip_suffix(&format!(".{r}")).map(str::to_string)
        });
        let path = match &known {
            Some(p) => p.clone(),
            None => unique(&mut taken, &scope_or(&g.nodes[i].scope, c.kind)),
        };
        for (init, r) in c.inits.iter().zip(role.iter()) {
            let Some(init) = init else { continue };
            // Names that say no layer (`bn_scale`, `onnx::Conv_7`, a fused `conv1.weight_bias`)
            // give way to the layer's.
            let fits = names.get(init).is_some_and(|p| *p == format!("{path}.{r}"));
            if !fits && !taken.contains(&format!("{path}.{r}")) {
                if let Some(old) = names.get(init) {
                    taken.remove(old);
                }
                let p = format!("{path}.{r}");
                taken.insert(p.clone());
                names.insert(init.clone(), p);
            }
        }
        c.path = path;
    }
    for name in &order {
        if names.contains_key(*name) {
            continue;
        }
        let (scope, role) = match uses.get(name.as_str()).and_then(|u| u.first()) {
            Some(&(i, k)) => {
                let scopes = uses[name.as_str()].iter().map(|&(j, _)| g.nodes[j].scope.as_str());
                (shared_scope(scopes), role_of(&g.nodes[i].op, k))
            }
            None => (String::new(), "unused"),
        };
        let base = if scope.is_empty() { role.to_string() } else { format!("{scope}.{role}") };
        names.insert((*name).clone(), unique(&mut taken, &base));
    }
    // A claim stands only if its path holds exactly the tensors it owns: a module with
    // further parameters stays a set of fields.
    let all: Vec<&String> = names.values().collect();
    claims.retain(|_, c| {
        let owned: HashSet<&str> =
            c.inits.iter().flatten().filter_map(|i| names.get(i).map(String::as_str)).collect();
        let prefix = format!("{}.", c.path);
        let consistent = c.inits.iter().zip(roles[c.kind as usize]).all(|(i, r)| {
            i.as_ref().is_none_or(|i| names.get(i).is_some_and(|p| *p == format!("{}.{r}", c.path)))
        });
        consistent
            && all
                .iter()
                .filter(|p| p.starts_with(&prefix) || **p == &c.path)
                .all(|p| owned.contains(p.as_str()))
    });
    (names, claims)
}

type Uses<'a> = HashMap<&'a str, Vec<(usize, usize)>>;

fn claim(g: &Graph, i: usize, uses: &Uses, single: &dyn Fn(&str) -> bool) -> Option<Claim> {
    let n = &g.nodes[i];
    let init = |k: usize| n.input(k).filter(|s| single(s)).map(str::to_string);
    let float2 = |name: &Option<String>, rank: usize| {
        name.as_ref()
            .and_then(|s| g.inits.get(s))
            .is_some_and(|c| c.dt == Dt::F32 && c.shape.len() == rank)
    };
    let mk = |kind, inits: Vec<Option<String>>| Claim {
        kind,
        path: String::new(),
        inits,
        absorbs: vec![],
        transposed: false,
    };
    let data_is_run = n.input(0).is_some_and(|s| !g.inits.contains_key(s));
    match n.op.as_str() {
        "Conv"
            if data_is_run && init(1).is_some() && (n.input(2).is_none() || init(2).is_some()) =>
        {
            let w = init(1);
            let rank = g.inits.get(w.as_deref()?)?.shape.len();
            (matches!(rank, 3 | 4) && float2(&w, rank)).then(|| mk(Kind::Conv, vec![w, init(2)]))
        }
        "Gemm"
            if data_is_run
                && init(1).is_some()
                && (n.input(2).is_none() || float2(&init(2), 1)) =>
        {
            let ok = n.int("transA", 0) == 0
                && n.float("alpha", 1.0) == 1.0
                && n.float("beta", 1.0) == 1.0;
            let mut c = mk(Kind::Linear, vec![init(1), init(2)]);
            c.transposed = n.int("transB", 0) == 0;
            (ok && float2(&init(1), 2)).then_some(c)
        }
        "MatMul" if data_is_run && float2(&init(1), 2) => {
            let w = init(1);
            let out_features = g.inits.get(w.as_deref()?)?.shape[1];
            let mut c = mk(Kind::Linear, vec![w, None]);
            c.transposed = true;
            let users = uses.get(n.outputs.first()?.as_str()).cloned().unwrap_or_default();
            if let [(j, k)] = users[..] {
                let add = &g.nodes[j];
                let b = add.input(1 - k).filter(|s| single(s)).map(str::to_string);
                let fits = b
                    .as_ref()
                    .and_then(|s| g.inits.get(s))
                    .is_some_and(|c| c.dt == Dt::F32 && c.shape == [out_features]);
                if add.op == "Add" && k < 2 && fits && !g.outputs.contains(n.outputs.first()?) {
                    c.inits[1] = b;
                    c.absorbs.push(j);
                }
            }
            Some(c)
        }
        "BatchNormalization"
            if data_is_run
                && (1..5).all(|k| float2(&init(k), 1))
                && n.int("training_mode", 0) == 0 =>
        {
            Some(mk(Kind::BatchNorm, (1..5).map(init).collect()))
        }
        "LayerNormalization"
            if data_is_run
                && float2(&init(1), 1)
                && (n.input(2).is_none() || float2(&init(2), 1)) =>
        {
            Some(mk(Kind::LayerNorm, vec![init(1), init(2)]))
        }
        "Gather"
            if n.int("axis", 0) == 0
                && float2(&init(0), 2)
                && n.input(1).is_some_and(|s| !g.inits.contains_key(s)) =>
        {
            Some(mk(Kind::Embedding, vec![init(0)]))
        }
        _ => None,
    }
}

/// The module an unnamed initializer belongs to: the innermost one holding every node that
/// reads it. An exporter shares one constant (an epsilon, a causal mask) among all the blocks
/// that use it; held by the first block, the others would read it from there, and the first
/// block's code would differ from theirs. A list holds only layers, so a constant its items
/// share belongs to the module above the list.
fn shared_scope<'a>(mut scopes: impl Iterator<Item = &'a str>) -> String {
    let Some(first) = scopes.next() else { return String::new() };
    let mut common: Vec<&str> = first.split('.').filter(|s| !s.is_empty()).collect();
    let mut list = false;
    for s in scopes {
        let segs: Vec<&str> = s.split('.').filter(|s| !s.is_empty()).collect();
        let k = common.iter().zip(&segs).take_while(|(a, b)| a == b).count();
        if k < common.len() {
            // Where the paths part, a number names an item of a list.
            let item = |p: &[&str]| p.get(k).is_some_and(|s| s.chars().all(|c| c.is_ascii_digit()));
            list = item(&common) || item(&segs);
            common.truncate(k);
        }
    }
    if list {
        common.pop();
    }
    common.join(".")
}

fn role_of(op: &str, k: usize) -> &'static str {
    match (op, k) {
        ("Conv" | "Gemm" | "MatMul" | "ConvTranspose" | "LayerNormalization" | "Mul", 1) => {
            "weight"
        }
        ("Gather", 0) => "weight",
        ("Conv" | "Gemm" | "LayerNormalization" | "ConvTranspose", 2) | ("Add", _) => "bias",
        _ => "constant",
    }
}

fn scope_or(scope: &str, kind: Kind) -> String {
    if scope.is_empty() {
        match kind {
            Kind::Conv => "conv",
            Kind::Linear => "linear",
            Kind::BatchNorm => "bn",
            Kind::LayerNorm => "norm",
            Kind::Embedding => "embedding",
        }
        .to_string()
    } else {
        clean_path(scope).unwrap_or_else(|| super::emit::ident(scope))
    }
}

fn unique(taken: &mut HashSet<String>, base: &str) -> String {
    // A root field must not hide a builtin (`constant`) or be a keyword.
    let base = match base.split_once('.') {
        None => super::emit::ident(base),
        Some(_) => base.to_string(),
    };
    let base = base.as_str();
    let mut p = base.to_string();
    let mut k = 1;
    while taken.contains(&p) || taken.iter().any(|t| t.starts_with(&format!("{p}."))) {
        p = format!("{base}_{k}");
        k += 1;
    }
    taken.insert(p.clone());
    p
}

/// A name usable as a field path as it is: dotted segments, each a word or a number, the
/// first a word.
pub fn clean_path(name: &str) -> Option<String> {
    // The dynamo exporter's own constants (`val_12`) name no module.
    if name.strip_prefix("val_").is_some_and(|r| r.chars().all(|c| c.is_ascii_digit())) {
        return None;
    }
    let segs: Vec<&str> = name.split('.').collect();
    // A model field hides the builtin of its name in the forward (dynamo names a folded
    // constant `unsqueeze`): such a name is no module's.
    if super::emit::ident(segs[0]) != segs[0] {
        return None;
    }
    let word = |s: &str| {
        let mut c = s.chars();
        c.next().is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
            && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let number = |s: &str| {
        !s.is_empty()
            && s.len() < 6
            && s.chars().all(|c| c.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'))
    };
    let ok = word(segs[0]) && segs.iter().all(|s| word(s) || number(s));
    ok.then(|| name.to_string())
}

/// A declared tensor field.
#[derive(Clone, Debug)]
pub struct Decl {
    pub buffer: bool,
    pub dt: Dt,
    pub shape: Vec<usize>,
}

/// The fields the generated source declares, by path, and the tensors the checkpoint holds.
#[derive(Default)]
pub struct Fields {
    pub tensors: BTreeMap<String, Decl>,
    /// Std layers: path → the call that makes one (`Conv2d(3, 64, 7, stride = 2, padding = 3)`).
    pub layers: BTreeMap<String, String>,
    /// The order paths were first used in, so the source lists fields as the graph reads them.
    pub order: Vec<String>,
    pub weights: Vec<(String, Const)>,
    next_buffer: usize,
}

impl Fields {
    /// Declares the tensor `path` holding `c` (once) and returns how the forward reads it.
    pub fn param(&mut self, path: &str, c: &Const, trainable: bool) -> String {
        if !self.tensors.contains_key(path) {
            let buffer = !trainable || !c.dt.is_float();
            self.tensors
                .insert(path.to_string(), Decl { buffer, dt: c.dt, shape: c.shape.clone() });
            self.order.push(path.to_string());
            self.weights.push((path.to_string(), c.clone()));
        }
        access(path)
    }

    /// Declares the std layer `path` with its tensors (already in the layer's layout).
    pub fn layer(&mut self, path: &str, call: String, tensors: Vec<(String, Const)>) -> String {
        if !self.layers.contains_key(path) {
            self.layers.insert(path.to_string(), call);
            self.order.push(path.to_string());
            for (name, c) in tensors {
                self.weights.push((format!("{path}.{name}"), c));
            }
        }
        access(path)
    }

    /// A name for a constant the model needs as a tensor: `constants.c0`, …
    /// A name for a constant the model needs as a tensor, in the module that reads it (so
    /// the module's forward can hold the read): `h.0.attn.const0`, or `constants.c0` at the top.
    /// `leaves` are the paths that are tensors or std layers, which can hold nothing more.
    pub fn buffer_name(&mut self, scope: &str, leaves: &HashSet<String>) -> String {
        let scope = clean_path(scope).unwrap_or_default();
        let mut module = String::new();
        for seg in scope.split('.').filter(|s| !s.is_empty()) {
            let next = if module.is_empty() { seg.to_string() } else { format!("{module}.{seg}") };
            if leaves.contains(&next)
                || self.layers.contains_key(&next)
                || self.tensors.contains_key(&next)
            {
                break;
            }
            module = next;
        }
        // A list's item is a module; the list itself holds only layers.
        while module.rsplit('.').next().is_some_and(|s| !s.chars().all(|c| c.is_ascii_digit()))
            && leaves.iter().any(|l| l.starts_with(&format!("{module}.0")))
        {
            module = module.rsplit_once('.').map_or(String::new(), |(a, _)| a.to_string());
        }
        loop {
            let k = self.next_buffer;
            self.next_buffer += 1;
            let p = if module.is_empty() {
                format!("constants.c{k}")
            } else {
                format!("{module}.const{k}")
            };
            let clash = self.order.iter().any(|o| *o == p || o.starts_with(&format!("{p}.")));
            if !clash {
                return p;
            }
        }
    }
}

/// `self.layer1[0].conv1.weight` for `layer1.0.conv1.weight`.
pub fn access(path: &str) -> String {
    let mut s = String::from("self");
    for seg in path.split('.') {
        if seg.chars().all(|c| c.is_ascii_digit()) {
            s.push_str(&format!("[{seg}]"));
        } else {
            s.push('.');
            s.push_str(seg);
        }
    }
    s
}

/// `w` transposed, for a weight the file stores as `[in, out]`.
pub fn transpose(c: &Const) -> Const {
    let (r, k) = (c.shape[0], c.shape[1]);
    let t = |i: usize| (i % r) * k + i / r;
    let elems = match &c.elems {
        Elems::F(v) => Elems::F((0..v.len()).map(|i| v[t(i)]).collect()),
        other => other.clone(),
    };
    Const { dt: c.dt, shape: vec![k, r], elems }
}
