use super::mutable::VisitMut;
use super::*;
use crate::span::FileId;

fn parse_ok(text: &str) -> File {
    let (file, diags) = crate::parse(FileId(3), text);
    assert!(diags.is_empty(), "{diags:?}");
    file
}

/// Every kind of node at least once.
const EVERY_NODE: &str = r#"
use std.nn.{Linear as L, Conv2d}
use "./blocks.mgn" as blocks
const K: int = 2 * 3
fn f(x: f32[..B, N], s: (int, float) = (1, 2.5)) -> f32[..B, N] {
    let (a, _): (int, bool) = (-s.0, !true)
    let y = if a > 0 { x } else if a < 0 { -x } else { x * 2 }
    y^T[0]
}
layer Block(d: dim, act: dtype = f32) {
    w = param f32[d, d] init normal(0.0, 0.02)
    b = buffer f32[d] if d > 1
    layers = repeat(2, i) L(d, d)
    pair = [Conv2d(d, d, 3), Conv2d(d, d, 3)]
    forward(x: f32[B, d]) -> f32[B, d] { self.layers(x @ self.w, flag = "on") }
}
model M {
    input t: f32[2, 4]
    blk = Block(4)
    forward {
        output o = blk(t)
        output t
        loss mean(o)
    }
}
"#;

struct Erase;

impl VisitMut for Erase {
    fn visit_span(&mut self, span: &mut Span) {
        *span = Span::default();
    }
}

#[test]
fn the_mutable_walk_reaches_every_span() {
    let mut file = parse_ok(EVERY_NODE);
    assert!(format!("{file:?}").contains("FileId(3)"));
    Erase.visit_file(&mut file);
    let printed = format!("{file:?}");
    assert!(!printed.contains("FileId(3)"), "a span was not visited:\n{printed}");
}

/// Records the names it meets, definitions and uses alike, in visiting order.
#[derive(Default)]
struct Names(Vec<String>);

impl<'ast> Visit<'ast> for Names {
    fn visit_ident(&mut self, i: &'ast Ident) {
        self.0.push(i.name.clone());
    }

    fn visit_expr(&mut self, e: &'ast Expr) {
        if let ExprKind::Name(n) = &e.kind {
            self.0.push(n.clone());
        }
        walk_expr(self, e);
    }
}

fn names_in(text: &str) -> Vec<String> {
    let mut v = Names::default();
    v.visit_file(&parse_ok(text));
    v.0
}

#[test]
fn children_are_visited_in_evaluation_order() {
    let cases: &[(&str, &[&str])] = &[
        // A parameter's default, its type, then its name.
        (
            "fn f(a: f32[N] = g, b: int = a) -> f32[M] { a }",
            &["f", "g", "N", "a", "a", "b", "M", "a"],
        ),
        // A `let`'s value, type and pattern; an output's value before its name.
        (
            "model M { forward { let (x, y): (f32[K], int) = h(v, k = w)\n output o = x } }",
            &["M", "h", "v", "k", "w", "K", "x", "y", "x", "o"],
        ),
        // A field's condition, then its initializer, then its name; config, fields, inputs,
        // forward.
        (
            "model M(d: dim) {\n input t: f32[d]\n forward { output o = t }\n \
             r = repeat(n, i) B(i) if c\n}",
            &["M", "d", "c", "n", "i", "B", "i", "r", "d", "t", "t", "o"],
        ),
        // Calls, fields, indexes and `if` chains in the order they are written.
        (
            "const C = if a { p.q(r)[s] } else if b { -t^T } else { [u, (v, w)] }",
            &["C", "a", "p", "q", "r", "s", "b", "t", "u", "v", "w"],
        ),
        ("use std.nn.{Linear as L}", &["std", "nn", "Linear", "L"]),
    ];
    for (text, want) in cases {
        assert_eq!(names_in(text), *want, "in {text}");
    }
}

/// A visitor that stops at `if` expressions: overriding one method replaces that part of the
/// walk only.
#[derive(Default)]
struct OutsideIfs(usize);

impl<'ast> Visit<'ast> for OutsideIfs {
    fn visit_expr(&mut self, e: &'ast Expr) {
        match &e.kind {
            ExprKind::If { .. } => {}
            ExprKind::Name(_) => self.0 += 1,
            _ => walk_expr(self, e),
        }
    }
}

#[test]
fn an_override_prunes_the_walk_below_it() {
    let file = parse_ok("const C = a + f(b, if c { d } else { e }) * g");
    let mut v = OutsideIfs::default();
    v.visit_file(&file);
    assert_eq!(v.0, 4, "a, f, b and g; nothing inside the `if`");
}
