//! pest errors to diagnostics: what was expected, named the way a person would (`a type`,
//! `an expression`), with a hint for the common slips.

use super::Rule;
use crate::diag::Diagnostic;
use crate::span::{FileId, Span};
use pest::error::{ErrorVariant, InputLocation};

pub(super) fn syntax_error(
    file: FileId,
    text: &str,
    base: usize,
    e: pest::error::Error<Rule>,
) -> Diagnostic {
    let local = match e.location {
        InputLocation::Pos(p) => p,
        InputLocation::Span((s, _)) => s,
    };
    let mut expected: Vec<String> = Vec::new();
    let mut at = base + local;
    match &e.variant {
        ErrorVariant::ParsingError { positives, .. } => {
            if let Some(attempts) = e.parse_attempts() {
                if attempts.max_position >= local {
                    at = base + attempts.max_position;
                    let tokens: Vec<String> =
                        attempts.expected_tokens().iter().map(|t| t.to_string()).collect();
                    expected.extend(literal_names(&tokens));
                }
            }
            for r in positives {
                if let Some(name) = rule_name(*r) {
                    push_unique(&mut expected, name.to_string());
                }
            }
        }
        ErrorVariant::CustomError { message } => {
            let span = Span::new(file, at, at);
            return Diagnostic::error(
                "E0001",
                format!("cannot parse this file: {message}"),
                span,
                "parsing stopped here",
            );
        }
    }
    let at = at.min(text.len());
    if let Some(d) = missing_field_name(file, text, at) {
        return d;
    }
    // Report at the next token, not at the whitespace before it.
    let mut at = at;
    while at < text.len() && text.as_bytes()[at].is_ascii_whitespace() {
        at += 1;
    }
    if let Some(d) = non_ascii_name(file, text, at) {
        return d;
    }
    // `layer(x)` fails after the reserved word, at `(`: point at the word instead.
    let word_before: String = text[..at]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if RESERVED.contains(&word_before.as_str())
        && expected.iter().any(|e| e == "an expression" || e == "a name")
    {
        at -= word_before.len();
    }
    // Categories ("an expression") make the keywords they start with redundant.
    if expected.iter().any(|e| e == "an expression") {
        expected.retain(|e| e != "`!`" && e != "`-`");
    }
    if expected.iter().any(|e| !e.starts_with('`')) {
        expected.retain(|e| {
            !(e.starts_with('`') && e[1..].starts_with(|c: char| c.is_ascii_alphabetic()))
        });
    }
    let found = describe_token(text, at);
    let end = (at + found.1).min(text.len());
    let span = Span::new(file, at, end);
    let message = if expected.is_empty() {
        format!("unexpected {}", found.0)
    } else {
        format!("expected {}, found {}", join_alternatives(&expected), found.0)
    };
    let label = if expected.is_empty() {
        "unexpected here".to_string()
    } else {
        format!("expected {} here", short_name(&expected))
    };
    let mut d = Diagnostic::error("E0001", message, span, label);
    if let Some(help) = syntax_help(text, at, &expected) {
        d = d.with_help(help);
    }
    d
}

/// A letter outside ASCII (`let α = …`): names are ASCII, so say that, with the name spelled
/// out where the letters are Greek.
fn non_ascii_name(file: FileId, text: &str, at: usize) -> Option<Diagnostic> {
    let c = text[at..].chars().next()?;
    if c.is_ascii() || !c.is_alphabetic() {
        return None;
    }
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let start = text[..at].char_indices().rev().take_while(|(_, c)| word(*c)).last();
    let start = start.map_or(at, |(i, _)| i);
    let end =
        text[at..].char_indices().find(|(_, c)| !word(*c)).map_or(text.len(), |(i, _)| at + i);
    let name = &text[start..end];
    let letters: String = text[at..end].chars().take_while(|c| !c.is_ascii()).collect();
    let d = Diagnostic::error(
        "E0001",
        format!("`{letters}` cannot be part of a name: names are written in ASCII"),
        Span::new(file, at, at + letters.len()),
        "not an ASCII letter",
    );
    let spelled: Option<String> =
        name.chars().map(|c| if c.is_ascii() { Some(c.to_string()) } else { greek(c) }).collect();
    Some(match spelled {
        Some(s) => d.with_help(format!("spell it out: `{s}`")),
        None => d.with_help("names use the letters A-Z and a-z, digits and `_`"),
    })
}

/// The English name of a Greek letter, as it is spelled in code (`α` → `alpha`).
fn greek(c: char) -> Option<String> {
    const LOWER: [&str; 25] = [
        "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
        "lambda", "mu", "nu", "xi", "omicron", "pi", "rho", "sigma", "sigma", "tau", "upsilon",
        "phi", "chi", "psi", "omega",
    ];
    match c {
        // U+03C2 is the final sigma, which shares its name with U+03C3.
        'α'..='ω' => Some(LOWER[c as usize - 'α' as usize].to_string()),
        'Α'..='Ω' if c != '\u{3a2}' => {
            let name = LOWER[c as usize - 'Α' as usize];
            Some(format!("{}{}", name[..1].to_uppercase(), &name[1..]))
        }
        _ => None,
    }
}

