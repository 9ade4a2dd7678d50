use super::*;

fn parse_ok(text: &str) -> File {
    let (f, diags) = parse(FileId(0), text);
    assert!(diags.is_empty(), "unexpected diagnostics: {diags:#?}");
    f
}

fn snippet(text: &str, s: Span) -> &str {
    &text[s.start as usize..s.end as usize]
}

#[test]
fn items_and_spans() {
    let text = concat!(
        "use std.nn.{Linear as L}\nconst K: int = 3 // three\nmodel M(n: dim = 4) {\n",
        "    input x: f32[n, ..B]\n    w = param f32[n] init zeros if true\n    forward {\n",
        "        let (a, _) = split(x @ w^T, 2)\n        output y = a\n        loss mean(a)\n",
        "    }\n}\n"
    );
    let f = parse_ok(text);
    assert_eq!(f.items.len(), 3);
    let Item::Const(c) = &f.items[1] else { panic!("const expected") };
    assert_eq!(
        snippet(text, c.span),
        "const K: int = 3",
        "trailing comments are not part of a span"
    );
    let Item::Layer(m) = &f.items[2] else { panic!("model expected") };
    assert_eq!(m.kind, LayerKind::Model);
    assert_eq!(snippet(text, m.inputs[0].ty.span), "f32[n, ..B]");
    assert!(matches!(m.inputs[0].ty.dims[1], DimItem::Variadic(_)));
    assert!(m.fields[0].cond.is_some());
    let body = &m.forward[0].body;
    assert_eq!(body.stmts.len(), 3);
    let Stmt::Let { value, .. } = &body.stmts[0] else { panic!("let expected") };
    assert_eq!(snippet(text, value.span), "split(x @ w^T, 2)");
}

#[test]
fn precedence_matches_python() {
    let text = "fn f() { a + b * c @ d^T - -e }";
    let f = parse_ok(text);
    let Item::Fn(func) = &f.items[0] else { panic!() };
    let tail = func.body.tail.as_ref().expect("tail expression");
    // a + ((b * c) @ d^T) - (-e): one chain of `+ -`, whose middle operand is one of `* @`
    let ExprKind::Binary(a, rest) = &tail.kind else { panic!("{:?}", tail.kind) };
    assert!(matches!(a.kind, ExprKind::Name(_)));
    let [(BinOp::Add, prod), (BinOp::Sub, neg)] = rest.as_slice() else { panic!("{rest:?}") };
    assert!(matches!(neg.kind, ExprKind::Unary(UnOp::Neg, _)));
    let ExprKind::Binary(b, products) = &prod.kind else { panic!() };
    let [(BinOp::Mul, _), (BinOp::MatMul, dt)] = products.as_slice() else { panic!() };
    assert!(matches!(b.kind, ExprKind::Name(_)));
    assert!(matches!(dt.kind, ExprKind::Transpose(_)));
}

#[test]
fn contextual_keywords_and_reserved_field_names() {
    let f = parse_ok(concat!(
        "layer L {\n    input = 3\n    model = X()\n",
        "    forward(loss: f32[2]) -> f32[2] { self.model(loss) }\n}"
    ));
    let Item::Layer(l) = &f.items[0] else { panic!() };
    assert_eq!(l.fields[0].name.name, "input");
    assert_eq!(l.fields[1].name.name, "model");
    assert_eq!(l.forward[0].params[0].name.name, "loss");
}

#[test]
fn recovers_after_an_error_and_reports_each() {
    let text = "fn a( { }\nfn ok() { 1 }\nlayer B { forward { ) }\n";
    let (f, diags) = parse(FileId(0), text);
    assert_eq!(diags.len(), 2, "{diags:#?}");
    assert_eq!(f.items.len(), 1, "the good item in between survives");
    assert_eq!(f.unparsed.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), ["a", "B"]);
}

#[test]
fn error_names_expected_tokens() {
    let (_, diags) = parse(FileId(0), "fn f(x: f32[4]) -> f32[4] { relu(x }");
    assert_eq!(diags[0].message, "expected `)`, `,`, `=` or an operator, found `}`");
}

