//! Split payloads put back together. The server splits a large payload
//! over several data frames with the same `message_id` header, `sum` (how
//! many) and `seq` (which, from 0); the SDKs keep the parts a few seconds
//! and handle the joined payload when the last arrives (the Go SDK's
//! `combine`). Here the whole is capped ([`MAX_PAYLOAD`]), and so are the
//! parts per payload and the payloads waiting, so a broken or hostile peer
//! cannot grow memory: a payload over the cap is refused and its parts dropped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::clients::feishu::frame::Frame;

/// The largest payload accepted, joined.
pub const MAX_PAYLOAD: usize = 1024 * 1024;
/// The most parts one payload may come in.
const MAX_PARTS: u64 = 64;
/// The most payloads waiting for parts at once (the oldest is dropped).
const MAX_WAITING: usize = 16;
/// Parts older than this are dropped (the SDKs keep them 5 s; a slow link gets more).
const KEEP: Duration = Duration::from_secs(30);

/// Why a payload is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartsError {
    #[error("a split payload of {0} bytes or more is over the limit of {MAX_PAYLOAD}")]
    TooLarge(usize),
    #[error("a split payload's headers are wrong (sum {sum}, seq {seq})")]
    Bad { sum: u64, seq: u64 },
}

struct Waiting {
    since: Instant,
    parts: Vec<Option<Vec<u8>>>,
    size: usize,
}

/// The payloads waiting for their other parts.
#[derive(Default)]
pub struct Parts {
    waiting: HashMap<String, Waiting>,
}

impl Parts {
    /// The frame's whole payload: at once when it is not split, when its
    /// last part arrives, else `Ok(None)` (wait for more).
    pub fn add(&mut self, f: &Frame) -> Result<Option<Vec<u8>>, PartsError> {
        let payload = f.payload.clone().unwrap_or_default();
        let sum = f.header_num("sum").unwrap_or(1);
        if sum <= 1 {
            return match payload.len() > MAX_PAYLOAD {
                true => Err(PartsError::TooLarge(payload.len())),
                false => Ok(Some(payload)),
            };
        }
        let seq = f.header_num("seq").unwrap_or(u64::MAX);
        let id = f.header("message_id").unwrap_or_default().to_string();
        if sum > MAX_PARTS || seq >= sum || id.is_empty() {
            return Err(PartsError::Bad { sum, seq });
        }
        self.waiting.retain(|_, w| w.since.elapsed() < KEEP);
        if !self.waiting.contains_key(&id) && self.waiting.len() >= MAX_WAITING {
            let oldest = self.waiting.iter().min_by_key(|(_, w)| w.since).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                tracing::warn!(message_id = %k, "parts of a Feishu payload were dropped (too many waiting)");
                self.waiting.remove(&k);
            }
        }
        let w = self.waiting.entry(id.clone()).or_insert_with(|| Waiting {
            since: Instant::now(),
            parts: vec![None; sum as usize],
            size: 0,
        });
        if w.parts.len() as u64 != sum {
            self.waiting.remove(&id);
            return Err(PartsError::Bad { sum, seq });
        }
        let slot = &mut w.parts[seq as usize];
        w.size = w.size - slot.as_ref().map_or(0, Vec::len) + payload.len();
        *slot = Some(payload);
        if w.size > MAX_PAYLOAD {
            let size = w.size;
            self.waiting.remove(&id);
            return Err(PartsError::TooLarge(size));
        }
        if w.parts.iter().any(Option::is_none) {
            return Ok(None);
        }
        let w = self.waiting.remove(&id);
        Ok(w.map(|w| w.parts.into_iter().flatten().flatten().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(id: &str, sum: u64, seq: u64, data: &[u8]) -> Frame {
        Frame {
            method: 1,
            headers: vec![
                ("type".into(), "event".into()),
                ("message_id".into(), id.into()),
                ("sum".into(), sum.to_string()),
                ("seq".into(), seq.to_string()),
            ],
            payload: Some(data.to_vec()),
            ..Default::default()
        }
    }

    #[test]
    fn parts_are_joined_in_order_whatever_order_they_come_in() {
        let mut p = Parts::default();
        assert_eq!(p.add(&part("a", 3, 2, b"!")), Ok(None));
        assert_eq!(p.add(&part("b", 1, 0, b"whole")), Ok(Some(b"whole".to_vec())));
        assert_eq!(p.add(&part("a", 3, 0, b"hel")), Ok(None));
        assert_eq!(p.add(&part("a", 3, 1, b"lo")), Ok(Some(b"hello!".to_vec())));
        assert!(p.waiting.is_empty());
    }

    #[test]
    fn oversize_and_bad_parts_are_refused() {
        let mut p = Parts::default();
        let half = vec![b'x'; MAX_PAYLOAD / 2 + 1];
        assert_eq!(p.add(&part("big", 2, 0, &half)), Ok(None));
        assert!(matches!(p.add(&part("big", 2, 1, &half)), Err(PartsError::TooLarge(_))));
        assert!(p.waiting.is_empty(), "the refused payload's parts are dropped");
        assert!(matches!(p.add(&part("x", 2, 2, b"a")), Err(PartsError::Bad { .. })));
        assert!(matches!(p.add(&part("x", 1000, 0, b"a")), Err(PartsError::Bad { .. })));
        assert!(matches!(p.add(&part("", 2, 0, b"a")), Err(PartsError::Bad { .. })));
        assert_eq!(p.add(&part("y", 2, 0, b"a")), Ok(None));
        assert!(matches!(p.add(&part("y", 3, 1, b"a")), Err(PartsError::Bad { .. })), "sum changed");
        for i in 0..MAX_WAITING + 3 {
            let _ = p.add(&part(&format!("w{i}"), 2, 0, b"a"));
        }
        assert!(p.waiting.len() <= MAX_WAITING);
        let whole = vec![b'x'; MAX_PAYLOAD + 1];
        assert!(matches!(p.add(&part("z", 1, 0, &whole)), Err(PartsError::TooLarge(_))));
    }
}
