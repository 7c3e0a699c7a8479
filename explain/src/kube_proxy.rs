//! kube-proxy's chain names for a Service, computed as kube-proxy computes them.
//!
//! `kubectl ferrolb explain` shows a user which kube-proxy chains a LoadBalancer IP leads to on a
//! node, so that `iptables-save | grep` or `nft list chain` finds them. kube-proxy derives every
//! per-Service name from a SHA-256 hash of the Service port's identity; this module repeats that
//! derivation byte for byte, for both of kube-proxy's Linux modes:
//!
//! - [`iptables`]: `KUBE-SVC-…`, `KUBE-SVL-…`, `KUBE-EXT-…`, `KUBE-FW-…` and `KUBE-SEP-…`
//!   (kubernetes `pkg/proxy/iptables/proxier.go`);
//! - [`nftables`]: `service-…`, `local-…`, `external-…`, `firewall-…`, `endpoint-…` and
//!   `affinity-…` in the `ip kube-proxy` / `ip6 kube-proxy` tables
//!   (kubernetes `pkg/proxy/nftables/proxier.go`).
//!
//! The algorithm was read from Kubernetes v1.37.2, the version the lab runs; the evidence (files,
//! functions, test vectors) is in `docs/decisions/0021-kube-proxy-chain-names.md`. Other
//! versions were not checked.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use data_encoding::BASE32;
use sha2::{Digest, Sha256};

/// A Service port's transport protocol, as `Service.spec.ports[].protocol` names it.
///
/// kube-proxy hashes the protocol in lower case (`strings.ToLower(string(svcPort.Protocol()))`),
/// so `TCP` in the API is `tcp` in every chain name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// `TCP`, the API's default when a port names no protocol.
    Tcp,
    /// `UDP`.
    Udp,
    /// `SCTP`.
    Sctp,
}

impl Protocol {
    /// The spelling of the Kubernetes API: `TCP`, `UDP` or `SCTP`.
    pub const fn api_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// The spelling kube-proxy hashes and writes into nftables chain names: `tcp`, `udp` or
    /// `sctp`.
    pub const fn kube_proxy_name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }
}

impl fmt::Display for Protocol {
    /// Writes the API's spelling (`TCP`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.api_name())
    }
}

/// A protocol that is not one of the API's `TCP`, `UDP` or `SCTP`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProtocol(pub String);

impl fmt::Display for UnknownProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown protocol {:?}: expected TCP, UDP or SCTP",
            self.0
        )
    }
}

impl std::error::Error for UnknownProtocol {}

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    /// Parses the API's spelling, exactly (`TCP`, `UDP`, `SCTP`): the API server accepts no
    /// other case, so another spelling is a mistake worth reporting.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "TCP" => Ok(Protocol::Tcp),
            "UDP" => Ok(Protocol::Udp),
            "SCTP" => Ok(Protocol::Sctp),
            other => Err(UnknownProtocol(other.to_owned())),
        }
    }
}

/// One port of one Service: what kube-proxy calls a `ServicePortName` (namespace, Service name,
/// port name) together with the port's protocol.
///
/// The names are used verbatim, as kube-proxy uses them. The API server only admits DNS labels
/// for the namespace, the Service and the port name (lower-case ASCII letters, digits and `-`),
/// so chain names built from real objects contain no space and fit the limits checked in the
/// tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServicePort<'a> {
    /// The Service's namespace (`metadata.namespace`).
    pub namespace: &'a str,
    /// The Service's name (`metadata.name`).
    pub name: &'a str,
    /// The port's name (`spec.ports[].name`); empty when the port has no name, which the API
    /// allows only for a Service with a single port.
    pub port_name: &'a str,
    /// The port's protocol (`spec.ports[].protocol`, `TCP` when absent).
    pub protocol: Protocol,
}

impl<'a> ServicePort<'a> {
    /// A Service port from its namespace, Service name, port name (empty for an unnamed port)
    /// and protocol.
    pub const fn new(
        namespace: &'a str,
        name: &'a str,
        port_name: &'a str,
        protocol: Protocol,
    ) -> Self {
        ServicePort {
            namespace,
            name,
            port_name,
            protocol,
        }
    }
}

impl fmt::Display for ServicePort<'_> {
    /// Writes kube-proxy's `ServicePortName.String()`: `namespace/name:portname`, or
    /// `namespace/name` when the port has no name. This is the text the iptables chain hashes
    /// cover and the comment kube-proxy puts on its iptables rules.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port_name.is_empty() {
            write!(f, ":{}", self.port_name)?;
        }
        Ok(())
    }
}

/// An endpoint address as kube-proxy writes it (`net.JoinHostPort(ip, port)` over the IP that
/// `netutils.ParseIPSloppy(address).String()` gives): `10.0.0.1:80`, `[fd00::1]:80`.
///
/// Go prints IPv6 addresses as RFC 5952 says (lower case, no leading zeros, `::` for the first
/// longest run of two or more zero groups), as Rust's `Ipv6Addr` does, except that Go prints an
/// IPv4-mapped address (`::ffff:a.b.c.d`) as the plain IPv4 address. A scope id is not part of an
/// EndpointSlice address and is left out.
fn endpoint_string(endpoint: SocketAddr) -> String {
    let ip = match endpoint.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 @ IpAddr::V4(_) => v4,
    };
    match ip {
        IpAddr::V4(v4) => format!("{v4}:{}", endpoint.port()),
        IpAddr::V6(v6) => format!("[{v6}]:{}", endpoint.port()),
    }
}

/// `base32.StdEncoding.EncodeToString(sha256.Sum256([]byte(concatenation of parts)))`, the
/// hash behind every per-Service name in both modes. The caller truncates it.
fn sha256_base32(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
    }
    BASE32.encode(&hasher.finalize())
}

/// The longest prefix of `s` of at most `max` bytes. kube-proxy slices bytes (`name[:n]`); the
/// names it slices are ASCII, and for any other text this stops at the last whole character.
fn truncate_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

pub mod iptables {
    //! kube-proxy's iptables mode (`pkg/proxy/iptables/proxier.go`).
    //!
    //! # The path of a LoadBalancer IP
    //!
    //! In the `nat` table, `PREROUTING` (and `OUTPUT`) jump to [`SERVICES`]. There one rule per
    //! LoadBalancer IP and port (comment `"<ns>/<svc>:<port> loadbalancer IP"`, written only while
    //! the Service has endpoints) jumps to [`firewall_chain`] when the Service has
    //! `loadBalancerSourceRanges`, else to [`external_chain`]. The firewall chain sends the admitted
    //! sources on to the external chain; the rest fall through and are dropped in the `filter`
    //! table's [`PROXY_FIREWALL`]. The external chain marks for masquerade ([`MARK_MASQ`]) and jumps
    //! to [`service_chain`] (`externalTrafficPolicy: Cluster`) or [`local_chain`] (`Local`, after
    //! sending pod and node traffic to the service chain). Those pick one [`endpoint_chain`] at
    //! random, which DNATs to the endpoint. [`POSTROUTING`] masquerades what was marked.
    //! Traffic to a LoadBalancer IP with no (local) endpoints is rejected or dropped in the `filter`
    //! table's [`EXTERNAL_SERVICES`].

