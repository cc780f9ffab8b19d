//! SMTP submission (RFC 6409) through lettre: one message, built here
//! (plain text plus a simple HTML part, the thread's `In-Reply-To` /
//! `References`, our own `Message-ID`, files attached), sent over implicit
//! TLS (465), STARTTLS (587, required) or — to 127.0.0.1 only, the config
//! refuses anything else — no TLS. Wire only: what to send where is the
//! email channel's business.
//!
//! lettre is built without its defaults: the tokio transport, rustls with
//! our ring provider, and the platform verifier (the same CA store the
//! other clients use; `SSL_CERT_FILE` works as for them).

use std::time::Duration;

use lettre::message::header::{ContentType, HeaderName, HeaderValue};
use lettre::message::{Attachment, Mailbox, MultiPart, SinglePart};
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::config::email::{MailServer, MailTls};
use crate::config::Secret;

/// How long one submission may take (connect, TLS, the whole dialogue).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a message was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SmtpError {
    /// The server refused it for good (5xx): its own doing, or the login's.
    #[error("the SMTP server refused the message: {0}")]
    Refused(String),
    /// Not reachable, timed out, 4xx: worth trying again later.
    #[error("cannot send through the SMTP server: {0}")]
    Unavailable(String),
    /// The message itself could not be built (an address the builder refuses).
    #[error("cannot build the mail: {0}")]
    Build(String),
}

/// A file to attach.
#[derive(Debug, Clone)]
pub struct File {
    pub name: String,
    pub mime: String,
    pub bytes: Vec<u8>,
}

/// One mail to send.
#[derive(Debug, Clone, Default)]
pub struct Mail {
    pub from: String,
    pub to: String,
    pub subject: String,
    /// `<…@…>`, ours.
    pub message_id: String,
    /// The message answered, `<…>`.
    pub in_reply_to: Option<String>,
    /// The thread, oldest first, each `<…>`.
    pub references: Vec<String>,
    pub text: String,
    /// A simple HTML rendering of `text`.
    pub html: String,
    pub files: Vec<File>,
    /// `Auto-Submitted: auto-generated` (RFC 3834): a job's report, not an answer.
    pub auto: bool,
}

/// An SMTP submission server, with the login.
#[derive(Clone)]
pub struct Smtp {
    transport: AsyncSmtpTransport<Tokio1Executor>,
}

impl Smtp {
    /// A transport for `server`, logging in as `user` when a password is given (and the connection is TLS).
    pub fn new(server: &MailServer, user: &str, password: Option<&Secret>) -> Result<Smtp, SmtpError> {
        let unavailable = |e: lettre::transport::smtp::Error| SmtpError::Unavailable(e.to_string());
        let mut b = match server.tls {
            MailTls::Implicit => AsyncSmtpTransport::<Tokio1Executor>::relay(&server.host).map_err(unavailable)?,
            MailTls::StartTls => {
                AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&server.host).map_err(unavailable)?
            }
            MailTls::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&server.host),
        };
        b = b.port(server.port).timeout(Some(SEND_TIMEOUT));
        // Never a password in the clear, even to 127.0.0.1: a plain local relay takes mail without a login.
        if let Some(p) = password.filter(|_| server.tls != MailTls::None) {
            b = b.credentials(Credentials::new(user.to_string(), p.expose().to_string()));
        }
        Ok(Smtp { transport: b.build() })
    }

    /// Send `mail`; Ok once the server took it.
    pub async fn send(&self, mail: &Mail) -> Result<(), SmtpError> {
        let message = build(mail)?;
        match tokio::time::timeout(SEND_TIMEOUT * 2, self.transport.send(message)).await {
            Err(_) => Err(SmtpError::Unavailable(format!("no answer within {:?}", SEND_TIMEOUT * 2))),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) if e.is_permanent() => Err(SmtpError::Refused(e.to_string())),
            Ok(Err(e)) => Err(SmtpError::Unavailable(e.to_string())),
        }
    }

    /// Whether the server answers and takes the login (`bramble doctor`).
    pub async fn test(&self) -> Result<bool, SmtpError> {
        tokio::time::timeout(SEND_TIMEOUT, self.transport.test_connection())
            .await
            .map_err(|_| SmtpError::Unavailable("no answer".into()))?
            .map_err(|e| SmtpError::Unavailable(e.to_string()))
    }
}

