//! Markdown (what models write) → Telegram HTML, split to fit one message.
//!
//! Telegram's HTML mode knows a few tags (`b i s u code pre a blockquote`) and
//! wants `& < >` escaped everywhere else; anything else is refused with "can't
//! parse entities" (the channel then falls back to plain text, see
//! [`html_to_plain`]). The converter is deliberately small:
//!
//! - fenced code blocks → `<pre><code class="language-x">`, inline code → `<code>`;
//! - `**bold**` / `__bold__`, `*italic*` / `_italic_` (not inside `snake_case`),
//!   `~~strike~~`, `[text](https://…)` links, `#` headings as bold, `-` bullets as `•`;
//! - inline markup never spans lines, so every line renders on its own and a
//!   message can be split between any two lines without breaking a tag.
//!
//! A message is at most [`MAX_MESSAGE`] UTF-16 units (Telegram counts UTF-16;
//! counting the HTML rather than the parsed text is conservative). A code block
//! too long for one message is split at line ends, each part closed and
//! reopened as its own `<pre>` block.

/// Telegram's limit on one message.
pub const MAX_MESSAGE: usize = 4096;

/// Markdown → HTML messages, each at most `limit` UTF-16 units, in order.
pub fn to_html_chunks(markdown: &str, limit: usize) -> Vec<String> {
    let mut pack = Packer { limit, chunks: Vec::new(), cur: String::new() };
    for block in blocks(markdown) {
        match block {
            Block::Line(line) => {
                let html = render_line(line);
                if len16(&html) <= limit {
                    pack.push(html);
                } else {
                    for piece in split_words(line, limit / 2) {
                        let html = render_line(&piece);
                        if len16(&html) <= limit {
                            pack.push(html);
                        } else {
                            // Pathological markup (hundreds of links): plain escaped text.
                            for part in split_hard(&piece, limit) {
                                pack.push(escape(&part));
                            }
                        }
                    }
                }
            }
            Block::Code { lang, body } => {
                let (open, close) = code_tags(lang);
                let html = format!("{open}{}{close}", escape(body));
                if len16(&html) <= limit {
                    pack.push(html);
                } else {
                    let room = limit.saturating_sub(len16(&open) + len16(&close)).max(16);
                    for part in split_code(body, room) {
                        pack.push(format!("{open}{}{close}", escape(&part)));
                    }
                }
            }
        }
    }
    pack.finish()
}

/// Plain text for a message Telegram refused as HTML: tags dropped (a link
/// keeps its address), entities unescaped.
pub fn html_to_plain(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    let mut href: Option<String> = None;
    let mut link_text_start = 0;
    while let Some(lt) = rest.find('<') {
        out.push_str(&unescape(&rest[..lt]));
        let Some(gt) = rest[lt..].find('>') else {
            out.push_str(&unescape(&rest[lt..]));
            return out;
        };
        let tag = &rest[lt + 1..lt + gt];
        if let Some(attrs) = tag.strip_prefix("a ") {
            href = attrs.split('"').nth(1).map(unescape);
            link_text_start = out.len();
        } else if tag == "/a" {
            if let Some(url) = href.take() {
                if out[link_text_start..] != url {
                    out.push_str(&format!(" ({url})"));
                }
            }
        }
        rest = &rest[lt + gt + 1..];
    }
    out.push_str(&unescape(rest));
    out
}

/// Escape text for Telegram HTML (also safe inside a quoted attribute).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> String {
    text.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", "\"").replace("&amp;", "&")
}

/// Length as Telegram counts it.
pub fn len16(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

enum Block<'a> {
    Line(&'a str),
    Code { lang: &'a str, body: &'a str },
}

/// Lines and fenced code blocks. An unclosed fence runs to the end.
fn blocks(md: &str) -> Vec<Block<'_>> {
    let mut out = Vec::new();
    let mut lines = LinesWithOffsets::new(md);
    while let Some((start, line)) = lines.next() {
        let t = line.trim_start();
        let Some(fence_rest) = t.strip_prefix("```") else {
            out.push(Block::Line(line));
            continue;
        };
        let lang = fence_rest.split_whitespace().next().unwrap_or("");
        let body_start = start + line.len() + usize::from(md[start + line.len()..].starts_with('\n'));
        let mut body_end = md.len();
        for (s, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                body_end = s;
                break;
            }
        }
        let body = md.get(body_start.min(md.len())..body_end).unwrap_or("");
        out.push(Block::Code { lang, body: body.strip_suffix('\n').unwrap_or(body) });
    }
    out
}