/// `self.` at the end of a line (a half-typed field access): reported at the `.`, on its own
/// line, not at the next line's first word.
fn missing_field_name(file: FileId, text: &str, at: usize) -> Option<Diagnostic> {
    let before = text[..at].trim_end_matches([' ', '\t']);
    let rest = &text[at..];
    let line_ends = rest.trim_start_matches([' ', '\t', '\r']).starts_with('\n') || rest.is_empty();
    let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
    let use_line = line.trim_start().starts_with("use ");
    if !before.ends_with('.') || before.ends_with("..") || !line_ends || use_line {
        return None;
    }
    let dot = before.len() - 1;
    let span = Span::new(file, dot, dot + 1);
    Some(
        Diagnostic::error("E0001", "expected a field name after `.`", span, "a name goes here")
            .with_help("the name follows the `.` on the same line, as in `self.weight`"),
    )
}

const RESERVED: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as", "f32", "f16", "bf16", "i32", "i64", "u32", "q8_0", "q4_0", "q4_1",
    "q4_k", "q6_k",
];

/// Keywords that a name follows.
const NAMING: &[&str] = &["let", "fn", "layer", "model", "const", "as"];

const DTYPES: &[&str] =
    &["f32", "f16", "bf16", "i32", "i64", "u32", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"];

const OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "@", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "^T", ".", "[", "(",
];

/// Names for the literal tokens pest expected: whitespace and comment markers are dropped, and
/// a crowd of operators (any expression may continue with one) becomes "an operator".
fn literal_names(tokens: &[String]) -> Vec<String> {
    let useful: Vec<&String> = tokens
        .iter()
        .filter(|t| {
            !t.trim().is_empty()
                && !t.contains("..")
                && *t != "BUILTIN_RULE"
                && !matches!(t.as_str(), "//" | "/*" | "*/" | "\"" | "_")
        })
        .collect();
    let operator_count = useful.iter().filter(|t| OPERATORS.contains(&t.as_str())).count();
    let mut out = Vec::new();
    for t in useful {
        if operator_count >= 3 && OPERATORS.contains(&t.as_str()) {
            push_unique(&mut out, "an operator".to_string());
        } else {
            push_unique(&mut out, format!("`{t}`"));
        }
    }
    // Closing brackets and separators first: they are what a user most often forgot.
    out.sort_by_key(|s| match s.as_str() {
        "`)`" | "`]`" | "`}`" => 0,
        "`,`" | "`:`" | "`=`" | "`->`" => 1,
        "an operator" => 3,
        _ => 2,
    });
    out
}

fn push_unique(v: &mut Vec<String>, s: String) {
    if !v.contains(&s) {
        v.push(s);
    }
}

fn join_alternatives(names: &[String]) -> String {
    let names: Vec<&String> = names.iter().take(8).collect();
    match names.len() {
        0 => String::new(),
        1 => names[0].clone(),
        n => {
            let head: Vec<&str> = names[..n - 1].iter().map(|s| s.as_str()).collect();
            format!("{} or {}", head.join(", "), names[n - 1])
        }
    }
}

fn short_name(names: &[String]) -> String {
    if names.len() == 1 {
        names[0].clone()
    } else {
        "something else".to_string()
    }
}

fn syntax_help(text: &str, at: usize, expected: &[String]) -> Option<String> {
    let rest = &text[at..];
    if rest.starts_with('=') && expected.iter().any(|e| e == "`:`") {
        return Some("parameters declare a type before a default: `name: dim = 4`".into());
    }
    // `model Net` where a member was expected: the item before it is probably not closed.
    let before = text[..at].trim_end();
    let prev_word: &str =
        before.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
    let prev_at_line_start =
        before[..before.len() - prev_word.len()].ends_with('\n') || before.len() == prev_word.len();
    let names_expected = expected
        .iter()
        .any(|e| e == "a name" || e == "a pattern" || e == "a parameter (`name: type`)");
    let word_here: String =
        rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    // `fn f16(…)`: the reserved word is the name being defined.
    if names_expected && RESERVED.contains(&word_here.as_str()) && NAMING.contains(&prev_word) {
        let dtype = DTYPES.contains(&word_here.as_str());
        let what = if dtype { " (an element type)" } else { "" };
        let item = match prev_word {
            "let" => "a `let` binding",
            "fn" => "a function",
            "layer" => "a layer",
            "model" => "a model",
            "const" => "a constant",
            _ => "an alias",
        };
        let example = if dtype && prev_word == "fn" {
            format!(", such as `to_{word_here}`")
        } else {
            String::new()
        };
        return Some(format!(
            "`{word_here}` is a reserved word{what} and cannot name {item}; \
             choose another name{example}"
        ));
    }
    if matches!(prev_word, "fn" | "layer" | "model" | "const" | "use")
        && prev_at_line_start
        && before.len() < text.len()
    {
        return Some(format!("`{prev_word}` starts a new item here; is a `}}` missing before it?"));
    }
    if RESERVED.contains(&word_here.as_str())
        && expected.iter().any(|e| e == "an expression" || e == "a name")
    {
        return Some(format!(
            "`{word_here}` is a reserved word; \
             a field with this name is reached as `self.{word_here}`"
        ));
    }
    // The word before is reserved and stands where a name should (`let fn = …`); a keyword
    // that introduces a name (the `let` of `let = …`) is not the problem.
    let word_before_prev = before[..before.len() - prev_word.len()]
        .trim_end()
        .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .next()
        .unwrap_or("");
    let in_name_position = !NAMING.contains(&prev_word) || NAMING.contains(&word_before_prev);
    if names_expected && RESERVED.contains(&prev_word) && in_name_position {
        return Some(format!("`{prev_word}` is a reserved word and cannot be used as a name here"));
    }
    if rest.starts_with("def ") || rest.starts_with("class ") {
        return Some("mgn items start with `fn`, `layer` or `model`".into());
    }
    None
}

