//! Hover: what a name refers to (a signature, a declaration, doc comments), what elaboration
//! learned about it (types, parameter shapes, what a parameter was bound to), and the GPU
//! time of its line from the model's last `mgnc bench --trace` (`crate::profile`).

use super::*;

pub fn hover(ctx: &Ctx, offset: usize) -> Option<lsp::Hover> {
    let a = ctx.this;
    let file = a.root_file();
    let src = a.program().sources.get(file);
    let facts = facts_for(ctx, &src.origin, &src.text);
    let occ = resolve::at(a.names(), file, offset).copied();
    let mut parts: Vec<String> = Vec::new();
    let mut range = None;
    if let Some(o) = occ {
        range = Some(o.span);
        parts.extend(describe_target(ctx, &facts, &o));
        if let Some(call) = o.call {
            let texts = facts_at(&facts, call, &[FactKind::Expr]);
            if !texts.is_empty() {
                parts.push(format!("this call gives `{}`", texts.join("` or `")));
            }
        }
    }
    if parts.is_empty() {
        // The innermost fact at the cursor: the type of the expression under it.
        let best = facts
            .iter()
            .filter(|f| f.start <= offset && offset <= f.end)
            .min_by_key(|f| (f.end - f.start, f.kind != FactKind::Expr));
        if let Some(best) = best {
            let span = Span { file, start: best.start as u32, end: best.end as u32 };
            let texts = facts_at(&facts, span, &[best.kind]);
            parts.push(code_block(&join_facts(&texts)));
            range = Some(span);
        }
    }
    if let Origin::Path(path) = &src.origin {
        let line = LineMap::new(&src.text).position(offset).line + 1;
        // The trace is beside the model that was benchmarked, which may be any open file that
        // loads this one.
        let models: Vec<std::path::PathBuf> = (std::iter::once(ctx.this).chain(ctx.all))
            .chain(ctx.facts_from)
            .filter(|a| a.reads(&src.origin))
            .filter_map(|a| crate::paths::uri_to_path(&a.uri))
            .collect();
        let found = crate::profile::line_times(path, line, &models);
        parts.extend(crate::profile::describe(&found));
    }
    if parts.is_empty() {
        return None;
    }
    Some(lsp::Hover {
        contents: lsp::HoverContents::Markup(lsp::MarkupContent {
            kind: lsp::MarkupKind::Markdown,
            value: parts.join("\n\n"),
        }),
        range: range.map(|s| range_of(a, s)),
    })
}

