//! Whose mail is read: a `From` header is forged with one line, so a sender
//! is served only when it is in `[email] allow_from` **and** the receiving
//! server vouches for it.
//!
//! The server's voice is its `Authentication-Results` header (RFC 8601),
//! and only the top of the header block is its own: every header below
//! what the receiving MTA added came with the message, and a sender can
//! write an `Authentication-Results: mx.example.org; dkim=pass` of their
//! own. So only the top-most `Authentication-Results` naming the configured
//! `authserv_id` counts, with those of the same id directly under it (one
//! per milter); any further down is ignored. It must say `dkim=pass` with
//! `header.d` (or `header.i`) of the `From` domain, or `spf=pass` with an
//! `smtp.mailfrom` of that domain (aligned: the domain that passed is the
//! one in `From`). Everything else is refused with the reason, which the
//! channel logs (rate-limited) and never answers: no backscatter.
//!
//! Before trust, two kinds of mail are never answered at all: our own coming
//! back (our address as sender, or a `Message-ID` we made) and automatic
//! mail (`Auto-Submitted` other than `no`, `Precedence: bulk/list/junk`).

/// Why a mail is not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No `From`, or more than one address in it.
    NoSender,
    /// Our own mail (loops).
    Ours,
    /// An auto-reply, a list's or bulk mail.
    Automatic(String),
    /// Not in `allow_from`.
    Stranger,
    /// In `allow_from`, but the receiving server did not vouch for the domain.
    Unauthenticated(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NoSender => f.write_str("no single From address"),
            Refusal::Ours => f.write_str("our own mail came back (a loop)"),
            Refusal::Automatic(why) => write!(f, "automatic mail ({why})"),
            Refusal::Stranger => f.write_str("the sender is not in [email] allow_from"),
            Refusal::Unauthenticated(why) => write!(f, "the sender is not authenticated: {why}"),
        }
    }
}

/// What is checked, from the config.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Our address, lower case.
    pub me: String,
    /// `allow_from`, lower case.
    pub allow: Vec<String>,
    /// `authserv_id`, lower case (`None`: nobody can be authenticated).
    pub authserv_id: Option<String>,
    /// The senders paired with `bramble pair --channel email`, served like `allow`'s.
    pub paired: Option<crate::policy::pairing::PairedCache>,
}

/// The facts of one mail the rules need.
#[derive(Debug, Default)]
pub struct Facts<'a> {
    /// Every `From` address.
    pub from: Vec<String>,
    pub message_id: Option<&'a str>,
    /// The header block, top first: (name, raw value).
    pub headers: Vec<(&'a str, &'a str)>,
}

impl Rules {
    /// The sender (lower case) if served, or why not.
    pub fn check(&self, facts: &Facts<'_>) -> Result<String, Refusal> {
        let [from] = facts.from.as_slice() else { return Err(Refusal::NoSender) };
        let from = from.trim().to_ascii_lowercase();
        if from == self.me || facts.message_id.is_some_and(|id| is_ours(id, &self.me)) {
            return Err(Refusal::Ours);
        }
        if let Some(why) = automatic(&facts.headers) {
            return Err(Refusal::Automatic(why));
        }
        if !self.allow.contains(&from) && !self.paired.as_ref().is_some_and(|p| p.contains(&from)) {
            return Err(Refusal::Stranger);
        }
        self.vouch(facts, &from).map_err(Refusal::Unauthenticated)?;
        Ok(from)
    }

    /// A stranger's sender (lower case) when the receiving server vouched for
    /// it: who may send a `/pair <code>` (a forged `From` cannot pair).
    pub fn vouched_stranger(&self, facts: &Facts<'_>) -> Option<String> {
        match self.check(facts) {
            Err(Refusal::Stranger) => {
                let from = facts.from.first()?.trim().to_ascii_lowercase();
                self.vouch(facts, &from).ok().map(|()| from)
            }
            _ => None,
        }
    }

