//! Semantic tokens: names classified by what they refer to, keywords, literals, comments.

use super::*;

pub const TOKEN_TYPES: &[lsp::SemanticTokenType] = &[
    lsp::SemanticTokenType::NAMESPACE,
    lsp::SemanticTokenType::TYPE,
    lsp::SemanticTokenType::CLASS,
    lsp::SemanticTokenType::FUNCTION,
    lsp::SemanticTokenType::PARAMETER,
    lsp::SemanticTokenType::VARIABLE,
    lsp::SemanticTokenType::PROPERTY,
    lsp::SemanticTokenType::KEYWORD,
    lsp::SemanticTokenType::NUMBER,
    lsp::SemanticTokenType::COMMENT,
    lsp::SemanticTokenType::STRING,
    lsp::SemanticTokenType::TYPE_PARAMETER,
];
pub const TOKEN_MODIFIERS: &[lsp::SemanticTokenModifier] = &[
    lsp::SemanticTokenModifier::DECLARATION,
    lsp::SemanticTokenModifier::READONLY,
    lsp::SemanticTokenModifier::DEFAULT_LIBRARY,
];

const T_NAMESPACE: u32 = 0;
const T_TYPE: u32 = 1;
const T_CLASS: u32 = 2;
const T_FUNCTION: u32 = 3;
const T_PARAMETER: u32 = 4;
const T_VARIABLE: u32 = 5;
const T_PROPERTY: u32 = 6;
const T_KEYWORD: u32 = 7;
const T_NUMBER: u32 = 8;
const T_COMMENT: u32 = 9;
const T_STRING: u32 = 10;
const T_TYPE_PARAMETER: u32 = 11;
const M_DECLARATION: u32 = 1;
const M_READONLY: u32 = 2;
const M_DEFAULT_LIBRARY: u32 = 4;

const RESERVED: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as",
];
const CONTEXTUAL: &[&str] = &["input", "output", "loss", "param", "buffer", "state", "init"];
const TYPES: &[&str] =
    &["f32", "f16", "bf16", "i32", "i64", "u32", "bool", "dim", "int", "float", "dtype", "init"];

pub fn semantic_tokens(a: &Analysis) -> Vec<lsp::SemanticToken> {
    let file = a.root_file();
    let text = text_of(a, file);
    let mut by_start: HashMap<u32, &Occurrence> = HashMap::new();
    for o in a.names().occurrences() {
        if o.span.file == file {
            by_start.entry(o.span.start).or_insert(o);
        }
    }
    let mut toks: Vec<(usize, usize, u32, u32)> = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let (e, tok) = if b[i..].starts_with(b"//") {
            let e = text[i..].find('\n').map(|n| i + n).unwrap_or(b.len());
            (e, Some((T_COMMENT, 0)))
        } else if b[i..].starts_with(b"/*") {
            let e = text[i + 2..].find("*/").map(|n| i + n + 4).unwrap_or(b.len());
            (e, Some((T_COMMENT, 0)))
        } else if c == b'"' {
            let e =
                text[i + 1..].find(['"', '\n']).map(|n| i + n + 2).unwrap_or(b.len()).min(b.len());
            (e, Some((T_STRING, 0)))
        } else if c.is_ascii_digit() {
            (number_end(b, i), Some((T_NUMBER, 0)))
        } else if ident_char(c) {
            let mut e = i;
            while e < b.len() && ident_char(b[e]) {
                e += 1;
            }
            let after_dot = i > 0 && b[i - 1] == b'.';
            (e, word_token(&text[i..e], by_start.get(&(i as u32)).copied(), after_dot))
        } else {
            (i + 1, None)
        };
        if let Some((t, m)) = tok {
            toks.push((i, e, t, m));
        }
        i = e;
    }
    encode(text, toks)
}

/// Where a number starting at `i` ends (`1`, `2.5`, `1e-3`).
fn number_end(b: &[u8], i: usize) -> usize {
    let mut e = i;
    while e < b.len()
        && (b[e].is_ascii_alphanumeric()
            || b[e] == b'_'
            || (b[e] == b'.'
                && b.get(e + 1).is_some_and(u8::is_ascii_digit)
                && b[i..e].iter().all(u8::is_ascii_digit))
            || ((b[e] == b'-' || b[e] == b'+') && matches!(b[e - 1], b'e' | b'E')))
    {
        e += 1;
    }
    e
}

