//! `bramble init`: a commented config.toml and the workspace templates; never overwrites a file.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;

use crate::config::{self, templates};
use crate::util;

pub(super) fn init(explicit: Option<&Path>, workspace: Option<&Path>) -> anyhow::Result<ExitCode> {
    let config_path = explicit.map(Path::to_path_buf).unwrap_or_else(config::default_config_path);
    let mut text = templates::CONFIG_TOML.to_string();
    if let Some(ws) = workspace {
        let ws = std::path::absolute(ws).with_context(|| format!("cannot resolve {}", ws.display()))?;
        let line = format!("workspace = {}", toml_string(&ws.to_string_lossy()));
        text = text.replacen("# workspace = \"~/.local/share/bramble/workspace\"", &line, 1);
    }
    let wrote = util::fs::write_new(&config_path, text.as_bytes())
        .with_context(|| format!("cannot write {}", config_path.display()))?;
    report_init(&config_path, wrote);
    // Read back what is now there (it may be the user's own file) to find the workspace.
    let loaded = config::load(Some(&config_path))?;
    let ws = match workspace {
        Some(ws) => ws.to_path_buf(),
        None => loaded.paths.workspace.clone(),
    };
    std::fs::create_dir_all(&ws).with_context(|| format!("cannot create the workspace {}", ws.display()))?;
    // The workspace may already hold what earlier commands left: never write through a link there.
    let confined = crate::workspace::Workspace::strict(&ws);
    for (rel, body) in templates::WORKSPACE {
        let path = ws.join(rel);
        let wrote =
            confined.write_new(rel, body.as_bytes()).with_context(|| format!("cannot write {}", path.display()))?;
        report_init(&path, wrote);
    }
    println!("\nNext: set your API key (e.g. export OPENAI_API_KEY=…), then try `bramble agent -m \"hello\"`.");
    Ok(ExitCode::SUCCESS)
}

fn report_init(path: &Path, wrote: bool) {
    if wrote {
        println!("wrote   {}", path.display());
    } else {
        println!("kept    {} (exists)", path.display());
    }
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_escaped() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }
}
