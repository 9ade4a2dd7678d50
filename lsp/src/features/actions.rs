//! Code actions: the quick fixes the compiler's diagnostics carry (`Diagnostic::fix`) — the
//! name a "did you mean" suggests, a missing `use` of a stdlib item, mgn's name for a PyTorch
//! function — offered for the diagnostics under the requested range.

use super::*;

/// The quick fixes for the diagnostics of `uri` that overlap `range`. `shown` are the
/// diagnostics the client sent as context: each action names the one it fixes, so an editor
/// can list it under that diagnostic.
pub fn code_actions(
    ctx: &Ctx,
    uri: &lsp::Uri,
    range: lsp::Range,
    shown: &[lsp::Diagnostic],
) -> Vec<lsp::CodeActionOrCommand> {
    let mut out: Vec<lsp::CodeAction> = Vec::new();
    for a in std::iter::once(ctx.this).chain(ctx.all.iter()) {
        for d in &a.outcome.diagnostics {
            let Some(fix) = d.fix() else { continue };
            let primary = d.primary_span();
            if (primary.file.0 as usize) >= a.program().sources.files().count()
                || a.uri_of(ctx.paths, primary.file).as_ref() != Some(uri)
                || fix.edits.iter().any(|e| e.span.file != primary.file)
            {
                continue;
            }
            let at = range_of(a, primary);
            if at.end < range.start || range.end < at.start {
                continue;
            }
            let edits: Vec<lsp::TextEdit> = fix
                .edits
                .iter()
                .map(|e| lsp::TextEdit { range: range_of(a, e.span), new_text: e.text.clone() })
                .collect();
            let code = lsp::NumberOrString::String(d.code.to_string());
            let fixes: Vec<lsp::Diagnostic> = shown
                .iter()
                .filter(|s| s.range == at && s.code.as_ref() == Some(&code))
                .cloned()
                .collect();
            let action = lsp::CodeAction {
                title: fix.title.clone(),
                kind: Some(lsp::CodeActionKind::QUICKFIX),
                diagnostics: (!fixes.is_empty()).then_some(fixes),
                edit: Some(lsp::WorkspaceEdit {
                    changes: Some([(uri.clone(), edits)].into_iter().collect()),
                    ..Default::default()
                }),
                is_preferred: Some(true),
                ..Default::default()
            };
            // Two open files that both load this one see its diagnostics twice.
            if !out.iter().any(|o| o.title == action.title && o.edit == action.edit) {
                out.push(action);
            }
        }
    }
    out.into_iter().map(lsp::CodeActionOrCommand::CodeAction).collect()
}
