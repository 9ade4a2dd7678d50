//! The readable IR dump printed by `mgnc build --emit ir`.

use super::{fmt_type, Graph, Op};
use crate::source::SourceMap;
use std::fmt::Write;

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn dump(g: &Graph, sources: &SourceMap) -> String {
    let mut o = String::new();
    let loc = |span: mgn_syntax::Span| {
        let (f, l, _) = sources.location(span);
        format!("{f}:{l}")
    };
    let _ = writeln!(o, "model {}", g.model);
    if !g.config.is_empty() {
        let args: Vec<String> = g.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let _ = writeln!(o, "arguments: {}", args.join(" "));
    }

    let _ = writeln!(o, "\ninputs:");
    for (name, id) in &g.inputs {
        let n = g.node(*id);
        let _ = writeln!(
            o,
            "  {:<6} {:<16} {:<20} {}",
            id.to_string(),
            name,
            fmt_type(n.dtype, &n.shape),
            loc(n.span)
        );
    }

    let _ = writeln!(o, "\nparameters:");
    let name_w = g.params.iter().map(|p| p.name.len()).max().unwrap_or(4).max(4);
    let shape_w = g.params.iter().map(|p| format!("{:?}", p.shape).len()).max().unwrap_or(5).max(5);
    let _ = writeln!(
        o,
        "  {:<name_w$}  {:<shape_w$}  {:<5}  {:>12}  {:<6}  init",
        "name", "shape", "dtype", "count", "kind"
    );
    for p in &g.params {
        let _ = writeln!(
            o,
            "  {:<name_w$}  {:<shape_w$}  {:<5}  {:>12}  {:<6}  {}",
            p.name,
            format!("{:?}", p.shape),
            p.dtype.name(),
            thousands(p.numel()),
            p.kind(),
            p.init
        );
    }
    let (trainable, buffers) = (g.param_count(true), g.param_count(false));
    let _ = writeln!(
        o,
        "  total: {} parameters ({} trainable, {} in buffers) in {} tensors",
        thousands(trainable + buffers),
        thousands(trainable),
        thousands(buffers),
        g.params.len()
    );
    for a in &g.aliases {
        let _ = writeln!(o, "  alias: {} is {}", a.name, g.params[a.param].name);
    }
    for &c in &g.counters {
        let _ = writeln!(o, "  counter: {} (+1 after each training step)", g.params[c].name);
    }

    let _ = writeln!(o, "\nnodes:");
    for (i, n) in g.nodes.iter().enumerate() {
        let lhs = format!("%{i}");
        let rhs = match &n.op {
            Op::Param { index } => format!("param {}", g.params[*index].name),
            op => {
                let args: Vec<String> = n.inputs.iter().map(|a| a.to_string()).collect();
                if args.is_empty() {
                    op.describe()
                } else {
                    format!("{} {}", op.describe(), args.join(", "))
                }
            }
        };
        let mut at = loc(n.user_span);
        if n.user_span != n.span {
            let (f, l, _) = sources.location(n.span);
            let _ = write!(at, " (via {f}:{l})");
        }
        let _ = writeln!(o, "  {lhs:>6} = {rhs:<48} {:<22} {at}", fmt_type(n.dtype, &n.shape));
    }

    let _ = writeln!(o, "\noutputs:");
    for (name, id) in &g.outputs {
        let n = g.node(*id);
        let _ = writeln!(o, "  {name} = {id}  {}", fmt_type(n.dtype, &n.shape));
    }
    if let Some(l) = g.loss {
        let n = g.node(l);
        let _ = writeln!(o, "loss = {l}  {}", fmt_type(n.dtype, &n.shape));
    }
    o
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_groups_digits() {
        assert_eq!(super::thousands(0), "0");
        assert_eq!(super::thousands(999), "999");
        assert_eq!(super::thousands(1000), "1,000");
        assert_eq!(super::thousands(134515008), "134,515,008");
    }
}
