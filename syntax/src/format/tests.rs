use super::*;
use std::path::{Path, PathBuf};

/// Every `.mgn` file of the repository: models, the stdlib, and the test programs (valid ones
/// and the golden error cases, of which only those that parse can be formatted).
fn repository_files() -> Vec<PathBuf> {
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_path_buf();
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> =
        ["models", "stdlib", "tests/valid", "tests/errors"].iter().map(|d| root.join(d)).collect();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("a readable directory") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "mgn") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The repository files that parse, with their text.
fn parsable_files() -> Vec<(PathBuf, String)> {
    repository_files()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("a readable file");
            (p, text)
        })
        .filter(|(_, text)| parse(FileId(0), text).1.is_empty())
        .collect()
}

fn fmt(text: &str) -> String {
    match format(text) {
        Ok(out) => out,
        Err(d) => panic!("formatting failed: {d:#?}\n{text}"),
    }
}

/// Formats and checks that formatting the result again changes nothing.
fn fmt_stable(text: &str) -> String {
    let out = fmt(text);
    assert_eq!(fmt(&out), out, "formatting is not idempotent for\n{text}");
    out
}

fn comment_texts(text: &str) -> Vec<String> {
    let mut v: Vec<String> =
        comments(text).iter().map(|c| text[c.start..c.end].to_string()).collect();
    v.sort();
    v
}

/// The items' ASTs without spans, `use` items first (where the formatter moves them).
fn ast_without_spans(text: &str) -> Vec<String> {
    let (file, diags) = parse(FileId(0), text);
    assert!(diags.is_empty(), "{diags:#?}");
    let (uses, rest): (Vec<&Item>, Vec<&Item>) =
        file.items.iter().partition(|i| matches!(i, Item::Use(_)));
    uses.into_iter().chain(rest).map(stripped).collect()
}

// ---- the whole repository ----------------------------------------------------------

#[test]
fn format_every_repository_file_is_idempotent_and_keeps_its_meaning() {
    let files = parsable_files();
    assert!(
        files.len() >= 100,
        "expected the models, stdlib and test programs, found {} files",
        files.len()
    );
    for (p, text) in &files {
        let out = match format(text) {
            Ok(out) => out,
            Err(d) => panic!("{}: {d:#?}", p.display()),
        };
        assert_eq!(
            ast_without_spans(&out),
            ast_without_spans(text),
            "{}: the AST changed",
            p.display()
        );
        let again = format(&out)
            .unwrap_or_else(|d| panic!("{}: the formatted text fails: {d:#?}", p.display()));
        assert_eq!(again, out, "{}: formatting twice differs from formatting once", p.display());
    }
}

#[test]
fn format_keeps_every_comment_of_every_repository_file() {
    for (p, text) in parsable_files() {
        let out = fmt(&text);
        let (before, after) = (comment_texts(&text), comment_texts(&out));
        assert_eq!(before.len(), after.len(), "{}: comment count", p.display());
        assert_eq!(before, after, "{}: comment text", p.display());
    }
}

#[test]
fn format_keeps_meaning_with_comments_inserted_anywhere() {
    // Comments dropped between tokens of real files must come out, with the code, unchanged
    // in meaning and stable; a misplaced one would make `verify` refuse the file (E0999).
    // The smaller files keep this quick in debug builds, where parsing dominates.
    let files = parsable_files()
        .into_iter()
        .filter(|(p, text)| !p.to_string_lossy().contains("errors") && text.len() < 4000);
    for (p, text) in files {
        let cs = comments(&text);
        let mut in_string = false;
        let mut positions = Vec::new();
        let mut ci = 0;
        for (i, b) in text.bytes().enumerate() {
            while ci < cs.len() && cs[ci].end <= i {
                ci += 1;
            }
            let in_comment = ci < cs.len() && cs[ci].start <= i;
            if b == b'"' && !in_comment {
                in_string = !in_string;
            }
            if (b == b' ' || b == b'\n') && !in_comment && !in_string {
                positions.push(i);
            }
        }
        let step = (positions.len() / 8).max(1);
        for &pos in positions.iter().step_by(step) {
            for insert in [" /* c */ ", " // c\n", "\n\n// own line\n\n"] {
                let mutated = format!("{}{insert}{}", &text[..pos], &text[pos..]);
                let out = match format(&mutated) {
                    Ok(out) => out,
                    Err(d) => panic!("{} with {insert:?} at {pos}: {d:#?}", p.display()),
                };
                assert_eq!(
                    fmt(&out),
                    out,
                    "{} with {insert:?} at {pos}: not idempotent",
                    p.display()
                );
                assert_eq!(comment_texts(&out), comment_texts(&mutated));
            }
        }
    }
}

