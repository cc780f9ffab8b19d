//! The long connection's one message, `pbbp2.Frame`, as protobuf (proto2)
//! bytes: a hand-written codec for these nine fields, so no protobuf crate
//! or build step. Field numbers and wire types are the official Go SDK's
//! (larksuite/oapi-sdk-go `ws/pbbp2.pb.go`, generated from `pbbp2.proto`):
//!
//! ```text
//! message Header { required string key = 1; required string value = 2; }
//! message Frame {
//!   required uint64 SeqID = 1;   required uint64 LogID = 2;
//!   required int32 service = 3;  required int32 method = 4;   // 0 control, 1 data
//!   repeated Header headers = 5;
//!   optional string payload_encoding = 6; optional string payload_type = 7;
//!   optional bytes payload = 8;  optional string LogIDNew = 9;
//! }
//! ```
//!
//! [`Frame::encode`] writes what the SDK's gogo marshaller writes, byte for
//! byte (fields in order; 6, 7 and 9 always, even empty; 8 only when there
//! is a payload), so the server sees what it sees from the SDK. [`Frame::decode`]
//! refuses what the SDK refuses (a missing required field, a wrong wire
//! type for a known field, a length past the end, a varint over 64 bits)
//! and skips unknown fields.

/// `method` of a control frame (ping, pong).
pub const METHOD_CONTROL: i32 = 0;
/// `method` of a data frame (event, card).
pub const METHOD_DATA: i32 = 1;

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("the frame ends inside a field")]
    Truncated,
    #[error("a varint is longer than 64 bits")]
    Overflow,
    #[error("field {field} has wire type {wire}, expected {expected}")]
    WireType { field: u64, wire: u8, expected: u8 },
    #[error("field number 0 or an end-group tag")]
    BadTag,
    #[error("required field `{0}` is missing")]
    Missing(&'static str),
    #[error("a header is not UTF-8")]
    NotUtf8,
}

/// One `pbbp2.Frame`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Frame {
    pub seq_id: u64,
    pub log_id: u64,
    pub service: i32,
    pub method: i32,
    /// `(key, value)` in order: `type`, `message_id`, `sum`, `seq`, `trace_id`, …
    pub headers: Vec<(String, String)>,
    pub payload_encoding: String,
    pub payload_type: String,
    pub payload: Option<Vec<u8>>,
    pub log_id_new: String,
}

impl Frame {
    /// A ping (a control frame with `type: ping`) for the connection's `service_id`.
    pub fn ping(service: i32) -> Frame {
        Frame { method: METHOD_CONTROL, service, headers: vec![("type".into(), "ping".into())], ..Default::default() }
    }

    /// The first value of header `key`.
    pub fn header(&self, key: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Header `key` as a number (absent or not a number: `None`).
    pub fn header_num(&self, key: &str) -> Option<u64> {
        self.header(key).and_then(|v| v.trim().parse().ok())
    }

    /// The bytes the SDK would write for this frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + self.payload.as_ref().map_or(0, Vec::len));
        varint_field(&mut out, 1, self.seq_id);
        varint_field(&mut out, 2, self.log_id);
        // int32 as protobuf does: sign-extended to 64 bits (a negative one takes 10 bytes).
        varint_field(&mut out, 3, i64::from(self.service) as u64);
        varint_field(&mut out, 4, i64::from(self.method) as u64);
        for (k, v) in &self.headers {
            let mut h = Vec::with_capacity(k.len() + v.len() + 4);
            bytes_field(&mut h, 1, k.as_bytes());
            bytes_field(&mut h, 2, v.as_bytes());
            bytes_field(&mut out, 5, &h);
        }
        bytes_field(&mut out, 6, self.payload_encoding.as_bytes());
        bytes_field(&mut out, 7, self.payload_type.as_bytes());
        if let Some(p) = &self.payload {
            bytes_field(&mut out, 8, p);
        }
        bytes_field(&mut out, 9, self.log_id_new.as_bytes());
        out
    }

    /// A frame from its bytes.
    pub fn decode(buf: &[u8]) -> Result<Frame, FrameError> {
        let mut f = Frame::default();
        let mut seen = 0u8;
        let mut r = Reader { buf, at: 0 };
        while !r.done() {
            let (field, wire) = r.tag()?;
            match field {
                1..=4 => {
                    expect(field, wire, 0)?;
                    let v = r.varint()?;
                    seen |= 1 << (field - 1);
                    match field {
                        1 => f.seq_id = v,
                        2 => f.log_id = v,
                        3 => f.service = v as i32,
                        _ => f.method = v as i32,
                    }
                }
                5 => {
                    expect(field, wire, 2)?;
                    f.headers.push(header(r.bytes()?)?);
                }
                6 | 7 | 9 => {
                    expect(field, wire, 2)?;
                    let s = String::from_utf8_lossy(r.bytes()?).into_owned();
                    match field {
                        6 => f.payload_encoding = s,
                        7 => f.payload_type = s,
                        _ => f.log_id_new = s,
                    }
                }
                8 => {
                    expect(field, wire, 2)?;
                    f.payload = Some(r.bytes()?.to_vec());
                }
                _ => r.skip(wire)?,
            }
        }
        for (bit, name) in [(0, "SeqID"), (1, "LogID"), (2, "service"), (3, "method")] {
            if seen & (1 << bit) == 0 {
                return Err(FrameError::Missing(name));
            }
        }
        Ok(f)
    }
}

fn expect(field: u64, wire: u8, expected: u8) -> Result<(), FrameError> {
    if wire == expected {
        Ok(())
    } else {
        Err(FrameError::WireType { field, wire, expected })
    }
}

