//! The document outline.

use super::*;

#[allow(deprecated)]
fn symbol(
    a: &Analysis,
    name: &Ident,
    span: Span,
    kind: lsp::SymbolKind,
    detail: Option<String>,
    children: Vec<lsp::DocumentSymbol>,
) -> lsp::DocumentSymbol {
    let span =
        if span.start <= name.span.start && name.span.end <= span.end { span } else { name.span };
    lsp::DocumentSymbol {
        name: name.name.clone(),
        detail,
        kind,
        tags: None,
        deprecated: None,
        range: range_of(a, span),
        selection_range: range_of(a, name.span),
        children: (!children.is_empty()).then_some(children),
    }
}

pub fn document_symbols(a: &Analysis) -> Vec<lsp::DocumentSymbol> {
    let root = a.program().module(a.program().root);
    let params = |ps: &[Param], kind: lsp::SymbolKind| -> Vec<lsp::DocumentSymbol> {
        ps.iter()
            .map(|p| {
                symbol(
                    a,
                    &p.name,
                    p.span,
                    kind,
                    Some(one_line(snippet(a, p.ty.span()))),
                    Vec::new(),
                )
            })
            .collect()
    };
    let mut out = Vec::new();
    for item in &root.ast.items {
        match item {
            Item::Use(_) => {}
            Item::Const(c) => out.push(symbol(
                a,
                &c.name,
                c.span,
                lsp::SymbolKind::CONSTANT,
                Some(one_line(snippet(a, c.value.span))),
                Vec::new(),
            )),
            Item::Fn(f) => {
                let detail = one_line(&item_signature(text_of(a, f.span.file), item));
                out.push(symbol(
                    a,
                    &f.name,
                    f.span,
                    lsp::SymbolKind::FUNCTION,
                    Some(detail),
                    params(&f.params, lsp::SymbolKind::VARIABLE),
                ));
            }
            Item::Layer(l) => {
                let mut children = params(&l.params, lsp::SymbolKind::TYPE_PARAMETER);
                for i in &l.inputs {
                    children.push(symbol(
                        a,
                        &i.name,
                        i.span,
                        lsp::SymbolKind::VARIABLE,
                        Some(format!("input {}", one_line(snippet(a, i.ty.span)))),
                        Vec::new(),
                    ));
                }
                for f in &l.fields {
                    let detail = one_line(snippet(a, f.span));
                    let detail =
                        detail.split_once('=').map(|(_, r)| r.trim().to_string()).unwrap_or(detail);
                    children.push(symbol(
                        a,
                        &f.name,
                        f.span,
                        lsp::SymbolKind::FIELD,
                        Some(detail),
                        Vec::new(),
                    ));
                }
                for fwd in &l.forward {
                    let name = Ident {
                        name: "forward".into(),
                        span: Span {
                            file: fwd.span.file,
                            start: fwd.span.start,
                            end: fwd.span.start + 7,
                        },
                    };
                    children.push(symbol(
                        a,
                        &name,
                        fwd.span,
                        lsp::SymbolKind::METHOD,
                        None,
                        params(&fwd.params, lsp::SymbolKind::VARIABLE),
                    ));
                }
                let (kind, detail) = if l.kind == LayerKind::Model {
                    (lsp::SymbolKind::MODULE, "model")
                } else {
                    (lsp::SymbolKind::CLASS, "layer")
                };
                out.push(symbol(a, &l.name, l.span, kind, Some(detail.into()), children));
            }
        }
    }
    out
}
