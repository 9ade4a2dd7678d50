//! Writing the source: the `use` lines, a generated layer for each module that holds
//! parameters (modules with the same fields share one), the model with its `dim` arguments,
//! inputs, fields, and the forward the lowering wrote.

use super::layers::{Decl, Fields};
use super::provenance::Stmt;
use super::structure::Forward;
use std::collections::{BTreeMap, BTreeSet, HashMap};

const RESERVED: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as", "f32", "f16", "bf16", "i32", "i64", "u32", "input", "output", "loss",
    "param", "buffer", "init", "training", "dim", "int", "float", "bool", "dtype", "state",
];

/// The standard library's functions that generated code may call besides the builtins
/// (`std.nn`'s activations without a builtin of their own).
const STD_FUNCTIONS: &[&str] = &["relu6", "hardsigmoid", "hardswish", "leaky_relu", "elu", "mish"];

/// `name` as an identifier that is no keyword and hides no builtin.
pub fn ident(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    s = s.trim_matches('_').to_string();
    while s.contains("__") {
        s = s.replace("__", "_");
    }
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s = format!("v_{s}");
    }
    // The compiler's own table of builtins: a name the importer makes must hide none of them,
    // including builtins added after this was written.
    let builtin = mgn_compiler::elab::builtins::is_builtin(&s);
    if RESERVED.contains(&s.as_str()) || builtin || STD_FUNCTIONS.contains(&s.as_str()) {
        s.push_str("_1");
    }
    s
}

enum Tree {
    Tensor(Decl),
    Layer(String),
    Node(Vec<(String, Tree)>),
}

fn insert(t: &mut Tree, path: &[&str], leaf: Tree) -> Result<(), String> {
    let Tree::Node(children) = t else { return Err("a parameter has fields below it".into()) };
    let (first, rest) = path.split_first().expect("a path has a segment");
    let pos = children.iter().position(|(k, _)| k == first);
    if rest.is_empty() {
        if pos.is_some() {
            return Err(format!("`{first}` is both a tensor or layer and a module"));
        }
        children.push((first.to_string(), leaf));
        return Ok(());
    }
    let i = match pos {
        Some(i) => i,
        None => {
            children.push((first.to_string(), Tree::Node(vec![])));
            children.len() - 1
        }
    };
    insert(&mut children[i].1, rest, leaf)
}

fn is_index(s: &str) -> bool {
    s.chars().all(|c| c.is_ascii_digit())
}

fn camel(s: &str) -> String {
    s.split('_')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
        })
        .collect()
}

/// The generated layer types, by body, so equal modules share one.
#[derive(Default)]
struct Types {
    by_body: BTreeMap<String, String>,
    names: BTreeSet<String>,
    items: Vec<String>,
}

impl Types {
    /// The layer whose body is `body` (compared without comments); a new one is written with
    /// `annotated`, the body with the comments naming the nodes of this, its first module.
    fn get(&mut self, hint: &str, body: String, annotated: String) -> String {
        if let Some(n) = self.by_body.get(&body) {
            return n.clone();
        }
        let base = match camel(hint) {
            s if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) => {
                format!("Module{s}")
            }
            s => s,
        };
        let mut name = base.clone();
        let mut k = 2;
        while self.names.contains(&name) || STD_LAYERS.contains(&name.as_str()) {
            name = format!("{base}{k}");
            k += 1;
        }
        self.names.insert(name.clone());
        self.items.push(format!("layer {name} {{\n{annotated}}}\n"));
        self.by_body.insert(body, name.clone());
        name
    }
}

const STD_LAYERS: &[&str] = &[
    "Linear",
    "Conv1d",
    "Conv2d",
    "BatchNorm1d",
    "BatchNorm2d",
    "LayerNorm",
    "Embedding",
    "Model",
    "Empty",
];

fn tensor_field(d: &Decl) -> String {
    let dims: Vec<String> = d.shape.iter().map(ToString::to_string).collect();
    let kind = if d.buffer { "buffer" } else { "param" };
    format!("{kind} {}[{}] init zeros", d.dt.mgn().unwrap_or("f32"), dims.join(", "))
}

/// The initializer text of one field: a tensor, a layer call, a list, or a generated layer.
/// Where a field is: its path, and the forwards structure recovery wrote, by path.
struct At<'a> {
    path: String,
    forwards: &'a HashMap<String, Forward>,
}

impl At<'_> {
    fn child(&self, k: &str) -> At<'_> {
        let path = if self.path.is_empty() { k.to_string() } else { format!("{}.{k}", self.path) };
        At { path, forwards: self.forwards }
    }
}

