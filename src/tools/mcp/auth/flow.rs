//! The OAuth 2.1 requests: PKCE (RFC 7636, S256 only), the authorization
//! URL with `resource` (RFC 8707), dynamic client registration (RFC 7591),
//! and the token endpoint's grants — `authorization_code`, `refresh_token`,
//! `client_credentials` — with the client authentication the server takes
//! (`none`, `client_secret_basic`, `client_secret_post`).
//!
//! Bodies are `application/x-www-form-urlencoded`, built with the URL
//! parser's serializer (no extra crate); answers are read with a cap and an
//! error from the token endpoint is shown with its `error` and description,
//! never with what was sent.

use base64::Engine as _;
use reqwest::Url;
use serde_json::{json, Value};

use super::discover::{self, Server, MAX_METADATA};
use super::store::ClientInfo;
use super::AuthError;

/// base64url without padding.
fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// `n` random bytes, base64url: verifiers and `state`.
pub fn random(n: usize) -> Result<String, AuthError> {
    use ring::rand::SecureRandom as _;
    let mut buf = vec![0u8; n];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .map_err(|_| AuthError::Failed("the system's random number generator failed".into()))?;
    Ok(b64(&buf))
}

/// A PKCE pair: the verifier kept, the S256 challenge sent.
pub struct Pkce {
    pub verifier: String,
    pub challenge: String,
}

impl Pkce {
    pub fn new() -> Result<Pkce, AuthError> {
        let verifier = random(32)?; // 43 characters, within RFC 7636's 43..=128
        Ok(Pkce { challenge: s256(&verifier), verifier })
    }
}

/// `BASE64URL(SHA256(verifier))`.
pub fn s256(verifier: &str) -> String {
    b64(ring::digest::digest(&ring::digest::SHA256, verifier.as_bytes()).as_ref())
}

/// Form-encode `pairs`.
pub fn form(pairs: &[(&str, &str)]) -> String {
    let mut u = Url::parse("http://x/").expect("a constant URL");
    {
        let mut q = u.query_pairs_mut();
        for (k, v) in pairs {
            q.append_pair(k, v);
        }
    }
    u.query().unwrap_or_default().to_string()
}

/// What the authorization URL carries.
pub struct AuthorizeRequest<'a> {
    pub client_id: &'a str,
    pub redirect_uri: &'a str,
    pub challenge: &'a str,
    pub state: &'a str,
    pub scope: Option<&'a str>,
    pub resource: &'a str,
}

/// The URL the person opens.
pub fn authorization_url(server: &Server, r: &AuthorizeRequest<'_>) -> Url {
    let mut url = server.authorization_endpoint.clone();
    {
        let mut q = url.query_pairs_mut();
        q.append_pair("response_type", "code")
            .append_pair("client_id", r.client_id)
            .append_pair("redirect_uri", r.redirect_uri)
            .append_pair("code_challenge", r.challenge)
            .append_pair("code_challenge_method", "S256")
            .append_pair("state", r.state)
            .append_pair("resource", r.resource);
        if let Some(scope) = r.scope {
            q.append_pair("scope", scope);
        }
    }
    url
}

/// The client authentication to use with `secret` at `server`.
pub fn auth_method(server: &Server, has_secret: bool) -> String {
    let supported = |m: &str| server.token_auth_methods.iter().any(|s| s == m);
    if !has_secret {
        return "none".into();
    }
    // RFC 8414: an absent list means client_secret_basic.
    if server.token_auth_methods.is_empty() || supported("client_secret_basic") {
        "client_secret_basic".into()
    } else if supported("client_secret_post") {
        "client_secret_post".into()
    } else {
        "client_secret_basic".into()
    }
}

