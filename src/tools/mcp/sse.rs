//! A server-sent events parser for MCP's two HTTP transports, fed chunk by chunk.
//!
//! Both transports carry JSON-RPC messages as SSE `data`: the streamable HTTP
//! one in the answer to a POST, the older HTTP+SSE one on a long-lived GET
//! (whose first event, `endpoint`, names the URL to POST to). reqwest gives
//! us the body in chunks that split lines and events anywhere, so the parser
//! keeps the unfinished line and the event being built between calls.
//!
//! Memory is bounded: an event whose data grows past `max_event` bytes is an
//! error ([`TooLarge`]), and the caller drops the stream — a server sending
//! 10 MB in one event does not make the daemon hold 10 MB. The format is the
//! WHATWG one: lines end in LF, CRLF or CR; `field: value` (one optional
//! space); `data` lines join with LF; a blank line dispatches; lines starting
//! with `:` are comments. `id` and `retry` are kept ([`Parser::last_id`],
//! [`Parser::retry`]): a streamable HTTP stream that ends before its answer
//! is resumed with `Last-Event-ID` after `retry` milliseconds.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// `event:`, or `message` when the event named none.
    pub name: String,
    pub data: String,
}

/// An event grew past the parser's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an event is larger than {0} bytes")]
pub struct TooLarge(pub usize);

/// The parser's state between chunks.
#[derive(Debug)]
pub struct Parser {
    line: Vec<u8>,
    /// The last chunk ended in CR: a LF starting the next one belongs to it.
    after_cr: bool,
    name: String,
    data: Vec<u8>,
    has_data: bool,
    max_event: usize,
    /// The `id` field of the event being built (WHATWG's "last event ID buffer").
    id_buffer: Option<String>,
    /// The id of the last event dispatched (or the last id-only event).
    pub last_id: Option<String>,
    /// The last `retry:` the server sent, in milliseconds (saturating; callers clamp it).
    pub retry: Option<u64>,
}

impl Parser {
    /// A parser refusing events (and lines) larger than `max_event` bytes.
    pub fn new(max_event: usize) -> Parser {
        Parser {
            line: Vec::new(),
            after_cr: false,
            name: String::new(),
            data: Vec::new(),
            has_data: false,
            max_event,
            id_buffer: None,
            last_id: None,
            retry: None,
        }
    }

