//! LSP over stdin and stdout that survives a client sending garbage.
//!
//! lsp-server's own stdio transport ends at the first malformed message, and the session with
//! it. This one reads the framing itself and hands the server (through an
//! `lsp_server::Connection`) only well-formed messages; the rest it deals with here:
//!
//! - a body that is not JSON is answered with a parse error (-32700, id null);
//! - JSON that is not a valid message is answered with an invalid-request error (-32600), with
//!   its id if it has one; a broken notification or response is dropped (nothing to answer);
//! - bad framing — a missing or unreadable `Content-Length`, a line that is not a header — is
//!   skipped up to the next `Content-Length` header. A length that is too long ends the body
//!   where the next header starts (a body that is JSON cannot contain a raw header line).
//!
//! Whatever is dropped is reported on stderr.

use crossbeam_channel::{select, Receiver, Sender};
use lsp_server::{Connection, ErrorCode, Message};
use serde_json::{json, Value};
use std::io::{self, Read, Write};
use std::thread::JoinHandle;

/// A header line longer than this is not a header.
const MAX_HEADER_LINE: usize = 4096;
/// The largest body read: an 8 MiB source, escaped in JSON, fits many times over.
const MAX_BODY: usize = 256 << 20;
/// What every header of a message starts with (compared without case).
const HEADER: &[u8] = b"content-length:";

/// The transport's threads. Only the writer is joined: it ends once the server has dropped
/// its connection, after writing everything sent; the reader may be waiting for input.
pub struct IoThreads {
    writer: JoinHandle<io::Result<()>>,
}

impl IoThreads {
    pub fn join(self) -> io::Result<()> {
        self.writer.join().unwrap_or_else(|_| Err(io::Error::other("the writer panicked")))
    }
}

/// A connection over stdin and stdout.
pub fn stdio() -> (Connection, IoThreads) {
    let (to_server, from_client) = crossbeam_channel::unbounded();
    let (to_client, from_server) = crossbeam_channel::unbounded();
    let (replies_tx, replies) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("mgn-lsp-reader".into())
        .spawn(move || read_messages(io::stdin().lock(), &to_server, &replies_tx))
        .expect("a reader thread");
    let writer = std::thread::Builder::new()
        .name("mgn-lsp-writer".into())
        .spawn(move || write_messages(&mut io::stdout().lock(), &from_server, replies))
        .expect("a writer thread");
    (Connection { sender: to_client, receiver: from_client }, IoThreads { writer })
}

/// Writes the server's messages, and the reader's answers to malformed requests, until the
/// server drops its connection.
fn write_messages(
    out: &mut impl Write,
    from_server: &Receiver<Message>,
    replies: Receiver<Value>,
) -> io::Result<()> {
    let mut replies = Some(replies);
    loop {
        let reply = match &replies {
            Some(r) => select! {
                recv(from_server) -> m => match m {
                    Ok(m) => { m.write(out)?; continue }
                    Err(_) => return Ok(()),
                },
                recv(r) -> v => v.ok(),
            },
            None => match from_server.recv() {
                Ok(m) => {
                    m.write(out)?;
                    continue;
                }
                Err(_) => return Ok(()),
            },
        };
        match reply {
            Some(v) => {
                let text = v.to_string();
                write!(out, "Content-Length: {}\r\n\r\n{text}", text.len())?;
                out.flush()?;
            }
            None => replies = None, // the reader has stopped
        }
    }
}

/// Reads messages until the end of input, `exit`, or the server going away.
fn read_messages(input: impl Read, to_server: &Sender<Message>, replies: &Sender<Value>) {
    let mut frames = Framer::new(input);
    loop {
        let frame = match frames.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                eprintln!("mgn-lsp: cannot read the input: {e}");
                return;
            }
        };
        match frame {
            Frame::Skipped(why) => {
                eprintln!("mgn-lsp: skipped input ({why}); reading on from the next header")
            }
            Frame::NotJson(why) => {
                eprintln!("mgn-lsp: a message is not JSON ({why})");
                let _ = replies.send(error(Value::Null, ErrorCode::ParseError, why));
            }
            Frame::Json(v) => match to_message(v) {
                Ok(msg) => {
                    let exit = matches!(&msg, Message::Notification(n) if n.method == "exit");
                    if to_server.send(msg).is_err() || exit {
                        return;
                    }
                }
                Err(Some(reply)) => {
                    eprintln!("mgn-lsp: an invalid request: {reply}");
                    let _ = replies.send(reply);
                }
                Err(None) => eprintln!("mgn-lsp: dropped a malformed notification or response"),
            },
        }
    }
}

