//! TLS on the hop from onepoold's router to a replica's launcher (issue
//! #36), with no certificate authority for a site to run.
//!
//! The launcher makes a key pair and a self-signed certificate at each
//! start ([`Identity::generate`]; the key never leaves its memory) and
//! reports the SHA-256 of the certificate's DER ([`Fingerprint`]) with its
//! port in the job's comment, which only onepoold's user and Slurm's
//! administrators can write ([`crate::conventions::ReplicaNote`]). The
//! router accepts exactly that certificate ([`pinned_client`]): a name or
//! a chain would prove nothing more, and a certificate that merely looks
//! right (another job's, a copied one without its key) fails either the
//! pin or the handshake's signature. The router proves itself inside the
//! session with the replica key it already sends on every request, so the
//! key and the prompts no longer cross the cluster network in clear.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme};

/// The name the router asks for and the certificate carries. Nothing
/// checks it (the pin does the work); it is there because TLS sends one.
pub const SERVER_NAME: &str = "onepool-replica";

/// SHA-256 of a certificate's DER, as the note carries it (64 lower-case
/// hex digits).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(der: &[u8]) -> Fingerprint {
        let d = ring::digest::digest(&ring::digest::SHA256, der);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        Fingerprint(out)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl FromStr for Fingerprint {
    type Err = String;
    fn from_str(s: &str) -> Result<Fingerprint, String> {
        let b = s.as_bytes();
        if b.len() != 64 {
            return Err(format!("a certificate fingerprint is 64 hex digits, not {} characters", b.len()));
        }
        let digit = |c: u8| (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
        let mut out = [0u8; 32];
        for (i, pair) in b.chunks_exact(2).enumerate() {
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => out[i] = (h * 16 + l) as u8,
                _ => return Err("a certificate fingerprint is lower-case hex digits only".into()),
            }
        }
        Ok(Fingerprint(out))
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A launcher's certificate and the server side of its TLS.
pub struct Identity {
    pub config: Arc<ServerConfig>,
    pub fingerprint: Fingerprint,
}

impl Identity {
    /// A new ECDSA P-256 key and a self-signed certificate for it.
    pub fn generate() -> Result<Identity, String> {
        let made = rcgen::generate_simple_self_signed(vec![SERVER_NAME.to_string()])
            .map_err(|e| format!("cannot make the replica's certificate: {e}"))?;
        let der = made.cert.der().clone();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.key_pair.serialize_der()));
        let fingerprint = Fingerprint::of(&der);
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| format!("TLS 1.3: {e}"))?
            .with_no_client_auth()
            .with_single_cert(vec![der], key)
            .map_err(|e| format!("the replica's certificate: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        // No session tickets: the router keeps its connections instead of
        // resuming, and a ticket arriving on an idle pooled connection
        // would read as the replica sending something unasked.
        config.send_tls13_tickets = 0;
        Ok(Identity { config: Arc::new(config), fingerprint })
    }
}

/// The router's side of one replica's TLS.
#[derive(Clone)]
pub struct PinnedClient {
    pub config: Arc<ClientConfig>,
    /// [`SERVER_NAME`], sent in the handshake.
    pub name: ServerName<'static>,
    pub pin: Fingerprint,
}

impl fmt::Debug for PinnedClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedClient({})", self.pin)
    }
}

/// The router's side: accepts the one certificate whose fingerprint is
/// `pin`, and checks the handshake's signature with its key (so only the
/// holder of that key passes).
pub fn pinned_client(pin: Fingerprint) -> Result<PinnedClient, String> {
    let provider = provider();
    let verifier = Arc::new(Pinned { pin, provider: provider.clone() });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| format!("TLS 1.3: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.resumption = rustls::client::Resumption::disabled();
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| format!("{SERVER_NAME}: {e}"))?.to_owned();
    Ok(PinnedClient { config: Arc::new(config), name, pin })
}

#[derive(Debug)]
struct Pinned {
    pin: Fingerprint,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if Fingerprint::of(end_entity) == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
