//! Structure recovery: the statements of one module (the nodes whose module path is
//! `layer1.0`, and those of the modules inside it) become the `forward` of that module's
//! generated layer, and the model calls it, when they read a few values from outside (the
//! first one threaded through, the others passed along: a mask, rotary tables, a constant
//! another module holds) and a few values of theirs are read after them (one is returned as
//! it is, several as a tuple). Inner modules go first, so a block's forward calls its
//! sub-blocks. Names inside a forward are local (`x` is its input), so modules that compute
//! the same thing get the same text, and `emit` gives them one layer. Only the text is
//! compared: the nodes a statement came from travel beside it (`Stmt::nodes`) and become
//! comments when the source is written.

use super::layers::access;
use super::provenance::Stmt;
use std::collections::{HashMap, HashSet};

/// The identifiers of a line, with their byte ranges, outside strings, not after a `.` and
/// not the name of a named argument (`mask` in `attention(q, k, v, mask = m)` reads no value
/// called `mask`).
fn words(line: &str) -> Vec<(usize, usize)> {
    let b = line.as_bytes();
    let (mut out, mut i, mut in_str) = (Vec::new(), 0, false);
    while i < b.len() {
        let c = b[i];
        if c == b'"' {
            in_str = !in_str;
        }
        if !in_str && (c.is_ascii_alphabetic() || c == b'_') && (i == 0 || !is_word(b[i - 1])) {
            let start = i;
            while i < b.len() && is_word(b[i]) {
                i += 1;
            }
            let named_arg = (line[..start].ends_with('(') || line[..start].ends_with(", "))
                && line[i..].starts_with(" = ");
            if (start == 0 || b[start - 1] != b'.') && !named_arg {
                out.push((start, i));
            }
            continue;
        }
        i += 1;
    }
    out
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The field accesses of a line: `self` and the `.name` and `[i]` after it.
fn accesses(line: &str) -> Vec<String> {
    let b = line.as_bytes();
    let mut out = Vec::new();
    for (a, e) in words(line) {
        if &line[a..e] != "self" {
            continue;
        }
        let mut i = e;
        loop {
            if i < b.len()
                && b[i] == b'.'
                && b.get(i + 1).is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
            {
                i += 1;
                while i < b.len() && is_word(b[i]) {
                    i += 1;
                }
            } else if i < b.len() && b[i] == b'[' {
                let close = line[i..].find(']').map_or(i, |k| i + k);
                if !line[i + 1..close].chars().all(|c| c.is_ascii_digit()) || close == i {
                    break;
                }
                i = close + 1;
            } else {
                break;
            }
        }
        out.push(line[a..i].to_string());
    }
    out
}

/// Replaces the whole access `from` (not a longer one it begins) by `to`.
fn replace_access(line: &str, from: &str, to: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(k) = rest.find(from) {
        let after = rest[k + from.len()..].bytes().next();
        let whole = !after.is_some_and(|c| is_word(c) || c == b'.' || c == b'[');
        out.push_str(&rest[..k]);
        out.push_str(if whole { to } else { from });
        rest = &rest[k + from.len()..];
    }
    out.push_str(rest);
    out
}

/// Renames whole identifiers (not fields after a `.`) by `map`.
pub fn rename(line: &str, map: &HashMap<String, String>) -> String {
    let mut out = String::new();
    let mut last = 0;
    for (a, b) in words(line) {
        if let Some(to) = map.get(&line[a..b]) {
            out.push_str(&line[last..a]);
            out.push_str(to);
            last = b;
        }
    }
    out.push_str(&line[last..]);
    out
}

/// The names a statement binds: `let a = …`, `let (a, b) = …`.
fn defined(line: &str) -> Vec<String> {
    let Some(rest) = line.strip_prefix("let ") else { return vec![] };
    let lhs = rest.split(" = ").next().unwrap_or("");
    lhs.trim_matches(['(', ')']).split(',').map(|s| s.trim().to_string()).collect()
}

/// A module's recovered forward.
#[derive(Clone, Debug)]
pub struct Forward {
    /// `forward(x: f32[2, 8], mask: f32[2, 1, 8, 8]) -> f32[2, 8]`
    pub header: String,
    pub body: Vec<Stmt>,
    /// What it returns: a local name, or a tuple of them.
    pub result: String,
}

impl Forward {
    /// The forward as a layer's member: with the comments naming nodes, or without (the text
    /// equal modules share).
    pub fn text(&self, comments: bool) -> String {
        let mut out = format!("    {} {{\n", self.header);
        for (k, s) in self.body.iter().enumerate() {
            let mut s = s.clone();
            // A line that starts with `(` would continue the one before: a tuple is returned
            // after a `;`.
            if k + 1 == self.body.len() && self.result.starts_with('(') {
                s.text.push(';');
            }
            if !comments {
                s.nodes.clear();
            }
            out.push_str(&s.render(8));
        }
        out.push_str(&format!("        {}\n    }}\n", self.result));
        out
    }
}

pub struct Recovered {
    pub body: Vec<Stmt>,
    /// The forward of each module whose statements moved into it, by module path.
    pub forwards: HashMap<String, Forward>,
}

/// The most values a block may read from outside, and give back. A decoder block reads its
/// hidden state, the rotary tables, a mask and a constant another module holds (an epsilon).
const MAX_IN: usize = 8;
const MAX_OUT: usize = 4;

/// Moves the statements of each module in `modules` (deepest first) into its forward.
pub fn recover(
    mut body: Vec<Stmt>,
    types: &HashMap<String, String>,
    modules: &[String],
    lens: &HashMap<String, usize>,
) -> Recovered {
    let mut forwards = HashMap::new();
    let mut order: Vec<&String> = modules.iter().collect();
    order.sort_by_key(|p| std::cmp::Reverse(p.split('.').count()));
    for path in order {
        if let Some((range, call, forward)) = extract(&body, types, path, lens) {
            body.splice(range, [Stmt::plain(call, path)]);
            forwards.insert(path.clone(), forward);
        }
    }
    let body = chain(&body, "", lens);
    Recovered { body, forwards }
}

type Extracted = (std::ops::Range<usize>, String, Forward);

fn extract(
    body: &[Stmt],
    types: &HashMap<String, String>,
    path: &str,
    lens: &HashMap<String, usize>,
) -> Option<Extracted> {
    let inside = |s: &String| s == path || s.starts_with(&format!("{path}."));
    let first = body.iter().position(|s| inside(&s.scope))?;
    let last = body.iter().rposition(|s| inside(&s.scope))?;
    // A node the exporter named without its module (`Cast_12`) between two of the module's
    // belongs to it.
    if !body[first..=last].iter().all(|s| inside(&s.scope) || s.scope.is_empty()) {
        return None;
    }
    let stmts = &body[first..=last];
    let lines: Vec<String> = stmts.iter().map(|s| s.text.clone()).collect();
    if lines.iter().any(|l| !l.starts_with("let ")) {
        return None;
    }
    let me = access(path);
    let after: Vec<&String> = body[last + 1..].iter().map(|s| &s.text).collect();
    let (outer, used_after) = boundary(&after, &lines, types, &me)?;
    // A few values out; a few in, the first of which is threaded (a block's hidden state), the
    // others passed along (a mask, rotary tables).
    if used_after.is_empty() || used_after.len() > MAX_OUT {
        return None;
    }
    if outer.is_empty() || outer.len() > MAX_IN {
        return None;
    }
    // The threaded input is a value computed outside, not a field.
    if outer[0].starts_with("self") {
        return None;
    }
    // Sizes that are expressions (`batch * 12`) would not bind in a pattern.
    let compound = |t: &str| t.contains(['(', '*', '+', '/']) || t.contains(" - ");
    let mut params = Vec::new();
    for v in &outer {
        let t = types.get(v)?;
        if compound(t) {
            return None;
        }
        params.push(t.clone());
    }
    let ty_out: Vec<&String> = used_after.iter().map(|v| types.get(v)).collect::<Option<_>>()?;
    let local = local_names(&outer, &lines);
    let mut text = Vec::new();
    for s in stmts {
        let mut l = s.text.clone();
        for v in outer.iter().filter(|v| v.starts_with("self")) {
            l = replace_access(&l, v, &local[v]);
        }
        let l = &l;
        // Only the module's own fields: another module's parameter keeps it in the model.
        let mine = words(l).iter().filter(|&&(a, b)| &l[a..b] == "self").all(|&(a, _)| {
            l[a..].starts_with(&format!("{me}.")) || l[a..].starts_with(&format!("{me}["))
        });
        if !mine || l.contains(&format!("{me}(")) {
            return None;
        }
        let l = l.replace(&format!("{me}."), "self.").replace(&format!("{me}["), "self[");
        text.push(Stmt { text: rename(&l, &local), ..s.clone() });
    }
    // Lists called item by item inside the module are called whole; the outputs stay read.
    let result: Vec<String> = used_after.iter().map(|v| local[v].clone()).collect();
    let result =
        if let [one] = &result[..] { one.clone() } else { format!("({})", result.join(", ")) };
    text.push(Stmt::plain(format!("let _ = {result}"), path));
    let mut text = chain(&text, path, lens);
    text.pop();
    let ret = if ty_out.iter().any(|t| compound(t)) {
        String::new()
    } else if let [t] = &ty_out[..] {
        format!(" -> {t}")
    } else {
        let t: Vec<&str> = ty_out.iter().map(|t| t.as_str()).collect();
        format!(" -> ({})", t.join(", "))
    };
    let sig: Vec<String> =
        outer.iter().zip(&params).map(|(v, t)| format!("{}: {t}", local[v])).collect();
    let header = format!("forward({}){ret}", sig.join(", "));
    let forward = Forward { header, body: text, result };
    let lhs = if let [one] = &used_after[..] {
        one.clone()
    } else {
        format!("({})", used_after.join(", "))
    };
    let call = format!("let {lhs} = {me}({})", outer.join(", "));
    Some((first..last + 1, call, forward))
}

/// The values the module's `lines` read from outside (lets, inputs, other modules' tensors),
/// in order of first use, and those of its own that later statements read.
fn boundary(
    after: &[&String],
    lines: &[String],
    types: &HashMap<String, String>,
    me: &str,
) -> Option<(Vec<String>, Vec<String>)> {
    let own: HashSet<String> = lines.iter().flat_map(|l| defined(l)).collect();
    let reads = |l: &String| -> Vec<String> {
        words(l)
            .into_iter()
            .map(|(a, b)| l[a..b].to_string())
            .filter(|w| types.contains_key(w))
            .collect()
    };
    let mut outer: Vec<String> = Vec::new();
    for l in lines {
        let rhs = l.split_once(" = ").map_or("", |(_, r)| r).to_string();
        for w in reads(&rhs) {
            if !own.contains(&w) && !outer.contains(&w) {
                outer.push(w);
            }
        }
    }
    // Tensors of the model's other modules the statements read (a rotary table, a mask
    // buffer) are passed in, as values from outside are.
    for l in lines {
        for acc in accesses(l) {
            if !(acc.starts_with(&format!("{me}.")) || acc.starts_with(&format!("{me}["))) {
                if !types.contains_key(&acc) {
                    return None; // a layer of another module: it cannot be passed
                }
                if !outer.contains(&acc) {
                    outer.push(acc);
                }
            }
        }
    }
    let mut used_after: Vec<String> = Vec::new();
    for l in after {
        for w in words(l).into_iter().map(|(a, b)| l[a..b].to_string()) {
            if own.contains(&w) && !used_after.contains(&w) {
                used_after.push(w);
            }
        }
    }
    Some((outer, used_after))
}

/// Local names inside a forward: `x` for the threaded input, the others by their base names.
fn local_names(outer: &[String], lines: &[String]) -> HashMap<String, String> {
    let mut local: HashMap<String, String> = HashMap::new();
    let mut taken: HashSet<String> = HashSet::new();
    let fresh = |name: &str, taken: &mut HashSet<String>| {
        let base =
            super::emit::ident(name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '_'));
        let mut n = base.clone();
        let mut k = 1;
        while taken.contains(&n) {
            n = format!("{base}_{k}");
            k += 1;
        }
        taken.insert(n.clone());
        n
    };
    for (k, v) in outer.iter().enumerate() {
        let v_name = v.rsplit(['.', '[']).next().unwrap_or("t").trim_end_matches(']').to_string();
        let v_name =
            if v_name.chars().all(|c| c.is_ascii_digit()) { format!("t{v_name}") } else { v_name };
        let n = if k == 0 {
            taken.insert("x".into());
            "x".to_string()
        } else {
            fresh(&v_name, &mut taken)
        };
        local.insert(v.clone(), n);
    }
    for name in lines.iter().flat_map(|l| defined(l)) {
        let n = fresh(&name, &mut taken);
        local.insert(name, n);
    }
    local
}