// ---- refusals ------------------------------------------------------------------------

#[test]
fn format_returns_syntax_errors_instead_of_formatting() {
    let d = format("fn f(x: f32[4]) -> f32[4] { relu(x }\n").expect_err("a syntax error");
    assert_eq!(d[0].code, "E0001");
    let d = format("const BIG = 99999999999999999999\n").expect_err("a literal too large");
    assert_eq!(d[0].code, "E0004");
}

#[test]
fn format_verification_refuses_output_that_changes_meaning_or_loses_comments() {
    let text = "const A = 1 // one\n";
    let (file, _) = parse(FileId(0), text);
    assert!(verify(text, &file, "const A = 1 // one\n").is_ok());
    let d = verify(text, &file, "const A = 2 // one\n").expect_err("a changed value");
    assert_eq!(d.code, "E0999");
    assert_eq!(
        d.primary_span(),
        Span::new(FileId(0), 0, 11),
        "points at the item that would change"
    );
    assert_eq!(verify(text, &file, "const A = 1\n").expect_err("a lost comment").code, "E0999");
    assert_eq!(verify(text, &file, "const A = \n").expect_err("no longer parses").code, "E0999");
}

// ---- layout --------------------------------------------------------------------------

#[test]
fn format_spacing_types_and_arguments() {
    assert_eq!(
        fmt_stable(concat!(
            "const   B:int=A+2*3;\n",
            "fn f(x:f32[B,T,d],y:int=1,)->f32[B,T,d]{conv(x,w,padding=(1,1),axis=-1,)}\n"
        )),
        concat!(
            "const B: int = A + 2 * 3\n\nfn f(x: f32[B, T, d], y: int = 1) -> f32[B, T, d] {\n",
            "    conv(x, w, padding = (1, 1), axis = -1)\n}\n"
        )
    );
    assert_eq!(
        fmt_stable("const T = ( a , )\nconst L = [ 1,2, ]\n"),
        "const T = (a,)\nconst L = [1, 2]\n",
        "one-tuples keep their comma"
    );
    assert_eq!(
        fmt_stable("fn f(x:f32[4],w ?:f32[4],b?: f32[4])->f32[4]{layer_norm(x,w,b)}\n"),
        concat!(
            "fn f(x: f32[4], w?: f32[4], b?: f32[4]) -> f32[4] {\n",
            "    layer_norm(x, w, b)\n}\n"
        ),
        "optional parameters keep their `?`"
    );
}

#[test]
fn format_items_members_and_blank_lines() {
    let text = concat!(
        "use std.nn.{Linear}\nconst A = 1\nconst B = 2\n\n\n\nconst C = 3\n",
        "layer L(d: dim) { w = param f32[d] init zeros;\n\n\n    b = param f32[d]\n",
        "    forward(x: f32[d]) -> f32[d] { x * self.w + self.b }\n}\nuse std.loss.{mse}\n",
        "model M() {\n    input x: f32[4]\n    forward { let y = x; output y; }\n}\n"
    );
    let expected = concat!(
        "use std.nn.{Linear}\nuse std.loss.{mse}\n\nconst A = 1\nconst B = 2\n\nconst C = 3\n\n",
        "layer L(d: dim) {\n    w = param f32[d] init zeros\n\n    b = param f32[d]\n",
        "    forward(x: f32[d]) -> f32[d] {\n        x * self.w + self.b\n    }\n}\n\nmodel M {\n",
        "    input x: f32[4]\n    forward {\n        let y = x\n        output y\n    }\n}\n"
    );
    assert_eq!(fmt_stable(text), expected);
}

