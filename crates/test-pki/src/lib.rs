//! A throwaway PKI for tests of TLS (and benchmarks against servers they start): a CA ("ca.pem"), certificates it signed for loopback
//! ("server") and for a client ("client"), and two from another CA nobody is told to trust
//! ("other-ca.pem"): a client ("intruder") and one for loopback ("impostor"). Each
//! certificate is `NAME.pem` with its key `NAME.key`, PEM, in a directory of the test's
//! own, removed when the [`TestPki`] is dropped.
//!
//! Must never: secure anything but a test's or a benchmark's own servers on loopback (its
//! keys are written in the clear to a temporary directory).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::path::{Path, PathBuf};

pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Makes the PKI in a fresh directory named after `name` (and this process).
    pub fn new(name: &str) -> Result<TestPki, String> {
        let dir =
            std::env::temp_dir().join(format!("stateplane-test-pki-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let pki = TestPki { dir };
        let (ours, other) = (ca("stateplane test CA")?, ca("another CA")?);
        pki.file("ca.pem", &ours.pem())?;
        pki.file("other-ca.pem", &other.pem())?;
        pki.leaf(&ours, &["127.0.0.1", "localhost"], "server")?;
        pki.leaf(&ours, &["operator"], "client")?;
        pki.leaf(&other, &["intruder"], "intruder")?;
        pki.leaf(&other, &["127.0.0.1"], "impostor")?;
        Ok(pki)
    }

    /// The path of the PKI's file `name` ("ca.pem", "client.key").
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A server's files for loopback: its certificate and key, and the CA that signed it
    /// (which checks its clients' certificates).
    pub fn server_files(&self) -> [PathBuf; 3] {
        ["server.pem", "server.key", "ca.pem"].map(|name| self.path(name))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes `text` into the file `name` of the PKI's directory and gives its path.
    pub fn file(&self, name: &str, text: &str) -> Result<PathBuf, String> {
        let path = self.path(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path)
    }

    /// A certificate for `sans` that `ca` signed, as `name.pem` and `name.key`.
    fn leaf(
        &self,
        ca: &CertifiedIssuer<'_, KeyPair>,
        sans: &[&str],
        name: &str,
    ) -> Result<(), String> {
        let key = KeyPair::generate().map_err(|e| format!("a key: {e}"))?;
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let cert = (CertificateParams::new(sans).and_then(|p| p.signed_by(&key, ca)))
            .map_err(|e| format!("the certificate {name}: {e}"))?;
        self.file(&format!("{name}.pem"), &cert.pem())?;
        self.file(&format!("{name}.key"), &key.serialize_pem())?;
        Ok(())
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A self-signed CA named `name`.
fn ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>, String> {
    let mut params =
        CertificateParams::new(Vec::<String>::new()).map_err(|e| format!("the CA {name}: {e}"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().map_err(|e| format!("a key: {e}"))?;
    CertifiedIssuer::self_signed(params, key).map_err(|e| format!("the CA {name}: {e}"))
}