/// The token at `at`, for "found ..." (description, byte length).
fn describe_token(text: &str, at: usize) -> (String, usize) {
    let rest = &text[at..];
    let Some(c) = rest.chars().next() else { return ("end of file".into(), 0) };
    if c.is_ascii_alphanumeric() || c == '_' {
        let word: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        let word = word.trim_end_matches('.').to_string();
        let len = word.len();
        return (format!("`{word}`"), len);
    }
    for op in ["->", "==", "!=", "<=", ">=", "&&", "||", "^T", ".."] {
        if rest.starts_with(op) {
            return (format!("`{op}`"), op.len());
        }
    }
    if c == '\n' || c == '\r' {
        return ("end of line".into(), 1);
    }
    (format!("`{c}`"), c.len_utf8())
}

fn rule_name(r: Rule) -> Option<&'static str> {
    Some(match r {
        Rule::EOI => "end of file",
        Rule::item_at
        | Rule::use_item
        | Rule::const_item
        | Rule::fn_item
        | Rule::layer_item
        | Rule::model_item => "an item (`use`, `const`, `fn`, `layer` or `model`)",
        Rule::kw_use | Rule::kw_const | Rule::kw_fn | Rule::kw_layer | Rule::kw_model => {
            "an item (`use`, `const`, `fn`, `layer` or `model`)"
        }
        Rule::input_decl
        | Rule::kw_input
        | Rule::field_def
        | Rule::forward_def
        | Rule::kw_forward => "a member (`input`, a field or `forward`)",
        Rule::let_stmt
        | Rule::kw_let
        | Rule::output_stmt
        | Rule::kw_output
        | Rule::loss_stmt
        | Rule::kw_loss => "a statement",
        Rule::expr
        | Rule::if_expr
        | Rule::paren_or_tuple
        | Rule::list
        | Rule::float
        | Rule::int
        | Rule::bool_lit
        | Rule::string
        | Rule::dtype_lit
        | Rule::self_kw
        | Rule::neg_op
        | Rule::not_op
        | Rule::kw_if => "an expression",
        Rule::or_op
        | Rule::and_op
        | Rule::eq_op
        | Rule::ne_op
        | Rule::le_op
        | Rule::ge_op
        | Rule::lt_op
        | Rule::gt_op
        | Rule::add_op
        | Rule::sub_op
        | Rule::matmul_op
        | Rule::mul_op
        | Rule::div_op
        | Rule::rem_op
        | Rule::call_args
        | Rule::field_access
        | Rule::index
        | Rule::transpose_op => "an operator",
        Rule::ident | Rule::field_name => "a name",
        Rule::dotted => "a module path",
        Rule::use_list => "`.{`",
        Rule::use_alias | Rule::kw_as => "`as`",
        Rule::use_source => "a module path or a quoted file path",
        Rule::params | Rule::param => "a parameter (`name: type`)",
        Rule::optional => "`?`",
        Rule::ret_type => "`->`",
        Rule::type_expr | Rule::scalar_type | Rule::tuple_type => "a type",
        Rule::tensor_type | Rule::typed_by_name | Rule::dtype => {
            "a tensor type such as `f32[B, 784]`"
        }
        Rule::variadic_dim => "`..`",
        Rule::block => "`{`",
        Rule::tuple_pattern | Rule::wildcard => "a pattern",
        Rule::field_cond => "`if`",
        Rule::param_init | Rule::kw_param => "`param`",
        Rule::buffer_init | Rule::kw_buffer => "`buffer`",
        Rule::const_init => "`const`",
        Rule::state_init | Rule::kw_state => "`state`",
        Rule::assign_stmt => "`self.field = …`",
        Rule::init_clause | Rule::kw_init => "`init`",
        Rule::repeat_init | Rule::kw_repeat => "`repeat`",
        Rule::repeat_name | Rule::kw_name => "`name = \"…\"`",
        Rule::kw_else => "`else`",
        Rule::arg => "an argument",
        _ => return None,
    })
}