/// `str::lines` with each line's byte offset (lines end at `\n`; a `\r` before it is dropped).
struct LinesWithOffsets<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> LinesWithOffsets<'a> {
    fn new(text: &'a str) -> Self {
        LinesWithOffsets { text, pos: 0 }
    }
}

impl<'a> Iterator for LinesWithOffsets<'a> {
    type Item = (usize, &'a str);
    fn next(&mut self) -> Option<(usize, &'a str)> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        let rest = &self.text[start..];
        let (line, used) = match rest.find('\n') {
            Some(n) => (&rest[..n], n + 1),
            None => (rest, rest.len()),
        };
        self.pos += used;
        Some((start, line.strip_suffix('\r').unwrap_or(line)))
    }
}

fn code_tags(lang: &str) -> (String, String) {
    let safe = !lang.is_empty() && lang.chars().all(|c| c.is_ascii_alphanumeric() || "+-#._".contains(c));
    if safe {
        (format!("<pre><code class=\"language-{lang}\">"), "</code></pre>".into())
    } else {
        ("<pre>".into(), "</pre>".into())
    }
}

/// One line of Markdown outside code blocks.
fn render_line(line: &str) -> String {
    let trimmed = line.trim_start();
    let indent = &line[..line.len() - trimmed.len()];
    let hashes = trimmed.bytes().take_while(|&b| b == b'#').count();
    if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
        return format!("<b>{}</b>", inline(trimmed[hashes..].trim()));
    }
    for bullet in ["- ", "* ", "+ "] {
        if let Some(item) = trimmed.strip_prefix(bullet) {
            return format!("{indent}• {}", inline(item));
        }
    }
    if trimmed.chars().all(|c| c == '-' || c == '*' || c == '_') && trimmed.len() >= 3 {
        return "——————".into();
    }
    format!("{indent}{}", inline(trimmed))
}

/// Inline markup of one line.
fn inline(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 16);
    let mut i = 0;
    while i < s.len() {
        let rest = &s[i..];
        if let Some((html, used)) = code_span(rest)
            .or_else(|| delimited(rest, "**", "b", &s[..i]))
            .or_else(|| delimited(rest, "__", "b", &s[..i]))
            .or_else(|| delimited(rest, "~~", "s", &s[..i]))
            .or_else(|| delimited(rest, "*", "i", &s[..i]))
            .or_else(|| delimited(rest, "_", "i", &s[..i]))
            .or_else(|| link(rest))
        {
            out.push_str(&html);
            i += used;
            continue;
        }
        let c = rest.chars().next().unwrap_or(' ');
        out.push_str(&escape(c.encode_utf8(&mut [0; 4])));
        i += c.len_utf8();
    }
    out
}

/// `` `code` `` (any run of backticks, closed by the same run).
fn code_span(rest: &str) -> Option<(String, usize)> {
    let n = rest.bytes().take_while(|&b| b == b'`').count();
    if n == 0 {
        return None;
    }
    let ticks = &rest[..n];
    let end = rest[n..].find(ticks)?;
    let inner = &rest[n..n + end];
    if inner.trim().is_empty() {
        return None;
    }
    Some((format!("<code>{}</code>", escape(inner.trim())), n + end + n))
}

/// `delim inner delim` → `<tag>inner</tag>`. The opener must be followed and the
/// closer preceded by a non-space; `_` needs word boundaries (`snake_case` stays).
fn delimited(rest: &str, delim: &str, tag: &str, before: &str) -> Option<(String, usize)> {
    let body = rest.strip_prefix(delim)?;
    let underscore = delim.starts_with('_');
    let single = delim.len() == 1;
    if single && body.starts_with(delim) {
        return None; // `**`, `__`: the double form did not match, so this is literal
    }
    if body.starts_with(char::is_whitespace) || body.is_empty() {
        return None;
    }
    if underscore && before.chars().next_back().is_some_and(char::is_alphanumeric) {
        return None;
    }
    let mut from = 0;
    while let Some(pos) = body[from..].find(delim) {
        let end = from + pos;
        let after = &body[end + delim.len()..];
        let glued = (single && after.starts_with(delim)) || (underscore && after.starts_with(char::is_alphanumeric));
        let closes = end > 0 && !body[..end].ends_with(char::is_whitespace) && !glued;
        if closes {
            return Some((format!("<{tag}>{}</{tag}>", inline(&body[..end])), delim.len() * 2 + end));
        }
        from = end + delim.len();
    }
    None
}