fn value(t: &Tree, hint: &str, at: &At, types: &mut Types, top: bool) -> Result<String, String> {
    match t {
        Tree::Tensor(d) => Ok(tensor_field(d)),
        Tree::Layer(call) => Ok(call.clone()),
        Tree::Node(children)
            if !children.is_empty() && children.iter().all(|(k, _)| is_index(k)) =>
        {
            let max =
                children.iter().map(|(k, _)| k.parse::<usize>().unwrap_or(0)).max().unwrap_or(0);
            let mut items = vec!["Empty()".to_string(); max + 1];
            for (k, c) in children {
                if matches!(c, Tree::Tensor(_)) {
                    return Err(format!(
                        "`{hint}.{k}` is a tensor in a numbered list (mgn lists hold layers)"
                    ));
                }
                items[k.parse::<usize>().unwrap_or(0)] =
                    value(c, &format!("{hint}_item"), &at.child(k), types, false)?;
            }
            // `repeat` makes a whole field, not an item of a list.
            if top && items.len() > 1 && items.iter().all(|i| *i == items[0]) {
                return Ok(format!("repeat({}) {}", items.len(), items[0]));
            }
            Ok(format!("[{}]", items.join(", ")))
        }
        Tree::Node(children) => {
            if children.iter().any(|(k, _)| is_index(k)) {
                return Err(format!("`{hint}` has both numbered and named fields"));
            }
            let mut body = String::new();
            for (k, c) in children {
                body.push_str(&format!("    {k} = {}\n", value(c, k, &at.child(k), types, true)?));
            }
            let mut annotated = body.clone();
            if let Some(f) = at.forwards.get(&at.path) {
                body.push('\n');
                body.push_str(&f.text(false));
                annotated.push('\n');
                annotated.push_str(&f.text(true));
            }
            Ok(format!("{}()", types.get(hint, body, annotated)))
        }
    }
}

/// What the model needs beyond the forward the lowering wrote.
pub struct Model<'a> {
    pub name: &'a str,
    pub header: Vec<String>,
    pub dims: Vec<(String, i64)>,
    pub inputs: Vec<(String, String)>,
    pub fields: &'a Fields,
    pub uses: &'a BTreeSet<String>,
    pub body: &'a [Stmt],
    pub forwards: &'a HashMap<String, Forward>,
}

pub fn source(m: &Model) -> Result<String, String> {
    let mut root = Tree::Node(vec![]);
    for path in &m.fields.order {
        let leaf = match (m.fields.tensors.get(path), m.fields.layers.get(path)) {
            (Some(d), _) => Tree::Tensor(d.clone()),
            (None, Some(call)) => Tree::Layer(call.clone()),
            (None, None) => continue,
        };
        let segs: Vec<&str> = path.split('.').collect();
        insert(&mut root, &segs, leaf).map_err(|e| format!("the field `{path}`: {e}"))?;
    }
    let mut types = Types::default();
    let mut fields = String::new();
    let Tree::Node(children) = &root else { unreachable!() };
    for (k, c) in children {
        let at = At { path: k.clone(), forwards: m.forwards };
        fields.push_str(&format!("    {k} = {}\n", value(c, k, &at, &mut types, true)?));
    }
    let mut out = String::new();
    for h in &m.header {
        out.push_str(&format!("// {h}\n"));
    }
    out.push('\n');
    let mut by_module: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for u in m.uses {
        let (module, item) = u.split_once('.').expect("module.item");
        by_module.entry(module).or_default().push(item);
    }
    for (module, items) in &by_module {
        out.push_str(&format!("use std.{module}.{{{}}}\n", items.join(", ")));
    }
    out.push('\n');
    if types.items.iter().any(|_| true) || fields.contains("Empty()") {
        if fields.contains("Empty()") || types.items.iter().any(|t| t.contains("Empty()")) {
            out.push_str("// A module without parameters, keeping the numbering of a list.\n");
            out.push_str("layer Empty {}\n\n");
        }
        for t in &types.items {
            out.push_str(t);
            out.push('\n');
        }
    }
    let args: Vec<String> = m.dims.iter().map(|(n, v)| format!("{n}: dim = {v}")).collect();
    let args = if args.is_empty() { String::new() } else { format!("({})", args.join(", ")) };
    out.push_str(&format!("model {}{args} {{\n", m.name));
    for (name, ty) in &m.inputs {
        out.push_str(&format!("    input {name}: {ty}\n"));
    }
    out.push('\n');
    out.push_str(&fields);
    out.push_str("\n    forward {\n");
    for s in m.body {
        out.push_str(&s.render(8));
    }
    out.push_str("    }\n}\n");
    Ok(out)
}

/// The paths that become generated layers: every module above a field that is not a list.
pub fn modules(fields: &Fields) -> Vec<String> {
    let mut out: BTreeSet<String> = BTreeSet::new();
    let mut lists: BTreeSet<String> = BTreeSet::new();
    for path in &fields.order {
        let segs: Vec<&str> = path.split('.').collect();
        for k in 1..segs.len() {
            let prefix = segs[..k].join(".");
            if is_index(segs[k]) {
                lists.insert(prefix);
            } else {
                out.insert(prefix);
            }
        }
    }
    out.difference(&lists).cloned().collect()
}

/// The length of every list of layers, by path (`layer1` → 3).
pub fn list_lengths(fields: &Fields) -> HashMap<String, usize> {
    let mut lens: HashMap<String, usize> = HashMap::new();
    for path in &fields.order {
        let segs: Vec<&str> = path.split('.').collect();
        for k in 1..segs.len() {
            if let Ok(i) = segs[k].parse::<usize>() {
                let n = lens.entry(segs[..k].join(".")).or_default();
                *n = (*n).max(i + 1);
            }
        }
    }
    lens
}
