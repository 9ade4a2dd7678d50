//! The front end after parsing: loading modules and their imports (`load`), resolving every
//! name in every item once (`resolve`), and checking that each refers to something along with
//! the structure rules (`names`), before any value is computed.

mod fixes;
pub mod load;
pub mod names;
pub mod resolve;

pub use load::{Binding, ModId, Module, Program};
use mgn_syntax::{Diagnostic, Span};
pub use resolve::{Occurrence, Problem, Resolution, SymKind, Target, Visible};

/// Names longer than this get no suggestion: an edit distance costs the product of the two
/// lengths, and two 70,000-letter names (which the fuzz test makes) would take minutes.
const MAX_SUGGESTED: usize = 100;

/// The candidate nearest to `name` by edit distance, if it is near enough to be a likely typo.
pub fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let len = name.chars().count();
    if len > MAX_SUGGESTED {
        return None;
    }
    let limit = (len / 3).clamp(1, 3);
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        // Lengths further apart than `limit` are further apart in edit distance too.
        if c == name || len.abs_diff(c.chars().count()) > limit {
            continue;
        }
        let d = strsim::levenshtein(name, c);
        let d = if d > limit && strsim::normalized_damerau_levenshtein(name, c) > 0.0 {
            // Transpositions (`sofmtax`) count once.
            strsim::damerau_levenshtein(name, c)
        } else {
            d
        };
        // A one-letter name is one edit away from every other short name: no suggestion, except
        // for the name typed twice (`self.ww` for the field `w`), a likely slip.
        let typed_twice = c.chars().count() == 1 && name.chars().count() == 2 && {
            let mut cs = name.chars();
            cs.next() == cs.next() && name.starts_with(c)
        };
        if !typed_twice && (d >= name.chars().count() || d >= c.chars().count()) {
            continue;
        }
        if d <= limit && best.is_none_or(|(bd, bc)| d < bd || (d == bd && c < bc)) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// `help: did you mean `x`?` text, if there is a near candidate.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    nearest(name, candidates).map(|c| format!("did you mean `{c}`?"))
}

/// `d` with `help: did you mean `x`?` and the fix that writes `x` at `span` (where `name`
/// is written), if there is a near candidate.
pub fn suggest<'a>(
    d: Diagnostic,
    span: Span,
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Diagnostic {
    match nearest(name, candidates) {
        Some(c) => replace_with(d.with_help(format!("did you mean `{c}`?")), span, c),
        None => d,
    }
}

/// The quick fix "replace with `text`" at `span`.
pub fn replace_with(d: Diagnostic, span: Span, text: &str) -> Diagnostic {
    d.with_replacement(format!("replace with `{text}`"), span, text)
}

/// The `(` of a call written at the start of a line below its callee, if it is: such a line
/// continues the expression above it, so `let y = x * 2` followed by a line `(y, x)` calls `2`.
pub fn paren_on_new_line(prog: &Program, callee: Span, call: Span) -> Option<Span> {
    let text = &prog.sources.try_get(callee.file)?.text;
    let between = text.get(callee.end as usize..call.end as usize)?;
    let mut newline = false;
    let mut rest = between;
    loop {
        let trimmed = rest.trim_start_matches([' ', '\t', '\r', '\n']);
        newline |= rest[..rest.len() - trimmed.len()].contains('\n');
        rest = trimmed;
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else {
            break;
        }
    }
    if !newline || !rest.starts_with('(') {
        return None;
    }
    let at = callee.end as usize + (between.len() - rest.len());
    Some(Span::new(callee.file, at, at + 1))
}

/// Explains a line starting with `(` that continued the line above as a call (see
/// `paren_on_new_line`).
pub fn continued_call(prog: &Program, d: Diagnostic, callee: Span, paren: Span) -> Diagnostic {
    let line = prog
        .sources
        .try_get(callee.file)
        .map_or(0, |f| f.lines.line_col((callee.end as usize).saturating_sub(1)).0);
    d.with_label(paren, format!("this `(` continues line {line}: it calls what ends that line"))
        .with_help(format!(
            "a line that starts with `(` continues the expression above it; end line {line} \
             with `;` if this line starts a new expression"
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_near_names_only() {
        let names = ["softmax", "log_softmax", "relu", "Linear"];
        assert_eq!(nearest("sofmax", names), Some("softmax"));
        assert_eq!(nearest("Lniear", names), Some("Linear"));
        assert_eq!(nearest("conv2d", names), None);
        assert_eq!(nearest("relu", names), None, "an exact match is not a suggestion");
        // One-letter names are near every short name, except the letter typed twice.
        let fields = ["w", "b"];
        assert_eq!(nearest("ww", fields), Some("w"));
        assert_eq!(nearest("x", fields), None);
        assert_eq!(nearest("wb", fields), None);
    }

    /// Edit distances cost the product of the lengths: a 70,000-letter name (a mutant the fuzz
    /// test makes) took seconds against a thousand short candidates, and minutes against one
    /// as long.
    #[test]
    fn very_long_names_are_not_compared() {
        let long = "x".repeat(70_000);
        let names: Vec<String> = (0..1000).map(|i| format!("name_{i}")).collect();
        let start = std::time::Instant::now();
        assert_eq!(nearest(&long, names.iter().map(String::as_str)), None);
        assert_eq!(nearest(&format!("{long}y"), [long.as_str()]), None);
        assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
        let (a, b) = ("x".repeat(99), "x".repeat(100));
        assert_eq!(nearest(&b, [a.as_str()]), Some(a.as_str()), "up to 100 letters");
    }
}