fn error(id: Value, code: ErrorCode, message: String) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code as i32, "message": message } })
}

/// The message a JSON value is; if it is none, the answer it gets (`None`: a notification or
/// a response, which get none).
fn to_message(v: Value) -> Result<Message, Option<Value>> {
    let id = v.get("id").cloned();
    let kind = (v.get("method").is_some(), v.get("result").is_some() || v.get("error").is_some());
    match serde_json::from_value::<Message>(v) {
        // A request whose id lsp-server cannot hold (not an i32 or a string) reads as a
        // notification: it is answered here.
        Ok(Message::Notification(_)) if id.is_some() => {
            let id = id.filter(|i| i.is_number() || i.is_string()).unwrap_or(Value::Null);
            let why = "not a valid request: its id is neither a 32-bit integer nor a string";
            Err(Some(error(id, ErrorCode::InvalidRequest, why.into())))
        }
        Ok(m) => Ok(m),
        Err(e) => match (id, kind) {
            (None, (true, _)) | (Some(_), (false, true)) => Err(None),
            (id, _) => {
                // An id is a number or a string; anything else cannot be echoed.
                let id = id.filter(|i| i.is_number() || i.is_string()).unwrap_or(Value::Null);
                let why = format!("not a valid request: {e}");
                Err(Some(error(id, ErrorCode::InvalidRequest, why)))
            }
        },
    }
}

/// What the input holds next.
#[derive(Debug, PartialEq)]
pub enum Frame {
    Json(Value),
    /// A framed body that is not JSON, and why.
    NotJson(String),
    /// Input dropped to reach the next header, and why.
    Skipped(String),
}

/// `Content-Length` framing over a byte stream, resynchronizing on the next header after
/// anything else.
pub struct Framer<R> {
    input: R,
    buf: Vec<u8>,
    /// Where the unread input starts in `buf`.
    at: usize,
}

/// Where `HEADER` first occurs in `bytes`, without case.
fn find_header(bytes: &[u8]) -> Option<usize> {
    let last = bytes.len().checked_sub(HEADER.len())?;
    (0..=last).find(|&i| {
        bytes[i].eq_ignore_ascii_case(&HEADER[0])
            && bytes[i..i + HEADER.len()].eq_ignore_ascii_case(HEADER)
    })
}

/// Whether `bytes` starts with a whole header line: `Content-Length:`, digits, CR LF. No JSON
/// text holds one (a JSON string cannot hold a raw line break), so inside a body it is the
/// next message's header. `None`: not known until more input comes.
fn header_line_at(bytes: &[u8]) -> Option<bool> {
    let rest = &bytes[HEADER.len()..];
    let value = rest.iter().position(|b| *b != b' ').unwrap_or(rest.len());
    let digits = rest[value..].iter().position(|b| !b.is_ascii_digit());
    match digits {
        None => None,
        Some(0) => Some(false),
        Some(n) => rest.get(value + n..value + n + 2).map(|end| end == b"\r\n"),
    }
}

impl<R: Read> Framer<R> {
    pub fn new(input: R) -> Framer<R> {
        Framer { input, buf: Vec::new(), at: 0 }
    }

