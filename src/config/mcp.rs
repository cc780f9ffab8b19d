//! `[[mcp.server]]`: the MCP servers whose tools the agent may call.
//!
//! A server is reached over HTTP (`url`: streamable HTTP, or the older
//! HTTP+SSE transport as a fallback) or started as a child process (`command`,
//! stdio). Every check a single table can make happens while it is read
//! (`try_from`), so a mistake is reported at its `FILE:LINE:COL` like the rest
//! of the config; what needs all tables (names unique) is checked in
//! [`McpConfig::check`], which points at the second name.
//!
//! Secrets: `headers_env = { Authorization = "Bearer HA_TOKEN" }` reads the
//! header's value (after the literal `Bearer `) from the environment variable
//! `HA_TOKEN` (or a systemd credential) when the server is connected; the
//! value is never logged nor shown by `status`.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;

use super::types::{Dur, HttpUrl};
use super::{ExecConfig, Network};

/// `[mcp]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpConfig {
    /// The servers, `[[mcp.server]]`.
    pub server: Vec<McpServer>,
}

impl McpConfig {
    /// What one table cannot check alone: two servers with one name.
    pub(super) fn check(&self) -> Result<(), (Option<Range<usize>>, String)> {
        for (i, s) in self.server.iter().enumerate() {
            if self.server[..i].iter().any(|other| other.name == s.name) {
                return Err((Some(s.name_span.clone()), format!("two MCP servers are named `{}`", s.name)));
            }
        }
        Ok(())
    }

    /// What `bramble check` should say: secrets named but not set, stdio servers without a sandbox.
    pub fn warnings(&self, exec: &ExecConfig) -> Vec<String> {
        let mut out = Vec::new();
        for s in &self.server {
            let vars = match &s.transport {
                McpTransport::Http { headers_env, .. } => headers_env
                    .values()
                    .map(|v| ("headers_env", header_from_env(v).1))
                    .chain(s.oauth.client_secret_env.as_deref().map(|v| ("client_secret_env", v)))
                    .chain(s.oauth.client_key_env.as_deref().map(|v| ("client_key_env", v)))
                    .collect::<Vec<_>>(),
                McpTransport::Stdio(st) => st.env_from.values().map(|v| ("env_from", v.as_str())).collect(),
            };
            for (key, var) in vars {
                if super::secret_from_env(var).is_none() {
                    out.push(format!(
                        "MCP server `{}`: {key} names {var}, which is not set: the server stays down until it is",
                        s.name
                    ));
                }
            }
            if matches!(s.transport, McpTransport::Stdio(_)) && exec.isolation == super::Isolation::Off {
                out.push(format!(
                    "MCP server `{}` runs without the sandbox ([exec] isolation = \"off\"), with bramble's rights",
                    s.name
                ));
            }
        }
        out
    }
}

/// A `headers_env` value: `"VAR"` (the header is the variable's value) or
/// `"Bearer VAR"` (a literal prefix, a space, then the variable's value).
pub fn header_from_env(spec: &str) -> (Option<&str>, &str) {
    match spec.trim().rsplit_once(' ') {
        Some((prefix, var)) => (Some(prefix.trim_end()), var),
        None => (None, spec.trim()),
    }
}

/// Longest server name: with `__` and a tool name it must stay within 64 characters.
pub const MAX_SERVER_NAME: usize = 32;

/// One `[[mcp.server]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawServer")]
pub struct McpServer {
    /// Letters, digits, `-`, `_`: the prefix of its tools' names (`<name>__<tool>`).
    pub name: String,
    /// Where `name` is in the file (for the duplicate-name error).
    pub name_span: Range<usize>,
    pub transport: McpTransport,
    /// The server's tools the model may call, by the server's names; `None`: all of them.
    pub tools: Option<Vec<String>>,
    /// Longest wait for one call (and for connecting).
    pub timeout: Dur,
    /// Whether untrusted turns (MQTT, unknown channels) may call its tools.
    pub allow_untrusted: bool,
    /// OAuth 2.1 settings of a `url` server (all optional: discovery does the rest).
    pub oauth: OAuthSettings,
}

