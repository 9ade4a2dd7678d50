//! Inlay hints: the type of each `let` binding, from elaboration's facts.

use super::*;

pub fn inlay_hints(ctx: &Ctx, range: lsp::Range) -> Vec<lsp::InlayHint> {
    let a = ctx.this;
    let file = a.root_file();
    let src = a.program().sources.get(file);
    let map = LineMap::new(&src.text);
    let (lo, hi) = (map.offset(range.start), map.offset(range.end));
    let facts = facts_for(ctx, &src.origin, &src.text);
    let mut spans: Vec<(usize, usize)> = facts
        .iter()
        .filter(|f| f.kind == FactKind::Let && f.end >= lo && f.start <= hi)
        .map(|f| (f.start, f.end))
        .collect();
    spans.sort();
    spans.dedup();
    spans
        .into_iter()
        .map(|(s, e)| {
            let texts =
                facts_at(&facts, Span { file, start: s as u32, end: e as u32 }, &[FactKind::Let]);
            let mut label = texts.iter().take(3).copied().collect::<Vec<_>>().join(" | ");
            if texts.len() > 3 {
                label.push_str(" | …");
            }
            lsp::InlayHint {
                position: map.position(e),
                label: lsp::InlayHintLabel::String(format!(": {label}")),
                kind: Some(lsp::InlayHintKind::TYPE),
                text_edits: None,
                tooltip: (texts.len() > 1).then(|| {
                    lsp::InlayHintTooltip::String(format!(
                        "{} instantiations:\n{}",
                        texts.len(),
                        texts.join("\n")
                    ))
                }),
                padding_left: Some(false),
                padding_right: Some(false),
                data: None,
            }
        })
        .collect()
}
