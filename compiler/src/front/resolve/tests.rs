//! The resolver on small programs, as data: where a name is written and what it must refer
//! to. A place is `name#k`, the k-th whole-word occurrence of `name` in the text (from 1).

use super::*;
use crate::front::load::load;
use crate::source::Origin;

#[derive(Debug)]
enum Want {
    /// The definition written at a place, of a kind.
    Def(&'static str, SymKind),
    Builtin(&'static str),
    /// The module of that name (`std.nn`).
    Module(&'static str),
    /// Nothing, and no problem either.
    Nothing,
    Unknown {
        later_field: Option<&'static str>,
        suggestion: Option<&'static str>,
    },
    BareSelf,
    SelfOutsideLayer,
    NoField {
        later: Option<&'static str>,
        suggestion: Option<&'static str>,
    },
    NoItem {
        suggestion: Option<&'static str>,
    },
}

use SymKind::*;
use Want::*;

const CASES: &[(&str, &[(&str, Want)])] = &[
    // Innermost first: a `let` shadows a parameter until its block ends.
    (
        "fn f(x: int) -> int { let y = if x > 0 { let x = 2\n x } else { x }\n y + x }",
        &[("x#4", Def("x#3", Local)), ("x#5", Def("x#1", Param)), ("x#6", Def("x#1", Param))],
    ),
    // Locals, then the module's items, then builtins.
    (
        concat!(
            "fn relu(x: int) -> int { x }\nfn g(relu: int) -> int { relu }\n",
            "fn h() -> int { relu(1) }\nfn k(x: f32[4]) -> f32[4] { gelu(x) }"
        ),
        &[
            ("relu#3", Def("relu#2", Param)),
            ("relu#4", Def("relu#1", Fn)),
            ("gelu#1", Builtin("gelu")),
            ("relu#1", Def("relu#1", Fn)),
        ],
    ),
    // A config parameter keeps the bare name a field shares; `self.d` is the field.
    (
        concat!(
            "layer L(d: dim) {\n d = d * 2\n w = param f32[d]\n",
            " forward(x: f32[d]) -> f32[d] { x * self.d }\n}"
        ),
        &[
            ("d#3", Def("d#1", Config)),
            ("d#4", Def("d#1", Config)),
            ("d#5", Def("d#1", Config)),
            ("d#7", Def("d#2", Field)),
        ],
    ),
    // Fields are visible to the fields after them; a later one is reported as such.
    (
        concat!(
            "layer L(n: int = e) {\n a = b\n b = 1\n c = self.e + self.b\n",
            " forward(x: f32[4]) -> f32[4] { x * a }\n e = 2\n}"
        ),
        &[
            ("e#1", Unknown { later_field: Some("e#3"), suggestion: None }),
            ("b#1", Unknown { later_field: Some("b#2"), suggestion: None }),
            ("e#2", NoField { later: Some("e#3"), suggestion: None }),
            ("b#3", Def("b#2", Field)),
            ("a#2", Def("a#1", Field)),
        ],
    ),
    // Config parameters are visible in each other's defaults; a `repeat` index in its body.
    (
        concat!(
            "layer B(i: int) { forward(x: f32[4]) -> f32[4] { x } }\n",
            "layer L(a: int = b, b: int = 1) {\n blocks = repeat(b, i) B(i)\n",
            " forward(x: f32[4]) -> f32[4] { blocks[a](x) }\n}"
        ),
        &[
            ("b#1", Def("b#2", Config)),
            ("b#3", Def("b#2", Config)),
            ("i#3", Def("i#2", Index)),
            ("a#2", Def("a#1", Config)),
            ("B#2", Def("B#1", Layer)),
        ],
    ),
    // Shape patterns: bare names bind first, then compare; builtins do not stop a binding.
    (
        "fn f(x: f32[n * 2, n], y: f32[n, mean]) -> f32[..S] { mean }",
        &[
            ("n#1", Def("n#2", Dim)),
            ("n#2", Def("n#2", Dim)),
            ("n#3", Def("n#2", Dim)),
            ("mean#1", Def("mean#1", Dim)),
            ("mean#2", Def("mean#1", Dim)),
            ("S#1", Def("S#1", Dim)),
        ],
    ),
    // Inputs come after the fields (their shapes may use them); outputs are definitions.
    (
        concat!(
            "model M(k: dim = 2) {\n input t: f32[w]\n w = k + 1\n forward {\n output o = t\n",
            " output t\n }\n}"
        ),
        &[
            ("w#1", Def("w#2", Field)),
            ("t#2", Def("t#1", Input)),
            ("t#3", Def("t#1", Input)),
            ("o#1", Def("o#1", Output)),
        ],
    ),
    // A model forward's return type (an error) binds nothing its body sees.
    (
        "model M {\n input t: f32[2]\n forward -> f32[S] {\n output o = t * S\n }\n}",
        &[("S#2", Unknown { later_field: None, suggestion: None })],
    ),
    // Modules and their items; a missing item.
    (
        concat!(
            "use std.nn\nuse std.loss as l\nlayer L { fc = nn.Linear(2, 2)\n g = nn.Lniear(2, 2)\n",
            " forward(x: f32[2]) -> f32[2] { fc(x) }\n}"
        ),
        &[
            ("nn#1", Module("std.nn")),
            ("nn#2", Module("std.nn")),
            ("l#1", Module("std.loss")),
            ("Lniear#1", NoItem { suggestion: Some("Linear") }),
        ],
    ),
    // Named arguments: a layer's config, a fn's parameters, a builtin's.
    (
        concat!(
            "fn f(a: int, b: int = 1) -> int { a }\n",
            "layer L(d: dim) { forward(x: f32[d]) -> f32[d] { softmax(x, axis = f(1, b = d)) } }\n",
            "model M { l = L(d = 3)\n forward { } }"
        ),
        &[
            ("b#2", Def("b#1", Param)),
            ("axis#1", Builtin("softmax")),
            ("d#4", Def("d#1", Config)),
            ("d#5", Def("d#1", Config)),
        ],
    ),
    // Fields of a layer held by a field, through indexes.
    (
        concat!(
            "layer B { inner = L2()\n forward(x: f32[2]) -> f32[2] { x } }\n",
            "layer L2 { forward(x: f32[2]) -> f32[2] { x } }\nmodel M { blocks = repeat(2) B()\n",
            " input t: f32[2]\n forward { output y = blocks[0].inner(t) } }"
        ),
        &[("inner#2", Def("inner#1", Field)), ("blocks#2", Def("blocks#1", Field))],
    ),
    // `self` misused, typos with suggestions, and a name whose import failed.
    (
        concat!(
            "use std.nn.{Nope}\nfn f(count: int) -> int { self.a + self + Nope + cuont }\n",
            "layer L { ab = 1\n w = 2\n c = self.ac + self.ww\n",
            " forward(x: f32[2]) -> f32[2] { x } }"
        ),
        &[
            ("self#1", SelfOutsideLayer),
            ("self#2", BareSelf),
            ("Nope#2", Nothing),
            ("cuont#1", Unknown { later_field: None, suggestion: Some("count") }),
            ("ac#1", NoField { later: None, suggestion: Some("ab") }),
            ("ww#1", NoField { later: None, suggestion: Some("w") }),
        ],
    ),
];

/// The span of the k-th whole-word occurrence of a name (`name#k`).
fn place(text: &str, file: mgn_syntax::FileId, at: &str) -> Span {
    let (name, k) = at.split_once('#').expect("name#k");
    let k: usize = k.parse().expect("an occurrence number");
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    let start = text
        .match_indices(name)
        .map(|(i, _)| i)
        .filter(|&i| {
            !word(text[..i].chars().last()) && !word(text[i + name.len()..].chars().next())
        })
        .nth(k - 1)
        .unwrap_or_else(|| panic!("no occurrence {k} of `{name}` in {text}"));
    Span::new(file, start, start + name.len())
}

#[test]
fn names_refer_to_what_the_lookup_order_says() {
    for (text, wants) in CASES {
        let (prog, diags) = load("t.mgn".into(), Origin::Memory("t".into()), text.to_string());
        let file = prog.module(prog.root).file;
        let parse_errors: Vec<_> = diags.iter().filter(|d| d.code == "E0001").collect();
        assert!(parse_errors.is_empty(), "{text}: {parse_errors:?}");
        let res = &prog.resolution;
        for (at, want) in wants.iter() {
            let span = place(text, file, at);
            let target = res.target(span);
            let problem = res.problem(span);
            let ok = match (want, target, problem) {
                (Def(d, kind), Some(t), None) => t.def() == Some((place(text, file, d), *kind)),
                (Builtin(name), Some(Target::Builtin(b)), None) => b.name == *name,
                (Module(name), Some(Target::Module(m)), None) => prog.module(m).name == *name,
                (Nothing, None, None) => true,
                (
                    Unknown { later_field, suggestion },
                    None,
                    Some(Problem::Unknown { later_field: l, suggestion: s, .. }),
                ) => *l == later_field.map(|f| place(text, file, f)) && s.as_deref() == *suggestion,
                (BareSelf, None, Some(Problem::BareSelf)) => true,
                (SelfOutsideLayer, None, Some(Problem::SelfOutsideLayer)) => true,
                (
                    NoField { later, suggestion },
                    _,
                    Some(Problem::NoField { later: l, suggestion: s, .. }),
                ) => *l == later.map(|f| place(text, file, f)) && s.as_deref() == *suggestion,
                (NoItem { suggestion }, None, Some(Problem::NoItem { suggestion: s, .. })) => {
                    s.as_deref() == *suggestion
                }
                _ => false,
            };
            assert!(ok, "{text}\n`{at}`: expected {want:?}, found {target:?} / {problem:?}");
        }
    }
}

#[test]
fn every_scope_lists_its_names() {
    let text = concat!(
        "layer L(d: dim) {\n d = 2\n w = param f32[d]\n",
        " forward(x: f32[B, d]) -> f32[B, d] { let y = x\n y }\n}"
    );
    let (prog, _) = load("t.mgn".into(), Origin::Memory("t".into()), text.to_string());
    let file = prog.module(prog.root).file;
    let scope_of = |name: &str, kind: SymKind| {
        let v = prog.resolution.visible().iter().find(|v| v.name == name && v.kind == kind);
        v.map(|v| &text[v.scope.start as usize..v.scope.end as usize])
            .map(|s| s.lines().next().unwrap_or("").to_string())
    };
    assert_eq!(scope_of("d", Config).as_deref(), Some("layer L(d: dim) {"));
    assert_eq!(scope_of("w", Field).as_deref(), Some("layer L(d: dim) {"));
    assert_eq!(
        scope_of("B", Dim).as_deref(),
        Some("forward(x: f32[B, d]) -> f32[B, d] { let y = x")
    );
    assert_eq!(scope_of("y", Local).as_deref(), Some("{ let y = x"));
    // A field sharing a config parameter's name is reached only as `self.d`: no scope.
    let field_d = prog.resolution.visible().iter().find(|v| v.name == "d" && v.kind == Field);
    assert_eq!(field_d.map(|v| v.scope), Some(Span::default()));
    assert_eq!(field_d.map(|v| v.def), Some(place(text, file, "d#2")));
}

#[test]
fn a_call_marks_its_callee() {
    let text = "use std.nn\nfn f(x: f32[2]) -> f32[2] { relu(x) }";
    let (prog, _) = load("t.mgn".into(), Origin::Memory("t".into()), text.to_string());
    let file = prog.module(prog.root).file;
    let relu = prog.resolution.occurrence(place(text, file, "relu#1")).expect("relu");
    let call = relu.call.expect("a call");
    assert_eq!(&text[call.start as usize..call.end as usize], "relu(x)");
    let x = prog.resolution.occurrence(place(text, file, "x#2")).expect("x");
    assert_eq!(x.call, None);
}
