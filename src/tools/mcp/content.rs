//! A `tools/call` result as text for the model.
//!
//! MCP results are a list of content blocks plus optional
//! `structuredContent`. Text blocks are the answer. Images are described in
//! the text (`[image: image/png, 12 KB]`) and handed on as images too, which
//! the agent shows to a model that can see them; audio is described only.
//! Resources are shown by their
//! text or described. `structuredContent` is added as JSON unless a text
//! block already says the same (servers are asked to send both). The
//! registry cuts the whole to `[agent] max_tool_result_chars` like any tool's.

use serde_json::Value;

use crate::provider::Image;

/// Image types vision APIs take.
const IMAGE_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];
/// Base64 characters of the largest image handed on (5 MB decoded, Anthropic's per-image limit).
const MAX_IMAGE_B64: usize = 5 * 1024 * 1024 / 3 * 4;

/// A rendered result: the text, whether the server flagged it as an error (`isError`), and its images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub is_error: bool,
    pub images: Vec<Image>,
}

/// The text of a result, and whether the server flagged it as an error (`isError`).
pub fn render(result: &Value) -> (String, bool) {
    let r = render_all(result);
    (r.text, r.is_error)
}

/// [`render`], with the result's images (PNG, JPEG, GIF, WebP up to 5 MB, at
/// most [`crate::tools::MAX_TOOL_IMAGES`]).
pub fn render_all(result: &Value) -> Rendered {
    let is_error = result.get("isError").and_then(Value::as_bool).unwrap_or(false);
    let mut parts: Vec<String> = Vec::new();
    let mut images = Vec::new();
    if let Some(Value::Array(blocks)) = result.get("content") {
        for block in blocks {
            parts.push(block_text(block));
            if let Some(image) = image_of(block).filter(|_| images.len() < crate::tools::MAX_TOOL_IMAGES) {
                images.push(image);
            }
        }
    }
    if let Some(structured) = result.get("structuredContent").filter(|v| !v.is_null()) {
        if !said_already(&parts, structured) {
            let json = serde_json::to_string(structured).unwrap_or_default();
            parts.push(if parts.is_empty() { json } else { format!("structuredContent: {json}") });
        }
    }
    let text = parts.join("\n");
    let text = if text.trim().is_empty() { "(the tool returned no content)".to_string() } else { text };
    Rendered { text, is_error, images }
}

/// An `image` block a vision model can take: a known type, plausible base64, not too large.
fn image_of(block: &Value) -> Option<Image> {
    if block.get("type").and_then(Value::as_str) != Some("image") {
        return None;
    }
    let mime = block.get("mimeType").and_then(Value::as_str)?;
    let data = block.get("data").and_then(Value::as_str)?;
    let plausible = !data.is_empty()
        && data.len() <= MAX_IMAGE_B64
        && data.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    (IMAGE_TYPES.contains(&mime) && plausible).then(|| Image { mime: mime.to_string(), base64: data.into() })
}

/// Whether a text block already carries `structured` (the same JSON, or the
/// `{"result": x}` wrapper of a plain value the Python SDK makes).
fn said_already(parts: &[String], structured: &Value) -> bool {
    let plain = match structured {
        Value::Object(m) if m.len() == 1 => m.get("result"),
        _ => None,
    };
    parts.iter().any(|p| {
        let parsed = serde_json::from_str::<Value>(p.trim()).ok();
        parsed.as_ref() == Some(structured)
            || plain.is_some_and(|v| parsed.as_ref() == Some(v) || v.as_str() == Some(p.as_str()))
    })
}

fn kb(base64_len: usize) -> String {
    let bytes = base64_len / 4 * 3;
    if bytes < 1024 {
        format!("{bytes} bytes")
    } else {
        format!("{} KB", bytes.div_ceil(1024))
    }
}

fn block_text(block: &Value) -> String {
    let s = |k: &str| block.get(k).and_then(Value::as_str).unwrap_or("");
    let mime =
        |default: &'static str| if s("mimeType").is_empty() { default.to_string() } else { s("mimeType").to_string() };
    match s("type") {
        "text" => s("text").to_string(),
        "image" => format!("[image: {}, {}]", mime("image"), kb(s("data").len())),
        "audio" => format!("[audio: {}, {}]", mime("audio"), kb(s("data").len())),
        "resource_link" => format!("[resource: {} {}]", s("uri"), s("name")).trim_end_matches(' ').replace(" ]", "]"),
        "resource" => {
            let r = block.get("resource").cloned().unwrap_or(Value::Null);
            let rs = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("").to_string();
            match r.get("text").and_then(Value::as_str) {
                Some(text) => format!("[resource {}]\n{text}", rs("uri")),
                None => format!("[resource: {}, {}, {}]", rs("uri"), rs("mimeType"), kb(rs("blob").len())),
            }
        }
        other => format!("[{} content]", if other.is_empty() { "unknown" } else { other }),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn text_structured_and_errors() {
        // The Python SDK's `add`: text "5" and {"result": 5}: said once.
        let r =
            json!({"content": [{"type": "text", "text": "5"}], "structuredContent": {"result": 5}, "isError": false});
        assert_eq!(render(&r), ("5".into(), false));
        let r = json!({"content": [{"type": "text", "text": "done"}], "structuredContent": {"lights": 3}});
        assert_eq!(render(&r).0, "done\nstructuredContent: {\"lights\":3}");
        let r = json!({"content": [], "structuredContent": {"lights": 3}});
        assert_eq!(render(&r).0, "{\"lights\":3}");
        let r = json!({"content": [{"type": "text", "text": "no such light"}], "isError": true});
        assert_eq!(render(&r), ("no such light".into(), true));
        assert_eq!(render(&json!({})).0, "(the tool returned no content)");
    }

    #[test]
    fn images_are_handed_on_when_a_model_could_take_them() {
        let r = json!({"content": [
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo="},
            {"type": "image", "mimeType": "image/tiff", "data": "AAAA"},
            {"type": "image", "mimeType": "image/png", "data": "not base64!"},
            {"type": "text", "text": "a camera snapshot"}
        ]});
        let r = render_all(&r);
        assert_eq!(r.images, vec![Image { mime: "image/png".into(), base64: "iVBORw0KGgo=".into() }]);
        assert!(r.text.starts_with("[image: image/png, 9 bytes]"), "{}", r.text);
    }

    #[test]
    fn binary_content_is_described() {
        let png = "A".repeat(16_384); // 12 KiB once decoded
        let r = json!({"content": [
            {"type": "image", "mimeType": "image/png", "data": png},
            {"type": "audio", "mimeType": "audio/wav", "data": "AAAA"},
            {"type": "resource_link", "uri": "file:///x.txt", "name": "x.txt"},
            {"type": "resource", "resource": {"uri": "mem://a", "text": "hello"}},
            {"type": "resource", "resource": {"uri": "mem://b", "mimeType": "application/zip", "blob": "AAAA"}},
            {"type": "hologram"}
        ]});
        let text = render(&r).0;
        assert_eq!(
            text,
            "[image: image/png, 12 KB]\n\
             [audio: audio/wav, 3 bytes]\n[resource: file:///x.txt x.txt]\n[resource mem://a]\nhello\n\
             [resource: mem://b, application/zip, 3 bytes]\n[hologram content]"
        );
    }
}