/// The MIME message of `mail`.
pub fn build(mail: &Mail) -> Result<Message, SmtpError> {
    let mailbox = |a: &str| a.parse::<Mailbox>().map_err(|e| SmtpError::Build(format!("`{a}`: {e}")));
    let mut b = Message::builder()
        .from(mailbox(&mail.from)?)
        .to(mailbox(&mail.to)?)
        .subject(mail.subject.clone())
        .message_id(Some(mail.message_id.clone()));
    if let Some(parent) = &mail.in_reply_to {
        b = b.in_reply_to(parent.clone());
    }
    if !mail.references.is_empty() {
        b = b.references(mail.references.join(" "));
    }
    if mail.auto {
        b = b.raw_header(HeaderValue::new(
            HeaderName::new_from_ascii_str("Auto-Submitted"),
            "auto-generated".to_string(),
        ));
    }
    let body = MultiPart::alternative_plain_html(mail.text.clone(), mail.html.clone());
    let result = if mail.files.is_empty() {
        b.multipart(body)
    } else {
        let mut mixed = MultiPart::mixed().multipart(body);
        for f in &mail.files {
            let ct = ContentType::parse(&f.mime).unwrap_or(
                ContentType::parse("application/octet-stream").map_err(|e| SmtpError::Build(e.to_string()))?,
            );
            let part: SinglePart = Attachment::new(f.name.clone()).body(f.bytes.clone(), ct);
            mixed = mixed.singlepart(part);
        }
        b.multipart(mixed)
    };
    result.map_err(|e| SmtpError::Build(e.to_string()))
}

/// `text` as a minimal HTML document: escaped, paragraphs kept, links left as text.
pub fn simple_html(text: &str) -> String {
    let mut out = String::from("<!DOCTYPE html><html><body><div style=\"font-family:sans-serif\">");
    for (i, para) in text.split("\n\n").enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("<p>");
        for (j, line) in para.lines().enumerate() {
            if j > 0 {
                out.push_str("<br>\n");
            }
            for c in line.chars() {
                match c {
                    '&' => out.push_str("&amp;"),
                    '<' => out.push_str("&lt;"),
                    '>' => out.push_str("&gt;"),
                    '"' => out.push_str("&quot;"),
                    c => out.push(c),
                }
            }
        }
        out.push_str("</p>");
    }
    out.push_str("</div></body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mail_carries_its_thread_and_both_parts() {
        let mail = Mail {
            from: "bot@example.org".into(),
            to: "me@example.org".into(),
            subject: "Re: lights".into(),
            message_id: "<b.1@example.org>".into(),
            in_reply_to: Some("<m2@example.org>".into()),
            references: vec!["<m1@example.org>".into(), "<m2@example.org>".into()],
            text: "on <now> & off".into(),
            html: simple_html("on <now> & off"),
            files: vec![File { name: "a.txt".into(), mime: "text/plain".into(), bytes: b"hi".to_vec() }],
            auto: true,
        };
        let raw = String::from_utf8(build(&mail).unwrap().formatted()).unwrap();
        for want in [
            "In-Reply-To: <m2@example.org>",
            "References: <m1@example.org> <m2@example.org>",
            "Message-ID: <b.1@example.org>",
            "Auto-Submitted: auto-generated",
            "multipart/alternative",
            "text/html",
            "filename=\"a.txt\"",
        ] {
            assert!(raw.contains(want), "{want} missing in:\n{raw}");
        }
        assert!(build(&Mail { to: "not an address".into(), ..mail }).is_err());
        assert!(simple_html("on <now> & off\n\nnext").contains("<p>on &lt;now&gt; &amp; off</p>\n<p>next</p>"));
    }
}
