//! What the features share, tested, and every feature on half-typed files.

use super::completion::{completion, Enclosing};
use super::*;
use crate::analysis::{Doc, Snapshot};
use lsp_types::Uri;
use std::str::FromStr;

/// One analysis of `text` as an unsaved buffer.
pub(super) fn analyse(text: &str) -> Arc<Analysis> {
    let uri = Uri::from_str("untitled:test.mgn").unwrap();
    let mut docs = HashMap::new();
    docs.insert(
        uri.clone(),
        Doc {
            text: text.to_string(),
            version: 1,
            origin: Origin::Memory(uri.as_str().to_string()),
        },
    );
    Arc::new(Analysis::run(Snapshot::new(&docs, &uri).unwrap()))
}

/// The enclosing item at `offset` of an analysed text, as the server finds it.
pub(super) fn enclosing(a: &Analysis, offset: usize) -> Enclosing<'_> {
    let root = a.program().root;
    let item = a.program().module(root).ast.items.iter().find(|i| i.span().contains(offset));
    Enclosing { analysis: a, module: root, item, current: true, in_forward: false }
}

/// Every feature at a few offsets of a text: none may panic.
fn exercise(paths: &Paths, text: &str) {
    let a = analyse(text);
    let ctx = Ctx { paths, this: &a, all: &[], facts_from: &[] };
    let _ = diagnostics(paths, &a);
    let _ = document_symbols(&a);
    let _ = semantic_tokens(&a);
    let whole = lsp::Range {
        start: lsp::Position { line: 0, character: 0 },
        end: lsp::Position { line: 9999, character: 0 },
    };
    let _ = inlay_hints(&ctx, whole);
    let n = text.len();
    for off in [0, n / 3, n / 2, n.saturating_sub(1), n, n + 5] {
        let _ = hover(&ctx, off);
        let _ = definition(&ctx, off);
        let _ = references(&ctx, off, true);
        let _ = completion(&enclosing(&a, off), text, off.min(n));
        let _ =
            complete(&a, &HashMap::new(), |t| Arc::try_unwrap(analyse(&t)).ok(), text, off.min(n));
        let _ = prepare_rename(&ctx, off);
        let _ = rename(&ctx, off, "renamed");
    }
}

#[test]
fn half_typed_files_never_panic() {
    let paths = Paths::without_stdlib();
    let model = include_str!("../../../models/tiny_gpt.mgn");
    let mut cut = 0;
    while cut < model.len() {
        if model.is_char_boundary(cut) {
            // The file typed up to here, and the file with a few characters missing here.
            exercise(&paths, &model[..cut]);
            let resume =
                (cut + 4..model.len()).find(|i| model.is_char_boundary(*i)).unwrap_or(model.len());
            exercise(&paths, &format!("{}{}", &model[..cut], &model[resume..]));
        }
        cut += 29;
    }
}

#[test]
fn doc_comments_and_signatures() {
    let text = concat!(
        "// not this one\n\n// Doubles.\n// Twice.\nfn twice(x: f32[N]) -> f32[N] { x * 2 }\n",
        "layer L(a: dim, b: dim = 2) { forward(x: f32[a]) -> f32[a] { x } }\n"
    );
    let fn_start = text.find("fn twice").unwrap();
    assert_eq!(doc_comment(text, fn_start).as_deref(), Some("Doubles.\nTwice."));
    assert_eq!(doc_comment(text, text.find("layer").unwrap()), None);
    let a = analyse(text);
    let items = &a.program().module(a.program().root).ast.items;
    assert_eq!(item_signature(text, &items[0]), "fn twice(x: f32[N]) -> f32[N]");
    assert_eq!(item_signature(text, &items[1]), "layer L(a: dim, b: dim = 2)");
}
