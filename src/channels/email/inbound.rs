//! One fetched mail → what the agent reads: parsed with mail-parser
//! (fuzzed, no panics on malformed MIME), checked by [`super::trust`], its
//! text taken from the plain part (or the HTML one, as text) without the
//! quoted history, its files saved to the workspace's `inbox/<date>/` as
//! Telegram's are, and its thread named (a thread is a session).

use mail_parser::{MessageParser, MimeHeaders};

use super::state::{bracket, Thread};
use super::trust::{Facts, Refusal, Rules};
use crate::bus::{Attachment, AttachmentKind};
use crate::policy::pairing;
use crate::workspace::Workspace;

/// The most text of one mail handed to the agent.
const MAX_TEXT: usize = 32 * 1024;
/// Image types shown to the model as images.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/webp", "image/gif"];

/// A mail accepted for the agent.
#[derive(Debug)]
pub struct Accepted {
    /// The sender, lower case.
    pub sender: String,
    pub text: String,
    pub thread: Thread,
    /// Files in the mail: (name, MIME type, bytes).
    pub files: Vec<(String, String, Vec<u8>)>,
}

/// What became of one mail.
#[derive(Debug)]
pub enum Read {
    Accepted(Box<Accepted>),
    Refused {
        sender: String,
        why: Refusal,
    },
    /// A stranger the receiving server vouched for sent `/pair <code>` (in
    /// the subject or as the first line).
    Pair {
        sender: String,
        code: String,
        /// Its `Message-ID` and subject, for the answer.
        message_id: Option<String>,
        subject: String,
    },
    /// Not a mail at all (mail-parser found no header block).
    Malformed,
}

/// Read `raw` under `rules`.
pub fn read(raw: &[u8], rules: &Rules) -> Read {
    let Some(msg) = MessageParser::new().parse(raw) else { return Read::Malformed };
    let from: Vec<String> = msg
        .from()
        .map(|a| a.iter().filter_map(|addr| addr.address()).map(str::to_string).collect())
        .unwrap_or_default();
    let facts = Facts { from: from.clone(), message_id: msg.message_id(), headers: msg.headers_raw().collect() };
    let sender = match rules.check(&facts) {
        Ok(s) => s,
        Err(why) => {
            let pair = (why == Refusal::Stranger).then(|| pair_request(&msg, rules, &facts)).flatten();
            return pair.unwrap_or_else(|| Read::Refused { sender: from.first().cloned().unwrap_or_default(), why });
        }
    };
    let references: Vec<String> = msg
        .references()
        .as_text_list()
        .map(|l| l.iter().map(|r| bracket(r)).collect())
        .or_else(|| msg.references().as_text().map(|r| vec![bracket(r)]))
        .unwrap_or_default();
    let parent = msg.in_reply_to().as_text().map(bracket);
    let mut refs = references;
    if let Some(p) = parent.filter(|p| !refs.contains(p)) {
        refs.push(p);
    }
    let subject = msg.subject().unwrap_or("").trim().to_string();
    let own_id =
        msg.message_id().map(str::to_string).unwrap_or_else(|| format!("no-id.{}@local", crate::util::unique::next()));
    let thread = Thread::of(&own_id, refs, &subject);
    let body = msg.body_text(0).map(|b| b.into_owned()).unwrap_or_default();
    let mut text = without_quote(&body);
    if msg.in_reply_to().as_text().is_none() && !subject.is_empty() {
        text = format!("[Subject: {subject}]\n{text}");
    }
    if text.len() > MAX_TEXT {
        let cut = (0..=MAX_TEXT).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
        text.truncate(cut);
        text.push_str("\n[… the rest of the mail was cut]");
    }
    let files = msg
        .attachments()
        .filter(|p| !p.is_message())
        .map(|p| {
            let name = p.attachment_name().unwrap_or("attachment").to_string();
            let mime = p
                .content_type()
                .map(|c| format!("{}/{}", c.ctype(), c.subtype().unwrap_or("octet-stream")).to_ascii_lowercase())
                .unwrap_or_else(|| "application/octet-stream".into());
            (name, mime, p.contents().to_vec())
        })
        .collect();
    Read::Accepted(Box::new(Accepted { sender, text, thread, files }))
}

