//! Completion: named arguments of the call being typed, fields after `self.`, items after
//! `module.`, then the names in scope, the module's items, builtins and keywords.

use super::*;

const KEYWORDS: &[&str] = &[
    "use", "const", "fn", "layer", "model", "forward", "repeat", "let", "if", "else", "true",
    "false", "self", "as", "input", "output", "loss", "param", "buffer", "state", "init", "f32",
    "f16", "bf16", "i32", "i64", "u32", "bool", "dim", "int", "float", "dtype",
];

/// The item being edited, from the current text or, when it does not parse right now, from
/// the latest analysis in which it did.
pub struct Enclosing<'a> {
    pub analysis: &'a Analysis,
    pub module: ModId,
    pub item: Option<&'a Item>,
    /// True when `item` comes from the current text (so scopes can use the cursor position).
    pub current: bool,
    /// For an older version of the item: whether the cursor is in its `forward` (the text says),
    /// so that the forward's names are offered there and only there.
    pub in_forward: bool,
}

/// `self.model.layer[0]` before a `.` or `(` at `end`: the names of the chain, indexes dropped.
fn chain_before(text: &str, end: usize) -> Vec<String> {
    let b = text.as_bytes();
    let mut i = end;
    let mut parts = Vec::new();
    loop {
        while i > 0 && b[i - 1] == b' ' {
            i -= 1;
        }
        // Skip `[...]` index groups.
        while i > 0 && b[i - 1] == b']' {
            let mut depth = 0;
            while i > 0 {
                i -= 1;
                match b[i] {
                    b']' => depth += 1,
                    b'[' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
        let e = i;
        while i > 0 && ident_char(b[i - 1]) {
            i -= 1;
        }
        if i == e {
            break;
        }
        parts.push(text[i..e].to_string());
        if i > 0 && b[i - 1] == b'.' {
            i -= 1;
        } else {
            break;
        }
    }
    parts.reverse();
    parts
}

/// The callee chain of the call whose argument list the cursor is in, how many positional
/// arguments come before the cursor, and the named arguments already written there.
fn enclosing_call(text: &str, at: usize) -> Option<(Vec<String>, usize, Vec<String>)> {
    let b = text.as_bytes();
    let mut depth = 0i32;
    let mut i = at;
    let limit = at.saturating_sub(4000);
    while i > limit {
        i -= 1;
        match b[i] {
            b')' | b']' | b'}' => depth += 1,
            b'[' | b'{' if depth == 0 => return None,
            b'(' if depth == 0 => {
                let callee = chain_before(text, i);
                if callee.is_empty() {
                    return None;
                }
                // Split the arguments at top-level commas; the last piece is being typed.
                let mut pieces = Vec::new();
                let (mut d, mut from) = (0i32, i + 1);
                for (j, &c) in b.iter().enumerate().take(at).skip(i + 1) {
                    match c {
                        b'(' | b'[' | b'{' => d += 1,
                        b')' | b']' | b'}' => d -= 1,
                        b',' if d == 0 => {
                            pieces.push(&text[from..j]);
                            from = j + 1;
                        }
                        _ => {}
                    }
                }
                let mut positional = 0;
                let mut named = Vec::new();
                for p in pieces {
                    let name = p.split_once('=').map(|(n, r)| (n.trim(), r)).filter(|(n, r)| {
                        !n.is_empty() && n.bytes().all(ident_char) && !r.starts_with('=')
                    });
                    match name {
                        Some((n, _)) => named.push(n.to_string()),
                        None => positional += 1,
                    }
                }
                return Some((callee, positional, named));
            }
            b'(' | b'[' | b'{' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn item_kind(item: &Item) -> (lsp::CompletionItemKind, &'static str) {
    match item {
        Item::Layer(l) if l.kind == LayerKind::Model => (lsp::CompletionItemKind::MODULE, "model"),
        Item::Layer(_) => (lsp::CompletionItemKind::CLASS, "layer"),
        Item::Fn(_) => (lsp::CompletionItemKind::FUNCTION, "fn"),
        Item::Const(_) => (lsp::CompletionItemKind::CONSTANT, "const"),
        Item::Use(_) => (lsp::CompletionItemKind::MODULE, "use"),
    }
}

fn item_completion(
    prog: &Program,
    label: &str,
    module: ModId,
    index: usize,
) -> lsp::CompletionItem {
    let item = prog.item(module, index);
    let text = &prog.sources.get(prog.module(module).file).text;
    let (kind, _) = item_kind(item);
    lsp::CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail: Some(one_line(&item_signature(text, item))),
        documentation: doc_comment(text, item.span().start as usize)
            .map(lsp::Documentation::String),
        ..Default::default()
    }
}

fn builtin_completion(b: &Builtin) -> lsp::CompletionItem {
    lsp::CompletionItem {
        label: b.name.to_string(),
        kind: Some(match b.value {
            Some(_) => lsp::CompletionItemKind::CONSTANT,
            None => lsp::CompletionItemKind::FUNCTION,
        }),
        detail: Some(builtin_signature(b)),
        documentation: Some(lsp::Documentation::String(b.doc.to_string())),
        ..Default::default()
    }
}

fn field_completions(prog: &Program, l: &LayerItem) -> Vec<lsp::CompletionItem> {
    let text = |f: &FieldDef| {
        for m in &prog.modules {
            if m.ast.items.iter().any(|i| matches!(i, Item::Layer(x) if std::ptr::eq(x, l))) {
                return prog
                    .sources
                    .get(m.file)
                    .text
                    .get(f.span.start as usize..f.span.end as usize)
                    .map(one_line);
            }
        }
        None
    };
    l.fields
        .iter()
        .map(|f| lsp::CompletionItem {
            label: f.name.name.clone(),
            kind: Some(lsp::CompletionItemKind::FIELD),
            detail: text(f),
            ..Default::default()
        })
        .collect()
}

pub(super) fn module_items(prog: &Program, m: ModId) -> Vec<lsp::CompletionItem> {
    prog.module(m)
        .ast
        .items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| Some(item_completion(prog, &item.name()?.name, m, i)))
        .collect()
}

pub fn completion(enc: &Enclosing, text: &str, offset: usize) -> Vec<lsp::CompletionItem> {
    let b = text.as_bytes();
    let mut start = offset.min(b.len());
    while start > 0 && ident_char(b[start - 1]) {
        start -= 1;
    }
    if let Some(items) = super::imports::use_completion(enc.analysis, text, start) {
        return items;
    }
    let visible = visible_at(enc, offset);
    // A bare name that holds a layer, as the innermost visible binding of it says.
    let local_layer = |name: &str| -> Option<LayerRef> {
        visible.iter().find(|v| v.name == name).and_then(|v| v.layer)
    };
    if start > 0 && b[start - 1] == b'.' {
        return member_completions(enc, text, start - 1, local_layer);
    }
    let mut out = argument_completions(enc, text, start, local_layer);
    let mut seen: HashSet<String> = HashSet::new();
    // Names in scope: locals, parameters, the layer's config and fields (innermost first).
    for v in visible {
        if !seen.insert(v.name.clone()) {
            continue;
        }
        let kind = match v.kind {
            SymKind::Field => lsp::CompletionItemKind::FIELD,
            SymKind::Dim => lsp::CompletionItemKind::TYPE_PARAMETER,
            _ => lsp::CompletionItemKind::VARIABLE,
        };
        let detail = declaration(enc.analysis, v.def, v.kind)
            .map(|d| one_line(&d))
            .unwrap_or_else(|| v.kind.describe().to_string());
        out.push(lsp::CompletionItem {
            label: v.name.clone(),
            kind: Some(kind),
            detail: Some(detail),
            sort_text: Some(format!("1{}", v.name)),
            ..Default::default()
        });
    }
    out.extend(global_completions(enc, &mut seen));
    for k in KEYWORDS {
        if seen.insert(k.to_string()) {
            out.push(lsp::CompletionItem {
                label: k.to_string(),
                kind: Some(lsp::CompletionItemKind::KEYWORD),
                sort_text: Some(format!("4{k}")),
                ..Default::default()
            });
        }
    }
    out
}

/// The names the compiler's scopes make visible at the cursor, innermost scope first.
fn visible_at<'a>(enc: &Enclosing<'a>, offset: usize) -> Vec<&'a Visible> {
    let Some(is) = enc.item.map(|i| i.span()) else { return Vec::new() };
    let forwards: Vec<Span> = match enc.item {
        Some(Item::Layer(l)) => l.forward.iter().map(|f| f.span).collect(),
        _ => Vec::new(),
    };
    let mut visible: Vec<&Visible> = enc
        .analysis
        .names()
        .visible()
        .iter()
        .filter(|v| {
            if v.scope == Span::default()
                || v.scope.file != is.file
                || v.scope.start < is.start
                || v.scope.end > is.end
            {
                return false;
            }
            if !enc.current {
                let of_forward = forwards.iter().any(|f| f.start <= v.scope.start);
                return enc.in_forward || !of_forward;
            }
            v.scope.contains(offset) && (v.kind != SymKind::Local || (v.def.end as usize) <= offset)
        })
        .collect();
    visible.sort_by_key(|v| v.scope.len());
    visible
}

/// `receiver.|`: the fields of a layer, the items of a module.
fn member_completions(
    enc: &Enclosing,
    text: &str,
    dot: usize,
    local_layer: impl Fn(&str) -> Option<LayerRef>,
) -> Vec<lsp::CompletionItem> {
    let prog = enc.analysis.program();
    let chain = chain_before(text, dot);
    let Some((first, rest)) = chain.split_first() else { return Vec::new() };
    let target = if first == "self" {
        let Some(Item::Layer(l)) = enc.item else { return Vec::new() };
        let Some((field, rest)) = rest.split_first() else {
            return field_completions(prog, l);
        };
        let field = l.fields.iter().find(|f| f.name.name == *field);
        field.and_then(|f| field_layer(prog, enc.module, f)).and_then(|r| follow(prog, r, rest))
    } else if let Some(r) = local_layer(first) {
        follow(prog, r, rest)
    } else {
        return match resolve_global(prog, enc.module, first) {
            Some(Target::Module(m)) if rest.is_empty() => module_items(prog, m),
            // Not known to the analysis: a `use` line may bind it all the same.
            None if rest.is_empty() => {
                super::imports::guessed_module_items(enc.analysis, text, first)
            }
            _ => Vec::new(),
        };
    };
    target.and_then(|r| layer_item(prog, r)).map(|l| field_completions(prog, l)).unwrap_or_default()
}

/// The named arguments of the call the cursor is in that are not given yet (listed first).
fn argument_completions(
    enc: &Enclosing,
    text: &str,
    start: usize,
    local_layer: impl Fn(&str) -> Option<LayerRef>,
) -> Vec<lsp::CompletionItem> {
    let prog = enc.analysis.program();
    let before = text[..start].trim_end();
    if !before.ends_with('(') && !before.ends_with(',') {
        return Vec::new();
    }
    let Some((callee, positional, given)) = enclosing_call(text, start) else {
        return Vec::new();
    };
    let layer = match enc.item {
        Some(Item::Layer(l)) => Some(l),
        _ => None,
    };
    let params: Vec<(String, String)> =
        match resolve::signature_at(prog, enc.module, layer, &callee, local_layer) {
            Some(Signature::Params(ps)) => {
                let decl = |p: &Param| {
                    let text = &prog.sources.get(p.span.file).text;
                    one_line(text.get(p.span.start as usize..p.span.end as usize).unwrap_or(""))
                };
                ps.iter().map(|p| (p.name.name.clone(), decl(p))).collect()
            }
            Some(Signature::Builtin(bi)) => bi
                .params
                .iter()
                .map(|p| {
                    let name = p.trim_end_matches('?').to_string();
                    (name, format!("{p} (argument of `{}`)", bi.name))
                })
                .collect(),
            None => Vec::new(),
        };
    let mut out = Vec::new();
    for (i, (name, detail)) in params.into_iter().enumerate() {
        if i < positional || given.contains(&name) {
            continue;
        }
        out.push(lsp::CompletionItem {
            label: name.clone(),
            kind: Some(lsp::CompletionItemKind::PROPERTY),
            detail: Some(detail),
            insert_text: Some(format!("{name} = ")),
            sort_text: Some(format!("0{i:03}")),
            label_details: Some(lsp::CompletionItemLabelDetails {
                detail: Some(" =".into()),
                description: Some("named argument".into()),
            }),
            ..Default::default()
        });
    }
    out
}

/// The module's items and imports, then the builtins, each as the compiler resolves its name
/// outside any local scope; names already in `seen` are shadowed.
fn global_completions(enc: &Enclosing, seen: &mut HashSet<String>) -> Vec<lsp::CompletionItem> {
    let prog = enc.analysis.program();
    let mut names: Vec<&str> = prog.module(enc.module).scope.keys().map(String::as_str).collect();
    names.sort();
    for b in builtins::all() {
        names.push(b.name);
    }
    let mut out = Vec::new();
    for name in names {
        if !seen.insert(name.to_string()) {
            continue;
        }
        let item = match resolve_global(prog, enc.module, name) {
            Some(Target::Item { module, index, .. }) => lsp::CompletionItem {
                sort_text: Some(format!("2{name}")),
                ..item_completion(prog, name, module, index)
            },
            Some(Target::Module(m)) => lsp::CompletionItem {
                label: name.to_string(),
                kind: Some(lsp::CompletionItemKind::MODULE),
                detail: Some(format!("module {}", prog.module(m).name)),
                sort_text: Some(format!("2{name}")),
                ..Default::default()
            },
            Some(Target::Builtin(b)) => {
                lsp::CompletionItem { sort_text: Some(format!("3{name}")), ..builtin_completion(b) }
            }
            Some(Target::Def { .. }) | None => continue,
        };
        out.push(item);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::features::tests::{analyse, enclosing};

    fn complete_at(text: &str, needle: &str, delta: usize) -> Vec<String> {
        let a = analyse(text);
        let off = text.find(needle).unwrap() + delta;
        completion(&enclosing(&a, off), text, off).into_iter().map(|c| c.label).collect()
    }

    #[test]
    fn member_completion() {
        let text = concat!(
            "use std.nn\nlayer B(d: dim) {\n    inner = nn.Linear(d, d)\n",
            "    forward(x: f32[d]) -> f32[d] { x }\n}\nmodel M {\n    input x: f32[4]\n",
            "    blocks = repeat(2) B(4)\n    forward {\n",
            "        output y = blocks[0].inner(x) + self.blocks(x)\n    }\n}\n"
        );
        let items = complete_at(text, "nn.Linear", 3);
        assert!(
            items.contains(&"Linear".to_string()) && items.contains(&"Conv2d".to_string()),
            "{items:?}"
        );
        assert_eq!(
            complete_at(text, "inner(x)", 0),
            ["inner"],
            "fields of a repeated layer's element"
        );
        assert_eq!(complete_at(text, "blocks(x)", 0), ["blocks"], "fields after self.");
        let items = complete_at(text, "d, d)", 0);
        assert!(
            items.contains(&"d".to_string()) && items.contains(&"relu".to_string()),
            "{items:?}"
        );
    }

    #[test]
    fn named_arguments_come_first() {
        let text = concat!(
            "layer L(width: dim, depth: int = 2) { forward(x: f32[width]) -> f32[width] { x } }\n",
            "model M {\n    l = L(4, )\n    forward { }\n}\n"
        );
        let items = complete_at(text, "4, )", 3);
        assert_eq!(items.first().map(String::as_str), Some("depth"), "{items:?}");
        assert!(!items.contains(&"width".to_string()), "given positionally: {items:?}");
    }

    /// The builtins come from the compiler's table: the ops added to it are offered with their
    /// signature and doc string like every other builtin.
    #[test]
    fn the_selection_and_scan_builtins_are_offered_with_their_docs() {
        let text =
            "model M {\n    input x: f32[4]\n    forward {\n        output y = x\n    }\n}\n";
        let a = analyse(text);
        let off = text.find("x\n    }").unwrap();
        let items = completion(&enclosing(&a, off), text, off);
        for name in NEW_BUILTINS {
            let b = builtins::lookup(name).unwrap_or_else(|| panic!("`{name}` is a builtin"));
            let item = items.iter().find(|c| c.label == *name);
            let item = item.unwrap_or_else(|| panic!("`{name}` is not offered"));
            assert_eq!(item.detail.as_deref(), Some(builtin_signature(b).as_str()), "{name}");
            let doc = Some(lsp::Documentation::String(b.doc.to_string()));
            assert_eq!(item.documentation, doc, "{name}");
        }
    }

    pub(crate) const NEW_BUILTINS: &[&str] = &[
        "where",
        "maximum",
        "minimum",
        "clamp",
        "erf",
        "log1p",
        "expm1",
        "softplus",
        "full",
        "zeros_like",
        "ones_like",
        "broadcast_to",
        "expand",
        "one_hot",
        "cumsum",
        "topk",
        "take_along_axis",
    ];
}