#[test]
fn limits_are_diagnostics() {
    for text in [
        "(".repeat(1000),
        format!("fn f() {{ {}x }}", "- ".repeat(100)),
        format!("fn f() {{ x{} }}", "^T".repeat(1000)),
    ] {
        let (_, diags) = parse(FileId(0), &text);
        assert!(diags.iter().any(|d| d.code == "E0003"), "{text:.40}: {diags:?}");
    }
    let (_, diags) = parse(FileId(0), &" ".repeat(limits::MAX_SOURCE_BYTES + 1));
    assert_eq!(diags[0].code, "E0002");
}

#[test]
fn long_flat_chains_are_fine() {
    let sum = vec!["x"; 200].join(" + ");
    parse_ok(&format!("fn f(x: int) -> int {{ {sum} }}"));
    let chain = " else if false { 1 }".repeat(2000);
    parse_ok(&format!("fn f() {{ if true {{ 1 }}{chain} else {{ 2 }} }}"));
}

/// A half-typed `self.` is reported on its own line, at the `.`, and the next line's first word
/// is not taken for the field's name.
#[test]
fn a_dot_at_the_end_of_a_line_is_reported_there() {
    let text =
        "model M {\n    forward {\n        let z = self.\n\n        output y = z\n    }\n}\n";
    let (_, diags) = parse(FileId(0), text);
    assert_eq!(diags.len(), 1, "{diags:#?}");
    assert_eq!(diags[0].message, "expected a field name after `.`");
    let dot = text.find("self.").unwrap() + 4;
    assert_eq!(diags[0].primary_span(), Span::new(FileId(0), dot, dot + 1));
    parse_ok("fn f(x: int) -> int { x . y }");
    parse_ok("fn f(x: int) -> int {\n    x\n        .y\n}");
}

#[test]
fn flat_operator_runs_of_any_length_are_one_node() {
    let terms: Vec<String> = (0..5_000).map(|i| format!("x{i}")).collect();
    let text = format!("fn f() {{ {} }}", terms.join(" + "));
    let f = parse_ok(&text);
    let Item::Fn(func) = &f.items[0] else { panic!() };
    let ExprKind::Binary(_, rest) = &func.body.tail.as_ref().unwrap().kind else { panic!() };
    assert_eq!(rest.len(), 4_999);
}

#[test]
fn parentheses_keep_their_own_node_and_nesting_is_still_limited() {
    let f = parse_ok("fn f() { (a + b) + c }");
    let Item::Fn(func) = &f.items[0] else { panic!() };
    let ExprKind::Binary(first, rest) = &func.body.tail.as_ref().unwrap().kind else { panic!() };
    assert_eq!(rest.len(), 1);
    assert!(matches!(first.kind, ExprKind::Binary(_, ref r) if r.len() == 1));
    // A chain of 300 postfix operations nests 300 deep: refused with the honest message.
    let text = format!("fn f() {{ x{} }}", ".a".repeat(300));
    let (_, diags) = parse(FileId(0), &text);
    assert_eq!(diags.len(), 1, "{diags:?}");
    assert!(diags[0].message.contains("nested more than 256 levels deep"), "{diags:?}");
}

#[test]
fn a_byte_order_mark_is_skipped() {
    let f = parse_ok("\u{feff}fn f() { 1 }");
    assert_eq!(f.items.len(), 1);
}

/// `repeat(n, i, name = "…")`: the index and the name pattern are each optional, and `name` is
/// not taken for the index when it is followed by `=`.
#[test]
fn repeat_takes_an_index_and_a_name_pattern() {
    let text = concat!(
        "model M {\n    a = repeat(2) L()\n    b = repeat(2, i) L(i)\n",
        "    c = repeat(2, name = \"c_x\") L()\n    d = repeat(2, i, name = \"d_{i}\") L(i)\n",
        "    e = repeat(2, name) L(name)\n}\n"
    );
    let f = parse_ok(text);
    let Item::Layer(m) = &f.items[0] else { panic!("model expected") };
    let parts: Vec<(Option<&str>, Option<&str>)> = m
        .fields
        .iter()
        .map(|fd| match &fd.init {
            FieldInit::Repeat { index, name, .. } => (
                index.as_ref().map(|i| i.name.as_str()),
                name.as_ref().map(|n| snippet(text, n.span)),
            ),
            _ => panic!("repeat expected"),
        })
        .collect();
    assert_eq!(
        parts,
        [
            (None, None),
            (Some("i"), None),
            (None, Some("\"c_x\"")),
            (Some("i"), Some("\"d_{i}\"")),
            (Some("name"), None),
        ]
    );
}
