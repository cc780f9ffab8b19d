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

#[cfg(test)]
mod tests {
    use super::WORKSPACE;

    /// Shipped skills teach bramble's own tools: a token never travels
    /// through the model, a command line or `[exec] env_allow`.
    #[test]
    fn shipped_skills_never_route_a_secret_through_the_model() {
        for (rel, text) in WORKSPACE.iter().filter(|(rel, _)| rel.starts_with("skills/")) {
            for needle in ["env_allow", "Bearer", "_TOKEN\"", "$HA_TOKEN", "HA_URL"] {
                assert!(!text.contains(needle), "{rel} teaches `{needle}`");
            }
        }
        let ha = WORKSPACE.iter().find(|(rel, _)| rel.contains("home-assistant")).map(|(_, t)| *t).unwrap_or("");
        for tool in ["ha_get_state", "ha_call_service", "[homeassistant]"] {
            assert!(ha.contains(tool), "the home-assistant skill does not teach `{tool}`");
        }
    }
}