/// Register bramble with the authorization server (RFC 7591).
pub async fn register(
    http: &reqwest::Client,
    server: &Server,
    endpoint: &Url,
    redirect_uri: &str,
    grant: &str,
) -> Result<ClientInfo, AuthError> {
    let supported = |m: &str| server.token_auth_methods.iter().any(|s| s == m);
    let wanted = if server.token_auth_methods.is_empty() || supported("none") {
        "none"
    } else if supported("client_secret_basic") {
        "client_secret_basic"
    } else {
        "client_secret_post"
    };
    let body = json!({
        "client_name": "bramble",
        "redirect_uris": [redirect_uri],
        "grant_types": [grant, "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": wanted,
        "application_type": "native",
    });
    let resp = http
        .post(endpoint.clone())
        .json(&body)
        .send()
        .await
        .map_err(|e| AuthError::unreachable("the registration endpoint", endpoint, &e))?;
    let (status, doc) = read_json(resp, "the registration endpoint", endpoint).await?;
    if !status.is_success() {
        return Err(AuthError::Failed(format!(
            "dynamic client registration was refused: {}",
            oauth_error(&doc, status)
        )));
    }
    let client_id = doc
        .get("client_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| AuthError::Metadata("the registration answer has no `client_id`".into()))?;
    let secret = doc.get("client_secret").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    let method = match doc.get("token_endpoint_auth_method").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => auth_method(server, secret.is_some()),
    };
    Ok(ClientInfo {
        client_id: client_id.to_string(),
        client_secret: secret,
        auth_method: method,
        ..ClientInfo::default()
    })
}

/// A token endpoint's answer.
#[derive(Default)]
pub struct Tokens {
    pub access_token: String,
    pub refresh_token: Option<String>,
    pub expires_in: Option<u64>,
    pub scope: Option<String>,
}

/// POST a grant to the token endpoint with the client's authentication.
pub async fn token(
    http: &reqwest::Client,
    endpoint: &Url,
    client: &ClientInfo,
    params: &[(&str, &str)],
) -> Result<Tokens, AuthError> {
    let assertion: String;
    let mut pairs: Vec<(&str, &str)> = params.to_vec();
    let mut req = http.post(endpoint.clone()).header(reqwest::header::ACCEPT, "application/json");
    let secret = client.client_secret.as_deref();
    match (client.auth_method.as_str(), secret) {
        ("client_secret_basic", Some(secret)) => {
            // RFC 6749 §2.3.1: each part form-encoded, then Basic.
            let user = form(&[("u", &client.client_id)]);
            let pass = form(&[("p", secret)]);
            let creds = format!("{}:{}", &user[2..], &pass[2..]);
            let value = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(creds));
            let mut header = reqwest::header::HeaderValue::from_str(&value)
                .map_err(|_| AuthError::Failed("the client secret cannot be sent in a header".into()))?;
            header.set_sensitive(true);
            req = req.header(reqwest::header::AUTHORIZATION, header);
        }
        ("client_secret_post", Some(secret)) => {
            pairs.push(("client_id", &client.client_id));
            pairs.push(("client_secret", secret));
        }
        ("private_key_jwt", _) => {
            let audience = client.audience.clone().unwrap_or_else(|| endpoint.to_string());
            assertion = client_assertion(client, &audience)?;
            pairs.push(("client_id", &client.client_id));
            pairs.push(("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"));
            pairs.push(("client_assertion", &assertion));
        }
        _ => pairs.push(("client_id", &client.client_id)),
    }
    let resp = req
        .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(form(&pairs))
        .send()
        .await
        .map_err(|e| AuthError::unreachable("the token endpoint", endpoint, &e))?;
    let (status, doc) = read_json(resp, "the token endpoint", endpoint).await?;
    if !status.is_success() {
        return Err(AuthError::Refused(oauth_error(&doc, status)));
    }
    let access_token = doc
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| AuthError::Metadata("the token endpoint's answer has no `access_token`".into()))?;
    if let Some(kind) = doc.get("token_type").and_then(Value::as_str) {
        if !kind.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Failed(format!("the token endpoint issued a `{kind}` token; bramble uses Bearer")));
        }
    }
    Ok(Tokens {
        access_token: access_token.to_string(),
        refresh_token: doc.get("refresh_token").and_then(Value::as_str).map(str::to_string),
        expires_in: doc.get("expires_in").and_then(Value::as_u64),
        scope: doc.get("scope").and_then(Value::as_str).map(str::to_string),
    })
}

/// A signed JWT (ES256) authenticating `client` at `audience` (RFC 7523 §2.2; `private_key_jwt`).
pub fn client_assertion(client: &ClientInfo, audience: &str) -> Result<String, AuthError> {
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let pem =
        client.key_pem.as_deref().ok_or_else(|| AuthError::Failed("the client's private key is not set".into()))?;
    let der: String = pem.lines().filter(|l| !l.starts_with("-----")).map(str::trim).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(der)
        .map_err(|_| AuthError::Failed("the client's private key is not a PEM document".into()))?;
    let rng = ring::rand::SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng).map_err(|_| {
        AuthError::Failed(
            "the client's private key is not an EC P-256 key in PKCS#8 (`-----BEGIN PRIVATE KEY-----`)".into(),
        )
    })?;
    let now = super::store::now();
    let header = json!({"alg": "ES256", "typ": "JWT"});
    let claims = json!({
        "iss": client.client_id, "sub": client.client_id, "aud": audience,
        "iat": now, "exp": now + 300, "jti": random(16)?,
    });
    let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
    let sig = key
        .sign(&rng, input.as_bytes())
        .map_err(|_| AuthError::Failed("signing the client assertion failed".into()))?;
    Ok(format!("{input}.{}", b64(sig.as_ref())))
}

/// `error: description` of an OAuth error answer (RFC 6749 §5.2), or the status.
fn oauth_error(doc: &Value, status: reqwest::StatusCode) -> String {
    let field = |k: &str| doc.get(k).and_then(Value::as_str).map(|s| s.chars().take(200).collect::<String>());
    match (field("error"), field("error_description")) {
        (Some(e), Some(d)) => format!("{e}: {d} (HTTP {status})"),
        (Some(e), None) => format!("{e} (HTTP {status})"),
        _ => format!("HTTP {status}"),
    }
}