    /// Feed a chunk; the events it completed, in order.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Event>, TooLarge> {
        let mut out = Vec::new();
        let mut rest = chunk;
        if self.after_cr {
            self.after_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            self.push_line_part(&rest[..end])?;
            let line = std::mem::take(&mut self.line);
            if let Some(event) = self.line_done(&line)? {
                out.push(event);
            }
            if rest[end] == b'\r' {
                match rest.get(end + 1) {
                    Some(b'\n') => rest = &rest[end + 2..],
                    Some(_) => rest = &rest[end + 1..],
                    None => {
                        self.after_cr = true;
                        rest = &[];
                    }
                }
            } else {
                rest = &rest[end + 1..];
            }
        }
        self.push_line_part(rest)?;
        Ok(out)
    }

    fn push_line_part(&mut self, part: &[u8]) -> Result<(), TooLarge> {
        if self.line.len() + part.len() + self.data.len() > self.max_event {
            self.reset();
            return Err(TooLarge(self.max_event));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn reset(&mut self) {
        self.line = Vec::new();
        self.data = Vec::new();
        self.name.clear();
        self.has_data = false;
    }

    /// One complete line: a field, a comment, or the blank line that dispatches.
    fn line_done(&mut self, line: &[u8]) -> Result<Option<Event>, TooLarge> {
        if line.is_empty() {
            if let Some(id) = self.id_buffer.take() {
                self.last_id = Some(id);
            }
            if !self.has_data {
                self.name.clear();
                return Ok(None);
            }
            let data = String::from_utf8_lossy(&self.data).into_owned();
            let name = if self.name.is_empty() { "message".to_string() } else { std::mem::take(&mut self.name) };
            self.reset();
            return Ok(Some(Event { name, data }));
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                if self.has_data {
                    self.data.push(b'\n');
                }
                if self.data.len() + value.len() > self.max_event {
                    self.reset();
                    return Err(TooLarge(self.max_event));
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
            b"event" => self.name = String::from_utf8_lossy(value).into_owned(),
            // An id with NUL is ignored (WHATWG); an empty one resets it.
            b"id" if !value.contains(&0) => self.id_buffer = Some(String::from_utf8_lossy(value).into_owned()),
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                let ms = value.iter().fold(0u64, |n, d| n.saturating_mul(10).saturating_add(u64::from(d - b'0')));
                self.retry = Some(ms);
            }
            _ => {} // unknown fields: ignored
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(parser: &mut Parser, chunks: &[&[u8]]) -> Vec<Event> {
        chunks.iter().flat_map(|c| parser.feed(c).unwrap()).collect()
    }

    fn ev(name: &str, data: &str) -> Event {
        Event { name: name.into(), data: data.into() }
    }

    #[test]
    fn events_split_anywhere_are_put_together() {
        let text =
            b"event: endpoint\ndata: /messages?s=1\n\n: comment\nevent: message\ndata: {\"a\":\ndata: 1}\nid: 7\n\n";
        let whole = all(&mut Parser::new(1024), &[text]);
        assert_eq!(whole, [ev("endpoint", "/messages?s=1"), ev("message", "{\"a\":\n1}")]);
        // Every split point gives the same events.
        for cut in 0..text.len() {
            let got = all(&mut Parser::new(1024), &[&text[..cut], &text[cut..]]);
            assert_eq!(got, whole, "cut at {cut}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        assert_eq!(all(&mut Parser::new(1024), &bytes), whole);
    }

    #[test]
    fn line_endings_and_field_forms() {
        let got =
            all(&mut Parser::new(1024), &[b"data:x\r\n\r\ndata:  two spaces\r\rdata\n\nevent:e\ndata: y\r", b"\n\r\n"]);
        assert_eq!(got, [ev("message", "x"), ev("message", " two spaces"), ev("message", ""), ev("e", "y")]);
        // An event with no data is not dispatched, and its name does not leak into the next.
        let got = all(&mut Parser::new(1024), &[b"event: ping\n\ndata: z\n\n"]);
        assert_eq!(got, [ev("message", "z")]);
        // An unfinished event at the end of the stream is not dispatched.
        assert!(all(&mut Parser::new(1024), &[b"data: half"]).is_empty());
    }

    #[test]
    fn ids_and_retry_are_kept() {
        let mut p = Parser::new(1024);
        // A priming event: an id, a retry, empty data.
        assert_eq!(p.feed(b"id: ev-1\nretry: 500\ndata: \n\n").unwrap(), [ev("message", "")]);
        assert_eq!((p.last_id.as_deref(), p.retry), (Some("ev-1"), Some(500)));
        // The id counts once its event is complete; a hostile retry saturates, a bad one is ignored.
        p.feed(b"id: ev-2\nretry: 99999999999999999999999999\ndata: x\n").unwrap();
        assert_eq!(p.last_id.as_deref(), Some("ev-1"));
        p.feed(b"\nretry: 12x\nretry: -5\nid: a\0b\n\n").unwrap();
        assert_eq!((p.last_id.as_deref(), p.retry), (Some("ev-2"), Some(u64::MAX)));
    }

    #[test]
    fn an_oversized_event_is_refused_without_being_held() {
        let mut p = Parser::new(100);
        assert_eq!(p.feed(b"data: ").unwrap(), []);
        let big = vec![b'x'; 60];
        p.feed(&big).unwrap();
        assert_eq!(p.feed(&big), Err(TooLarge(100)));
        assert!(p.line.capacity() <= 200 && p.data.capacity() <= 200, "nothing big is kept");
        // Many data lines add up too.
        let mut p = Parser::new(100);
        let line = [b"data: ".as_slice(), &[b'y'; 40], b"\n"].concat();
        p.feed(&line).unwrap();
        p.feed(&line).unwrap();
        assert_eq!(p.feed(&line), Err(TooLarge(100)));
    }
}
