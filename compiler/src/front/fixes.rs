//! Fixes that take more than replacing the name a diagnostic points at: the missing `use` of a
//! stdlib item. The editor offers them as quick fixes (`mgnc lsp`'s code actions).

use crate::source::SourceMap;
use mgn_syntax::ast::{File, Item, UseItem, UseSource};
use mgn_syntax::{Edit, Fix, Span};

/// Imports `name` from `std.module` into the file where `at` is: into the braces of an
/// existing `use std.module.{…}` line, else as a new `use` line below the file's last one (or
/// at the top when it has none).
pub fn add_import(file: &File, sources: &SourceMap, at: Span, module: &str, name: &str) -> Fix {
    let title = format!("add `use std.{module}.{{{name}}}`");
    let text = sources.try_get(at.file).map_or("", |f| f.text.as_str());
    let uses: Vec<&UseItem> = file
        .items
        .iter()
        .filter_map(|i| match i {
            Item::Use(u) if u.span.file == at.file => Some(u),
            _ => None,
        })
        .collect();
    let same_module = uses.iter().find(|u| {
        let UseSource::Path(path) = &u.source else { return false };
        let names: Vec<&str> = path.iter().map(|p| p.name.as_str()).collect();
        names == ["std", module] && u.names.is_some() && u.alias.is_none()
    });
    let brace = same_module.and_then(|u| {
        let end = u.span.end as usize;
        (text.get(..end)?.ends_with('}')).then_some(end - 1)
    });
    let edit = match (brace, uses.last()) {
        (Some(b), _) => {
            // After the last name, before any space ahead of the `}`.
            let pos = text[..b].trim_end().len() as u32;
            let empty = text[..b].trim_end().ends_with('{');
            let text = if empty { name.to_string() } else { format!(", {name}") };
            Edit { span: Span { file: at.file, start: pos, end: pos }, text }
        }
        (None, Some(last)) => Edit {
            span: Span { file: at.file, start: last.span.end, end: last.span.end },
            text: format!("\nuse std.{module}.{{{name}}}"),
        },
        (None, None) => Edit {
            span: Span { file: at.file, start: 0, end: 0 },
            text: format!("use std.{module}.{{{name}}}\n\n"),
        },
    };
    Fix { title, edits: vec![edit] }
}