#[test]
fn format_empty_and_comment_only_files() {
    assert_eq!(fmt_stable(""), "");
    assert_eq!(fmt_stable("\n\n  \n"), "");
    assert_eq!(fmt_stable("// only\n\n\n/* this */"), "// only\n\n/* this */\n");
    assert_eq!(
        fmt_stable("const A = 1\r\n// c\r\nconst B = 2 // t \r\n"),
        "const A = 1\n// c\nconst B = 2  // t\n",
        "CRLF becomes LF"
    );
}

#[test]
fn format_breaks_long_parameter_lists_and_joins_short_ones() {
    let long = concat!(
        "layer Conv(in_channels: dim, out_channels: dim, kernel_size: dim, stride: dim = 1, ",
        "padding: int = 0, bias: bool = true) {\n}\n"
    );
    assert_eq!(
        fmt_stable(long),
        concat!(
            "layer Conv(\n    in_channels: dim,\n    out_channels: dim,\n    kernel_size: dim,\n",
            "    stride: dim = 1,\n    padding: int = 0,\n    bias: bool = true,\n) {}\n"
        )
    );
    assert_eq!(
        fmt_stable("fn f(\n    a: int,\n    b: int,\n) -> int {\n    a + b\n}\n"),
        "fn f(a: int, b: int) -> int {\n    a + b\n}\n"
    );
    // Exactly 100 columns stays on one line; 101 breaks.
    let params = |n: usize| format!("fn f(a: int, {}: int) -> int {{\n    a\n}}\n", "b".repeat(n));
    let fits = params(100 - "fn f(a: int, : int) -> int {".len());
    assert_eq!(fmt_stable(&fits), fits);
    assert!(fmt_stable(&params(101 - "fn f(a: int, : int) -> int {".len()))
        .starts_with("fn f(\n    a: int,\n"));
    let forward = concat!(
        "layer L {\n",
        "    forward(x: f32[B, T, query_dim], ctx: f32[B, S, cross_attention_dimension]) -> ",
        "f32[B, T, query_dim] {\n        x\n    }\n}\n"
    );
    assert_eq!(
        fmt_stable(forward),
        concat!(
            "layer L {\n    forward(\n        x: f32[B, T, query_dim],\n",
            "        ctx: f32[B, S, cross_attention_dimension],\n    ) -> f32[B, T, query_dim] {\n",
            "        x\n    }\n}\n"
        )
    );
}