/// `[text](url)` with an http(s), tg or mailto address.
fn link(rest: &str) -> Option<(String, usize)> {
    let body = rest.strip_prefix('[')?;
    let close = body.find("](")?;
    let text = &body[..close];
    let after = &body[close + 2..];
    let end = after.find(')')?;
    let url = after[..end].trim();
    let allowed = ["http://", "https://", "tg://", "mailto:"].iter().any(|p| url.starts_with(p));
    if text.is_empty() || !allowed || url.contains(char::is_whitespace) {
        return None;
    }
    Some((format!("<a href=\"{}\">{}</a>", escape(url), inline(text)), 1 + close + 2 + end + 1))
}

/// Greedy packing of rendered units into messages.
struct Packer {
    limit: usize,
    chunks: Vec<String>,
    cur: String,
}

impl Packer {
    fn push(&mut self, html: String) {
        let sep = usize::from(!self.cur.is_empty());
        if len16(&self.cur) + sep + len16(&html) <= self.limit {
            if sep == 1 {
                self.cur.push('\n');
            }
            self.cur.push_str(&html);
        } else {
            self.flush();
            self.cur = html;
        }
    }

    fn flush(&mut self) {
        let text = std::mem::take(&mut self.cur);
        let trimmed = text.trim_matches('\n');
        if !trimmed.trim().is_empty() {
            self.chunks.push(trimmed.to_string());
        }
    }

    fn finish(mut self) -> Vec<String> {
        self.flush();
        self.chunks
    }
}

/// A code body in parts whose escaped text fits `room`, split at line ends
/// where possible.
fn split_code(body: &str, room: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut cur_len = 0;
    for line in body.split_inclusive('\n') {
        let line_len = len16(&escape(line));
        if cur_len + line_len > room && !cur.is_empty() {
            parts.push(std::mem::take(&mut cur).trim_end_matches('\n').to_string());
            cur_len = 0;
        }
        if line_len > room {
            for piece in split_escaped(line, room) {
                parts.push(piece);
            }
            continue;
        }
        cur.push_str(line);
        cur_len += line_len;
    }
    if !cur.trim().is_empty() {
        parts.push(cur.trim_end_matches('\n').to_string());
    }
    parts
}

