use super::*;

/// Hands out its bytes `chunk` at a time, as a pipe may.
struct Chunked<'a> {
    bytes: &'a [u8],
    chunk: usize,
}

impl Read for Chunked<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.chunk.min(out.len()).min(self.bytes.len());
        out[..n].copy_from_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        Ok(n)
    }
}

fn framed(body: &str) -> String {
    format!("Content-Length: {}\r\n\r\n{body}", body.len())
}

/// Every frame of `input`, read in chunks of 1, 7 and 64 Ki bytes (the same each time), with
/// `Skipped` reasons left out.
fn frames(input: &[u8]) -> Vec<Frame> {
    let mut all = Vec::new();
    for chunk in [1, 7, 1 << 16] {
        let mut f = Framer::new(Chunked { bytes: input, chunk });
        let mut got = Vec::new();
        while let Some(frame) = f.next_frame().unwrap() {
            got.push(match frame {
                Frame::Skipped(_) => Frame::Skipped(String::new()),
                Frame::NotJson(_) => Frame::NotJson(String::new()),
                json => json,
            });
        }
        all.push(got);
    }
    assert!(all.windows(2).all(|w| w[0] == w[1]), "chunking changed the frames: {all:#?}");
    all.pop().unwrap()
}

fn json(n: i32) -> Frame {
    Frame::Json(json!({ "id": n, "method": "m" }))
}

fn body(n: i32) -> String {
    json!({ "id": n, "method": "m" }).to_string()
}

const SKIPPED: Frame = Frame::Skipped(String::new());
const NOT_JSON: Frame = Frame::NotJson(String::new());

#[test]
fn well_framed_messages_pass() {
    let input = format!(
        "{}content-length: {}\r\nContent-Type: application/vscode-jsonrpc\r\n\r\n{}\r\n{}",
        framed(&body(1)),
        body(2).len(),
        body(2),
        framed(&body(3))
    );
    assert_eq!(frames(input.as_bytes()), [json(1), json(2), json(3)]);
}

#[test]
fn bodies_that_are_not_json_are_reported_and_reading_goes_on() {
    let input = [framed("{not json"), framed("\u{0}"), framed(&body(1))].concat();
    assert_eq!(frames(input.as_bytes()), [NOT_JSON, NOT_JSON, json(1)]);
    let next = framed(&body(2));
    let bytes = [b"Content-Length: 2\r\n\r\n\xff\xfe".as_slice(), next.as_bytes()].concat();
    assert_eq!(frames(&bytes), [NOT_JSON, json(2)]);
}

#[test]
fn bad_framing_is_skipped_to_the_next_header() {
    let cases = [
        // No header: the body is glued to the next header.
        format!("{}{}", body(9), framed(&body(1))),
        // Headers without a length, then the body.
        format!("Content-Type: x\r\n\r\n{}{}", body(9), framed(&body(1))),
        // Headers without a length, then the next message at once.
        format!("Content-Type: x\r\n\r\n{}", framed(&body(1))),
        // A line that is not a header; lengths that are not numbers or too large.
        format!("this is no header\r\n\r\n{{}}{}", framed(&body(1))),
        format!("Content-Length: lots\r\n\r\n{}{}", body(9), framed(&body(1))),
        format!("Content-Length: 99999999999999999999\r\n\r\n{{}}{}", framed(&body(1))),
        format!("Content-Length: 1000000000\r\n\r\n{{}}{}", framed(&body(1))),
        // A header line without end.
        format!("X-{}: y\r\n\r\n{}", "a".repeat(10_000), framed(&body(1))),
    ];
    for input in cases {
        let got = frames(input.as_bytes());
        assert_eq!(got.last(), Some(&json(1)), "{input:.80}: {got:?}");
        assert!(!got.contains(&json(9)), "{input:.80}: {got:?}");
    }
}

#[test]
fn a_wrong_length_costs_at_most_its_own_message() {
    // Too short: the cut body is not JSON; its rest is skipped.
    let input = format!("Content-Length: 5\r\n\r\n{}{}", body(9), framed(&body(1)));
    assert_eq!(frames(input.as_bytes()), [NOT_JSON, SKIPPED, json(1)]);
    // Too long: the body ends where the next header line starts, whole or cut by the length.
    for extra in [1000, 30, 17, 3] {
        let b = body(2);
        let input = format!("Content-Length: {}\r\n\r\n{b}{}", b.len() + extra, framed(&body(1)));
        assert_eq!(frames(input.as_bytes()), [json(2), json(1)], "{extra}");
    }
    // "Content-Length:" inside a JSON string is not a header.
    let text = "{\"id\":1,\"method\":\"m\",\"params\":\"Content-Length: 5\\r\\n\"}";
    assert_eq!(frames(framed(text).as_bytes()).len(), 1);
    // The input ends inside a body, or inside a header.
    assert_eq!(frames(b"Content-Length: 50\r\n\r\n{\"id\""), [SKIPPED]);
    assert_eq!(frames(b"Content-Len"), []);
}

#[test]
fn readers_answer_what_the_server_is_not_given() {
    let input = [
        framed("{oops"),
        framed(r#"{"id":7,"method":5}"#),
        framed(r#"{"id":1099511627776,"method":"m"}"#),
        framed(r#"{"id":{"a":1},"method":"m"}"#),
        framed("[1,2]"),
        framed(r#"{"method":7}"#),
        framed(r#"{"id":3,"result":{},"error":5}"#),
        framed(r#"{"jsonrpc":"2.0","id":8,"method":"m"}"#),
        framed(r#"{"jsonrpc":"2.0","method":"exit"}"#),
        framed(r#"{"jsonrpc":"2.0","id":9,"method":"after exit"}"#),
    ]
    .concat();
    let (to_server, server) = crossbeam_channel::unbounded();
    let (replies_tx, replies) = crossbeam_channel::unbounded();
    read_messages(input.as_bytes(), &to_server, &replies_tx);
    let got: Vec<(Value, Value)> =
        replies.try_iter().map(|v| (v["id"].clone(), v["error"]["code"].clone())).collect();
    assert_eq!(
        got,
        [
            (Value::Null, json!(-32700)),
            (json!(7), json!(-32600)),
            (json!(1099511627776u64), json!(-32600)),
            (Value::Null, json!(-32600)),
            (Value::Null, json!(-32600)),
        ]
    );
    let methods: Vec<String> = server
        .try_iter()
        .map(|m| match m {
            Message::Request(r) => r.method,
            Message::Notification(n) => n.method,
            Message::Response(_) => "a response".into(),
        })
        .collect();
    assert_eq!(methods, ["m", "exit"], "nothing is read after `exit`");
}