    use std::net::SocketAddr;

    use super::{ServicePort, endpoint_string, sha256_base32};

    /// The longest chain name iptables accepts (`XT_EXTENSION_MAXNAMELEN` is 29 with the
    /// terminating NUL). kube-proxy truncates its hashes to 16 characters to stay under it.
    pub const CHAIN_NAME_MAX_LEN: usize = 28;

    /// How many base32 characters of the SHA-256 hash kube-proxy keeps (`encoded[:16]`).
    pub const HASH_LEN: usize = 16;

    /// Prefix of the cluster-policy service chain (`servicePortPolicyClusterChainNamePrefix`).
    pub const SERVICE_CHAIN_PREFIX: &str = "KUBE-SVC-";
    /// Prefix of the local-policy service chain (`servicePortPolicyLocalChainNamePrefix`).
    pub const LOCAL_CHAIN_PREFIX: &str = "KUBE-SVL-";
    /// Prefix of the external traffic chain (`serviceExternalChainNamePrefix`).
    pub const EXTERNAL_CHAIN_PREFIX: &str = "KUBE-EXT-";
    /// Prefix of the `loadBalancerSourceRanges` chain (`serviceFirewallChainNamePrefix`).
    pub const FIREWALL_CHAIN_PREFIX: &str = "KUBE-FW-";
    /// Prefix of an endpoint chain (`servicePortEndpointChainNamePrefix`).
    pub const ENDPOINT_CHAIN_PREFIX: &str = "KUBE-SEP-";

    /// `nat` and `filter`: the dispatch chain, entered from `PREROUTING` and `OUTPUT` (`nat`),
    /// and from `FORWARD` and `OUTPUT` for new connections (`filter`, rejecting ClusterIP
    /// traffic of Services without endpoints).
    pub const SERVICES: &str = "KUBE-SERVICES";
    /// `filter`: drops or rejects new connections to external and LoadBalancer IPs of Services
    /// without (local) endpoints; entered from `INPUT` and `FORWARD`.
    pub const EXTERNAL_SERVICES: &str = "KUBE-EXTERNAL-SERVICES";
    /// `nat`: NodePort dispatch, the last rule of [`SERVICES`] for local destinations;
    /// `filter`: health check node ports, from `INPUT`.
    pub const NODE_PORTS: &str = "KUBE-NODEPORTS";
    /// `nat`: masquerades what [`MARK_MASQ`] marked; entered from `POSTROUTING`.
    pub const POSTROUTING: &str = "KUBE-POSTROUTING";
    /// `nat`: sets the masquerade mark (`0x4000` by default).
    pub const MARK_MASQ: &str = "KUBE-MARK-MASQ";
    /// `filter`: accepts marked and established forwarded traffic; entered from `FORWARD`.
    pub const FORWARD: &str = "KUBE-FORWARD";
    /// `filter`: drops LoadBalancer traffic that a [`firewall_chain`] did not admit; entered
    /// from `INPUT`, `OUTPUT` and `FORWARD` for new connections.
    pub const PROXY_FIREWALL: &str = "KUBE-PROXY-FIREWALL";
    /// `mangle`, `nat` and `filter`: an empty chain kube-proxy watches to notice that something
    /// flushed its rules.
    pub const PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
    /// `filter`: kubelet's anti-martian chain (`127.0.0.0/8` from elsewhere), which kube-proxy
    /// also creates.
    pub const FIREWALL: &str = "KUBE-FIREWALL";

    /// kube-proxy's `portProtoHash`: the first 16 characters of
    /// base32(SHA-256(`ServicePortName.String()` + lower-case protocol)).
    fn port_proto_hash(port: &ServicePort<'_>) -> String {
        let name = port.to_string();
        let mut hash = sha256_base32(&[&name, port.protocol.kube_proxy_name()]);
        hash.truncate(HASH_LEN);
        hash
    }

    /// `KUBE-SVC-<hash>`: the service port's main chain, which picks an endpoint among all
    /// ready endpoints (`Cluster` traffic policy) (`servicePortPolicyClusterChain`).
    pub fn service_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).service
    }

    /// `KUBE-SVL-<hash>`: picks an endpoint among this node's endpoints (`Local` traffic
    /// policy); exists only when the Service has a `Local` policy
    /// (`servicePortPolicyLocalChainName`).
    pub fn local_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).local
    }

    /// `KUBE-EXT-<hash>`: where traffic to external IPs, LoadBalancer IPs and node ports goes
    /// first (`serviceExternalChainName`).
    pub fn external_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).external
    }

    /// `KUBE-FW-<hash>`: admits the `loadBalancerSourceRanges` to the external chain; exists
    /// only when the Service has source ranges (`serviceFirewallChainName`).
    pub fn firewall_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).firewall
    }

    /// `KUBE-SEP-<hash>`: the chain that DNATs to one endpoint of the service port
    /// (`servicePortEndpointChainName`). The hash covers the endpoint as kube-proxy writes it,
    /// `ip:port` (`[ip]:port` for IPv6), after the service port's name and protocol.
    pub fn endpoint_chain(port: &ServicePort<'_>, endpoint: SocketAddr) -> String {
        endpoint_chain_from_str(port, &endpoint_string(endpoint))
    }

    /// [`endpoint_chain`] over kube-proxy's endpoint string itself.
    fn endpoint_chain_from_str(port: &ServicePort<'_>, endpoint: &str) -> String {
        let name = port.to_string();
        let hash = sha256_base32(&[&name, port.protocol.kube_proxy_name(), endpoint]);
        format!("{ENDPOINT_CHAIN_PREFIX}{}", &hash[..HASH_LEN])
    }

    /// Whether `chain` is one of kube-proxy's per-Service or per-endpoint chains rather than a
    /// fixed one (`isServiceChainName`).
    pub fn is_service_chain(chain: &str) -> bool {
        [
            SERVICE_CHAIN_PREFIX,
            LOCAL_CHAIN_PREFIX,
            ENDPOINT_CHAIN_PREFIX,
            FIREWALL_CHAIN_PREFIX,
            EXTERNAL_CHAIN_PREFIX,
        ]
        .iter()
        .any(|prefix| chain.starts_with(prefix))
    }

    /// The four chains of one service port, which share one hash; computed once.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    pub struct ServiceChains {
        /// `KUBE-SVC-…`, see [`service_chain`].
        pub service: String,
        /// `KUBE-SVL-…`, see [`local_chain`].
        pub local: String,
        /// `KUBE-EXT-…`, see [`external_chain`].
        pub external: String,
        /// `KUBE-FW-…`, see [`firewall_chain`].
        pub firewall: String,
    }

    impl ServiceChains {
        /// The chains of `port`.
        pub fn new(port: &ServicePort<'_>) -> Self {
            let hash = port_proto_hash(port);
            ServiceChains {
                service: format!("{SERVICE_CHAIN_PREFIX}{hash}"),
                local: format!("{LOCAL_CHAIN_PREFIX}{hash}"),
                external: format!("{EXTERNAL_CHAIN_PREFIX}{hash}"),
                firewall: format!("{FIREWALL_CHAIN_PREFIX}{hash}"),
            }
        }
    }
}