    /// Reads more input; false at its end.
    fn fill(&mut self) -> io::Result<bool> {
        if self.at > 0 {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        let mut chunk = [0u8; 1 << 16];
        loop {
            match self.input.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The next frame; `None` at the end of input.
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        let mut length = None;
        let mut headers = 0;
        loop {
            let Some(end) = self.line_end()? else { return Ok(None) };
            let Some(end) = end else {
                return self.skip(1, "a header line longer than 4096 bytes").map(Some);
            };
            let line = &self.buf[self.at..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                self.at = end + 1;
                if headers == 0 {
                    continue; // a blank line between messages
                }
                match length {
                    Some(n) => return self.body(n).map(Some),
                    None => return self.skip(0, "a message without Content-Length").map(Some),
                }
            }
            let Some((name, value)) = header(line) else {
                return self.skip(1, "a line that is not a header").map(Some);
            };
            if name.eq_ignore_ascii_case("content-length") {
                match value.parse::<usize>() {
                    Ok(n) if n <= MAX_BODY => length = Some(n),
                    _ => return self.skip(1, &format!("Content-Length: {value}")).map(Some),
                }
            }
            headers += 1;
            self.at = end + 1;
        }
    }

    /// Where the current line ends (its `\n`): `Ok(None)` at the end of input, `Some(None)`
    /// for a line too long to be a header.
    fn line_end(&mut self) -> io::Result<Option<Option<usize>>> {
        let mut scanned = 0; // bytes after `at` that hold no line break
        loop {
            let rest = &self.buf[self.at + scanned..];
            if let Some(i) = rest.iter().position(|b| *b == b'\n') {
                return Ok(Some(Some(self.at + scanned + i)));
            }
            scanned = self.buf.len() - self.at;
            if scanned > MAX_HEADER_LINE {
                return Ok(Some(None));
            }
            if !self.fill()? {
                return Ok(None); // a partial line at the end of input is dropped
            }
        }
    }

    /// Drops input up to the next header at or after `from` bytes into the unread input.
    fn skip(&mut self, from: usize, why: &str) -> io::Result<Frame> {
        let mut from = self.at + from;
        loop {
            if let Some(i) = self.buf.get(from..).and_then(find_header) {
                self.at = from + i;
                return Ok(Frame::Skipped(why.to_string()));
            }
            // Keep what could be the start of a header cut by the end of the buffer.
            self.at = self.buf.len().saturating_sub(HEADER.len() - 1).max(self.at);
            if !self.fill()? {
                self.at = self.buf.len();
                return Ok(Frame::Skipped(why.to_string()));
            }
            from = self.at;
        }
    }

    /// A body of `n` bytes, or less if the next header comes first.
    fn body(&mut self, n: usize) -> io::Result<Frame> {
        let mut scanned = 0; // bytes of the body in which no header line starts
        loop {
            let have = (self.buf.len() - self.at).min(n);
            let body = &self.buf[self.at..self.at + have];
            let mut cut = None;
            while cut.is_none() {
                let Some(i) = find_header(&body[scanned..]) else {
                    scanned = scanned.max(have.saturating_sub(HEADER.len() - 1));
                    break;
                };
                match header_line_at(&body[scanned + i..]) {
                    Some(true) => cut = Some(scanned + i),
                    Some(false) => scanned += i + 1,
                    None => {
                        scanned += i; // perhaps a header, once more input comes
                        break;
                    }
                }
            }
            if let Some(len) = cut {
                return Ok(self.parse(len));
            }
            if have == n {
                return Ok(self.parse(n));
            }
            if !self.fill()? {
                self.at = self.buf.len();
                return Ok(Frame::Skipped("the input ended inside a message".into()));
            }
        }
    }

    /// The body of `len` bytes at the start of the unread input, consumed. A body that is not
    /// JSON ends where a header starts in it, if one does: its length was too long, and cut
    /// the header line (`body` finds whole ones).
    fn parse(&mut self, len: usize) -> Frame {
        let body = &self.buf[self.at..self.at + len];
        match serde_json::from_slice::<Value>(body) {
            Ok(v) => {
                self.at += len;
                Frame::Json(v)
            }
            Err(e) => {
                // JSON followed by the start of a header: the length was too long by a part of
                // a header line.
                let mut values = serde_json::Deserializer::from_slice(body).into_iter::<Value>();
                if let Some(Ok(v)) = values.next() {
                    let rest = &body[values.byte_offset()..];
                    let n = rest.len().min(HEADER.len());
                    if rest[..n].eq_ignore_ascii_case(&HEADER[..n]) {
                        self.at += len - rest.len();
                        return Frame::Json(v);
                    }
                }
                let len = match find_header(body) {
                    Some(i) if i > 0 => i,
                    _ => len,
                };
                self.at += len;
                Frame::NotJson(e.to_string())
            }
        }
    }
}

/// A header line's name and value (`Name: value`); `None` if it is not one.
fn header(line: &[u8]) -> Option<(&str, &str)> {
    let line = std::str::from_utf8(line).ok()?;
    let (name, value) = line.split_once(':')?;
    let token = |c: char| c.is_ascii_alphanumeric() || "-_.!#$%&'*+^`|~".contains(c);
    (!name.is_empty() && name.chars().all(token)).then_some((name, value.trim()))
}

#[cfg(test)]
mod tests;
