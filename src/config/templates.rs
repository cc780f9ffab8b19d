//! The files `bramble init` writes: the commented config and the workspace
//! templates. They live in the repository under `config/` (so packages can
//! ship them too) and are compiled into the binary from there.

/// The commented `config.toml`.
pub const CONFIG_TOML: &str = include_str!("../../config/bramble.toml");

/// Workspace templates: path relative to the workspace, contents.
pub const WORKSPACE: &[(&str, &str)] = &[
    ("AGENTS.md", include_str!("../../config/workspace/AGENTS.md")),
    ("SOUL.md", include_str!("../../config/workspace/SOUL.md")),
    ("USER.md", include_str!("../../config/workspace/USER.md")),
    ("TOOLS.md", include_str!("../../config/workspace/TOOLS.md")),
    ("IDENTITY.md", include_str!("../../config/workspace/IDENTITY.md")),
    ("HEARTBEAT.md", include_str!("../../config/workspace/HEARTBEAT.md")),
    ("memory/MEMORY.md", include_str!("../../config/workspace/memory/MEMORY.md")),
    ("skills/home-assistant/SKILL.md", include_str!("../../config/workspace/skills/home-assistant/SKILL.md")),
    ("skills/system-health/SKILL.md", include_str!("../../config/workspace/skills/system-health/SKILL.md")),
];