pub mod nftables {
    //! kube-proxy's nftables mode (`pkg/proxy/nftables/proxier.go`).
    //!
    //! Everything lives in one table per IP family, `ip kube-proxy` and `ip6 kube-proxy`
    //! ([`Family::table`]); names need no `KUBE-` prefix. A per-Service name is
    //! `<prefix><hash>-<ns>/<svc>/<proto>/<portname>`, where `<hash>` is the first 8 base32
    //! characters of SHA-256 of the part after it, e.g. `service-ULMVA6XW-ns1/svc1/tcp/p80`.
    //! An endpoint's adds `__<ip>/<port>` with the IPv6 colons written as dots, e.g.
    //! `endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80`.
    //!
    //! # The path of a LoadBalancer IP
    //!
    //! The base chain [`NAT_PREROUTING`] (and [`NAT_OUTPUT`]) jumps to [`SERVICES`], whose rule
    //! `ip daddr . meta l4proto . th dport vmap @service-ips` looks the packet up in the map
    //! [`SERVICE_IPS`]: the element `<lb-ip> . tcp . <port>` (present while the Service has
    //! endpoints) says `goto` [`external_chain`]. That chain marks for masquerade and goes to
    //! [`service_chain`] (`Cluster` policy) or [`local_chain`] (`Local`). Those DNAT to an endpoint
    //! directly (`dnat to <ip>:<port>`, or a `numgen random` map over several); only a Service with
    //! `sessionAffinity: ClientIP` has per-endpoint chains ([`endpoint_chain`]) and affinity sets
    //! ([`affinity_set`]) in between. [`MASQUERADING`], from [`NAT_POSTROUTING`], masquerades what
    //! was marked.
    //!
    //! Before DNAT, [`FILTER_PREROUTING_PRE_DNAT`] (and [`FILTER_OUTPUT_PRE_DNAT`]) jump to
    //! [`FIREWALL_CHECK`] for new connections, whose map [`FIREWALL_IPS`] sends a LoadBalancer IP
    //! with `loadBalancerSourceRanges` to [`firewall_chain`], which drops the other sources. The
    //! filter chains jump to [`SERVICE_ENDPOINTS_CHECK`], whose map [`NO_ENDPOINT_SERVICES`] drops
    //! (no local endpoints) or rejects (no endpoints, via [`REJECT_CHAIN`]) traffic to a Service
    //! IP that has nowhere to go.

    use std::fmt;
    use std::net::{IpAddr, SocketAddr};

    use super::{Protocol, ServicePort, endpoint_string, sha256_base32, truncate_bytes};

    /// The name of kube-proxy's table in both families (`kubeProxyTable`).
    pub const TABLE_NAME: &str = "kube-proxy";

    /// The longest name nftables accepts (`knftables.NameLengthMax`).
    pub const NAME_LENGTH_MAX: usize = 256;

    /// How many base32 characters of the SHA-256 hash kube-proxy keeps (`encoded[:8]`).
    pub const HASH_LEN: usize = 8;

    /// The longest prefix kube-proxy allows itself, hyphen included
    /// (`chainNamePrefixLengthMax`).
    const CHAIN_NAME_PREFIX_LENGTH_MAX: usize = 16;

    /// The longest `<hash>-<ns>/…` part (`chainNameBaseLengthMax`); longer ones are truncated
    /// and end in `...`.
    pub const CHAIN_NAME_BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - CHAIN_NAME_PREFIX_LENGTH_MAX;

