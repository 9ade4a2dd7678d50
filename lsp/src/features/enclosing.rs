//! Which item's scope completion answers from. While a line is being typed the item around it
//! often does not parse, and right after a file is opened no analysis may have seen it parse;
//! so, best first: the item in the current text; the current text without the line being typed
//! (positions unchanged); the item's last version that parsed; no item (module names only).

use super::completion::{completion, Enclosing};
use super::*;

/// Where the cursor is among the root file's items.
enum Place<'a> {
    Parsed(&'a Item),
    /// In an item that does not parse right now, named so.
    Unparsed(&'a Ident),
    Outside,
}

fn place(root: &mgn_compiler::front::Module, offset: usize) -> Place<'_> {
    let parsed = root.ast.items.iter().filter(|i| i.span().start as usize <= offset);
    let parsed = parsed.max_by_key(|i| i.span().start);
    let unparsed = root.ast.unparsed.iter().filter(|n| (n.span.start as usize) < offset);
    let unparsed = unparsed.max_by_key(|n| n.span.start);
    match (parsed, unparsed) {
        (Some(i), _) if i.span().contains(offset) && !matches!(i, Item::Use(_)) => Place::Parsed(i),
        (Some(i), Some(n)) if i.span().end <= n.span.start => Place::Unparsed(n),
        (None, Some(n)) => Place::Unparsed(n),
        _ => Place::Outside,
    }
}

/// Completion at `offset` of `text` (the buffer `this` analysed). `last` holds, by item name,
/// the latest analysis in which the item parsed; `names_of` loads and resolves another text of
/// the same buffer.
pub fn complete(
    this: &Analysis,
    last: &HashMap<String, Arc<Analysis>>,
    names_of: impl FnOnce(String) -> Option<Analysis>,
    text: &str,
    offset: usize,
) -> Vec<lsp::CompletionItem> {
    let prog = this.program();
    let name = match place(prog.module(prog.root), offset) {
        Place::Parsed(item) => return completion(&at(this, Some(item), true, false), text, offset),
        Place::Outside => return completion(&at(this, None, true, false), text, offset),
        Place::Unparsed(name) => name,
    };
    if let Some(repaired) = names_of(without_line(text, offset)) {
        if let Place::Parsed(item) =
            place(repaired.program().module(repaired.program().root), offset)
        {
            return completion(&at(&repaired, Some(item), true, false), text, offset);
        }
    }
    if let Some(old) = last.get(&name.name) {
        let root = old.program().module(old.program().root);
        if let Some(item) =
            root.ast.items.iter().find(|i| i.name().is_some_and(|n| n.name == name.name))
        {
            let in_forward = forward_between(text, name.span.end as usize, offset);
            return completion(&at(old, Some(item), false, in_forward), text, offset);
        }
    }
    completion(&at(this, None, true, false), text, offset)
}

fn at<'a>(
    a: &'a Analysis,
    item: Option<&'a Item>,
    current: bool,
    in_forward: bool,
) -> Enclosing<'a> {
    Enclosing { analysis: a, module: a.program().root, item, current, in_forward }
}

/// The text with the line around `offset` blanked (its bytes made spaces, so every other
/// position stays where it was).
fn without_line(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    format!("{}{}{}", &text[..start], " ".repeat(end - start), &text[end..])
}

/// Whether a line between `from` and `to` starts with `forward`: the cursor is in (or after)
/// the item's forward.
fn forward_between(text: &str, from: usize, to: usize) -> bool {
    let to = to.min(text.len());
    text.get(from.min(to)..to).is_some_and(|t| {
        t.lines().any(|l| {
            l.trim_start()
                .strip_prefix("forward")
                .is_some_and(|r| !r.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        })
    })
}

#[cfg(test)]
mod tests;