/// A `/pair <code>` (subject, or the body's first line) from a stranger
/// whose domain the receiving server vouched for.
fn pair_request(msg: &mail_parser::Message<'_>, rules: &Rules, facts: &Facts<'_>) -> Option<Read> {
    let sender = rules.vouched_stranger(facts)?;
    let subject = msg.subject().unwrap_or("").trim().to_string();
    let body = msg.body_text(0).map(|b| b.into_owned()).unwrap_or_default();
    let first = body.lines().find(|l| !l.trim().is_empty()).unwrap_or("").to_string();
    let code = pairing::request(&subject, true).or_else(|| pairing::request(&first, true))?;
    Some(Read::Pair { sender, code, message_id: msg.message_id().map(bracket), subject })
}

/// `body` without the quoted history of a reply: from an `On … wrote:` line
/// followed by `>` lines, or the `>` lines alone, to the end.
fn without_quote(body: &str) -> String {
    let lines: Vec<&str> = body.lines().collect();
    let first_quote = lines.iter().position(|l| l.trim_start().starts_with('>'));
    let Some(q) = first_quote else { return body.trim().to_string() };
    let rest_quoted = lines[q..].iter().all(|l| l.trim().is_empty() || l.trim_start().starts_with('>'));
    if !rest_quoted {
        return body.trim().to_string(); // inline answers between quotes: keep it all
    }
    let mut end = q;
    while end > 0 && lines[end - 1].trim().is_empty() {
        end -= 1;
    }
    if end > 0 && lines[end - 1].trim_end().ends_with("wrote:") {
        end -= 1;
    }
    let kept = lines[..end].join("\n").trim().to_string();
    if kept.is_empty() {
        body.trim().to_string()
    } else {
        kept
    }
}

/// Save `files` to `inbox/<today>/` (blocking); those that cannot be saved are logged and named in the text.
pub fn save(ws: &Workspace, files: &[(String, String, Vec<u8>)], text: &mut String) -> Vec<Attachment> {
    let mut saved = Vec::new();
    for (name, mime, bytes) in files {
        let safe = crate::channels::inbox::safe_name(name);
        match crate::channels::inbox::save_new(ws, &safe, bytes) {
            Ok(path) => {
                let kind =
                    if IMAGE_TYPES.contains(&mime.as_str()) { AttachmentKind::Image } else { AttachmentKind::File };
                saved.push(Attachment { kind, path, mime: mime.clone(), size: bytes.len() as u64 });
            }
            Err(e) => {
                tracing::error!(file = %safe, error = %e, "cannot save a mail's attachment");
                text.push_str(&format!("\n[an attachment, {safe}, could not be saved: {e}]"));
            }
        }
    }
    saved
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            me: "bot@home.example".into(),
            allow: vec!["me@example.org".into()],
            authserv_id: Some("mx".into()),
            paired: None,
        }
    }

    #[test]
    fn a_reply_is_read_without_its_quote_and_in_its_thread() {
        let raw = "Authentication-Results: mx; dkim=pass header.d=example.org\r\n\
                   From: Me <me@example.org>\r\nTo: bot@home.example\r\nSubject: Re: lights\r\n\
                   Message-ID: <m3@example.org>\r\nIn-Reply-To: <bramble.1@home.example>\r\n\
                   References: <m1@example.org> <bramble.1@home.example>\r\n\r\n\
                   Turn them off.\r\n\r\nOn Mon, bot wrote:\r\n> They are on.\r\n> \r\n";
        let Read::Accepted(a) = read(raw.as_bytes(), &rules()) else { panic!("refused") };
        assert_eq!(a.text, "Turn them off.");
        assert_eq!(a.thread.root(), "<m1@example.org>");
        assert_eq!(a.thread.message_id, "<m3@example.org>");
        assert_eq!(a.thread.references, ["<m1@example.org>", "<bramble.1@home.example>", "<m3@example.org>"]);
    }

    #[test]
    fn malformed_and_hostile_mail_is_refused_not_panicked_on() {
        for raw in [
            &b""[..],
            b"\xff\xfe\x00",
            b"From: \r\n\r\n",
            b"Content-Type: multipart/mixed; boundary=\"\r\n\r\n--\r\n--",
        ] {
            assert!(!matches!(read(raw, &rules()), Read::Accepted(_)));
        }
        let deep = format!(
            "Authentication-Results: mx; dkim=pass header.d=example.org\r\nFrom: me@example.org\r\n{}",
            "Content-Type: multipart/mixed; boundary=a\r\n\r\n--a\r\n".repeat(2000)
        );
        let _ = read(deep.as_bytes(), &rules());
    }
}
