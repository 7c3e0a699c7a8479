//! The speaker's command line: every option, also settable through the environment variable
//! shown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use ferrolb_runtime::args::{self, CommonArgs};

/// ferrolb's speaker: announces Service IPs from this node (layer 2: ARP and NDP).
///
/// Every option can also be set through the environment variable shown.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct Args {
    /// This node's name (the Node object); in a Pod, from the downward API (spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,
    /// Namespace, class, kubeconfig, listen address and logs: as the controller's.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Serve /metrics, /healthz and /readyz on this IP instead of `--listen`'s (same port). The
    /// chart passes the node's own address: the speaker runs in the host network, and binding
    /// every interface would serve metrics on the LAN the LoadBalancer IPs face.
    #[arg(long, env = "FERROLB_LISTEN_IP")]
    pub listen_ip: Option<std::net::IpAddr>,
    /// Serve the live report `kubectl ferrolb explain` reads (GET /explain/v1alpha1, next to
    /// /metrics and as reachable): which node owns each layer 2 IP and who would take over,
    /// this speaker's quorum, its BGP sessions and the routes sent. Turn it off where even that
    /// much must not be readable from the node network.
    #[arg(long, env = "FERROLB_EXPLAIN_REPORT", default_value_t = true, action = clap::ArgAction::Set)]
    pub explain_report: bool,
    /// TLS for /metrics, /healthz and /readyz (off unless both files are given).
    #[command(flatten)]
    pub metrics_tls: ferrolb_runtime::tls::TlsArgs,
    /// Name prefix of the speakers' presence Leases (`<prefix>-<node>`, labelled
    /// `ferrolb.io/speaker-presence=<prefix>`); speakers of one release share it, and a quorum
    /// counts the speakers that do.
    #[arg(
        long,
        env = "FERROLB_PRESENCE_GROUP",
        default_value = "ferrolb-speaker"
    )]
    pub presence_group: String,
    /// How the speakers decide who may own layer 2 IPs: `legacy` (every speaker heartbeats
    /// every other; proven up to a few hundred nodes) or `voters` (every speaker beats to the
    /// few `--voters`, whose reports decide: cost per node independent of the cluster's size;
    /// decision record 0023). The same on every speaker: a speaker on `voters` holds itself
    /// back while it hears one on `legacy`, so switch every speaker at once (a roll of the
    /// DaemonSet with maxUnavailable 100%) for an outage of about a second.
    #[arg(long, env = "FERROLB_MEMBERSHIP", value_enum, default_value_t = Membership::Legacy)]
    pub membership: Membership,
    /// With `--membership=voters`: the voter nodes' names (comma-separated; at most 7, an
    /// odd number spread over failure domains, 5 usually). Every speaker must be given the
    /// same list.
    #[arg(long, env = "FERROLB_VOTERS", value_delimiter = ',')]
    pub voters: Vec<String>,
    /// With `--membership=voters` and no `--voters`: the ConfigMap (in --namespace) in which
    /// the controller publishes the voters (its `--voters-object`). Every speaker watches it;
    /// a voter node also reads it afresh every second and keeps its duty record, a Lease
    /// `<name>-<node>` (decision record 0023, *Changing the voters*).
    #[arg(long, env = "FERROLB_VOTERS_OBJECT")]
    pub voters_object: Option<String>,
    /// UDP port of the heartbeats between speakers (open it between nodes).
    #[arg(long, env = "FERROLB_GOSSIP_PORT", default_value_t = 7946)]
    pub gossip_port: u16,
    /// File holding the key that authenticates heartbeats (the same on every node; mount it
    /// from a Secret): the whole file but trailing whitespace. At least 16 bytes.
    #[arg(long, env = "FERROLB_GOSSIP_KEY_FILE")]
    pub gossip_key_file: PathBuf,
    /// File holding the next gossip key during a key rotation (the Secret's `nextkey`):
    /// heartbeats signed with it are accepted too. Absent or empty: no next key. Both files are
    /// re-read every few seconds, so a changed Secret takes effect without a restart.
    #[arg(long, env = "FERROLB_GOSSIP_NEXT_KEY_FILE")]
    pub gossip_next_key_file: Option<PathBuf>,
    /// How often each speaker sends a heartbeat to every other speaker (Go duration).
    #[arg(long, env = "FERROLB_HEARTBEAT_INTERVAL", default_value = "100ms", value_parser = args::duration)]
    pub heartbeat_interval: Duration,
    /// A speaker not heard for this long counts as dead and its IPs move (Go duration). Failover
    /// takes about this long; at least three heartbeat intervals.
    #[arg(long, env = "FERROLB_FAILURE_TIMEOUT", default_value = "500ms", value_parser = args::duration)]
    pub failure_timeout: Duration,
    /// Interface name prefixes never announced on (comma-separated; replaces the default list).
    #[arg(
        long,
        env = "FERROLB_IGNORE_INTERFACES",
        value_delimiter = ',',
        default_values_t = crate::l2::interfaces::DEFAULT_IGNORED_PREFIXES
            .iter()
            .map(|s| s.to_string())
    )]
    pub ignore_interfaces: Vec<String>,
    /// Re-send gratuitous ARP / unsolicited NA for owned IPs this often after the takeover
    /// burst (Go duration; 0s: never), so a client or switch that missed a takeover, or kept an
    /// entry from before it, is corrected within this time. 60 s stays well inside the usual
    /// 300 s MAC-table ageing of switches (docs/decisions/0015).
    #[arg(long, env = "FERROLB_GARP_REFRESH", default_value = "60s", value_parser = args::duration)]
    pub garp_refresh: Duration,
    /// Flap damping: after losing its quorum, this node waits 2 s (doubling per loss within a
    /// minute, up to 30 s) before it may own layer 2 IPs again, so that an owner whose heartbeats
    /// are lost in bursts does not move its IPs back and forth (docs/decisions/0015).
    #[arg(long, env = "FERROLB_FLAP_DAMPING", default_value_t = true, action = clap::ArgAction::Set)]
    pub flap_damping: bool,
    /// A speaker stopped to be replaced (see --restart-hold-when) asks the others to keep it the
    /// owner of its IPs for this long instead of taking them over, so a rolling update does not
    /// move every IP away and back (each move breaks the connections kube-proxy tracks on the
    /// node); its successor takes them up once ready. Also how long this speaker keeps a
    /// replaced peer's IPs. Meanwhile ARP/NDP for those IPs goes unanswered (established clients
    /// keep their entries). 0s: IPs move at once on every stop (Go duration).
    #[arg(long, env = "FERROLB_RESTART_HOLD", default_value = "10s", value_parser = args::duration)]
    pub restart_hold: Duration,
    /// When a stop is a replacement: `pod-deleted` (this speaker's Pod, --pod-name, is being
    /// deleted, as in a rolling update; a node shutting down does not delete its pods) or
    /// `always` (a supervisor that restarts the speaker).
    #[arg(long, env = "FERROLB_RESTART_HOLD_WHEN", value_enum, default_value_t = crate::l2::restart::HoldWhen::PodDeleted)]
    pub restart_hold_when: crate::l2::restart::HoldWhen,
    /// This speaker's Pod (the chart passes it from the downward API). Its controller (the
    /// DaemonSet) becomes the owner of the presence Lease and status objects this speaker
    /// writes, so they go with the release; outside a pod the Lease is owned by the Node and
    /// the status objects by nothing.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// Accept BGP connections from configured peers on these addresses (comma-separated, e.g.
    /// `0.0.0.0:179,[::]:179`). Off by default: on the host network, port 179 may belong to
    /// another BGP daemon (Calico's BIRD, FRR); the speaker always connects out itself.
    #[arg(long, env = "FERROLB_BGP_LISTEN", value_delimiter = ',')]
    pub bgp_listen: Vec<SocketAddr>,
    /// Write a ServiceBGPStatus object per Service this node advertises over BGP (MetalLB's
    /// status API). false: none, and the ones this node wrote before are deleted (a cluster
    /// of 100 nodes and 10,000 Services would otherwise hold a million of them). Routes are
    /// not affected.
    #[arg(long, env = "FERROLB_BGP_STATUS_OBJECTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub bgp_status_objects: bool,
    /// API writes a second for status objects (ServiceL2Status and ServiceBGPStatus: creates,
    /// status patches and deletes), on average; 0: no limit. A rollout or a mass move can
    /// need thousands per speaker, and every speaker writes at once: this bounds what a
    /// cluster of N speakers sends the API server to N times this. Announcing is never
    /// delayed: only the objects that report it are.
    #[arg(long, env = "FERROLB_STATUS_WRITES_PER_SECOND", default_value_t = 20.0)]
    pub status_writes_per_second: f64,
    /// Status object writes that may go at once after a quiet time (a failover of a few
    /// dozen IPs is reported without waiting).
    #[arg(long, env = "FERROLB_STATUS_WRITES_BURST", default_value_t = 100)]
    pub status_writes_burst: u32,
}

/// How the speakers decide who may own layer 2 IPs (`--membership`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Membership {
    /// Every speaker heartbeats every other (decision record 0015).
    Legacy,
    /// Every speaker beats to a few voters (decision record 0023).
    Voters,
}