#[test]
fn format_breaks_long_calls_lists_and_operator_chains() {
    let hug = concat!(
        "fn f() {\n",
        "    let y = attention(split_heads(q, heads), split_heads(k, heads), split_heads(v, ",
        "heads), causal = true)\n}\n"
    );
    assert_eq!(
        fmt_stable(hug),
        concat!(
            "fn f() {\n    let y = attention(\n",
            "        split_heads(q, heads), split_heads(k, heads), split_heads(v, heads), causal ",
            "= true\n    )\n}\n"
        ),
        "arguments that fit on one line of their own"
    );
    let tall = concat!(
        "layer L {\n",
        "    blocks = [DownBlock(c0, c0, tdim, heads, ctx_dim, groups), DownBlock(c0, c1, tdim, ",
        "heads, ctx_dim, groups), Plain(c1)]\n}\n"
    );
    assert_eq!(
        fmt_stable(tall),
        concat!(
            "layer L {\n    blocks = [\n        DownBlock(c0, c0, tdim, heads, ctx_dim, groups),\n",
            "        DownBlock(c0, c1, tdim, heads, ctx_dim, groups),\n        Plain(c1),\n    ]\n",
            "}\n"
        ),
        "one element per line, with a trailing comma"
    );
    let chain = concat!(
        "model M {\n    forward {\n",
        "        loss cross_entropy(logits, labels) + bce_with_logits(flag_logits, flags) + 0.5 * ",
        "mse(pooled, recon)\n    }\n}\n"
    );
    assert_eq!(
        fmt_stable(chain),
        concat!(
            "model M {\n    forward {\n        loss cross_entropy(logits, labels)\n",
            "            + bce_with_logits(flag_logits, flags)\n",
            "            + 0.5 * mse(pooled, recon)\n    }\n}\n"
        ),
        "a line starting with an operator continues the one above"
    );
}

#[test]
fn format_long_field_clauses_go_to_continuation_lines() {
    let text = concat!(
        "layer C(i: dim, o: dim, k: dim) {\n",
        "    weight = param f32[o, i / groups, k, k] init kaiming_uniform(in_channels / groups * ",
        "kernel_size * kernel_size, a = sqrt(5.0))\n",
        "    bias = param f32[out_channels] init fan_in_uniform(in_channels / groups * ",
        "kernel_size * kernel_size) if bias\n}\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "layer C(i: dim, o: dim, k: dim) {\n    weight = param f32[o, i / groups, k, k]\n",
            "        init kaiming_uniform(in_channels / groups * kernel_size * kernel_size, a = ",
            "sqrt(5.0))\n    bias = param f32[out_channels]\n",
            "        init fan_in_uniform(in_channels / groups * kernel_size * kernel_size) if ",
            "bias\n}\n"
        )
    );
}

#[test]
fn format_if_expressions() {
    let text = concat!(
        "fn f(c: bool, x: int) -> int {\n    let a = if c {\n        x\n    } else { 1 }\n",
        "    let b = if c { let y = x * 2\n y } else if !c { x } else { 0 }\n    a + b\n}\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "fn f(c: bool, x: int) -> int {\n    let a = if c { x } else { 1 }\n",
            "    let b = if c {\n        let y = x * 2\n        y\n    } else if !c {\n        x\n",
            "    } else {\n        0\n    }\n    a + b\n}\n"
        )
    );
    let long = concat!(
        "fn f() {\n",
        "    let h = if act == ACT_RELU { relu(h) } else if act == ACT_TANH { tanh(h) } else { h ",
        "* self.scale }\n}\n"
    );
    assert_eq!(
        fmt_stable(long),
        concat!(
            "fn f() {\n    let h = if act == ACT_RELU {\n        relu(h)\n",
            "    } else if act == ACT_TANH {\n        tanh(h)\n    } else {\n",
            "        h * self.scale\n    }\n}\n"
        )
    );
}

#[test]
fn format_parentheses_written_by_the_user_are_kept() {
    let text = concat!(
        "const A = (a + b) * c\nconst B = a - (b - c)\nconst C = (a * b) + c\n",
        "const D = ((a + b))\nconst E = (x) + f((y))\nconst F = -(-x)\n",
        "const G = (-x)^T + (a - b)[0]\nconst H = !(a && b) || (c == d) == e\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "const A = (a + b) * c\nconst B = a - (b - c)\nconst C = (a * b) + c\n",
            "const D = (a + b)\nconst E = x + f(y)\nconst F = -(-x)\n",
            "const G = (-x)^T + (a - b)[0]\nconst H = !(a && b) || (c == d) == e\n"
        )
    );
}

