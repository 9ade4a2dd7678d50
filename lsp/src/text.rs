//! Editor positions (line, UTF-16 code unit) to byte offsets and back, and applying the
//! incremental edits of `textDocument/didChange`.

use lsp_types::{Position, Range, TextDocumentContentChangeEvent};

/// Line starts of a text, for converting between byte offsets and LSP positions.
pub struct LineMap<'t> {
    text: &'t str,
    starts: Vec<usize>,
}

impl<'t> LineMap<'t> {
    pub fn new(text: &'t str) -> LineMap<'t> {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineMap { text, starts }
    }

    /// The position of a byte offset (clamped to the text, and back to a char boundary).
    pub fn position(&self, offset: usize) -> Position {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = match self.starts.binary_search(&offset) {
            Ok(i) => i,
            Err(i) => i - 1,
        };
        let col = self.text[self.starts[line]..offset].encode_utf16().count();
        Position { line: line as u32, character: col as u32 }
    }

    pub fn range(&self, start: usize, end: usize) -> Range {
        Range { start: self.position(start), end: self.position(end.max(start)) }
    }

    /// The byte offset of a position. A line past the end gives the end of the text; a
    /// character past the end of its line gives the end of that line (before its newline), and
    /// one inside a surrogate pair gives the start of that character.
    pub fn offset(&self, pos: Position) -> usize {
        let Some(&start) = self.starts.get(pos.line as usize) else { return self.text.len() };
        let line_end =
            self.starts.get(pos.line as usize + 1).map(|e| e - 1).unwrap_or(self.text.len());
        let line = &self.text[start..line_end];
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut units = 0u32;
        for (i, c) in line.char_indices() {
            let next = units + c.len_utf16() as u32;
            if next > pos.character {
                return start + i;
            }
            units = next;
        }
        start + line.len()
    }
}

/// Applies one change event: a ranged replacement, or the whole text when there is no range.
pub fn apply_change(text: &mut String, change: &TextDocumentContentChangeEvent) {
    match change.range {
        None => *text = change.text.clone(),
        Some(range) => {
            let map = LineMap::new(text);
            let start = map.offset(range.start);
            let end = map.offset(range.end).max(start);
            text.replace_range(start..end, &change.text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pos(line: u32, character: u32) -> Position {
        Position { line, character }
    }

    #[test]
    fn utf16_columns() {
        // `é` is 2 bytes and 1 UTF-16 unit; `𝔸` is 4 bytes and 2 units.
        let text = "aé𝔸b\nxy";
        let m = LineMap::new(text);
        assert_eq!(m.offset(pos(0, 0)), 0);
        assert_eq!(m.offset(pos(0, 2)), 3);
        assert_eq!(m.offset(pos(0, 4)), 7, "after the surrogate pair");
        assert_eq!(m.offset(pos(0, 3)), 3, "inside a pair: the start of the character");
        assert_eq!(m.offset(pos(0, 99)), 8, "past the line end: the line end");
        assert_eq!(m.offset(pos(1, 1)), 10);
        assert_eq!(m.offset(pos(7, 0)), text.len());
        for off in [0, 1, 3, 7, 8, 9, 10, 11] {
            assert_eq!(m.offset(m.position(off)), off, "round trip at {off}");
        }
        assert_eq!(m.position(7), pos(0, 4));
    }

    #[test]
    fn incremental_edits() {
        let mut text = "let x = 1\nlet y = 𝔸 + 2\n".to_string();
        let edit = |r: Option<Range>, t: &str| TextDocumentContentChangeEvent {
            range: r,
            range_length: None,
            text: t.into(),
        };
        apply_change(&mut text, &edit(Some(Range { start: pos(1, 8), end: pos(1, 10) }), "z"));
        assert_eq!(text, "let x = 1\nlet y = z + 2\n");
        apply_change(&mut text, &edit(Some(Range { start: pos(0, 4), end: pos(1, 4) }), ""));
        assert_eq!(text, "let y = z + 2\n");
        apply_change(&mut text, &edit(Some(Range { start: pos(1, 0), end: pos(1, 0) }), "end"));
        assert_eq!(text, "let y = z + 2\nend");
        apply_change(&mut text, &edit(None, "all new"));
        assert_eq!(text, "all new");
    }

    #[test]
    fn crlf_line_ends() {
        let m = LineMap::new("ab\r\ncd");
        assert_eq!(m.offset(pos(0, 5)), 2, "the \\r is not part of the line");
        assert_eq!(m.offset(pos(1, 1)), 5);
    }
}
