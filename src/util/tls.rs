//! TLS for the HTTP clients, with the CA store loaded at the first https
//! handshake instead of when a client is built.
//!
//! reqwest's own rustls setup builds rustls-platform-verifier's verifier,
//! which reads the whole system CA store at once: 147 files opened under
//! `/etc/ssl/certs` (and ~1 ms) before a `bramble agent -m` against a LAN
//! model over plain `http://` — which never needs a certificate — sends a
//! byte. [`client_config`] gives reqwest the same verifier behind a
//! [`OnceLock`]: built on the first certificate to check, then shared by
//! the clients that use it (the providers' and Telegram's: one copy of the
//! CA store in memory instead of one per client). Nothing about
//! verification changes: the same platform verifier, the same crypto
//! provider, HTTP/1.1 ALPN.
//!
//! `web_fetch`'s client keeps reqwest's own setup: it is built at the first
//! fetch anyway (an https one, nearly always), and giving it this config
//! cost 94 KB of binary (measured) for no saving.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// A rustls client config for reqwest (`tls_backend_preconfigured`): the
/// platform verifier, made on first use; HTTP/1.1 ALPN.
pub fn client_config() -> rustls::ClientConfig {
    let provider =
        CryptoProvider::get_default().cloned().unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let verifier = Arc::new(LazyVerifier { provider: provider.clone() });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| rustls::ClientConfig::builder_with_protocol_versions(rustls::DEFAULT_VERSIONS))
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// The platform verifier, built when the first certificate is checked.
#[derive(Debug)]
struct LazyVerifier {
    provider: Arc<CryptoProvider>,
}

/// The process's one platform verifier (and CA store). Only a success is
/// kept: a store that could not be read (mid-upgrade of ca-certificates) is
/// tried again at the next handshake.
static PLATFORM: OnceLock<rustls_platform_verifier::Verifier> = OnceLock::new();

/// Whether the CA store has been loaded in this process (for tests).
pub fn ca_store_loaded() -> bool {
    PLATFORM.get().is_some()
}

impl LazyVerifier {
    fn get(&self) -> Result<&'static rustls_platform_verifier::Verifier, rustls::Error> {
        if let Some(v) = PLATFORM.get() {
            return Ok(v);
        }
        match rustls_platform_verifier::Verifier::new(self.provider.clone()) {
            Ok(v) => Ok(PLATFORM.get_or_init(|| v)),
            Err(e) => Err(rustls::Error::General(format!("cannot load the system's CA certificates: {e}"))),
        }
    }
}

impl ServerCertVerifier for LazyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.get()?.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.get()?.verify_tls13_signature(message, cert, dss)
    }

    /// What the ClientHello offers: the provider's schemes (what the platform
    /// verifier returns too), without loading anything.
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