#[test]
fn format_keeps_semicolons_that_end_a_statement_before_a_continuation_character() {
    let text = concat!(
        "fn f(x: int) -> (int, int) {\n    let y = x * 2;\n    (y, x)\n}\nfn g(x: int) -> int {\n",
        "    let y = x;\n    -y\n}\nfn h(x: int) -> int {\n    let y = x;\n    let z = y;\n",
        "    z;\n}\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "fn f(x: int) -> (int, int) {\n    let y = x * 2;\n    (y, x)\n}\n\n",
            "fn g(x: int) -> int {\n    let y = x;\n    -y\n}\n\nfn h(x: int) -> int {\n",
            "    let y = x\n    let z = y\n    z\n}\n"
        )
    );
}

#[test]
fn format_places_comments() {
    let text = concat!(
        "// header\n\n// about f\nfn f(x: int, // the input\n  y: int /* second */,\n",
        "  // nothing after\n) -> int { // opening\n    let a = x   // trailing\n",
        "    let bb = y // aligned\n\n\n    // before the tail\n    a + bb\n    // dangling\n",
        "}   // after the item\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "// header\n\n// about f\nfn f(\n    x: int,  // the input\n",
            "    y: int,  /* second */\n    // nothing after\n) -> int {  // opening\n",
            "    let a = x   // trailing\n    let bb = y  // aligned\n\n    // before the tail\n",
            "    a + bb\n    // dangling\n}  // after the item\n"
        )
    );
}

#[test]
fn format_copies_statements_and_headers_with_comments_inside_them() {
    let text = concat!(
        "model M {\n  forward {\n          let y = f(x,\n                    // inside a call\n",
        "                    z)\n    output y\n  }\n}\nlayer L /* odd */ (n: dim) {\n}\n"
    );
    assert_eq!(
        fmt_stable(text),
        concat!(
            "model M {\n    forward {\n        let y = f(x,\n                  // inside a call\n",
            "                  z)\n        output y\n    }\n}\n\nlayer L /* odd */ (n: dim) {}\n"
        )
    );
}

#[test]
fn format_strings_holding_comment_markers_are_not_comments() {
    let text = "const S = \"a // b /* c */\"  // real\n";
    assert_eq!(fmt_stable(text), text);
    assert_eq!(comments(text).len(), 1);
}

#[test]
fn format_deeply_nested_ifs_stay_fast() {
    // Every level holds a statement and a condition too long for one line: each level must
    // be rendered a bounded number of times, not twice per level.
    let cond =
        "a_rather_long_condition_name && another_rather_long_condition_name || yet_another_one";
    let mut body = "0".to_string();
    for i in 0..40 {
        body = format!("if {cond} {{ let v{i} = 1\n {body} }} else {{ 1 }}");
    }
    let text = format!("fn f() -> int {{\n    {body}\n}}\n");
    let start = std::time::Instant::now();
    fmt_stable(&text);
    assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
}

#[test]
fn format_breaks_a_flat_sum_of_thousands_of_terms_one_per_line() {
    let terms: Vec<String> = (0..5_000).map(|i| format!("x{i}")).collect();
    let text = format!("fn f() -> int {{\n    {}\n}}\n", terms.join(" + "));
    // On the 2 MiB stack of a test thread: no recursion per term.
    let out = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || fmt(&text))
        .unwrap()
        .join()
        .expect("formatting returns");
    assert_eq!(out.lines().filter(|l| l.trim_start().starts_with("+ x")).count(), 4_999);
    assert_eq!(fmt(&out), out);
}

#[test]
fn format_keeps_a_byte_order_mark_and_locates_errors_after_it() {
    let text = "\u{feff}fn   f() -> int { 1 }\n";
    assert_eq!(fmt(text), "\u{feff}fn f() -> int {\n    1\n}\n");
    let bad = "\u{feff}fn f( { 1 }\n";
    let diags = format(bad).unwrap_err();
    let at = diags[0].primary_span().start as usize;
    assert_eq!(&bad[at..at + 1], "{", "{diags:?}");
}