/// How bramble authorizes with a `url` server that asks for OAuth (a 401 naming its metadata).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthSettings {
    /// A client registered beforehand with the authorization server (else: dynamic registration).
    pub client_id: Option<String>,
    /// The environment variable (or credential) holding that client's secret.
    pub client_secret_env: Option<String>,
    /// The variable (or credential) holding that client's EC P-256 private key (PKCS#8 PEM): `private_key_jwt`.
    pub client_key_env: Option<String>,
    /// A client ID metadata document's https URL, used as the client id where the server supports that.
    pub client_metadata_url: Option<String>,
    /// `authorization_code` (a person logs in once, `bramble mcp login`) or `client_credentials` (machine).
    pub grant_type: GrantType,
    /// Scopes to ask for (space-separated), instead of the server's.
    pub scope: Option<String>,
}

/// `grant_type` of a `url` server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantType {
    #[default]
    AuthorizationCode,
    ClientCredentials,
}

/// How a server is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    Http {
        url: HttpUrl,
        /// Which HTTP transport: `auto` tries streamable HTTP, then HTTP+SSE.
        kind: HttpKind,
        /// Headers sent as they are.
        headers: BTreeMap<String, String>,
        /// Headers whose values come from these environment variables (or credentials).
        headers_env: BTreeMap<String, String>,
    },
    Stdio(StdioServer),
}

/// `transport` of a `url` server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HttpKind {
    /// Streamable HTTP; on a 4xx to the first POST, the older HTTP+SSE transport.
    #[default]
    Auto,
    /// Streamable HTTP only (MCP 2025-03-26 and later).
    StreamableHttp,
    /// The HTTP+SSE transport of MCP 2024-11-05 only.
    Sse,
}

/// A server started as a child process, speaking JSON-RPC on its stdin/stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioServer {
    pub command: String,
    pub args: Vec<String>,
    /// Variables set for it (besides `PATH`, `HOME`, `LANG`, `TERM`, as for `exec`).
    pub env: BTreeMap<String, String>,
    /// Variables whose values come from bramble's environment (or credentials), by name.
    pub env_from: BTreeMap<String, String>,
    /// Network for the server (default "all": most servers exist to reach
    /// something, and many ignore proxy settings, which "internet" relies on).
    pub network: Network,
    /// Its sandbox limits; unset ones are `[exec]`'s, except CPU time (none: the server lives long).
    pub max_memory_mb: Option<u64>,
    pub max_cpu_seconds: Option<u64>,
    pub max_processes: Option<u64>,
    pub max_open_files: Option<u64>,
}