/// A word's token: what the name refers to where the compiler resolved it, else a keyword or
/// type by spelling (a word after `.` that resolved to nothing stays plain).
fn word_token(word: &str, o: Option<&Occurrence>, after_dot: bool) -> Option<(u32, u32)> {
    let Some(o) = o else {
        return match word {
            _ if after_dot => None,
            _ if RESERVED.contains(&word) => Some((T_KEYWORD, 0)),
            _ if TYPES.contains(&word) => Some((T_TYPE, 0)),
            _ if CONTEXTUAL.contains(&word) => Some((T_KEYWORD, 0)),
            "std" => Some((T_NAMESPACE, 0)),
            _ => None,
        };
    };
    let decl = if o.def { M_DECLARATION } else { 0 };
    Some(match o.target {
        Target::Builtin(_) => (T_FUNCTION, M_DEFAULT_LIBRARY),
        Target::Module(_) => (T_NAMESPACE, 0),
        Target::Def { kind, .. } | Target::Item { kind, .. } => match kind {
            SymKind::Local | SymKind::Index | SymKind::Output => (T_VARIABLE, decl),
            SymKind::Input => (T_VARIABLE, decl | M_READONLY),
            SymKind::Param => (T_PARAMETER, decl),
            SymKind::Config => (T_PARAMETER, decl | M_READONLY),
            SymKind::Field => (T_PROPERTY, decl),
            SymKind::Dim => (T_TYPE_PARAMETER, decl),
            SymKind::Layer | SymKind::Model => (T_CLASS, decl),
            SymKind::Fn => (T_FUNCTION, decl),
            SymKind::Const => (T_VARIABLE, decl | M_READONLY),
        },
    })
}

/// LSP's relative encoding of `(start, end, type, modifiers)` tokens, one token per line
/// (block comments are split at newlines).
fn encode(text: &str, toks: Vec<(usize, usize, u32, u32)>) -> Vec<lsp::SemanticToken> {
    let map = LineMap::new(text);
    let mut out = Vec::new();
    let (mut last_line, mut last_col) = (0u32, 0u32);
    for (s, e, t, m) in toks {
        let mut s = s;
        while s < e {
            let line_end = text[s..e].find('\n').map(|n| s + n).unwrap_or(e);
            if line_end > s {
                let p = map.position(s);
                let len = text[s..line_end].encode_utf16().count() as u32;
                let delta_line = p.line - last_line;
                let delta_start =
                    if delta_line == 0 { p.character - last_col } else { p.character };
                out.push(lsp::SemanticToken {
                    delta_line,
                    delta_start,
                    length: len,
                    token_type: t,
                    token_modifiers_bitset: m,
                });
                last_line = p.line;
                last_col = p.character;
            }
            s = line_end + 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::tests::analyse;

    #[test]
    fn semantic_tokens_classify_names() {
        let text = concat!(
            "use std.nn.{Linear}\n// c\nlayer A(d: dim) {\n    fc = Linear(d, 2)\n",
            "    forward(x: f32[B, d]) -> f32[B, 2] { relu(fc(x)) }\n}\n"
        );
        let a = analyse(text);
        let toks = semantic_tokens(&a);
        // Decode to (line, col, len, type).
        let (mut line, mut col) = (0, 0);
        let mut decoded = Vec::new();
        for t in toks {
            if t.delta_line > 0 {
                line += t.delta_line;
                col = t.delta_start;
            } else {
                col += t.delta_start;
            }
            decoded.push((line, col, t.length, t.token_type, t.token_modifiers_bitset));
        }
        let find =
            |l: u32, c: u32| decoded.iter().find(|t| t.0 == l && t.1 == c).map(|t| (t.3, t.4));
        assert_eq!(find(0, 0), Some((T_KEYWORD, 0)), "use");
        assert_eq!(find(0, 12), Some((T_CLASS, 0)), "Linear");
        assert_eq!(find(1, 0), Some((T_COMMENT, 0)));
        assert_eq!(find(2, 6), Some((T_CLASS, M_DECLARATION)), "A");
        assert_eq!(find(2, 8), Some((T_PARAMETER, M_DECLARATION | M_READONLY)), "d");
        assert_eq!(find(2, 11), Some((T_TYPE, 0)), "dim");
        assert_eq!(find(3, 4), Some((T_PROPERTY, M_DECLARATION)), "fc");
        assert_eq!(find(3, 19), Some((T_NUMBER, 0)), "2");
        assert_eq!(find(4, 15), Some((T_TYPE, 0)), "f32");
        assert_eq!(find(4, 19), Some((T_TYPE_PARAMETER, M_DECLARATION)), "B");
        assert_eq!(find(4, 41), Some((T_FUNCTION, M_DEFAULT_LIBRARY)), "relu");
        assert_eq!(find(4, 46), Some((T_PROPERTY, 0)), "fc");
    }
}