    /// An nftables address family kube-proxy runs a table in: one per IP family of the
    /// cluster.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Family {
        /// `ip`: IPv4 (`knftables.IPv4Family`).
        Ip,
        /// `ip6`: IPv6 (`knftables.IPv6Family`).
        Ip6,
    }

    impl Family {
        /// The family whose table handles traffic to `addr`. An IPv4-mapped IPv6 address
        /// counts as IPv4, as Go's `net.IP` treats it.
        pub fn of(addr: IpAddr) -> Self {
            match addr {
                IpAddr::V4(_) => Family::Ip,
                IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Family::Ip,
                IpAddr::V6(_) => Family::Ip6,
            }
        }

        /// The family's keyword: `ip` or `ip6`.
        pub const fn as_str(self) -> &'static str {
            match self {
                Family::Ip => "ip",
                Family::Ip6 => "ip6",
            }
        }

        /// The table as `nft` names it, family first: `ip kube-proxy` or `ip6 kube-proxy`
        /// (as in `nft list table ip kube-proxy`).
        pub const fn table(self) -> &'static str {
            match self {
                Family::Ip => "ip kube-proxy",
                Family::Ip6 => "ip6 kube-proxy",
            }
        }
    }

    impl fmt::Display for Family {
        /// Writes the keyword (`ip`, `ip6`).
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.as_str())
        }
    }

    /// Base chain, `filter` type, `prerouting` hook at DNAT priority − 10: jumps to
    /// [`FIREWALL_CHECK`] for new connections.
    pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
    /// Base chain, `filter` type, `output` hook at DNAT priority − 10: jumps to
    /// [`FIREWALL_CHECK`] for new connections.
    pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
    /// Base chain, `filter` type, `input` hook: jumps to [`NODEPORT_ENDPOINTS_CHECK`] and
    /// [`SERVICE_ENDPOINTS_CHECK`] for new connections.
    pub const FILTER_INPUT: &str = "filter-input";
    /// Base chain, `filter` type, `forward` hook: jumps to [`SERVICE_ENDPOINTS_CHECK`] and
    /// [`CLUSTER_IPS_CHECK`] for new connections.
    pub const FILTER_FORWARD: &str = "filter-forward";
    /// Base chain, `filter` type, `output` hook: jumps to [`SERVICE_ENDPOINTS_CHECK`] and
    /// [`CLUSTER_IPS_CHECK`] for new connections.
    pub const FILTER_OUTPUT: &str = "filter-output";
    /// Base chain, `nat` type, `prerouting` hook: jumps to [`SERVICES`].
    pub const NAT_PREROUTING: &str = "nat-prerouting";
    /// Base chain, `nat` type, `output` hook: jumps to [`SERVICES`].
    pub const NAT_OUTPUT: &str = "nat-output";
    /// Base chain, `nat` type, `postrouting` hook: jumps to [`MASQUERADING`].
    pub const NAT_POSTROUTING: &str = "nat-postrouting";

    /// Chain: service dispatch through the maps [`SERVICE_IPS`] and [`SERVICE_NODEPORTS`].
    pub const SERVICES: &str = "services";
    /// Map `<ip> . <proto> . <port> : verdict`: ClusterIP, external IP and LoadBalancer IP
    /// traffic to its service or external chain.
    pub const SERVICE_IPS: &str = "service-ips";
    /// Map `<proto> . <port> : verdict`: NodePort traffic to its external chain.
    pub const SERVICE_NODEPORTS: &str = "service-nodeports";
    /// Set of the node IPs that accept NodePort traffic, when `nodePortAddresses` limits them.
    pub const NODEPORT_IPS: &str = "nodeport-ips";
    /// Set of the active ClusterIPs.
    pub const CLUSTER_IPS: &str = "cluster-ips";
    /// Chain: drops or rejects traffic to Service IPs without endpoints, through
    /// [`NO_ENDPOINT_SERVICES`].
    pub const SERVICE_ENDPOINTS_CHECK: &str = "service-endpoints-check";
    /// Chain: the same for node ports, through [`NO_ENDPOINT_NODEPORTS`].
    pub const NODEPORT_ENDPOINTS_CHECK: &str = "nodeport-endpoints-check";
    /// Map `<ip> . <proto> . <port> : verdict`: `drop`, or `goto reject-chain`, for Service
    /// IPs without (local) endpoints.
    pub const NO_ENDPOINT_SERVICES: &str = "no-endpoint-services";
    /// Map `<proto> . <port> : verdict`: the same for node ports.
    pub const NO_ENDPOINT_NODEPORTS: &str = "no-endpoint-nodeports";
    /// Chain: `reject`, the target of [`NO_ENDPOINT_SERVICES`] and [`NO_ENDPOINT_NODEPORTS`].
    pub const REJECT_CHAIN: &str = "reject-chain";
    /// Chain: rejects traffic to unused ports of ClusterIPs and drops traffic to unallocated
    /// ClusterIPs.
    pub const CLUSTER_IPS_CHECK: &str = "cluster-ips-check";
    /// Map `<ip> . <proto> . <port> : verdict`: LoadBalancer IPs with
    /// `loadBalancerSourceRanges` to their [`firewall_chain`].
    pub const FIREWALL_IPS: &str = "firewall-ips";
    /// Chain: looks new connections up in [`FIREWALL_IPS`].
    pub const FIREWALL_CHECK: &str = "firewall-check";
    /// Chain: masquerades marked traffic and hairpin connections.
    pub const MASQUERADING: &str = "masquerading";
    /// Set of `<ip> . <ip> . <proto> . <port>`: endpoint-to-itself connections to masquerade.
    pub const HAIRPIN_CONNECTIONS: &str = "hairpin-connections";
    /// Map `<proto> . <port> : verdict`: localhost NodePort traffic kube-proxy rejects.
    pub const LOCALHOST_NODEPORT_REJECT_PORTS: &str = "localhost-nodeport-reject-ports";

    /// Prefix of the cluster-policy service chain (`servicePortPolicyClusterChainNamePrefix`).
    pub const SERVICE_CHAIN_PREFIX: &str = "service-";
    /// Prefix of the local-policy service chain (`servicePortPolicyLocalChainNamePrefix`).
    pub const LOCAL_CHAIN_PREFIX: &str = "local-";
    /// Prefix of the external traffic chain (`serviceExternalChainNamePrefix`).
    pub const EXTERNAL_CHAIN_PREFIX: &str = "external-";
    /// Prefix of the `loadBalancerSourceRanges` chain (`servicePortFirewallChainNamePrefix`).
    pub const FIREWALL_CHAIN_PREFIX: &str = "firewall-";
    /// Prefix of an endpoint chain (`servicePortEndpointChainNamePrefix`).
    pub const ENDPOINT_CHAIN_PREFIX: &str = "endpoint-";
    /// Prefix of an endpoint's session affinity set (`servicePortEndpointAffinityNamePrefix`).
    pub const AFFINITY_SET_PREFIX: &str = "affinity-";

    /// The chain counting and rejecting localhost NodePort traffic of one protocol, e.g.
    /// `localhost-nodeport-reject-tcp` (`localhostNodePortRejectChainName`).
    pub fn localhost_nodeport_reject_chain(protocol: Protocol) -> String {
        format!("localhost-nodeport-reject-{}", protocol.kube_proxy_name())
    }

    /// kube-proxy's `hashAndTruncate`: `<first 8 base32 chars of SHA-256(name)>-<name>`, cut to
    /// [`CHAIN_NAME_BASE_LENGTH_MAX`] bytes with a `...` ending when longer.
    fn hash_and_truncate(name: &str) -> String {
        let hash = sha256_base32(&[name]);
        let mut based = format!("{}-{name}", &hash[..HASH_LEN]);
        if based.len() > CHAIN_NAME_BASE_LENGTH_MAX {
            based = format!(
                "{}...",
                truncate_bytes(&based, CHAIN_NAME_BASE_LENGTH_MAX - 3)
            );
        }
        based
    }

    /// `servicePortChainNameBase`: `<hash>-<ns>/<svc>/<proto>/<portname>` (the port name is
    /// empty for an unnamed port, leaving a trailing `/`).
    fn service_base(port: &ServicePort<'_>) -> String {
        hash_and_truncate(&format!(
            "{}/{}/{}/{}",
            port.namespace,
            port.name,
            port.protocol.kube_proxy_name(),
            port.port_name
        ))
    }

    /// `servicePortEndpointChainNameBase` over kube-proxy's endpoint string (`ip:port`,
    /// `[ip]:port`): `<hash>-<ns>/<svc>/<proto>/<portname>__<ip>/<port>` with the colons of an
    /// IPv6 address replaced by dots.
    pub(super) fn endpoint_base_from_str(port: &ServicePort<'_>, endpoint: &str) -> String {
        // net.SplitHostPort: the port follows the last colon; an IPv6 host is bracketed.
        let (host, endpoint_port) = endpoint.rsplit_once(':').unwrap_or((endpoint, ""));
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        hash_and_truncate(&format!(
            "{}/{}/{}/{}__{}/{}",
            port.namespace,
            port.name,
            port.protocol.kube_proxy_name(),
            port.port_name,
            host.replace(':', "."),
            endpoint_port
        ))
    }

    fn endpoint_base(port: &ServicePort<'_>, endpoint: SocketAddr) -> String {
        endpoint_base_from_str(port, &endpoint_string(endpoint))
    }

    /// `service-<hash>-<ns>/<svc>/<proto>/<portname>`: the service port's main chain, which
    /// DNATs to one of all ready endpoints (`Cluster` traffic policy).
    pub fn service_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).service
    }

    /// `local-<hash>-…`: DNATs to one of this node's endpoints (`Local` traffic policy).
    pub fn local_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).local
    }

    /// `external-<hash>-…`: where the [`SERVICE_IPS`] element of a LoadBalancer or external
    /// IP, and the [`SERVICE_NODEPORTS`] element of a node port, go.
    pub fn external_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).external
    }

    /// `firewall-<hash>-…`: drops sources outside `loadBalancerSourceRanges`; the target of
    /// the Service's [`FIREWALL_IPS`] elements.
    pub fn firewall_chain(port: &ServicePort<'_>) -> String {
        ServiceChains::new(port).firewall
    }

    /// `endpoint-<hash>-<ns>/<svc>/<proto>/<portname>__<ip>/<port>`: DNATs to one endpoint.
    /// In kube-proxy v1.37.2 it exists only for Services with `sessionAffinity: ClientIP`;
    /// without affinity the service chain DNATs directly.
    pub fn endpoint_chain(port: &ServicePort<'_>, endpoint: SocketAddr) -> String {
        format!("{ENDPOINT_CHAIN_PREFIX}{}", endpoint_base(port, endpoint))
    }

    /// `affinity-<hash>-…__<ip>/<port>`: the set of client IPs stuck to one endpoint under
    /// `sessionAffinity: ClientIP`; same base as [`endpoint_chain`].
    pub fn affinity_set(port: &ServicePort<'_>, endpoint: SocketAddr) -> String {
        format!("{AFFINITY_SET_PREFIX}{}", endpoint_base(port, endpoint))
    }

    /// Whether `chain` is one of kube-proxy's per-Service or per-endpoint chains rather than a
    /// fixed one: those, and only those, contain a `/` (`isServiceChainName`).
    pub fn is_service_chain(chain: &str) -> bool {
        chain.contains('/')
    }

    /// The four chains of one service port, which share one hashed base; computed once.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    pub struct ServiceChains {
        /// `service-…`, see [`service_chain`].
        pub service: String,
        /// `local-…`, see [`local_chain`].
        pub local: String,
        /// `external-…`, see [`external_chain`].
        pub external: String,
        /// `firewall-…`, see [`firewall_chain`].
        pub firewall: String,
    }

    impl ServiceChains {
        /// The chains of `port`.
        pub fn new(port: &ServicePort<'_>) -> Self {
            let base = service_base(port);
            ServiceChains {
                service: format!("{SERVICE_CHAIN_PREFIX}{base}"),
                local: format!("{LOCAL_CHAIN_PREFIX}{base}"),
                external: format!("{EXTERNAL_CHAIN_PREFIX}{base}"),
                firewall: format!("{FIREWALL_CHAIN_PREFIX}{base}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! Byte-exact vectors from kube-proxy's own Go tests, Kubernetes v1.37.2 (module
    //! `k8s.io/kubernetes@v1.37.2`). `TestOverallIPTablesRules` and friends build Services
    //! with `makeTestService(ns, name, ...)` and EndpointSlices, sync, and compare the whole
    //! rule dump; each vector below names the file, the test and the dump line it comes from.
    //! The few cases those tests lack (an unnamed port, UDP, an IPv6 endpoint in iptables mode)
    //! say so and were computed by kube-proxy's own functions, copied verbatim into a Go
    //! program.

    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

    use proptest::prelude::*;

    const fn tcp<'a>(namespace: &'a str, name: &'a str, port_name: &'a str) -> ServicePort<'a> {
        ServicePort::new(namespace, name, port_name, Protocol::Tcp)
    }

    fn ep(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn service_port_name_is_kube_proxys_string() {
        // pkg/proxy/types.go ServicePortName.String(): NamespacedName.String() + fmtPortName,
        // which adds ":<port>" only for a named port.
        assert_eq!(tcp("ns1", "svc1", "p80").to_string(), "ns1/svc1:p80");
        assert_eq!(tcp("ns1", "svc1", "").to_string(), "ns1/svc1");
    }

    #[test]
    fn protocol_spellings() {
        assert_eq!("TCP".parse::<Protocol>(), Ok(Protocol::Tcp));
        assert_eq!("UDP".parse::<Protocol>(), Ok(Protocol::Udp));
        assert_eq!("SCTP".parse::<Protocol>(), Ok(Protocol::Sctp));
        assert!("tcp".parse::<Protocol>().is_err());
        assert_eq!(Protocol::Sctp.kube_proxy_name(), "sctp");
        assert_eq!(Protocol::Udp.to_string(), "UDP");
    }

    // ---- iptables ----

    #[test]
    fn iptables_service_chains_from_kube_proxy_tests() {
        use iptables::*;
        // pkg/proxy/iptables/proxier_test.go, TestOverallIPTablesRules:
        // `-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" ... -j KUBE-SVC-XPGD46QRK7WJZT7O`
        assert_eq!(
            service_chain(&tcp("ns1", "svc1", "p80")),
            "KUBE-SVC-XPGD46QRK7WJZT7O"
        );
        // Same test: `... "ns2/svc2:p80 loadbalancer IP" ... -d 1.2.3.4 --dport 80 -j KUBE-EXT-GNZBNJ2PO5MGZ6GT`
        assert_eq!(
            external_chain(&tcp("ns2", "svc2", "p80")),
            "KUBE-EXT-GNZBNJ2PO5MGZ6GT"
        );
        // Same test: `... "ns5/svc5:p80 loadbalancer IP" ... -d 5.6.7.8 --dport 80 -j KUBE-FW-NUKIZ6OKUXPJNT4C`
        assert_eq!(
            firewall_chain(&tcp("ns5", "svc5", "p80")),
            "KUBE-FW-NUKIZ6OKUXPJNT4C"
        );
        // Same test: `... "ns3/svc3:p80 cluster IP" ... -j KUBE-SVC-X27LE4BHSL4DOUIK`,
        // `... "ns4/svc4:p80 cluster IP" ... -j KUBE-SVC-4SW47YFZTEDKD3PK`.
        assert_eq!(
            service_chain(&tcp("ns3", "svc3", "p80")),
            "KUBE-SVC-X27LE4BHSL4DOUIK"
        );
        assert_eq!(
            service_chain(&tcp("ns4", "svc4", "p80")),
            "KUBE-SVC-4SW47YFZTEDKD3PK"
        );
        // pkg/proxy/iptables/proxier_test.go, TestSortIPTablesRules ("basic test using each
        // match type"), a dump of the ns2/svc2 Local-policy LoadBalancer:
        // `-A KUBE-EXT-GNZBNJ2PO5MGZ6GT -j KUBE-SVL-GNZBNJ2PO5MGZ6GT`
        assert_eq!(
            local_chain(&tcp("ns2", "svc2", "p80")),
            "KUBE-SVL-GNZBNJ2PO5MGZ6GT"
        );
        // pkg/proxy/iptables/proxier_test.go, TestSyncProxyRulesRepeated:
        // `... "ns2/svc2:p8080 cluster IP" ... -j KUBE-SVC-2VJB64SDSIJUP5T6`
        assert_eq!(
            service_chain(&tcp("ns2", "svc2", "p8080")),
            "KUBE-SVC-2VJB64SDSIJUP5T6"
        );
    }

    #[test]
    fn iptables_endpoint_chains_from_kube_proxy_tests() {
        use iptables::*;
        // pkg/proxy/iptables/proxier_test.go, TestOverallIPTablesRules:
        // `-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -j KUBE-SEP-SXIVWICOYRO3J4NJ`
        assert_eq!(
            endpoint_chain(&tcp("ns1", "svc1", "p80"), ep("10.180.0.1:80")),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        // Same test, one endpoint IP in two Services: the service port is in the hash.
        // `... "ns3/svc3:p80 -> 10.180.0.3:80" -j KUBE-SEP-OYPFS5VJICHGATKP`
        // `... "ns5/svc5:p80 -> 10.180.0.3:80" -j KUBE-SEP-I77PXRDZVX7PMWMN`
        assert_eq!(
            endpoint_chain(&tcp("ns3", "svc3", "p80"), ep("10.180.0.3:80")),
            "KUBE-SEP-OYPFS5VJICHGATKP"
        );
        assert_eq!(
            endpoint_chain(&tcp("ns5", "svc5", "p80"), ep("10.180.0.3:80")),
            "KUBE-SEP-I77PXRDZVX7PMWMN"
        );
        // Same test, two endpoints of one Service:
        // `... "ns4/svc4:p80 -> 10.180.0.4:80" ... -j KUBE-SEP-UKSFD7AGPMPPLUHC`
        // `... "ns4/svc4:p80 -> 10.180.0.5:80" -j KUBE-SEP-C6EBXVWJJZMIWKLZ`
        assert_eq!(
            endpoint_chain(&tcp("ns4", "svc4", "p80"), ep("10.180.0.4:80")),
            "KUBE-SEP-UKSFD7AGPMPPLUHC"
        );
        assert_eq!(
            endpoint_chain(&tcp("ns4", "svc4", "p80"), ep("10.180.0.5:80")),
            "KUBE-SEP-C6EBXVWJJZMIWKLZ"
        );
        // pkg/proxy/iptables/proxier_test.go, TestSyncProxyRulesRepeated:
        // `... "ns2/svc2:p8080 -> 10.0.2.1:8080" -j KUBE-SEP-UHEGFW77JX3KXTOV`
        assert_eq!(
            endpoint_chain(&tcp("ns2", "svc2", "p8080"), ep("10.0.2.1:8080")),
            "KUBE-SEP-UHEGFW77JX3KXTOV"
        );
    }

    #[test]
    fn iptables_unnamed_port_udp_and_ipv6_cross_checked_with_go() {
        // kube-proxy v1.37.2's iptables tests have no chain name for an unnamed port, a UDP
        // port or an IPv6 endpoint. These were computed by portProtoHash and
        // servicePortEndpointChainName copied verbatim from pkg/proxy/iptables/proxier.go
        // (v1.37.2) and run with go1.26, the endpoint built as kube-proxy builds it,
        // net.JoinHostPort(net.ParseIP(ip).String(), strconv.Itoa(port)).
        use iptables::*;
        // ServicePortName "ns1/svc1" (no ":"), protocol "tcp".
        assert_eq!(
            service_chain(&tcp("ns1", "svc1", "")),
            "KUBE-SVC-AQI2S6QIMU7PVVRP"
        );
        assert_eq!(
            endpoint_chain(&tcp("ns1", "svc1", ""), ep("10.180.0.1:80")),
            "KUBE-SEP-RD5U5EMOXIC4RU5H"
        );
        assert_eq!(
            service_chain(&ServicePort::new("ns1", "svc1", "p80", Protocol::Udp)),
            "KUBE-SVC-OJWW7NSBVZTDHXNW"
        );
        // Endpoint string "[fd00:10:180::1]:80".
        assert_eq!(
            endpoint_chain(&tcp("ns1", "svc1", "p80"), ep("[fd00:10:180::1]:80")),
            "KUBE-SEP-OGYCNMB4EMRUSJ6N"
        );
    }

    #[test]
    fn iptables_service_chains_share_one_hash() {
        let chains = iptables::ServiceChains::new(&tcp("ns5", "svc5", "p80"));
        assert_eq!(chains.service, "KUBE-SVC-NUKIZ6OKUXPJNT4C");
        assert_eq!(chains.local, "KUBE-SVL-NUKIZ6OKUXPJNT4C");
        assert_eq!(chains.external, "KUBE-EXT-NUKIZ6OKUXPJNT4C");
        assert_eq!(chains.firewall, "KUBE-FW-NUKIZ6OKUXPJNT4C");
    }

    #[test]
    fn iptables_fixed_chains_and_service_chain_test() {
        use iptables::*;
        for fixed in [
            SERVICES,
            EXTERNAL_SERVICES,
            NODE_PORTS,
            POSTROUTING,
            MARK_MASQ,
            FORWARD,
            PROXY_FIREWALL,
            PROXY_CANARY,
            FIREWALL,
        ] {
            assert!(!is_service_chain(fixed), "{fixed}");
            assert!(fixed.len() <= CHAIN_NAME_MAX_LEN, "{fixed}");
        }
        assert!(is_service_chain("KUBE-SEP-SXIVWICOYRO3J4NJ"));
        assert!(is_service_chain("KUBE-FW-NUKIZ6OKUXPJNT4C"));
    }

    // ---- nftables ----

    #[test]
    fn nftables_service_chains_from_kube_proxy_tests() {
        use nftables::*;
        // pkg/proxy/nftables/proxier_test.go, TestOverallNFTablesRules:
        // `add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }`
        assert_eq!(
            service_chain(&tcp("ns1", "svc1", "p80")),
            "service-ULMVA6XW-ns1/svc1/tcp/p80"
        );
        // Same test: `add element ip kube-proxy service-ips { 1.2.3.4 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }`
        assert_eq!(
            external_chain(&tcp("ns2", "svc2", "p80")),
            "external-42NFTM6N-ns2/svc2/tcp/p80"
        );
        // Same test: `add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }`
        assert_eq!(
            firewall_chain(&tcp("ns5", "svc5", "p80")),
            "firewall-HVFWP5L3-ns5/svc5/tcp/p80"
        );
        // Same test: `add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80`.
        assert_eq!(
            service_chain(&tcp("ns4", "svc4", "p80")),
            "service-LAUZTJTB-ns4/svc4/tcp/p80"
        );
        // pkg/proxy/nftables/proxier_test.go, TestSyncProxyRulesRepeated:
        // `add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 8080 : goto service-MHHHYRWA-ns2/svc2/tcp/p8080 }`
        assert_eq!(
            service_chain(&tcp("ns2", "svc2", "p8080")),
            "service-MHHHYRWA-ns2/svc2/tcp/p8080"
        );
        // pkg/proxy/nftables/proxier_test.go, Test_servicePortChainNameBase "simple" and
        // "different port, different hash" (the base, here with the service- prefix).
        assert_eq!(
            service_chain(&tcp("testing", "service", "http")),
            "service-P4ZYZVCF-testing/service/tcp/http"
        );
        assert_eq!(
            service_chain(&tcp("testing", "service", "https")),
            "service-LZBRENCP-testing/service/tcp/https"
        );
        // Same test, "max length": 63-character names, sctp.
        let long = ServicePort::new(
            "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx",
            "very-long-service-name-why-would-you-even-do-this-i-mean-really",
            "port-443-providing-the-hypertext-transmission-protocol-with-tls",
            Protocol::Sctp,
        );
        assert_eq!(
            local_chain(&long),
            "local-KR6NACJP-very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx/very-long-service-name-why-would-you-even-do-this-i-mean-really/sctp/port-443-providing-the-hypertext-transmission-protocol-with-tls"
        );
    }

    #[test]
    fn nftables_endpoint_chains_from_kube_proxy_tests() {
        use nftables::*;
        // pkg/proxy/nftables/proxier_test.go, TestOverallNFTablesRules (ns5/svc5 has
        // sessionAffinity ClientIP):
        // `add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80`
        // `add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ... }`
        let svc5 = tcp("ns5", "svc5", "p80");
        assert_eq!(
            endpoint_chain(&svc5, ep("10.180.0.3:80")),
            "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        );
        assert_eq!(
            affinity_set(&svc5, ep("10.180.0.3:80")),
            "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        );
        // pkg/proxy/nftables/proxier_test.go, TestOverallNFTablesRulesIPv6:
        // `add chain ip6 kube-proxy endpoint-5HFFSBBM-ns5/svc5/tcp/p80__fd00.10.180..3/80`
        assert_eq!(
            endpoint_chain(&svc5, ep("[fd00:10:180::3]:80")),
            "endpoint-5HFFSBBM-ns5/svc5/tcp/p80__fd00.10.180..3/80"
        );
        // pkg/proxy/nftables/helpers_test.go, TestTracePacketV6:
        // `add chain ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80`
        // `add chain ip6 kube-proxy endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80`
        let svc1 = tcp("ns1", "svc1", "p80");
        assert_eq!(
            endpoint_chain(&svc1, ep("[fd00:10:180::1]:80")),
            "endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80"
        );
        assert_eq!(
            endpoint_chain(&svc1, ep("[fd00:10:180::2:1]:80")),
            "endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80"
        );
        // pkg/proxy/nftables/helpers_test.go, TestTracePacketV4:
        // `add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80`
        // `add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80`
        assert_eq!(
            endpoint_chain(&svc1, ep("10.180.0.1:80")),
            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        assert_eq!(
            endpoint_chain(&tcp("ns2", "svc2", "p80"), ep("10.180.0.2:80")),
            "endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80"
        );
        // pkg/proxy/nftables/proxier_test.go, Test_servicePortEndpointChainNameBase
        // "simple" and "different endpoint, different hash".
        let testing = tcp("testing", "service", "http");
        assert_eq!(
            endpoint_chain(&testing, ep("10.180.0.1:80")),
            "endpoint-JO2XBXZR-testing/service/tcp/http__10.180.0.1/80"
        );
        assert_eq!(
            endpoint_chain(&testing, ep("10.180.0.2:80")),
            "endpoint-5S6H3H22-testing/service/tcp/http__10.180.0.2/80"
        );
    }

    #[test]
    fn nftables_endpoint_base_vectors_over_kube_proxys_strings() {
        // pkg/proxy/nftables/proxier_test.go, Test_servicePortEndpointChainNameBase: these
        // cases pass endpoint strings that Go's net.IP.String() would never produce (a single
        // zero group written as "::"), so they go through the string-level function, as the Go
        // test calls servicePortEndpointChainNameBase directly.
        let testing = tcp("testing", "service", "http");
        // "ipv6"
        assert_eq!(
            nftables::endpoint_base_from_str(&testing, "[fd80:abcd:12::a1b2:c3d4:e5f6:9999]:80"),
            "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"
        );
        let long = ServicePort::new(
            "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx",
            "very-long-service-name-why-would-you-even-do-this-i-mean-really",
            "port-443-providing-the-hypertext-transmission-protocol-with-tls",
            Protocol::Sctp,
        );
        // "max length without truncation"
        assert_eq!(
            nftables::endpoint_base_from_str(&long, "[1234:5678:9abc:def0::abc:1234]:443"),
            "5YS7AFEA-very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx/very-long-service-name-why-would-you-even-do-this-i-mean-really/sctp/port-443-providing-the-hypertext-transmission-protocol-with-tls__1234.5678.9abc.def0..abc.1234/443"
        );
        // ... and the same through the public, SocketAddr-typed function.
        assert_eq!(
            nftables::endpoint_chain(&long, ep("[1234:5678:9abc:def0::abc:1234]:443")),
            "endpoint-5YS7AFEA-very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx/very-long-service-name-why-would-you-even-do-this-i-mean-really/sctp/port-443-providing-the-hypertext-transmission-protocol-with-tls__1234.5678.9abc.def0..abc.1234/443"
        );
        // "truncated, 1" and "truncated, 2 (different IP, which is not visible in the result)"
        assert_eq!(
            nftables::endpoint_base_from_str(&long, "[1234:5678:9abc:def0::abcd:1234:5678]:443"),
            "CI6C53Q3-very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx/very-long-service-name-why-would-you-even-do-this-i-mean-really/sctp/port-443-providing-the-hypertext-transmission-protocol-with-tls__1234.5678.9abc.def0..abcd.1234..."
        );
        assert_eq!(
            nftables::endpoint_base_from_str(&long, "[1234:5678:9abc:def0::abcd:1234:8765]:443"),
            "2FLXFK6X-very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx/very-long-service-name-why-would-you-even-do-this-i-mean-really/sctp/port-443-providing-the-hypertext-transmission-protocol-with-tls__1234.5678.9abc.def0..abcd.1234..."
        );
    }

    #[test]
    fn nftables_unnamed_port_keeps_the_trailing_slash() {
        // servicePortChainNameBase formats "%s/%s/%s/%s" with the port name last, so an
        // unnamed port leaves "ns1/svc1/tcp/". kube-proxy v1.37.2's nftables tests have no
        // unnamed port; these were computed by hashAndTruncate and the body of
        // servicePortEndpointChainNameBase copied verbatim from pkg/proxy/nftables/proxier.go
        // (v1.37.2) and run with go1.26.
        assert_eq!(
            nftables::service_chain(&tcp("ns1", "svc1", "")),
            "service-6KJ5P52A-ns1/svc1/tcp/"
        );
        assert_eq!(
            nftables::endpoint_chain(
                &ServicePort::new("ns1", "svc1", "", Protocol::Udp),
                ep("[fd00:10:180::1]:53")
            ),
            "endpoint-7MTFE5QW-ns1/svc1/udp/__fd00.10.180..1/53"
        );
    }

    #[test]
    fn nftables_tables_and_fixed_names() {
        use nftables::*;
        assert_eq!(
            Family::of(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4))),
            Family::Ip
        );
        assert_eq!(Family::of(IpAddr::V6(Ipv6Addr::LOCALHOST)), Family::Ip6);
        assert_eq!(
            Family::of("::ffff:1.2.3.4".parse::<IpAddr>().unwrap()),
            Family::Ip
        );
        assert_eq!(Family::Ip.table(), "ip kube-proxy");
        assert_eq!(Family::Ip6.table(), "ip6 kube-proxy");
        assert_eq!(Family::Ip6.to_string(), "ip6");
        assert_eq!(format!("{} {TABLE_NAME}", Family::Ip), Family::Ip.table());
        // pkg/proxy/nftables/proxier_test.go, TestOverallNFTablesRules:
        // `add chain ip kube-proxy localhost-nodeport-reject-tcp`
        assert_eq!(
            localhost_nodeport_reject_chain(Protocol::Tcp),
            "localhost-nodeport-reject-tcp"
        );
        for fixed in [
            SERVICES,
            SERVICE_IPS,
            SERVICE_NODEPORTS,
            FIREWALL_CHECK,
            FIREWALL_IPS,
            NAT_PREROUTING,
            MASQUERADING,
        ] {
            assert!(!is_service_chain(fixed), "{fixed}");
        }
        assert!(is_service_chain("service-ULMVA6XW-ns1/svc1/tcp/p80"));
    }

    #[test]
    fn endpoint_strings_are_gos() {
        // Go's net.IP.String() (checked with go1.26: net.ParseIP(s).String()):
        // "2001:db8:0:0:1:0:0:1" -> "2001:db8::1:0:0:1" (first longest run),
        // "1:0:0:2:0:0:0:3" -> "1:0:0:2::3", "fd80:abcd:12:0:a1b2:c3d4:e5f6:9999" unchanged
        // (one zero group is not "::"), "::ffff:10.1.2.3" -> "10.1.2.3".
        assert_eq!(
            endpoint_string(ep("[2001:db8:0:0:1:0:0:1]:80")),
            "[2001:db8::1:0:0:1]:80"
        );
        assert_eq!(
            endpoint_string(ep("[1:0:0:2:0:0:0:3]:80")),
            "[1:0:0:2::3]:80"
        );
        assert_eq!(
            endpoint_string(ep("[fd80:abcd:12:0:a1b2:c3d4:e5f6:9999]:80")),
            "[fd80:abcd:12:0:a1b2:c3d4:e5f6:9999]:80"
        );
        assert_eq!(endpoint_string(ep("[::ffff:10.1.2.3]:80")), "10.1.2.3:80");
        assert_eq!(
            endpoint_string(ep("[2001:DB8::0001]:443")),
            "[2001:db8::1]:443"
        );
        // A scope id is not part of the endpoint.
        let scoped = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, 80, 0, 7));
        assert_eq!(endpoint_string(scoped), "[::1]:80");
    }

    // ---- properties ----

    /// A DNS-1123 label, as the API admits for namespaces, Service names and port names.
    fn label() -> impl Strategy<Value = String> {
        "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
    }

    fn protocol() -> impl Strategy<Value = Protocol> {
        prop_oneof![
            Just(Protocol::Tcp),
            Just(Protocol::Udp),
            Just(Protocol::Sctp)
        ]
    }

    fn endpoint() -> impl Strategy<Value = SocketAddr> {
        prop_oneof![
            (any::<[u8; 4]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
            (any::<[u16; 8]>(), any::<u16>())
                .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
        ]
    }

    /// An owned Service port: namespace, name, port name (maybe empty), protocol.
    fn service_port() -> impl Strategy<Value = (String, String, String, Protocol)> {
        (
            label(),
            label(),
            prop_oneof![Just(String::new()), label()],
            protocol(),
        )
    }

    /// Two endpoints that kube-proxy writes differently.
    fn distinct_endpoints() -> impl Strategy<Value = (SocketAddr, SocketAddr)> {
        (endpoint(), endpoint()).prop_filter("different endpoints", |(a, b)| {
            endpoint_string(*a) != endpoint_string(*b)
        })
    }

    proptest! {
        #[test]
        fn iptables_names_fit_and_have_no_spaces(
            (ns, name, port_name, proto) in service_port(),
            addr in endpoint(),
        ) {
            let port = ServicePort::new(&ns, &name, &port_name, proto);
            let chains = iptables::ServiceChains::new(&port);
            let sep = iptables::endpoint_chain(&port, addr);
            for chain in [&chains.service, &chains.local, &chains.external, &chains.firewall, &sep] {
                prop_assert!(chain.starts_with("KUBE-"), "{}", chain);
                prop_assert!(chain.len() <= iptables::CHAIN_NAME_MAX_LEN, "{}", chain);
                prop_assert!(!chain.contains(' '), "{}", chain);
                prop_assert!(iptables::is_service_chain(chain), "{}", chain);
            }
            prop_assert_eq!(chains.service, iptables::service_chain(&port));
        }

        #[test]
        fn iptables_different_endpoints_give_different_sep_chains(
            (ns, name, port_name, proto) in service_port(),
            (a, b) in distinct_endpoints(),
        ) {
            let port = ServicePort::new(&ns, &name, &port_name, proto);
            prop_assert_ne!(
                iptables::endpoint_chain(&port, a),
                iptables::endpoint_chain(&port, b)
            );
        }

        #[test]
        fn nftables_names_fit_and_have_no_spaces(
            (ns, name, port_name, proto) in service_port(),
            addr in endpoint(),
        ) {
            let port = ServicePort::new(&ns, &name, &port_name, proto);
            let chains = nftables::ServiceChains::new(&port);
            let endpoint = nftables::endpoint_chain(&port, addr);
            let affinity = nftables::affinity_set(&port, addr);
            for chain in [&chains.service, &chains.local, &chains.external, &chains.firewall, &endpoint, &affinity] {
                prop_assert!(chain.len() <= nftables::NAME_LENGTH_MAX, "{}", chain);
                prop_assert!(!chain.contains(' '), "{}", chain);
                // nftables names may hold only [A-Za-z0-9_./-].
                prop_assert!(
                    chain.bytes().all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b)),
                    "{}", chain
                );
                prop_assert!(nftables::is_service_chain(chain), "{}", chain);
            }
            // The service base is never truncated (at most 205 bytes, says kube-proxy).
            let base = format!("{}/{}/{}/{}", ns, name, proto.kube_proxy_name(), port_name);
            prop_assert!(chains.service.ends_with(&base), "{}", chains.service);
        }

        #[test]
        fn nftables_different_endpoints_give_different_endpoint_chains(
            (ns, name, port_name, proto) in service_port(),
            (a, b) in distinct_endpoints(),
        ) {
            let port = ServicePort::new(&ns, &name, &port_name, proto);
            prop_assert_ne!(
                nftables::endpoint_chain(&port, a),
                nftables::endpoint_chain(&port, b)
            );
        }
    }
}
