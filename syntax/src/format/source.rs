//! Looking at the source text around the AST (comments, blank lines, parentheses as written)
//! and emitting entries with their attached comments.

use super::*;

impl Fmt<'_> {
    // ---- looking at the source -----------------------------------------------------

    /// Index of the first comment starting at or after `pos`.
    pub(super) fn comment_at_or_after(&self, pos: usize) -> usize {
        self.cs.partition_point(|c| c.start < pos)
    }

    pub(super) fn has_comment_in(&self, start: usize, end: usize) -> bool {
        self.cs.get(self.comment_at_or_after(start)).is_some_and(|c| c.start < end)
    }

    pub(super) fn comment_text(&self, i: usize) -> &str {
        &self.text[self.cs[i].start..self.cs[i].end]
    }

    pub(super) fn in_block_comment(&self, pos: usize) -> bool {
        let i = self.cs.partition_point(|c| c.start < pos);
        i > 0 && self.cs[i - 1].block && self.cs[i - 1].end > pos
    }

    /// Whether a blank line separates `a` from `b` (the text between holds only whitespace and
    /// separators).
    pub(super) fn has_blank(&self, a: usize, b: usize) -> bool {
        let parts: Vec<&str> = self.text[a..b].split('\n').collect();
        parts.len() >= 3 && parts[1..parts.len() - 1].iter().any(|p| p.trim().is_empty())
    }

    pub(super) fn same_line(&self, a: usize, b: usize, separators: &str) -> bool {
        self.text[a..b]
            .chars()
            .all(|c| c == ' ' || c == '\t' || c == '\r' || separators.contains(c))
    }

    /// The first offset at or after `pos` that is not whitespace or a comment.
    pub(super) fn skip_trivia(&self, mut pos: usize) -> usize {
        let b = self.text.as_bytes();
        loop {
            while pos < b.len() && b[pos].is_ascii_whitespace() {
                pos += 1;
            }
            match self.cs.get(self.comment_at_or_after(pos)) {
                Some(c) if c.start == pos => pos = c.end,
                _ => return pos,
            }
        }
    }

    /// The `)` that closes the `(` at `open`.
    pub(super) fn matching_paren(&self, open: usize) -> usize {
        let b = self.text.as_bytes();
        let mut depth = 0usize;
        let mut ci = self.comment_at_or_after(open);
        let mut i = open;
        while i < b.len() {
            if let Some(c) = self.cs.get(ci) {
                if c.start == i {
                    i = c.end;
                    ci += 1;
                    continue;
                }
            }
            match b[i] {
                b'"' => {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        i += 1;
                    }
                }
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return i;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        b.len()
    }

    /// Whether the expression was written inside its own parentheses: the parser widens an
    /// expression's span to the parentheses that only group it.
    pub(super) fn written_in_parens(&self, e: &Expr) -> bool {
        let (s, t) = range(e.span);
        let b = self.text.as_bytes();
        t > s + 1 && b[s] == b'(' && b[t - 1] == b')' && self.matching_paren(s) == t - 1
    }

    /// The text of a literal, without the parentheses it may have been written in.
    pub(super) fn literal_text(&self, span: Span) -> &str {
        let mut t = &self.text[range(span).0..range(span).1];
        while t.starts_with('(') && t.ends_with(')') {
            t = t[1..t.len() - 1].trim();
        }
        t
    }

    /// The source of `start..end` as written, re-indented so that its first line starts at
    /// `indent`; the inside of block comments is left alone.
    pub(super) fn verbatim(&self, start: usize, end: usize, indent: usize) -> Vec<String> {
        let line_start = self.text[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
        let old_indent =
            self.text[line_start..start].len() - self.text[line_start..start].trim_start().len();
        let mut out = Vec::new();
        let mut pos = start;
        for (k, line) in self.text[start..end].split('\n').enumerate() {
            let line_end = pos + line.len();
            let keep_end = self.in_block_comment(line_end);
            let body = if keep_end { line } else { line.trim_end() };
            let text = if k == 0 {
                format!("{}{}", pad(indent), body)
            } else if self.in_block_comment(pos) {
                body.to_string()
            } else if body.trim().is_empty() {
                String::new()
            } else {
                let content = body.trim_start();
                let had = body.len() - content.len();
                format!("{}{}", pad((had + indent).saturating_sub(old_indent)), content)
            };
            out.push(text);
            pos = line_end + 1;
        }
        out
    }

    /// Distributes the comments between `lo` and `hi` among entries with the given spans.
    /// With `opening`, comments on the first line (right after an opening bracket) come back
    /// separately; comments after the last entry come back as a comments-only entry.
    pub(super) fn attach(
        &self,
        lo: usize,
        hi: usize,
        spans: &[(usize, usize)],
        opening: bool,
    ) -> (Vec<usize>, Vec<Attached>, Vec<(bool, usize)>) {
        let n = self.cs.len();
        let mut ci = self.comment_at_or_after(lo);
        let mut pos = lo;
        let mut open = Vec::new();
        let first = spans.first().map(|s| s.0).unwrap_or(hi);
        if opening {
            while ci < n
                && self.cs[ci].start < first.min(hi)
                && self.same_line(pos, self.cs[ci].start, "")
            {
                open.push(ci);
                pos = self.cs[ci].end;
                ci += 1;
            }
        }
        let mut out = Vec::new();
        for (k, &(s, e)) in spans.iter().enumerate() {
            let mut a = Attached::default();
            while ci < n && self.cs[ci].start < s {
                a.leading.push((self.has_blank(pos, self.cs[ci].start), ci));
                pos = self.cs[ci].end;
                ci += 1;
            }
            a.code_blank = self.has_blank(pos, s);
            // Comments inside the entry are its own business.
            while ci < n && self.cs[ci].start < e {
                ci += 1;
            }
            pos = e;
            let next = spans.get(k + 1).map(|s| s.0).unwrap_or(hi);
            while ci < n && self.cs[ci].start < next && self.same_line(pos, self.cs[ci].start, ";,")
            {
                a.trailing.push(ci);
                pos = self.cs[ci].end;
                ci += 1;
            }
            out.push(a);
        }
        let mut rest = Vec::new();
        while ci < n && self.cs[ci].start < hi {
            rest.push((self.has_blank(pos, self.cs[ci].start), ci));
            pos = self.cs[ci].end;
            ci += 1;
        }
        (open, out, rest)
    }

    // ---- emitting entries ------------------------------------------------------------

    /// Appends entries at `indent`: leading comments, blank lines kept (at most one, never at
    /// the start), trailing comments aligned across neighbouring one-line entries.
    pub(super) fn emit(&self, out: &mut Vec<String>, indent: usize, entries: &[Entry]) {
        let first_line = out.len();
        let columns = self.comment_columns(entries);
        for (k, en) in entries.iter().enumerate() {
            for &(blank, ci) in &en.att.leading {
                if blank && out.len() > first_line {
                    out.push(String::new());
                }
                out.push(format!("{}{}", pad(indent), self.comment_text(ci)));
            }
            if en.lines.is_empty() {
                continue;
            }
            if en.att.code_blank && out.len() > first_line {
                out.push(String::new());
            }
            let mut lines = en.lines.clone();
            if !en.att.trailing.is_empty() {
                let last = lines.last_mut().expect("an entry with lines");
                let w = width(last);
                let col = columns[k].unwrap_or(w + COMMENT_GAP);
                last.push_str(&pad(col - w));
                last.push_str(&self.trailing_text(&en.att.trailing));
            }
            out.extend(lines);
        }
    }

    pub(super) fn trailing_text(&self, cs: &[usize]) -> String {
        cs.iter().map(|&i| self.comment_text(i)).collect::<Vec<_>>().join(" ")
    }

    /// Trailing comments of a run of one-line entries (no blank line or own-line comment
    /// between them) start in one column.
    pub(super) fn comment_columns(&self, entries: &[Entry]) -> Vec<Option<usize>> {
        let single = |e: &Entry| e.lines.len() == 1;
        let mut cols = vec![None; entries.len()];
        let mut i = 0;
        while i < entries.len() {
            let mut j = i + 1;
            while j < entries.len()
                && single(&entries[j - 1])
                && single(&entries[j])
                && entries[j].att.leading.is_empty()
                && !entries[j].att.code_blank
            {
                j += 1;
            }
            let commented =
                || (i..j).filter(|&k| single(&entries[k]) && !entries[k].att.trailing.is_empty());
            if let Some(w) = commented().map(|k| width(&entries[k].lines[0])).max() {
                for k in commented() {
                    cols[k] = Some(w + COMMENT_GAP);
                }
            }
            i = j;
        }
        cols
    }

    /// `lines` with ` {`, the body and `}` added; comments right after `{` stay on its line.
    pub(super) fn braced(
        &self,
        mut lines: Vec<String>,
        open: &[usize],
        inner: Vec<String>,
        indent: usize,
    ) -> Vec<String> {
        let ends_in_line_comment = {
            let last = lines.last().map(|l| l.as_str()).unwrap_or("");
            comments(last).last().is_some_and(|c| !c.block && c.end == last.trim_end().len())
        };
        if ends_in_line_comment {
            lines.push(format!("{}{{", pad(indent)));
        } else {
            lines.last_mut().expect("a header line").push_str(" {");
        }
        if inner.is_empty() && open.is_empty() {
            lines.last_mut().expect("a header line").push('}');
            return lines;
        }
        if !open.is_empty() {
            let last = lines.last_mut().expect("a header line");
            last.push_str(&pad(COMMENT_GAP));
            last.push_str(&self.trailing_text(open));
        }
        lines.extend(inner);
        lines.push(format!("{}}}", pad(indent)));
        lines
    }
}
