//! Definition and references, across every open document's analysis.

use super::*;

pub fn definition(ctx: &Ctx, offset: usize) -> Option<lsp::Location> {
    let a = ctx.this;
    let o = resolve::at(a.names(), a.root_file(), offset)?;
    match o.target {
        Target::Def { span, .. } | Target::Item { span, .. } => location_of(ctx.paths, a, span),
        Target::Module(m) => {
            let file = a.program().module(m).file;
            location_of(ctx.paths, a, Span { file, start: 0, end: 0 })
        }
        Target::Builtin(_) => None,
    }
}

/// A definition's identity across analyses: the file it is in and its span.
fn identity(a: &Analysis, t: Target) -> Option<(Origin, u32, u32)> {
    match t {
        Target::Def { span, .. } | Target::Item { span, .. } => {
            Some((a.program().sources.get(span.file).origin.clone(), span.start, span.end))
        }
        Target::Module(m) => {
            Some((a.program().sources.get(a.program().module(m).file).origin.clone(), 0, 0))
        }
        Target::Builtin(_) => None,
    }
}

pub fn references(ctx: &Ctx, offset: usize, include_declaration: bool) -> Vec<lsp::Location> {
    let a = ctx.this;
    let Some(o) = resolve::at(a.names(), a.root_file(), offset) else { return Vec::new() };
    let builtin = match o.target {
        Target::Builtin(b) => Some(b.name),
        _ => None,
    };
    let id = identity(a, o.target);
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for b in std::iter::once(ctx.this).chain(ctx.all.iter()) {
        for occ in b.names().occurrences() {
            let same = match (occ.target, builtin) {
                (Target::Builtin(x), Some(name)) => x.name == name,
                (_, Some(_)) => false,
                (t, None) => id.is_some() && identity(b, t) == id,
            };
            if !same || (occ.def && !include_declaration) {
                continue;
            }
            if let Some(loc) = location_of(ctx.paths, b, occ.span) {
                if seen.insert((loc.uri.clone(), loc.range.start, loc.range.end)) {
                    out.push(loc);
                }
            }
        }
    }
    out.sort_by(|x, y| {
        (x.uri.as_str(), x.range.start.line, x.range.start.character).cmp(&(
            y.uri.as_str(),
            y.range.start.line,
            y.range.start.character,
        ))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::tests::analyse;

    /// The column of the definition `definition` finds from each offset of a one-line text.
    fn definition_column(text: &str, off: usize) -> Option<u32> {
        let a = analyse(text);
        let paths = Paths::without_stdlib();
        let ctx = Ctx { paths: &paths, this: &a, all: &[], facts_from: &[] };
        definition(&ctx, off).map(|l| l.range.start.character)
    }

    #[test]
    fn the_name_starting_at_the_cursor_wins() {
        let text = "fn f(x: int, yy: int) -> int { x+yy }";
        let use_y = text.find("x+yy").unwrap() + 2;
        assert_eq!(definition_column(text, use_y), Some(13), "`|yy` after `x`: yy");
        assert_eq!(definition_column(text, use_y - 1), Some(5), "`x|+`: x");
        assert_eq!(definition_column(text, use_y + 2), Some(13), "`yy|`: yy");
    }

    #[test]
    fn names_go_where_the_compiler_resolves_them() {
        // Each case: the text, where the cursor is (after the needle's start), and the
        // column of the definition.
        let cases: &[(&str, &str, u32)] = &[
            // An input's shape uses a field defined below it.
            ("model M { input t: f32[w]\n w = 2\n forward { output o = t } }", "w]", 1),
            // A config default reads another config parameter.
            ("layer L(a: int = b, b: int = 1) { forward(x: f32[a]) -> f32[a] { x } }", "b,", 20),
            // A config parameter keeps the bare name a field shares.
            ("layer L(d: dim) { d = 2\n forward(x: f32[d]) -> f32[d] { x } }", "d])", 8),
        ];
        for (text, needle, col) in cases {
            let off = text.find(needle).unwrap();
            assert_eq!(definition_column(text, off), Some(*col), "{needle} in {text}");
        }
    }
}