    /// Whether the configured receiving server says DKIM or SPF passed for `from`'s domain.
    fn vouch(&self, facts: &Facts<'_>, from: &str) -> Result<(), String> {
        let Some(id) = &self.authserv_id else { return Err("[email] authserv_id is not set".into()) };
        let domain = from.rsplit_once('@').map(|(_, d)| d).unwrap_or("");
        authenticated(&facts.headers, id, domain).map(drop)
    }
}

/// The local part of every `Message-ID` we make starts with this.
pub const ID_PREFIX: &str = "bramble.";

/// Whether `message_id` (with or without `<>`) is one we made, as `me`.
pub fn is_ours(message_id: &str, me: &str) -> bool {
    let id = message_id.trim().trim_start_matches('<').trim_end_matches('>').to_ascii_lowercase();
    let domain = me.rsplit_once('@').map(|(_, d)| d).unwrap_or(me);
    id.starts_with(ID_PREFIX) && id.ends_with(&format!("@{domain}"))
}

/// Why a mail is automatic, if it is (RFC 3834 `Auto-Submitted`, `Precedence`).
fn automatic(headers: &[(&str, &str)]) -> Option<String> {
    for (name, value) in headers {
        let v = value.trim().to_ascii_lowercase();
        if name.eq_ignore_ascii_case("Auto-Submitted") && !v.starts_with("no") {
            return Some(format!("Auto-Submitted: {v}"));
        }
        if name.eq_ignore_ascii_case("Precedence") && ["bulk", "list", "junk"].iter().any(|p| v.starts_with(p)) {
            return Some(format!("Precedence: {v}"));
        }
    }
    None
}

/// Whether the top-most `Authentication-Results` of `authserv_id` says DKIM
/// or SPF passed for `domain`; the error says what it said instead.
pub fn authenticated(headers: &[(&str, &str)], authserv_id: &str, domain: &str) -> Result<&'static str, String> {
    let mine = |v: &str| parse(v).filter(|(id, _)| id.eq_ignore_ascii_case(authserv_id)).map(|(_, r)| r);
    // The top-most one of ours, then those of ours directly under it.
    let start = headers.iter().position(|(n, v)| is_ar(n) && mine(v).is_some());
    let Some(start) = start else {
        return Err(format!("no Authentication-Results header of {authserv_id}"));
    };
    let mut results = Vec::new();
    for (name, value) in &headers[start..] {
        match is_ar(name).then(|| mine(value)).flatten() {
            Some(r) => results.extend(r),
            None => break,
        }
    }
    let d = domain.to_ascii_lowercase();
    let of_domain = |v: &str| {
        let v = v.trim().to_ascii_lowercase();
        v == d || v.rsplit_once('@').is_some_and(|(_, vd)| vd == d)
    };
    for r in &results {
        let prop = |p: &str| r.props.iter().find(|(k, _)| k == p).map(|(_, v)| v.as_str());
        let passed = r.result == "pass";
        if passed
            && r.method == "dkim"
            && (prop("header.d").is_some_and(of_domain) || prop("header.i").is_some_and(of_domain))
        {
            return Ok("dkim");
        }
        if passed && r.method == "spf" && prop("smtp.mailfrom").is_some_and(of_domain) {
            return Ok("spf");
        }
    }
    let said: Vec<String> = results.iter().map(|r| format!("{}={}", r.method, r.result)).collect();
    Err(format!(
        "{authserv_id} said {} — no dkim=pass or spf=pass for {domain}",
        if said.is_empty() { "nothing".to_string() } else { said.join(", ") }
    ))
}

fn is_ar(name: &str) -> bool {
    name.eq_ignore_ascii_case("Authentication-Results")
}

/// One `method=result` of an `Authentication-Results` header, with its properties (keys lower case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodResult {
    pub method: String,
    pub result: String,
    pub props: Vec<(String, String)>,
}