impl StdioServer {
    /// The `[exec]` settings its sandbox is built from: `[exec]`'s layers with its own network and limits.
    pub fn exec_config(&self, exec: &ExecConfig) -> ExecConfig {
        let mut cfg = exec.clone();
        cfg.network = self.network;
        cfg.max_memory_mb = self.max_memory_mb.unwrap_or(exec.max_memory_mb);
        cfg.max_cpu_seconds = self.max_cpu_seconds.unwrap_or(0);
        cfg.max_processes = self.max_processes.unwrap_or(exec.max_processes);
        cfg.max_open_files = self.max_open_files.unwrap_or(exec.max_open_files);
        cfg
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    name: toml::Spanned<String>,
    url: Option<HttpUrl>,
    transport: Option<HttpKind>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    headers_env: BTreeMap<String, String>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    env_from: BTreeMap<String, String>,
    network: Option<Network>,
    max_memory_mb: Option<u64>,
    max_cpu_seconds: Option<u64>,
    max_processes: Option<u64>,
    max_open_files: Option<u64>,
    tools: Option<Vec<String>>,
    timeout: Option<Dur>,
    #[serde(default)]
    allow_untrusted: bool,
    client_id: Option<String>,
    client_secret_env: Option<String>,
    client_key_env: Option<String>,
    client_metadata_url: Option<String>,
    grant_type: Option<GrantType>,
    scope: Option<String>,
}

/// Whether `name` may name a server: 1 to 32 of `A-Z a-z 0-9 - _` (no path characters, no dots).
pub fn valid_server_name(name: &str) -> bool {
    (1..=MAX_SERVER_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl TryFrom<RawServer> for McpServer {
    type Error = String;
    fn try_from(r: RawServer) -> Result<Self, String> {
        let name_span = r.name.span();
        let oauth = oauth_settings(r.name.get_ref(), &r)?;
        let oauth_set = oauth_key(&r);
        let name = r.name.into_inner();
        if !valid_server_name(&name) {
            return Err(format!(
                "`{name}` is not an MCP server name: 1 to {MAX_SERVER_NAME} characters from `A-Z a-z 0-9 - _` \
                 (it prefixes the tools' names, `{{name}}__{{tool}}`)"
            ));
        }
        let stdio_only = [
            ("args", !r.args.is_empty()),
            ("env", !r.env.is_empty()),
            ("env_from", !r.env_from.is_empty()),
            ("network", r.network.is_some()),
            ("max_memory_mb", r.max_memory_mb.is_some()),
            ("max_cpu_seconds", r.max_cpu_seconds.is_some()),
            ("max_processes", r.max_processes.is_some()),
            ("max_open_files", r.max_open_files.is_some()),
        ];
        let http_only = [
            ("transport", r.transport.is_some()),
            ("headers", !r.headers.is_empty()),
            ("headers_env", !r.headers_env.is_empty()),
            oauth_set.map_or(("client_id", false), |k| (k, true)),
        ];
        let transport = match (r.url, r.command) {
            (Some(url), None) => {
                if let Some((key, _)) = stdio_only.iter().find(|(_, set)| *set) {
                    return Err(format!("MCP server `{name}`: `{key}` is for a `command` server, not a `url` one"));
                }
                for (header, spec) in &r.headers_env {
                    let var = header_from_env(spec).1;
                    if var.is_empty() || var.contains(['=', '\0', '/']) {
                        return Err(format!(
                            "MCP server `{name}`: headers_env `{header}` = `{spec}` does not end in an environment \
                             variable's name (like \"HA_TOKEN\" or \"Bearer HA_TOKEN\")"
                        ));
                    }
                }
                for (header, value) in r.headers.iter().chain(&r.headers_env) {
                    if reqwest::header::HeaderName::from_bytes(header.trim().as_bytes()).is_err() {
                        return Err(format!("MCP server `{name}`: `{header}` is not a valid HTTP header name"));
                    }
                    if reqwest::header::HeaderValue::from_str(value.trim()).is_err() {
                        return Err(format!(
                            "MCP server `{name}`: the value of header `{header}` is not a valid HTTP header value"
                        ));
                    }
                }
                McpTransport::Http {
                    url,
                    kind: r.transport.unwrap_or_default(),
                    headers: r.headers,
                    headers_env: r.headers_env,
                }
            }
            (None, Some(command)) => {
                if let Some((key, _)) = http_only.iter().find(|(_, set)| *set) {
                    return Err(format!("MCP server `{name}`: `{key}` is for a `url` server, not a `command` one"));
                }
                if command.trim().is_empty() {
                    return Err(format!("MCP server `{name}`: `command` is empty"));
                }
                for key in r.env.keys().chain(r.env_from.keys()) {
                    if key.is_empty() || key.contains(['=', '\0']) {
                        return Err(format!("MCP server `{name}`: `{key}` is not an environment variable name"));
                    }
                }
                McpTransport::Stdio(StdioServer {
                    command,
                    args: r.args,
                    env: r.env,
                    env_from: r.env_from,
                    network: r.network.unwrap_or(Network::All),
                    max_memory_mb: r.max_memory_mb,
                    max_cpu_seconds: r.max_cpu_seconds,
                    max_processes: r.max_processes,
                    max_open_files: r.max_open_files,
                })
            }
            (Some(_), Some(_)) => {
                return Err(format!("MCP server `{name}` has both `url` and `command`: it is one or the other"))
            }
            (None, None) => {
                return Err(format!(
                    "MCP server `{name}` needs `url = \"http://…\"` (an HTTP server) or `command = \"…\"` (a program \
                     speaking MCP on stdin/stdout)"
                ))
            }
        };
        let timeout = r.timeout.unwrap_or(Dur::secs(60));
        if timeout.get().is_zero() {
            return Err(format!("MCP server `{name}`: `timeout` must be more than 0s"));
        }
        Ok(McpServer { name, name_span, transport, tools: r.tools, timeout, allow_untrusted: r.allow_untrusted, oauth })
    }
}

/// The first OAuth key a table sets (they are for `url` servers only).
fn oauth_key(r: &RawServer) -> Option<&'static str> {
    [
        ("client_id", r.client_id.is_some()),
        ("client_secret_env", r.client_secret_env.is_some()),
        ("client_key_env", r.client_key_env.is_some()),
        ("client_metadata_url", r.client_metadata_url.is_some()),
        ("grant_type", r.grant_type.is_some()),
        ("scope", r.scope.is_some()),
    ]
    .into_iter()
    .find_map(|(k, set)| set.then_some(k))
}

/// The OAuth keys of a table, checked: what they name must be usable.
fn oauth_settings(name: &str, r: &RawServer) -> Result<OAuthSettings, String> {
    let grant_type = r.grant_type.unwrap_or_default();
    for (key, var) in [("client_secret_env", &r.client_secret_env), ("client_key_env", &r.client_key_env)] {
        if let Some(var) = var.as_deref().filter(|v| v.trim().is_empty() || v.contains(['=', '\0', '/', ' '])) {
            return Err(format!("MCP server `{name}`: {key} `{var}` is not an environment variable's name"));
        }
    }
    let credential = r.client_secret_env.is_some() || r.client_key_env.is_some();
    if grant_type == GrantType::ClientCredentials && (r.client_id.is_none() || !credential) {
        return Err(format!(
            "MCP server `{name}`: grant_type = \"client_credentials\" needs `client_id` and `client_secret_env` (or \
             `client_key_env`): the client registered with the authorization server for this machine"
        ));
    }
    if credential && r.client_id.is_none() {
        return Err(format!(
            "MCP server `{name}`: `client_secret_env` / `client_key_env` need `client_id` (whose they are)"
        ));
    }
    if r.client_secret_env.is_some() && r.client_key_env.is_some() {
        return Err(format!(
            "MCP server `{name}`: `client_secret_env` and `client_key_env` are two ways to authenticate: pick one"
        ));
    }
    if let Some(url) = &r.client_metadata_url {
        let ok = reqwest::Url::parse(url).is_ok_and(|u| u.scheme() == "https" && u.path() != "/" && u.host().is_some());
        if !ok {
            return Err(format!(
                "MCP server `{name}`: client_metadata_url `{url}` must be an https:// URL with a path (where the \
                 client's metadata document is published)"
            ));
        }
    }
    if r.client_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
        return Err(format!("MCP server `{name}`: `client_id` is empty"));
    }
    Ok(OAuthSettings {
        client_id: r.client_id.clone(),
        client_secret_env: r.client_secret_env.clone(),
        client_key_env: r.client_key_env.clone(),
        client_metadata_url: r.client_metadata_url.clone(),
        grant_type,
        scope: r.scope.clone().filter(|s| !s.trim().is_empty()),
    })
}

#[cfg(all(test, feature = "mcp"))]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, Path::new("/c.toml")).map_err(|e| e.to_string())
    }

    #[test]
    #[cfg(feature = "mcp")]
    fn http_and_stdio_servers_parse() {
        let c = parse(
            r#"
[[mcp.server]]
name = "ha"
url = "http://homeassistant.local:8123/api/mcp"
headers_env = { Authorization = "Bearer HA_MCP_TOKEN", X-Raw = "RAW_VAR" }
tools = ["HassTurnOn"]
timeout = "30s"

[[mcp.server]]
name = "files_2"
command = "/usr/bin/python3"
args = ["-m", "server"]
env = { LEVEL = "debug" }
network = false
max_memory_mb = 256
allow_untrusted = true
"#,
        )
        .unwrap();
        let [ha, files] = c.mcp.server.as_slice() else { panic!("two servers") };
        assert_eq!(ha.name, "ha");
        assert_eq!(ha.timeout, Dur::secs(30));
        assert_eq!(ha.tools.as_deref(), Some(&["HassTurnOn".to_string()][..]));
        assert!(!ha.allow_untrusted);
        let McpTransport::Http { url, kind, headers_env, .. } = &ha.transport else { panic!("http") };
        assert_eq!(url.as_str(), "http://homeassistant.local:8123/api/mcp");
        assert_eq!(*kind, HttpKind::Auto);
        assert_eq!(header_from_env(&headers_env["Authorization"]), (Some("Bearer"), "HA_MCP_TOKEN"));
        assert_eq!(header_from_env(&headers_env["X-Raw"]), (None, "RAW_VAR"));
        let McpTransport::Stdio(s) = &files.transport else { panic!("stdio") };
        assert_eq!(s.args, ["-m", "server"]);
        assert_eq!(s.network, Network::None);
        assert!(files.allow_untrusted);
        assert_eq!(files.timeout, Dur::secs(60));
        let exec = s.exec_config(&ExecConfig::default());
        assert_eq!((exec.max_memory_mb, exec.max_cpu_seconds, exec.network), (256, 0, Network::None));
    }

    #[test]
    fn mistakes_are_reported_at_their_place() {
        let cases = [
            ("[[mcp.server]]\nname = \"../x\"\nurl = \"http://a\"\n", "is not an MCP server name"),
            ("[[mcp.server]]\nname = \"a.b\"\nurl = \"http://a\"\n", "is not an MCP server name"),
            ("[[mcp.server]]\nname = \"x\"\n", "needs `url = "),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ncommand = \"y\"\n", "both `url` and `command`"),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\nargs = [\"-v\"]\n", "`args` is for a `command` server"),
            (
                "[[mcp.server]]\nname = \"x\"\ncommand = \"y\"\nheaders_env = { A = \"B\" }\n",
                "`headers_env` is for a `url`",
            ),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\nheaders = { \"Bad Name\" = \"v\" }\n",
                "not a valid HTTP header name",
            ),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"ftp://a\"\n", "must be an http:// or https:// URL"),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ntimeout = \"soon\"\n", "is not a duration"),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ntimeout = \"0s\"\n", "more than 0s"),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ntrusted = true\n",
                "unknown key `trusted` in [mcp.server]",
            ),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ntransport = \"websocket\"\n",
                "unknown variant `websocket`",
            ),
            ("[[mcp.server]]\nname = \"x\"\ncommand = \"y\"\nclient_id = \"c\"\n", "`client_id` is for a `url`"),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ngrant_type = \"client_credentials\"\n",
                "needs `client_id` and `client_secret_env`",
            ),
            ("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\nclient_secret_env = \"S\"\n", "need `client_id`"),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\nclient_metadata_url = \"http://m/c.json\"\n",
                "must be an https:// URL with a path",
            ),
            (
                "[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ngrant_type = \"password\"\n",
                "unknown variant `password`",
            ),
        ];
        for (text, want) in cases {
            let err = parse(text).unwrap_err();
            assert!(err.starts_with("/c.toml:"), "{err}");
            assert!(err.contains(want), "{text}: {err}");
        }
        // A bad value points at its line.
        let err = parse("[[mcp.server]]\nname = \"x\"\nurl = \"http://a\"\ntimeout = \"soon\"\n").unwrap_err();
        assert!(err.starts_with("/c.toml:4:"), "{err}");
    }

    #[test]
    #[cfg(feature = "mcp")]
    fn oauth_keys_parse() {
        let c = parse(
            "[[mcp.server]]\nname = \"m\"\nurl = \"https://a/mcp\"\nclient_id = \"bramble-pi\"\n\
             client_secret_env = \"M_SECRET\"\ngrant_type = \"client_credentials\"\nscope = \"read write\"\n\
             [[mcp.server]]\nname = \"n\"\nurl = \"https://b/mcp\"\nclient_metadata_url = \"https://me.example/c.json\"\n",
        )
        .unwrap();
        let [m, n] = c.mcp.server.as_slice() else { panic!("two servers") };
        assert_eq!(m.oauth.grant_type, GrantType::ClientCredentials);
        assert_eq!(m.oauth.client_secret_env.as_deref(), Some("M_SECRET"));
        assert_eq!(m.oauth.scope.as_deref(), Some("read write"));
        assert_eq!(n.oauth.grant_type, GrantType::AuthorizationCode);
        assert_eq!(n.oauth.client_metadata_url.as_deref(), Some("https://me.example/c.json"));
    }

    #[test]
    #[cfg(feature = "mcp")]
    fn unset_secrets_are_warned_about() {
        let c = parse(
            "[[mcp.server]]\nname = \"a\"\nurl = \"http://a\"\nheaders_env = { Authorization = \"Bearer BRAMBLE_UNSET_9c\" }\n\
             [[mcp.server]]\nname = \"b\"\ncommand = \"x\"\nenv_from = { K = \"HOME\" }\n",
        )
        .unwrap();
        let w = c.mcp.warnings(&ExecConfig::default());
        assert_eq!(
            w,
            ["MCP server `a`: headers_env names BRAMBLE_UNSET_9c, which is not set: the server stays down until it is"]
        );
        let err = parse("[[mcp.server]]\nname = \"a\"\nurl = \"http://a\"\nheaders_env = { A = \"Bearer ../x\" }\n")
            .unwrap_err();
        assert!(err.contains("does not end in an environment variable's name"), "{err}");
    }

    #[test]
    fn duplicate_names_point_at_the_second() {
        let err = parse(
            "[[mcp.server]]\nname = \"a\"\nurl = \"http://a\"\n\n[[mcp.server]]\nname = \"a\"\ncommand = \"x\"\n",
        )
        .unwrap_err();
        assert!(err.starts_with("/c.toml:6:8: two MCP servers are named `a`"), "{err}");
    }
}
