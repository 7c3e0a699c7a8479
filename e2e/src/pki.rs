//! The lab's certificates: a CA, the API server's serving certificate, one client certificate per
//! component (admin, kube-controller-manager, kube-proxy), the ServiceAccount signing key, and a
//! kubeconfig per component.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// Paths of the generated files.
#[derive(Clone, Debug)]
pub struct Pki {
    /// Directory holding everything.
    pub dir: PathBuf,
}

/// A client identity: user name (CN) and groups (O).
pub struct Identity<'a> {
    /// File stem and kubeconfig name.
    pub file: &'a str,
    /// User name.
    pub user: &'a str,
    /// Groups.
    pub groups: &'a [&'a str],
}

/// The client identities the lab issues.
pub const IDENTITIES: &[Identity<'static>] = &[
    Identity {
        file: "admin",
        user: "ferrolb-lab-admin",
        groups: &["system:masters"],
    },
    Identity {
        file: "kube-controller-manager",
        user: "system:kube-controller-manager",
        groups: &[],
    },
    Identity {
        file: "kube-proxy",
        user: "system:kube-proxy",
        groups: &[],
    },
    // The scheduler, run on kubelet labs (`up --kubelet`).
    Identity {
        file: "kube-scheduler",
        user: "system:kube-scheduler",
        groups: &[],
    },
    // The API server towards the kubelets (logs, exec, the pods proxy).
    Identity {
        file: "apiserver-kubelet-client",
        user: "kube-apiserver-kubelet-client",
        groups: &["system:masters"],
    },
];

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

impl Pki {
    /// Path of a file in the PKI directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Path of a component's kubeconfig.
    pub fn kubeconfig(&self, file: &str) -> PathBuf {
        self.dir.join(format!("{file}.kubeconfig"))
    }

    /// Generates everything unless it already exists (keeps certificates across `up` runs).
    pub fn ensure(dir: &Path, server: &str, server_ips: &[IpAddr]) -> anyhow::Result<Self> {
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        // Certificates are kept across `up`s, unless the server's names changed.
        let stamp = format!("{server} {server_ips:?}");
        if pki.path("ca.crt").exists()
            && pki.path("ca.key").exists()
            && IDENTITIES.iter().all(|id| pki.kubeconfig(id.file).exists())
            && pki.path("server").exists()
            && std::fs::read_to_string(pki.path("names")).is_ok_and(|s| s == stamp)
        {
            return Ok(pki);
        }
        std::fs::create_dir_all(dir)?;
        // Kubelet identities are issued on demand (`issue_node`) from the CA made here: those of
        // an earlier CA would be refused.
        for entry in std::fs::read_dir(dir)?.filter_map(Result::ok) {
            if entry.file_name().to_string_lossy().starts_with("node-") {
                std::fs::remove_file(entry.path())?;
            }
        }
        let ca_key = KeyPair::generate()?;
        write(&pki.path("ca.key"), &ca_key.serialize_pem())?;
        let ca = CertifiedIssuer::self_signed(ca_params()?, ca_key)?;
        write(&pki.path("ca.crt"), &ca.pem())?;

        let mut sans: Vec<String> = vec![
            "localhost".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
            "127.0.0.1".into(),
        ];
        sans.extend(server_ips.iter().map(ToString::to_string));
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name = name("kube-apiserver", &[]);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate()?;
        write(
            &pki.path("apiserver.crt"),
            &params.signed_by(&key, &ca)?.pem(),
        )?;
        write(&pki.path("apiserver.key"), &key.serialize_pem())?;

        let sa = KeyPair::generate()?;
        write(&pki.path("sa.key"), &sa.serialize_pem())?;
        write(&pki.path("sa.pub"), &sa.public_key_pem())?;

        for id in IDENTITIES {
            pki.write_identity(&ca, server, id)?;
        }
        write(&pki.path("names"), &stamp)?;
        write(&pki.path("server"), server)?;
        Ok(pki)
    }

    /// A client certificate, its key and a kubeconfig for `id`, signed by `ca`.
    fn write_identity<S: rcgen::SigningKey>(
        &self,
        ca: &rcgen::Issuer<'_, S>,
        server: &str,
        id: &Identity<'_>,
    ) -> anyhow::Result<PathBuf> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = name(id.user, id.groups);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate()?;
        write(
            &self.path(&format!("{}.crt", id.file)),
            &params.signed_by(&key, ca)?.pem(),
        )?;
        write(
            &self.path(&format!("{}.key", id.file)),
            &key.serialize_pem(),
        )?;
        write(
            &self.kubeconfig(id.file),
            &self.kubeconfig_text(server, id.file),
        )?;
        Ok(self.kubeconfig(id.file))
    }

    /// The kubeconfig of node `node`'s kubelet (user `system:node:<node>`, group `system:nodes`,
    /// as the API server's Node authorizer expects), issued on first use.
    pub fn issue_node(&self, node: &str) -> anyhow::Result<PathBuf> {
        let file = format!("node-{node}");
        if self.kubeconfig(&file).exists() {
            return Ok(self.kubeconfig(&file));
        }
        let key_pem = std::fs::read_to_string(self.path("ca.key")).context("reading ca.key")?;
        let ca = rcgen::Issuer::new(ca_params()?, KeyPair::from_pem(&key_pem)?);
        let server = std::fs::read_to_string(self.path("server")).context("reading server")?;
        let user = format!("system:node:{node}");
        self.write_identity(
            &ca,
            &server,
            &Identity {
                file: &file,
                user: &user,
                groups: &["system:nodes"],
            },
        )
    }

    fn kubeconfig_text(&self, server: &str, file: &str) -> String {
        let d = self.dir.display();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {d}/ca.crt\nusers:\n- name: {file}\n  user:\n    client-certificate: {d}/{file}.crt\n    client-key: {d}/{file}.key\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: {file}}}\ncurrent-context: lab\n"
        )
    }

    /// A kubeconfig for a bearer token (ServiceAccounts of ferrolb's components).
    pub fn token_kubeconfig(&self, server: &str, user: &str, token: &str) -> String {
        let d = self.dir.display();
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {server}\n    certificate-authority: {d}/ca.crt\nusers:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: {user}}}\ncurrent-context: lab\n"
        )
    }
}

/// The lab CA's parameters: the same each time, so a stored key makes the same issuer again.
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = name("ferrolb-lab-ca", &[]);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

fn name(common: &str, groups: &[&str]) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common);
    for g in groups {
        dn.push(DnType::OrganizationName, *g);
    }
    dn
}
