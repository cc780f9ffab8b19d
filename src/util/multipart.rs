//! `multipart/form-data` bodies (RFC 7578), built by hand.
//!
//! Two callers need them: Telegram's `sendPhoto`/`sendDocument` and the
//! OpenAI-compatible `/v1/audio/transcriptions`. reqwest's `multipart` feature
//! would bring `mime_guess` and a streaming body for what is, here, one file
//! already in memory and a few text fields: a `Vec<u8>` and a boundary do.
//!
//! Field names and file names are ours or sanitised by the caller; they are
//! still quoted safely (`"` and line breaks cannot end the header early).

use std::fmt::Write as _;

/// A form being built. [`Form::finish`] gives the body and its content type.
pub struct Form {
    boundary: String,
    body: Vec<u8>,
}

impl Form {
    /// An empty form with a boundary that cannot occur in `payload_hint`
    /// (the file's bytes, or anything else the caller will add).
    pub fn new(payload_hint: &[u8]) -> Form {
        let mut seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()).rotate_left(32);
        loop {
            let boundary = format!("bramble-{seed:016x}");
            if !contains(payload_hint, boundary.as_bytes()) {
                return Form { boundary, body: Vec::with_capacity(payload_hint.len() + 512) };
            }
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        }
    }

    /// A text field.
    pub fn text(mut self, name: &str, value: &str) -> Form {
        let mut head = String::new();
        let _ = write!(head, "--{}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n", self.boundary, quote(name));
        self.body.extend_from_slice(head.as_bytes());
        self.body.extend_from_slice(value.as_bytes());
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// A file field: its bytes, sent unchanged.
    pub fn file(mut self, name: &str, file_name: &str, content_type: &str, data: &[u8]) -> Form {
        let mut head = String::new();
        let _ = write!(
            head,
            "--{}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"{}\"\r\nContent-Type: {}\r\n\r\n",
            self.boundary,
            quote(name),
            quote(file_name),
            content_type.replace(['\r', '\n'], "")
        );
        self.body.extend_from_slice(head.as_bytes());
        self.body.extend_from_slice(data);
        self.body.extend_from_slice(b"\r\n");
        self
    }

    /// The body and the `Content-Type` header value that goes with it.
    pub fn finish(mut self) -> (Vec<u8>, String) {
        self.body.extend_from_slice(format!("--{}--\r\n", self.boundary).as_bytes());
        (self.body, format!("multipart/form-data; boundary={}", self.boundary))
    }
}

/// A name safe inside a quoted header parameter.
fn quote(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '"' => '\'',
            '\r' | '\n' | '\\' => '_',
            c => c,
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_has_its_fields_and_the_file_bytes_unchanged() {
        let data = [0u8, 159, 146, 150, b'\r', b'\n', b'-', b'-'];
        let (body, ctype) =
            Form::new(&data).text("model", "whisper-1").file("file", "a\"b\r\n.ogg", "audio/ogg", &data).finish();
        let boundary = ctype.strip_prefix("multipart/form-data; boundary=").unwrap();
        let text = String::from_utf8_lossy(&body);
        assert!(text.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n"
        )));
        assert!(text.contains("filename=\"a'b__.ogg\"\r\nContent-Type: audio/ogg\r\n\r\n"), "{text}");
        assert!(contains(&body, &data), "file bytes as they were");
        assert!(body.ends_with(format!("\r\n--{boundary}--\r\n").as_bytes()));
    }

    #[test]
    fn the_boundary_never_occurs_in_the_payload() {
        let probe = Form::new(b"");
        let mut payload = probe.boundary.clone().into_bytes();
        payload.extend_from_slice(b"xyz");
        let form = Form::new(&payload);
        assert!(!contains(&payload, form.boundary.as_bytes()));
    }
}
