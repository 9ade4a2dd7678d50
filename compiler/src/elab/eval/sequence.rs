//! Layers made by field initializers, and the sequences a field can hold: a list literal of
//! layers (PyTorch's `nn.Sequential`; a list nested in it is a sequence inside the sequence,
//! named by its position: `features.1.0`), a list chosen by `if` (its items named by their
//! position in the chosen list), and `repeat`'s copies. Every layer made here is named by the
//! place it is made at, so a layer that was made elsewhere (an existing field) is refused:
//! reusing it would give one layer two checkpoint names.

use super::*;
use crate::elab::value::{item_path, Sequence};

impl<'p> Evaluator<'p> {
    /// Evaluates a field initializer, or a part of one, whose layers are made at `path`: a list
    /// literal makes a sequence of items made at `path.0`, `path.1`, …; an `if` makes its chosen
    /// branch's value at `path`; anything else is evaluated, a layer call in it making the
    /// layer at `path`.
    pub(super) fn construct(&mut self, e: &Expr, path: &str) -> R<Value> {
        match &e.kind {
            ExprKind::List(items) => self.construct_list(items, path),
            ExprKind::If { branches, otherwise } => {
                for (c, b) in branches {
                    if self.expect_bool(c)? {
                        return self.construct_block(b, path);
                    }
                }
                match otherwise {
                    Some(b) => self.construct_block(b, path),
                    None => Ok(Value::unit()),
                }
            }
            _ => {
                self.ctor_path = Some(path.to_string());
                let v = self.eval(e);
                self.ctor_path = None;
                v
            }
        }
    }

    /// A block of a field's `if`: its statements as anywhere, its value made at `path`.
    fn construct_block(&mut self, b: &Block, path: &str) -> R<Value> {
        let mark = self.frame().locals.len();
        let r = match self.eval_stmts(b) {
            Ok(()) => match &b.tail {
                Some(e) => self.construct(e, path),
                None => Ok(Value::unit()),
            },
            Err(d) => Err(d),
        };
        self.frame().locals.truncate(mark);
        r
    }

    /// `[Conv2d(...), [Conv2d(...), BatchNorm2d(...)]]`: a sequence of layers (and sequences)
    /// named `path.0`, `path.1`, …; a list of other values stays a list.
    fn construct_list(&mut self, items: &[Expr], path: &str) -> R<Value> {
        let mut values = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            values.push(self.construct(item, &format!("{path}.{i}"))?);
        }
        let layers = values.iter().filter(|v| item_path(v).is_some()).count();
        if layers == 0 {
            return Ok(Value::List(Rc::new(values)));
        }
        for (i, v) in values.iter().enumerate() {
            if let Some(p) = item_path(v).filter(|p| *p != format!("{path}.{i}")) {
                return Err(Diagnostic::error(
                    "E0108",
                    format!("the list item `{path}.{i}` would reuse the existing layer `{p}`"),
                    items[i].span,
                    "an existing layer",
                )
                .with_help(concat!(
                    "call the layer type to make a new layer here; ",
                    "sharing weights between fields is not supported"
                )));
            }
        }
        if layers < values.len() {
            let other = values.iter().position(|v| item_path(v).is_none()).unwrap_or(0);
            let layer = values.iter().position(|v| item_path(v).is_some()).unwrap_or(0);
            return Err(Diagnostic::error(
                "E0201",
                "a list of layers must hold only layers",
                items[other].span,
                format!("{}, not a layer", self.describe(&values[other])),
            )
            .with_label(items[layer].span, "a layer")
            .with_help(
                "layers in a list are applied in order; keep other values in separate fields",
            ));
        }
        Ok(Value::Sequence(Rc::new(Sequence { path: path.to_string(), items: values })))
    }

    /// `name = repeat(n, i) Block(...)`: copies named `name.0`, `name.1`, ..., or by the
    /// pattern `pattern` (`name.block_0`, ...).
    pub(super) fn repeat_field(
        &mut self,
        count: &Expr,
        index: Option<&Ident>,
        pattern: Option<&Expr>,
        body: &Expr,
        full: &str,
    ) -> R<Value> {
        let n = self.repeat_count(count)?;
        let names = self.copy_names(pattern, index, n)?;
        let mut items = Vec::new();
        for (i, name) in (0..n).zip(&names) {
            if let Some(id) = index {
                self.bind(&id.name, id.span, Value::Int(i));
            }
            let at = format!("{full}.{name}");
            let v = self.construct(body, &at);
            if index.is_some() {
                self.frame().locals.pop();
            }
            let v = v?;
            match item_path(&v) {
                Some(p) if p == at => items.push(v),
                Some(p) => {
                    return Err(Diagnostic::error(
                        "E0108",
                        format!(
                            "`repeat` would reuse the existing layer `{p}` instead of making copies"
                        ),
                        body.span,
                        "an existing layer",
                    )
                    .with_help("call the layer type to make new copies: `repeat(n) Block(...)`"))
                }
                None => {
                    return Err(Diagnostic::error(
                        "E0201",
                        format!("`repeat` needs a layer, found {}", self.describe(&v)),
                        body.span,
                        "not a layer",
                    )
                    .with_help("write `repeat(n) Block(...)`"))
                }
            }
        }
        Ok(Value::Sequence(Rc::new(Sequence { path: full.to_string(), items })))
    }

    fn repeat_count(&mut self, count: &Expr) -> R<i64> {
        match self.eval(count)? {
            Value::Int(n) if (0..=MAX_REPEAT).contains(&n) => Ok(n),
            Value::Int(n) => Err(Diagnostic::error(
                "E0301",
                format!("repeat count {n} is out of range"),
                count.span,
                format!("must be between 0 and {MAX_REPEAT}"),
            )),
            v => Err(Diagnostic::error(
                "E0201",
                format!("a repeat count must be an integer, found {}", self.describe(&v)),
                count.span,
                "not an integer",
            )),
        }
    }
}

/// "3 × layer `Block` at `blocks`", or "a sequence of 2 layers at `features.1`": what a
/// field holding a sequence holds, for hover.
pub(super) fn describe_sequence(s: &Sequence) -> String {
    let first = s.items.first().and_then(|v| match v {
        Value::Layer(l) => Some(&l.type_name),
        _ => None,
    });
    let same = s.items.iter().all(|v| matches!(v, Value::Layer(l) if Some(&l.type_name) == first));
    match first {
        Some(t) if same => format!("{} × layer `{t}` at `{}`", s.items.len(), s.path),
        _ => format!("a sequence of {} layers at `{}`", s.items.len(), s.path),
    }
}

#[cfg(test)]
mod tests;