/// A `Header` message: both fields required.
fn header(buf: &[u8]) -> Result<(String, String), FrameError> {
    let mut r = Reader { buf, at: 0 };
    let (mut key, mut value) = (None, None);
    while !r.done() {
        let (field, wire) = r.tag()?;
        match field {
            1 | 2 => {
                expect(field, wire, 2)?;
                let s = std::str::from_utf8(r.bytes()?).map_err(|_| FrameError::NotUtf8)?.to_string();
                if field == 1 {
                    key = Some(s);
                } else {
                    value = Some(s);
                }
            }
            _ => r.skip(wire)?,
        }
    }
    Ok((key.ok_or(FrameError::Missing("key"))?, value.ok_or(FrameError::Missing("value"))?))
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8 & 0x7F) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn varint_field(out: &mut Vec<u8>, field: u64, v: u64) {
    varint(out, field << 3);
    varint(out, v);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, data: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn done(&self) -> bool {
        self.at >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, FrameError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.buf.get(self.at).ok_or(FrameError::Truncated)?;
            self.at += 1;
            v |= u64::from(b & 0x7F) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(FrameError::Overflow)
    }

    fn tag(&mut self) -> Result<(u64, u8), FrameError> {
        let t = self.varint()?;
        let (field, wire) = (t >> 3, (t & 7) as u8);
        if field == 0 || wire == 4 {
            return Err(FrameError::BadTag);
        }
        Ok((field, wire))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], FrameError> {
        let n = usize::try_from(n).map_err(|_| FrameError::Truncated)?;
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(FrameError::Truncated)?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let n = self.varint()?;
        self.take(n)
    }

    /// Skip an unknown field of `wire` type (groups, type 3, are refused as the SDK does not use them).
    fn skip(&mut self, wire: u8) -> Result<(), FrameError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.bytes().map(drop),
            5 => self.take(4).map(drop),
            _ => Err(FrameError::BadTag),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `NewPingFrame(3).Marshal()` of the Go SDK, worked out from its
    /// generated `MarshalToSizedBuffer`: 1, 2, 3, 4 as varints, the header,
    /// then empty 6, 7 and 9; no payload field (nil).
    const SDK_PING: &[u8] = &[
        0x08, 0x00, 0x10, 0x00, 0x18, 0x03, 0x20, 0x00, // SeqID 0, LogID 0, service 3, method 0
        0x2a, 0x0c, 0x0a, 0x04, b't', b'y', b'p', b'e', 0x12, 0x04, b'p', b'i', b'n', b'g', // type=ping
        0x32, 0x00, 0x3a, 0x00, 0x4a, 0x00, // payload_encoding, payload_type, LogIDNew: ""
    ];

    #[test]
    fn a_ping_is_the_sdks_bytes() {
        assert_eq!(Frame::ping(3).encode(), SDK_PING);
        assert_eq!(Frame::decode(SDK_PING).unwrap(), Frame::ping(3));
    }

    #[test]
    fn an_event_frame_round_trips_with_big_numbers() {
        let f = Frame {
            seq_id: 300,
            log_id: u64::MAX,
            service: 12_345,
            method: METHOD_DATA,
            headers: vec![
                ("type".into(), "event".into()),
                ("message_id".into(), "m1".into()),
                ("sum".into(), "2".into()),
                ("seq".into(), "1".into()),
            ],
            payload: Some(br#"{"schema":"2.0"}"#.to_vec()),
            ..Default::default()
        };
        let bytes = f.encode();
        // SeqID 300 is the two-byte varint ac 02; LogID u64::MAX takes ten bytes.
        assert_eq!(&bytes[..3], &[0x08, 0xac, 0x02]);
        assert_eq!(&bytes[3..14], &[0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        let back = Frame::decode(&bytes).unwrap();
        assert_eq!(back, f);
        assert_eq!(
            (back.header("type"), back.header_num("sum"), back.header_num("seq")),
            (Some("event"), Some(2), Some(1))
        );
        // A negative int32 is sign-extended, as protobuf does, and read back.
        let neg = Frame { service: -1, ..Frame::ping(0) };
        assert_eq!(Frame::decode(&neg.encode()).unwrap().service, -1);
    }

    #[test]
    fn unknown_fields_are_skipped_and_bad_bytes_refused() {
        let mut b = SDK_PING.to_vec();
        b.extend_from_slice(&[0x58, 0x07]); // field 11, varint
        b.extend_from_slice(&[0x65, 1, 2, 3, 4]); // field 12, fixed32
        assert_eq!(Frame::decode(&b).unwrap(), Frame::ping(3));
        assert_eq!(Frame::decode(&SDK_PING[..SDK_PING.len() - 1]), Err(FrameError::Truncated));
        assert_eq!(Frame::decode(&SDK_PING[2..]), Err(FrameError::Missing("SeqID")));
        assert_eq!(Frame::decode(&[0x08, 0x00, 0x10, 0x00, 0x18, 0x00]), Err(FrameError::Missing("method")));
        assert!(matches!(Frame::decode(&[0x0a, 0x00]), Err(FrameError::WireType { field: 1, .. })));
        assert_eq!(Frame::decode(&[0x08; 1]), Err(FrameError::Truncated));
        assert_eq!(
            Frame::decode(&[0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
            Err(FrameError::Overflow)
        );
        assert_eq!(
            Frame::decode(&[0x42, 0xff, 0xff, 0xff, 0xff, 0x0f]),
            Err(FrameError::Truncated),
            "a length past the end"
        );
        assert_eq!(Frame::decode(&[0x00]), Err(FrameError::BadTag));
        // A header without its value.
        assert_eq!(Frame::decode(&[0x2a, 0x03, 0x0a, 0x01, b'k']), Err(FrameError::Missing("value")));
        assert_eq!(Frame::decode(&[]), Err(FrameError::Missing("SeqID")));
    }
}