/// `self.a.b[2].c` → `a.b.2.c`.
fn dotted(acc: &str) -> Option<String> {
    let rest = acc.strip_prefix("self")?;
    let mut out = String::new();
    for part in rest.split(['.', '[']).filter(|p| !p.is_empty()) {
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(part.trim_end_matches(']'));
    }
    Some(out)
}

/// `let o = ACC[I](ARG, REST)` → (o, ACC, I, ARG, REST).
fn item_call(line: &str) -> Option<(&str, &str, usize, &str, &str)> {
    let (lhs, rhs) = line.strip_prefix("let ")?.split_once(" = ")?;
    let open = rhs.find("](")?;
    let lb = rhs[..open].rfind('[')?;
    let args = rhs[open + 2..].strip_suffix(')')?;
    let (arg, rest) = args.split_once(", ").unwrap_or((args, ""));
    let plain = |s: &str| !s.contains(['(', ' ']);
    if !plain(arg) || !rest.split(", ").all(plain) || lhs.contains(['(', ',']) {
        return None;
    }
    Some((lhs, &rhs[..lb], rhs[lb + 1..open].parse().ok()?, arg, rest))
}

/// Calls of every item of a list in turn, each feeding the next and read nowhere else, become
/// one call of the list (`self.layer1(x)`), as a Sequential is called. `within` is the path
/// of the module whose forward `lines` are (empty for the model); `lens` the length of every
/// list, by path. The call names the nodes of the calls it replaces.
pub fn chain(lines: &[Stmt], within: &str, lens: &HashMap<String, usize>) -> Vec<Stmt> {
    let uses = |name: &str, skip: usize| {
        lines
            .iter()
            .enumerate()
            .filter(|&(k, _)| k != skip)
            .filter(|(_, s)| words(&s.text).iter().any(|&(a, b)| &s.text[a..b] == name))
            .count()
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if let Some((o, acc, 0, arg, rest)) = item_call(&lines[i].text) {
            let path =
                dotted(acc).map(|p| if within.is_empty() { p } else { format!("{within}.{p}") });
            let n = path.and_then(|p| lens.get(&p).copied()).unwrap_or(0);
            let mut last = (o, i);
            let mut ok = n >= 1;
            for k in 1..n {
                match lines.get(i + k).and_then(|s| item_call(&s.text)) {
                    Some((o2, acc2, idx, arg2, rest2))
                        if acc2 == acc && idx == k && arg2 == last.0 && rest2 == rest =>
                    {
                        // The value between two items is read by the next item only.
                        ok &= uses(last.0, last.1) == 1;
                        last = (o2, i + k);
                    }
                    _ => ok = false,
                }
                if !ok {
                    break;
                }
            }
            if ok {
                let args = if rest.is_empty() { arg.to_string() } else { format!("{arg}, {rest}") };
                let mut nodes: Vec<String> = Vec::new();
                for s in &lines[i..i + n] {
                    nodes.extend(
                        s.nodes.iter().filter(|m| !nodes.contains(m)).cloned().collect::<Vec<_>>(),
                    );
                }
                let text = format!("let {} = {acc}({args})", last.0);
                out.push(Stmt { text, scope: lines[i].scope.clone(), nodes });
                i += n;
                continue;
            }
        }
        out.push(lines[i].clone());
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stmts(lines: &[(&str, &str)]) -> Vec<Stmt> {
        lines.iter().map(|(text, scope)| Stmt::plain(text.to_string(), scope)).collect()
    }

    #[test]
    fn a_named_argument_reads_no_value_of_its_name() {
        let t = "f32[2, 3, 4, 4]".to_string();
        let types: HashMap<String, String> =
            ["mask", "scale", "y", "o"].iter().map(|v| (v.to_string(), t.clone())).collect();
        // `scale` is the block's own, read inside it only: the `scale = …` after it names an
        // argument, so one value leaves the block, and the block's input `mask` is renamed
        // where it is read, not where it names an argument.
        let body = stmts(&[
            ("let scale = mask * 2.0", "blk"),
            ("let y = attention(scale, mask, mask, scale = 0.5, mask = mask)", "blk"),
            ("let o = attention(y, y, y, scale = 0.5)", ""),
            ("output o", ""),
        ]);
        let r = recover(body, &types, &["blk".to_string()], &HashMap::new());
        assert_eq!(r.body[0].text, "let y = self.blk(mask)");
        let f = &r.forwards["blk"];
        assert_eq!(f.header, format!("forward(x: {t}) -> {t}"));
        assert_eq!(f.body[1].text, "let y = attention(scale, x, x, scale = 0.5, mask = x)");
        assert_eq!(f.result, "y");
    }
}