/// The status and the JSON body (an object, or `null` when the body is not JSON), read with a cap.
async fn read_json(
    mut resp: reqwest::Response,
    what: &str,
    url: &Url,
) -> Result<(reqwest::StatusCode, Value), AuthError> {
    let status = resp.status();
    if status.is_redirection() {
        return Err(AuthError::Failed(format!("{what} ({url}) answered with a redirect, which is not followed")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| AuthError::unreachable(what, url, &e))? {
        if body.len() + chunk.len() > MAX_METADATA {
            return Err(AuthError::Metadata(format!("{what}'s answer is larger than {} KiB", MAX_METADATA / 1024)));
        }
        body.extend_from_slice(&chunk);
    }
    let doc = serde_json::from_slice::<Value>(&body).unwrap_or(Value::Null);
    if status.is_success() && !doc.is_object() {
        return Err(AuthError::Metadata(format!("{what}'s answer is not a JSON object")));
    }
    Ok((status, doc))
}

/// The client id bramble uses at `server` (no registration): a configured
/// one, else the client metadata document's URL where the server takes it.
pub fn configured_client(
    settings: &crate::config::OAuthSettings,
    server: &Server,
) -> Result<Option<ClientInfo>, AuthError> {
    if let Some(id) = &settings.client_id {
        let secret = match &settings.client_secret_env {
            Some(var) => Some(
                crate::config::secret_from_env(var)
                    .ok_or_else(|| {
                        AuthError::Failed(format!(
                            "client_secret_env names {var}, which is not set (or put it in the service's credentials)"
                        ))
                    })?
                    .expose()
                    .to_string(),
            ),
            None => None,
        };
        if let Some(var) = &settings.client_key_env {
            let pem = crate::config::secret_from_env(var).ok_or_else(|| {
                AuthError::Failed(format!(
                    "client_key_env names {var}, which is not set (or put it in the service's credentials)"
                ))
            })?;
            return Ok(Some(ClientInfo {
                client_id: id.clone(),
                client_secret: None,
                auth_method: "private_key_jwt".into(),
                audience: Some(server.issuer.clone().unwrap_or_else(|| server.token_endpoint.to_string())),
                key_pem: Some(pem.expose().to_string()),
            }));
        }
        let method = auth_method(server, secret.is_some());
        return Ok(Some(ClientInfo {
            client_id: id.clone(),
            client_secret: secret,
            auth_method: method,
            ..ClientInfo::default()
        }));
    }
    if let Some(url) = settings.client_metadata_url.as_ref().filter(|_| server.client_id_metadata_documents) {
        discover::require_secure(url, "client_metadata_url")?;
        return Ok(Some(ClientInfo { client_id: url.clone(), auth_method: "none".into(), ..ClientInfo::default() }));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_is_rfc_7636_s256() {
        // RFC 7636 appendix B.
        assert_eq!(s256("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
        let p = Pkce::new().unwrap();
        assert_eq!(p.verifier.len(), 43);
        assert_ne!(p.verifier, Pkce::new().unwrap().verifier);
        assert_eq!(form(&[("a", "b c&d"), ("e", "é")]), "a=b+c%26d&e=%C3%A9");
    }

    #[test]
    fn client_assertions_are_es256_jwts_for_the_issuer() {
        use ring::signature::{EcdsaKeyPair, KeyPair as _, UnparsedPublicKey, ECDSA_P256_SHA256_FIXED};
        let rng = ring::rand::SystemRandom::new();
        let der = EcdsaKeyPair::generate_pkcs8(&ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let public = EcdsaKeyPair::from_pkcs8(&ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING, der.as_ref(), &rng)
            .unwrap()
            .public_key()
            .as_ref()
            .to_vec();
        let b64std = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
        let pem = format!("-----BEGIN PRIVATE KEY-----\n{b64std}\n-----END PRIVATE KEY-----\n");
        let client = ClientInfo { client_id: "pi".into(), key_pem: Some(pem), ..ClientInfo::default() };
        let jwt = client_assertion(&client, "https://as.example").unwrap();
        let (input, sig) = jwt.rsplit_once('.').unwrap();
        let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(sig).unwrap();
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &public).verify(input.as_bytes(), &sig).unwrap();
        let claims = input.split('.').nth(1).unwrap();
        let claims: Value =
            serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        assert_eq!((claims["iss"].as_str(), claims["sub"].as_str()), (Some("pi"), Some("pi")));
        assert_eq!(claims["aud"], "https://as.example");
        // A key that is not one: a clear error, no panic.
        let bad = ClientInfo {
            key_pem: Some("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----".into()),
            ..client
        };
        assert!(client_assertion(&bad, "x").unwrap_err().to_string().contains("not an EC P-256 key"));
    }
}
