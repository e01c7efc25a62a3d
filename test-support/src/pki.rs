//! A throw-away PKI for TLS tests, generated at test time (no key is ever committed):
//! a CA, a server certificate for `localhost` / 127.0.0.1, a client certificate from the
//! same CA, and a client certificate from an unrelated CA (which must be refused).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

pub struct Pem {
    pub cert: PathBuf,
    pub key: PathBuf,
}

pub struct TestPki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server: Pem,
    pub client: Pem,
    /// Signed by another CA: servers that trust only `ca` must refuse it.
    pub untrusted_client: Pem,
}

fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().expect("ca key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let cert = params.self_signed(&key).expect("self-signed ca");
    (cert, Issuer::new(params, key))
}

fn leaf(dir: &Path, name: &str, issuer: &Issuer<'_, KeyPair>, purpose: ExtendedKeyUsagePurpose) -> Pem {
    let key = KeyPair::generate().expect("leaf key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![purpose];
    let cert = params.signed_by(&key, issuer).expect("signed leaf");
    let pem = Pem { cert: dir.join(format!("{name}.crt")), key: dir.join(format!("{name}.key")) };
    std::fs::write(&pem.cert, cert.pem()).expect("write cert");
    std::fs::write(&pem.key, key.serialize_pem()).expect("write key");
    pem
}

impl TestPki {
    pub fn generate() -> Self {
        let dir = std::env::temp_dir().join(format!("inventory-pki-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("pki dir");
        let (ca_cert, issuer) = ca("inventory test ca");
        let ca_path = dir.join("ca.crt");
        std::fs::write(&ca_path, ca_cert.pem()).expect("write ca");
        let server = leaf(&dir, "server", &issuer, ExtendedKeyUsagePurpose::ServerAuth);
        let client = leaf(&dir, "client", &issuer, ExtendedKeyUsagePurpose::ClientAuth);
        let (_, rogue) = ca("rogue ca");
        let untrusted_client = leaf(&dir, "rogue-client", &rogue, ExtendedKeyUsagePurpose::ClientAuth);
        Self { dir, ca: ca_path, server, client, untrusted_client }
    }

    pub fn read(path: &Path) -> String {
        std::fs::read_to_string(path).expect("read pem")
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