fn describe_target(ctx: &Ctx, facts: &[FileFact], o: &Occurrence) -> Vec<String> {
    let a = ctx.this;
    match o.target {
        Target::Builtin(b) => vec![code_block(&builtin_signature(b)), b.doc.to_string()],
        Target::Module(m) => vec![code_block(&format!("module {}", a.program().module(m).name))],
        Target::Def { span, kind } | Target::Item { span, kind, .. } => {
            // Facts live at the definition; a definition in another file has its own facts.
            let def_facts;
            let facts = if span.file == a.root_file() {
                facts
            } else {
                let f = a.program().sources.get(span.file);
                def_facts = facts_for(ctx, &f.origin, &f.text);
                &def_facts[..]
            };
            let name = snippet(a, span).to_string();
            match kind {
                SymKind::Layer | SymKind::Model | SymKind::Fn | SymKind::Const => {
                    let Some((m, item)) = item_at(a.program(), span) else { return Vec::new() };
                    let text = text_of(a, span.file);
                    let mut out = vec![code_block(&item_signature(text, item))];
                    let module = &a.program().module(m).name;
                    if is_std(a, span.file) || span.file != a.root_file() {
                        out.push(format!("*from `{module}`*"));
                    }
                    if let Some(doc) = doc_comment(text, item.span().start as usize) {
                        out.push(doc);
                    }
                    out
                }
                SymKind::Local => {
                    let texts = facts_at(facts, span, &[FactKind::Let]);
                    if texts.is_empty() {
                        vec![code_block(&format!("let {name}"))]
                    } else {
                        vec![code_block(
                            &texts
                                .iter()
                                .map(|t| format!("let {name}: {t}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        )]
                    }
                }
                SymKind::Field => {
                    let texts = facts_at(facts, span, &[FactKind::Param, FactKind::Layer]);
                    let mut out = vec![code_block(&declaration(a, span, kind).unwrap_or(name))];
                    if !texts.is_empty() {
                        out.push(
                            join_facts(&texts)
                                .lines()
                                .map(|l| format!("- {l}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        );
                    }
                    out
                }
                SymKind::Input => {
                    let decl = declaration(a, span, kind).unwrap_or(name);
                    let mut out = vec![code_block(&decl)];
                    if let Some((_, Item::Layer(l))) = item_at(a.program(), span) {
                        if let Some(i) = l.inputs.iter().find(|i| i.name.span == span) {
                            let texts = facts_at(facts, i.span, &[FactKind::Expr]);
                            if !texts.is_empty() {
                                out.push(format!("`{}`", texts.join("`, `")));
                            }
                        }
                    }
                    out
                }
                SymKind::Output => vec![code_block(&format!("output {name}"))],
                _ => {
                    let mut out = vec![code_block(
                        &declaration(a, span, kind)
                            .unwrap_or_else(|| format!("{name} ({})", kind.describe())),
                    )];
                    // What a parameter was bound to in the calls elaboration made.
                    let texts = facts_at(facts, span, &[FactKind::Arg]);
                    if !texts.is_empty() {
                        out.push(
                            join_facts(&texts)
                                .lines()
                                .map(|l| format!("- bound to {l}"))
                                .collect::<Vec<_>>()
                                .join("\n"),
                        );
                    }
                    out
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::tests::analyse;

    fn hover_text(text: &str, needle: &str, delta: usize) -> String {
        let paths = Paths::without_stdlib();
        let a = analyse(text);
        let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
        let off = text.find(needle).unwrap() + delta;
        let h = hover(&ctx, off).expect("a hover");
        let lsp::HoverContents::Markup(m) = h.contents else { panic!("markup hover") };
        m.value
    }

    #[test]
    fn hover_on_a_forward_parameter_shows_what_it_was_bound_to() {
        let text = concat!(
            "layer L(d: dim) {\n    forward(x: f32[B, d]) -> f32[B, d] { relu(x) }\n}\n",
            "model M {\n    input t: f32[3, 5]\n    l = L(5)\n    forward {\n",
            "        output y = l(t)\n    }\n}\n"
        );
        let h = hover_text(text, "relu(x)", 5);
        assert!(h.contains("bound to f32[3, 5]"), "{h}");
    }

    #[test]
    fn hover_on_a_dim_named_like_a_builtin_shows_the_dim() {
        // Elaboration binds `mean` here, so hover says what it is bound to, not the builtin.
        let text = concat!(
            "fn f(x: f32[n, mean]) -> f32[n] { sum(x, 1) }\n",
            "model M {\n    input t: f32[2, 3]\n    forward {\n        output y = f(t)\n    }\n}\n"
        );
        let h = hover_text(text, "mean]", 1);
        assert!(h.contains("mean: dim (bound by a shape pattern)"), "{h}");
    }

    #[test]
    fn hover_on_a_selection_or_scan_builtin_shows_its_signature_and_doc() {
        use crate::features::completion::tests::NEW_BUILTINS;
        for name in NEW_BUILTINS {
            let text = format!(
                "model M {{\n    input x: f32[4]\n    forward {{\n        let f = {name}\n        \
                 output y = x\n    }}\n}}\n"
            );
            let b = builtins::lookup(name).expect("a builtin");
            let h = hover_text(&text, &format!("{name}\n"), 1);
            assert!(h.contains(&builtin_signature(b)) && h.contains(b.doc), "{name}: {h}");
        }
    }
}