/// Raw text in pieces whose *escaped* form fits `room`.
fn split_escaped(text: &str, room: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut len = 0;
    for c in text.chars() {
        let l = len16(&escape(c.encode_utf8(&mut [0; 4])));
        if len + l > room {
            parts.push(std::mem::take(&mut cur));
            len = 0;
        }
        cur.push(c);
        len += l;
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    parts
}

/// Raw text in pieces of escaped length ≤ `room`, for a plain (unmarked) line.
fn split_hard(text: &str, room: usize) -> Vec<String> {
    split_escaped(text, room)
}

/// A long line in pieces of about `room` escaped units, broken at spaces when possible.
fn split_words(line: &str, room: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut len = 0;
    for word in line.split_inclusive(' ') {
        let l = len16(&escape(word));
        if len + l > room && !cur.is_empty() {
            parts.push(std::mem::take(&mut cur));
            len = 0;
        }
        if l > room {
            parts.extend(split_escaped(word, room));
            continue;
        }
        cur.push_str(word);
        len += l;
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(md: &str) -> String {
        let chunks = to_html_chunks(md, MAX_MESSAGE);
        assert_eq!(chunks.len(), 1, "{chunks:?}");
        chunks.into_iter().next().unwrap()
    }

    #[test]
    fn escapes_html_specials() {
        assert_eq!(one("a < b && c > d"), "a &lt; b &amp;&amp; c &gt; d");
        assert_eq!(one("<script>alert(1)</script>"), "&lt;script&gt;alert(1)&lt;/script&gt;");
    }

    #[test]
    fn inline_markup() {
        assert_eq!(
            one("**bold** and *it* and _it2_ and ~~gone~~"),
            "<b>bold</b> and <i>it</i> and <i>it2</i> and <s>gone</s>"
        );
        assert_eq!(one("use `a<b>` here"), "use <code>a&lt;b&gt;</code> here");
        assert_eq!(one("**bold with `code` inside**"), "<b>bold with <code>code</code> inside</b>");
        assert_eq!(one("snake_case_name and 2 * 3 * 4"), "snake_case_name and 2 * 3 * 4");
        assert_eq!(one("**unclosed bold"), "**unclosed bold");
        assert_eq!(one("# Title\n- item *one*"), "<b>Title</b>\n• item <i>one</i>");
    }

    #[test]
    fn links() {
        assert_eq!(
            one("see [the docs](https://example.com/a?b=1&c=\"2\") now"),
            "see <a href=\"https://example.com/a?b=1&amp;c=&quot;2&quot;\">the docs</a> now"
        );
        assert_eq!(one("[x](javascript:alert(1))"), "[x](javascript:alert(1))");
        assert_eq!(one("[**bold link**](http://a.b)"), "<a href=\"http://a.b\"><b>bold link</b></a>");
    }

    #[test]
    fn code_blocks() {
        let html = one("Run:\n```bash\necho \"<hi>\" && ls\n```\ndone");
        assert_eq!(
            html,
            "Run:\n<pre><code class=\"language-bash\">echo \"&lt;hi&gt;\" &amp;&amp; ls</code></pre>\ndone"
                .replace("\"&lt;hi&gt;\"", "&quot;&lt;hi&gt;&quot;")
        );
        assert_eq!(one("```\n**not bold**\n```"), "<pre>**not bold**</pre>");
        // An unclosed fence runs to the end; a weird language is dropped.
        assert_eq!(one("```a\"b\nx"), "<pre>x</pre>");
    }

    #[test]
    fn plain_fallback_keeps_text_and_addresses() {
        let html = one("**a** & <b> [docs](https://x.y) `c`");
        assert_eq!(html_to_plain(&html), "a & <b> docs (https://x.y) c");
        assert_eq!(html_to_plain("<a href=\"https://x.y\">https://x.y</a>"), "https://x.y");
    }

    /// Checks every chunk: within the limit and every tag it opens is closed.
    fn check_chunks(chunks: &[String], limit: usize) {
        for c in chunks {
            assert!(len16(c) <= limit, "{} > {limit}: {c}", len16(c));
            for tag in ["pre", "code", "b", "i", "a", "s"] {
                let opens = c.matches(&format!("<{tag}>")).count() + c.matches(&format!("<{tag} ")).count();
                assert_eq!(opens, c.matches(&format!("</{tag}>")).count(), "unbalanced <{tag}> in {c}");
            }
        }
    }

    #[test]
    fn long_text_splits_at_lines_under_the_limit() {
        let md: String = (0..400).map(|i| format!("line **{i}** of some text\n")).collect();
        let chunks = to_html_chunks(&md, MAX_MESSAGE);
        assert!(chunks.len() >= 3, "{}", chunks.len());
        check_chunks(&chunks, MAX_MESSAGE);
        let joined = chunks.join("\n");
        assert!(joined.contains("line <b>0</b>") && joined.contains("line <b>399</b>"));
    }

    #[test]
    fn a_code_block_across_the_boundary_is_closed_and_reopened() {
        let code: String = (0..300).map(|i| format!("let x{i} = a < b && c;\n")).collect();
        let md = format!("Here is the code:\n```rust\n{code}```\nThat's all.");
        let chunks = to_html_chunks(&md, MAX_MESSAGE);
        assert!(chunks.len() >= 2, "{}", chunks.len());
        check_chunks(&chunks, MAX_MESSAGE);
        let code_chunks = chunks.iter().filter(|c| c.contains("<pre><code class=\"language-rust\">")).count();
        assert!(code_chunks >= 2, "{chunks:?}");
        // Nothing lost, nothing doubled, every line whole.
        let plain: String = chunks.iter().map(|c| html_to_plain(c)).collect::<Vec<_>>().join("\n");
        for i in 0..300 {
            assert_eq!(plain.matches(&format!("let x{i} = a < b && c;")).count(), 1, "line {i}");
        }
        for c in chunks.iter().filter(|c| c.contains("<pre>")) {
            let inner =
                c.split("<pre><code class=\"language-rust\">").nth(1).unwrap().split("</code></pre>").next().unwrap();
            assert!(inner.lines().all(|l| l.starts_with("let x") && l.ends_with("c;")), "{inner}");
        }
        assert!(chunks.last().unwrap().ends_with("That's all."));
    }

    #[test]
    fn one_huge_line_and_wide_characters_are_split() {
        let md = "é😀<".repeat(5000);
        let chunks = to_html_chunks(&md, MAX_MESSAGE);
        check_chunks(&chunks, MAX_MESSAGE);
        let plain: String = chunks.iter().map(|c| html_to_plain(c)).collect::<String>().replace('\n', "");
        assert_eq!(plain, md);
        let words = "word ".repeat(3000);
        let chunks = to_html_chunks(&words, MAX_MESSAGE);
        check_chunks(&chunks, MAX_MESSAGE);
        assert!(chunks.iter().all(|c| !c.starts_with("ord")), "split at spaces");
    }

    #[test]
    fn small_limits_still_make_progress() {
        let chunks = to_html_chunks("```\nabcdefghijklmnopqrstuvwxyz0123456789\n```", 40);
        check_chunks(&chunks, 40);
        let plain: String = chunks.iter().map(|c| html_to_plain(c)).collect();
        assert_eq!(plain, "abcdefghijklmnopqrstuvwxyz0123456789");
    }
}
