//! Text as tokens come: a token of a byte-level BPE may hold part of a UTF-8 character, and a
//! decoder may change how a token reads by what follows it (SentencePiece's leading space), so
//! a token is not decoded alone. Each step decodes a short window of the latest tokens twice —
//! without and with the new ones — and gives what the new ones add, once that text no longer
//! ends in a replacement character (an incomplete character that later bytes may finish). The
//! window then starts where the given text ended. At the end, what is left is given as the
//! whole decode gives it, replacement characters and all, so the text printed is the text
//! `decode(ids, skip_special_tokens=True)` returns.

use tokenizers::Tokenizer;

pub struct TextStream<'a> {
    tokenizer: &'a Tokenizer,
    ids: Vec<u32>,
    /// The window's first token: the tokens before it are given as text.
    prefix: usize,
    /// The window's tokens before `read` are given as text; those after are pending.
    read: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> TextStream<'a> {
        TextStream { tokenizer, ids: Vec::new(), prefix: 0, read: 0 }
    }

    fn decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tokenizer.decode(ids, true).map_err(|e| format!("cannot decode tokens: {e}"))
    }

    /// Adds a token; the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>, String> {
        self.ids.push(id);
        let before = self.decode(&self.ids[self.prefix..self.read])?;
        let now = self.decode(&self.ids[self.prefix..])?;
        if now.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let new = after(&before, &now);
        if new.is_empty() {
            return Ok(None);
        }
        let new = new.to_string();
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(Some(new))
    }

    /// What the pending tokens read as, incomplete characters included; the stream is then
    /// empty of pending tokens.
    pub fn finish(&mut self) -> Result<String, String> {
        let before = self.decode(&self.ids[self.prefix..self.read])?;
        let now = self.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(after(&before, &now).to_string())
    }
}

/// What `now` adds to `before`: the part after their common beginning (all of `before`, unless
/// the new tokens changed how the window's given text reads, which cannot be taken back).
fn after<'s>(before: &str, now: &'s str) -> &'s str {
    let common = before.char_indices().zip(now.chars()).find(|((_, a), b)| a != b);
    match common {
        Some(((i, _), _)) => &now[i..],
        None => &now[before.len().min(now.len())..],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> Tokenizer {
        let path =
            concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/generate/tokenizer.json");
        Tokenizer::from_file(path).expect("the fixture's tokenizer")
    }

    /// Byte-level tokens split multi-byte characters: each is given whole, once complete, and
    /// the pieces add up to the whole decode.
    #[test]
    fn multi_byte_characters_are_given_whole() {
        let tok = fixture();
        let text = "Café 東京 🙂 ok";
        let ids = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert!(ids.len() > text.chars().count() - 4, "some characters take several tokens");
        let mut s = TextStream::new(&tok);
        let mut pieces = Vec::new();
        for &id in &ids {
            if let Some(p) = s.push(id).unwrap() {
                assert!(!p.contains('\u{FFFD}'), "{p:?} holds part of a character");
                pieces.push(p);
            }
        }
        pieces.push(s.finish().unwrap());
        assert_eq!(pieces.concat(), text);
        assert!(pieces.iter().any(|p| p == "🙂" || p.ends_with('🙂')), "{pieces:?}");
    }

    /// Bytes that never make a character are given at the end as the decode gives them.
    #[test]
    fn what_never_completes_is_given_at_the_end() {
        let tok = fixture();
        // The first byte of a four-byte character, alone.
        let lone = tok.encode("🙂", false).unwrap().get_ids()[0];
        let a = tok.token_to_id("a").unwrap();
        let mut s = TextStream::new(&tok);
        assert_eq!(s.push(a).unwrap().as_deref(), Some("a"));
        assert_eq!(s.push(lone).unwrap(), None);
        assert_eq!(s.finish().unwrap(), tok.decode(&[lone], true).unwrap());
        assert_eq!(s.finish().unwrap(), "", "nothing is given twice");
    }
}
