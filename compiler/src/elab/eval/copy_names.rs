//! The names of `repeat`'s copies: `0`, `1`, … by default, or the text of a name pattern with
//! the copy index written into its holes (`repeat(12, i, name = "encoder_layer_{i}")`), so a
//! repeated block can take the names an upstream checkpoint gives its copies.

use super::*;
use std::collections::HashMap;

/// A piece of a name pattern: text as written, or a hole `{i}` for the copy index.
enum Part {
    Text(String),
    Index,
}

impl<'p> Evaluator<'p> {
    /// The names of `count` copies: each a segment of a checkpoint name, and no two alike.
    pub(super) fn copy_names(
        &mut self,
        pattern: Option<&Expr>,
        index: Option<&Ident>,
        count: i64,
    ) -> R<Vec<String>> {
        let Some(pattern) = pattern else {
            return Ok((0..count).map(|i| i.to_string()).collect());
        };
        let text = match self.eval(pattern)? {
            Value::Str(s) => s,
            v => {
                return Err(Diagnostic::error(
                    "E0201",
                    format!(
                        "the name pattern of `repeat` must be a string, found {}",
                        self.describe(&v)
                    ),
                    pattern.span,
                    "not a string",
                )
                .with_help(
                    "write the copies' names with the index in braces: `name = \"block_{i}\"`",
                ))
            }
        };
        let parts = parse(&text, index, pattern.span)?;
        let mut names = Vec::with_capacity(count as usize);
        let mut seen: HashMap<String, i64> = HashMap::new();
        for i in 0..count {
            let name: String = parts
                .iter()
                .map(|p| match p {
                    Part::Text(t) => t.clone(),
                    Part::Index => i.to_string(),
                })
                .collect();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                let like = segment_like(&text);
                let help = if like.is_empty() || like == *text {
                    "give each copy a name of letters, digits and `_`: `\"block_{i}\"`".into()
                } else {
                    format!("write it with `_` instead: `\"{like}\"`")
                };
                return Err(Diagnostic::error(
                    "E0201",
                    format!("copy {i} would be named `{name}`, which is not a name segment"),
                    pattern.span,
                    "this pattern",
                )
                .with_note(
                    "each copy's name is one segment of its checkpoint names: letters, digits \
                     and `_`, at least one (`.` separates segments)",
                )
                .with_help(help));
            }
            if let Some(first) = seen.insert(name.clone(), i) {
                return Err(Diagnostic::error(
                    "E0106",
                    format!("copies {first} and {i} would both be named `{name}`"),
                    pattern.span,
                    "the same name for every copy",
                )
                .with_help(match index {
                    Some(id) => {
                        format!("put the copy index in the pattern: `\"{name}_{{{}}}\"`", id.name)
                    }
                    None => format!(
                        "name the copy index and put it in the pattern: \
                         `repeat(n, i, name = \"{name}_{{i}}\")`"
                    ),
                }));
            }
            names.push(name);
        }
        Ok(names)
    }
}

/// Splits a pattern into text and holes; every hole must name the copy index.
fn parse(text: &str, index: Option<&Ident>, span: Span) -> R<Vec<Part>> {
    let mut parts = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(brace(span, "a `}` that closes no `{`"));
        }
        let Some(len) = rest[open..].find('}') else {
            return Err(brace(span, "a `{` that is never closed"));
        };
        parts.push(Part::Text(rest[..open].to_string()));
        let hole = rest[open + 1..open + len].trim();
        match index {
            Some(id) if id.name == hole => parts.push(Part::Index),
            Some(id) => {
                return Err(Diagnostic::error(
                    "E0101",
                    format!("`{{{hole}}}` in the name pattern is not the copy index `{}`", id.name),
                    span,
                    "this pattern",
                )
                .with_label(id.span, "the copy index")
                .with_help(format!("write `{{{}}}` where the copy's index goes", id.name)))
            }
            None => {
                let is_name = hole.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && hole.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let suggested = if is_name { hole } else { "i" };
                return Err(Diagnostic::error(
                    "E0101",
                    format!("`{{{hole}}}` in the name pattern names no copy index"),
                    span,
                    "this pattern",
                )
                .with_help(format!(
                    "name the copy index after the count: `repeat(n, {suggested}, name = …)`"
                )));
            }
        }
        rest = &rest[open + len + 1..];
    }
    parts.push(Part::Text(rest.to_string()));
    Ok(parts)
}

/// The pattern with every character a name segment cannot hold (outside its holes) as `_`.
fn segment_like(pattern: &str) -> String {
    let mut in_hole = false;
    pattern
        .chars()
        .map(|c| {
            in_hole = (in_hole || c == '{') && c != '}';
            let keep = in_hole || c == '}' || c.is_ascii_alphanumeric() || c == '_';
            if keep {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn brace(span: Span, what: &str) -> Diagnostic {
    Diagnostic::error("E0201", format!("the name pattern has {what}"), span, "this pattern")
        .with_help("holes are written `{i}`, with the copy index's name in braces")
}

#[cfg(test)]
mod tests;
