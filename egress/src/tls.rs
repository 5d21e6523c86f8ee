//! TLS for the process's outbound HTTPS clients (this crate's, and the LLM and Discord
//! clients'): rustls with aws-lc, the platform's verifier and roots.
//!
//! Reading the platform's roots (a bundle of ~150 certificates, and on some systems a
//! directory of them) is the largest single cost of a Lambda function's init. The
//! verifier here reads them on the first certificate it has to check, once per process,
//! and every client shares them; building a client reads no file.

use std::sync::{Arc, LazyLock, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};

/// The platform verifier, made on first use: `Err` says why no roots could be loaded.
static PLATFORM: OnceLock<Result<Arc<rustls_platform_verifier::Verifier>, String>> =
    OnceLock::new();

static CONFIG: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|e| panic!("aws-lc-rs offers TLS 1.2 and 1.3: {e}"))
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(LazyPlatformVerifier { provider }))
        .with_no_client_auth();
    Arc::new(config)
});

/// The client configuration every outbound HTTPS client of the process shares. Cheap:
/// the roots are read on the first handshake (see the module's documentation).
pub fn client_config() -> Arc<ClientConfig> {
    CONFIG.clone()
}

/// The platform verifier, created when the first server certificate is to be checked.
/// Signatures are checked with the provider's algorithms, which is what the platform
/// verifier does too, so a handshake's early steps need no roots.
#[derive(Debug)]
struct LazyPlatformVerifier {
    provider: Arc<CryptoProvider>,
}

impl LazyPlatformVerifier {
    fn platform(&self) -> Result<&rustls_platform_verifier::Verifier, rustls::Error> {
        PLATFORM
            .get_or_init(|| {
                rustls_platform_verifier::Verifier::new(self.provider.clone())
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .as_deref()
            .map_err(|e| {
                rustls::Error::General(format!("no TLS roots could be loaded on this system: {e}"))
            })
    }
}

impl ServerCertVerifier for LazyPlatformVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.platform()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: both halves observe the process-wide verifier.
    #[test]
    fn the_config_reads_no_roots_until_a_certificate_is_checked() {
        let config = client_config();
        assert!(
            PLATFORM.get().is_none(),
            "roots were read to build a config"
        );
        assert!(Arc::ptr_eq(&config, &client_config()));

        // Not DER: the platform verifier refuses it, so it was created and consulted.
        let verifier = LazyPlatformVerifier {
            provider: config.crypto_provider().clone(),
        };
        let err = verifier
            .verify_server_cert(
                &CertificateDer::from(vec![1, 2, 3]),
                &[],
                &ServerName::try_from("example.com").unwrap(),
                &[],
                UnixTime::now(),
            )
            .unwrap_err();
        assert!(PLATFORM.get().is_some_and(|p| p.is_ok()), "{err}");
    }
}