/// An `Authentication-Results` value: its authserv-id and results (RFC 8601 §2.2).
pub fn parse(value: &str) -> Option<(String, Vec<MethodResult>)> {
    let text = uncomment(value);
    let mut parts = text.split(';');
    let id = parts.next()?.split_whitespace().next()?.to_string();
    let mut results = Vec::new();
    for part in parts {
        // `a = b` is `a=b`: CFWS is allowed around the `=`.
        let mut squeezed = String::new();
        for word in part.split_whitespace() {
            if !squeezed.is_empty() && !squeezed.ends_with('=') && !word.starts_with('=') {
                squeezed.push(' ');
            }
            squeezed.push_str(word);
        }
        let mut words = squeezed.split(' ').filter(|w| !w.is_empty());
        let Some((method, result)) = words.next().and_then(|w| w.split_once('=')) else { continue };
        let method = method.split('/').next().unwrap_or(method).to_ascii_lowercase();
        let props = words
            .filter_map(|w| w.split_once('='))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.trim_matches('"').to_string()))
            .collect();
        results.push(MethodResult { method, result: result.to_ascii_lowercase(), props });
    }
    Some((id, results))
}

/// `text` without its `(comments)` (nested, with `\` escapes), quoted strings kept.
fn uncomment(text: &str) -> String {
    let (mut out, mut depth, mut quoted, mut escaped) = (String::new(), 0u32, false, false);
    for c in text.chars() {
        if escaped {
            escaped = false;
            if depth == 0 {
                out.push(c);
            }
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' if depth == 0 => {
                quoted = !quoted;
                out.push(c);
            }
            '(' if !quoted => depth += 1,
            ')' if !quoted && depth > 0 => depth -= 1,
            c if depth == 0 => out.push(if c == '\r' || c == '\n' || c == '\t' { ' ' } else { c }),
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            me: "bot@home.example".into(),
            allow: vec!["me@example.org".into()],
            authserv_id: Some("mx.home.example".into()),
            paired: None,
        }
    }

    #[test]
    fn only_a_stranger_the_server_vouched_for_may_pair_and_a_paired_one_is_served() {
        let ar = [("Authentication-Results", "mx.home.example; dkim=pass header.d=example.org")];
        let forged = [("Authentication-Results", "mx.evil.example; dkim=pass header.d=example.org")];
        let r = rules();
        assert_eq!(r.vouched_stranger(&facts("Bob@example.org", &ar)).as_deref(), Some("bob@example.org"));
        assert_eq!(r.vouched_stranger(&facts("bob@example.org", &forged)), None, "a forged From cannot pair");
        assert_eq!(r.vouched_stranger(&facts("me@example.org", &ar)), None, "already allowed");
        let dir = tempfile::tempdir().unwrap();
        let paired = crate::policy::pairing::PairedCache::new(dir.path(), crate::policy::pairing::PairChannel::Email);
        paired.add("bob@example.org");
        let r = Rules { paired: Some(paired), ..rules() };
        assert_eq!(r.check(&facts("bob@example.org", &ar)), Ok("bob@example.org".into()));
        assert!(matches!(r.check(&facts("bob@example.org", &forged)), Err(Refusal::Unauthenticated(_))));
    }

    fn facts<'a>(from: &str, headers: &[(&'a str, &'a str)]) -> Facts<'a> {
        Facts { from: vec![from.into()], message_id: Some("abc@example.org"), headers: headers.to_vec() }
    }

    #[test]
    fn results_are_read_as_rfc_8601_writes_them() {
        let (id, r) = parse(
            "mx.home.example (version 1);\r\n\tdkim=pass (2048-bit key) header.d=example.org header.i=@example.org;\r\n \
             spf = pass (sender ok) smtp.mailfrom=\"me@example.org\"; dmarc=fail",
        )
        .unwrap();
        assert_eq!(id, "mx.home.example");
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].method.as_str(), r[0].result.as_str()), ("dkim", "pass"));
        assert!(r[0].props.contains(&("header.d".into(), "example.org".into())));
        assert_eq!(r[1].props, [("smtp.mailfrom".to_string(), "me@example.org".to_string())]);
        assert_eq!(parse("mx.home.example; none").unwrap().1, []);
    }

    #[test]
    fn only_the_top_most_verdict_of_our_server_counts() {
        let ok = [("Authentication-Results", "mx.home.example; dkim=pass header.d=example.org"), ("Received", "x")];
        assert_eq!(rules().check(&facts("Me@Example.org", &ok)), Ok("me@example.org".into()));
        let spf = [("Authentication-Results", "mx.home.example; spf=pass smtp.mailfrom=me@example.org")];
        assert!(rules().check(&facts("me@example.org", &spf)).is_ok());
        // A forged From without any verdict.
        let err = rules().check(&facts("me@example.org", &[("Received", "x")])).unwrap_err();
        assert!(err.to_string().contains("no Authentication-Results header of mx.home.example"), "{err}");
        // Another server's verdict.
        let other = [("Authentication-Results", "mx.evil.example; dkim=pass header.d=example.org")];
        assert!(matches!(rules().check(&facts("me@example.org", &other)), Err(Refusal::Unauthenticated(_))));
        // A pass forged below the real stamp.
        let forged = [
            ("Authentication-Results", "mx.home.example; dkim=none; spf=softfail smtp.mailfrom=evil.example"),
            ("Received", "from evil.example"),
            ("Authentication-Results", "mx.home.example; dkim=pass header.d=example.org"),
        ];
        let err = rules().check(&facts("me@example.org", &forged)).unwrap_err().to_string();
        assert!(err.contains("dkim=none, spf=softfail"), "{err}");
        // A pass for another domain (not aligned with From).
        let unaligned = [("Authentication-Results", "mx.home.example; dkim=pass header.d=evil.example")];
        assert!(rules().check(&facts("me@example.org", &unaligned)).is_err());
        // Two milters' stamps at the top both count.
        let two = [
            ("Authentication-Results", "mx.home.example; spf=fail smtp.mailfrom=example.org"),
            ("Authentication-Results", "mx.home.example; dkim=pass header.d=example.org"),
        ];
        assert!(rules().check(&facts("me@example.org", &two)).is_ok());
        // A comment cannot smuggle a result in.
        let comment = [("Authentication-Results", "mx.home.example; dkim=fail (dkim=pass header.d=example.org)")];
        assert!(rules().check(&facts("me@example.org", &comment)).is_err());
    }

    #[test]
    fn strangers_loops_and_robots_are_refused_first() {
        let ok = [("Authentication-Results", "mx.home.example; dkim=pass header.d=example.org")];
        assert_eq!(rules().check(&facts("you@example.org", &ok)), Err(Refusal::Stranger));
        assert_eq!(rules().check(&facts("bot@home.example", &ok)), Err(Refusal::Ours));
        let mut f = facts("me@example.org", &ok);
        f.message_id = Some("<bramble.1a.2@home.example>");
        assert_eq!(rules().check(&f), Err(Refusal::Ours));
        let auto = [ok[0], ("Auto-Submitted", "auto-replied")];
        assert!(matches!(rules().check(&facts("me@example.org", &auto)), Err(Refusal::Automatic(_))));
        let bulk = [ok[0], ("Precedence", "bulk")];
        assert!(matches!(rules().check(&facts("me@example.org", &bulk)), Err(Refusal::Automatic(_))));
        let human = [ok[0], ("Auto-Submitted", "no")];
        assert!(rules().check(&facts("me@example.org", &human)).is_ok());
        let two = Facts { from: vec!["me@example.org".into(), "x@y.z".into()], ..facts("x", &ok) };
        assert_eq!(rules().check(&two), Err(Refusal::NoSender));
    }
}
