//! What one step of the work loop reads from and does to the world outside it, as one small
//! trait ([`LoopIo`]): the caches, the heartbeats, the ARP/NDP responders, the BGP driver and
//! the Event queue. [`World`] is the real one; the work loop's unit tests fake it, so the loop's
//! rules (who may own, what is announced, reported and counted) are tested without a cluster,
//! sockets or a network.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::l2::interfaces::Interface;
use crate::l2::plan::Announcement;
use crate::service_views::{Changed, Source, ViewMap};
use crate::view::{NodeView, ServiceObject, SliceObject};
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::Config;
use ferrolb_config::validate::Validated;
use ferrolb_layer2::heartbeat::Heard;
use ferrolb_layer2::liveness::Member;
use ferrolb_layer2::quorum::Report;
use ferrolb_layer2::tenure::Tenure;
use ferrolb_runtime::events::EventQueue;
use k8s_openapi::api::coordination::v1::Lease;

use crate::bgp::step::Bgp;
use crate::l2::announce::Announcer;
use crate::l2::gossip::Gossip;
use crate::l2::{status, voters};
use crate::watch;

/// What the heartbeat table says at one instant, for the gate.
pub struct Heartbeats {
    /// What each peer heard (or held for a restart) said last.
    pub reports: BTreeMap<String, Report>,
    /// What each peer's latest heartbeat says of this node's.
    pub acks: BTreeMap<String, Heard>,
    /// Until when this node may answer, from those acknowledgements.
    pub tenure: Tenure,
    /// The sequence number of this node's latest heartbeat that said `ready: false` (0: none),
    /// read after the acknowledgements.
    pub last_unready_seq: u64,
}

/// The work loop's I/O. Reads are of caches (never a request); writes never wait on the API
/// server (Events are queued, status objects are written by their own task).
/// The Services and EndpointSlices, and which of them changed, come through
/// [`Source`](crate::service_views::Source).
pub(crate) trait LoopIo: Source {
    /// The cached Nodes, as planning reads them.
    fn nodes(&self) -> Vec<Arc<NodeView>>;
    /// A number that changes whenever the cached Nodes do: equal readings, equal Nodes (the
    /// check every heartbeat interval reads the Nodes again only when it moved).
    fn nodes_generation(&self) -> u64;
    /// The speakers' presence Leases.
    fn presence(&self) -> Vec<Arc<Lease>>;
    /// Whether the configuration changed since the last call.
    fn take_config_dirty(&self) -> bool;
    /// The cached configuration objects, validated.
    fn validated(&self, namespace: &str) -> Validated;
    /// Sends heartbeats to `addresses` from now on, and keeps heartbeat state for the Nodes
    /// `nodes` only.
    fn set_peers(&self, addresses: Vec<IpAddr>, nodes: BTreeSet<String>);
    /// The heartbeat table at `now`, with this node's tenure among the `known` speakers.
    fn heartbeats(&self, known: &BTreeSet<String>, now: Instant) -> Heartbeats;
    /// What this node's heartbeats say from now on: whether it acts, and its usable interfaces
    /// (a change goes out at once).
    fn say(&self, acts: bool, interfaces: BTreeSet<String>) -> impl Future<Output = ()>;
    /// Answers ARP/NDP for exactly `plan`; returns the interfaces that could not be set up,
    /// with why.
    fn announce(
        &mut self,
        plan: &BTreeMap<IpAddr, Announcement>,
        usable: &BTreeMap<String, Interface>,
    ) -> Vec<(String, String)>;
    /// Lets the responders answer until `until` (the mandate).
    fn renew(&self, until: Instant);
    /// Plans and hands over this node's BGP advertisements (every eligible node advertises,
    /// whatever the layer 2 owner choice); `alive` are the live members when this node acts (it
    /// may then sweep departed nodes' ServiceBGPStatus). Returns how many Services it
    /// advertises.
    fn advertise(
        &mut self,
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        me: &str,
        services: &ViewMap,
        alive: Option<&BTreeMap<String, Member>>,
    ) -> usize;
    /// Queues an `announceFailed` Event on a Service.
    fn announce_failed(&self, key: &ServiceKey, uid: Option<String>, why: String);
    /// With `--membership=voters`: the voters membership, which decides in place of the
    /// heartbeat table and the presence Leases.
    fn voters(&self) -> Option<&voters::Link> {
        None
    }
}

/// The real world: the watch caches, the heartbeats over UDP, the responders, the BGP driver
/// and the Event queue.
pub(crate) struct World {
    pub stores: watch::Stores,
    pub gossip: Arc<Gossip>,
    pub announcer: Announcer,
    pub bgp: Bgp,
    pub events: EventQueue,
    /// The speaker's namespace (the Secrets BGPPeers name are read there).
    pub namespace: String,
}

impl Source for World {
    fn services(&self) -> Vec<Arc<ServiceObject>> {
        self.stores.services.state()
    }

    fn slices(&self) -> Vec<Arc<SliceObject>> {
        self.stores.slices.state()
    }

    fn service(&self, key: &ServiceKey) -> Option<Arc<ServiceObject>> {
        self.stores.service(key)
    }

    fn slices_of(&self, key: &ServiceKey) -> Vec<Arc<SliceObject>> {
        self.stores.slices_of(key)
    }

    fn take_changed(&self) -> Changed {
        self.stores.take_changed()
    }
}

impl LoopIo for World {
    fn nodes(&self) -> Vec<Arc<NodeView>> {
        self.stores.nodes.state()
    }

    fn nodes_generation(&self) -> u64 {
        self.stores.nodes.generation()
    }

    fn presence(&self) -> Vec<Arc<Lease>> {
        self.stores
            .presence
            .as_ref()
            .map(|p| p.state())
            .unwrap_or_default()
    }

    fn take_config_dirty(&self) -> bool {
        self.stores.take_config_dirty()
    }

    fn validated(&self, namespace: &str) -> Validated {
        self.stores.validated(namespace)
    }

    fn set_peers(&self, addresses: Vec<IpAddr>, nodes: BTreeSet<String>) {
        self.gossip.set_peers(addresses);
        self.gossip.set_nodes(nodes);
    }

    fn heartbeats(&self, known: &BTreeSet<String>, now: Instant) -> Heartbeats {
        let reports = self.gossip.reports(now);
        // One read of the acknowledgements serves the tenure and the claim rule.
        let acks = self.gossip.acks();
        let tenure = self.gossip.tenure(known, &acks);
        // After the acknowledgements: none of them is of a heartbeat later than this.
        let last_unready_seq = self.gossip.last_unready_seq();
        Heartbeats {
            reports,
            acks,
            tenure,
            last_unready_seq,
        }
    }

    async fn say(&self, acts: bool, interfaces: BTreeSet<String>) {
        self.gossip.set_local(acts, interfaces).await;
    }

    fn announce(
        &mut self,
        plan: &BTreeMap<IpAddr, Announcement>,
        usable: &BTreeMap<String, Interface>,
    ) -> Vec<(String, String)> {
        self.announcer
            .apply(plan, usable)
            .into_iter()
            .map(|f| (f.interface, f.error))
            .collect()
    }

    fn renew(&self, until: Instant) {
        self.announcer.renew(until);
    }

    fn advertise(
        &mut self,
        config: &Config,
        nodes: &BTreeMap<String, NodeView>,
        me: &str,
        services: &ViewMap,
        alive: Option<&BTreeMap<String, Member>>,
    ) -> usize {
        if let Some(alive) = alive {
            self.bgp.sweep_departed(me, nodes, alive.keys());
        }
        self.stores
            .secrets
            .want(&watch::password_secrets(config, &self.namespace));
        let secrets = &self.stores.secrets;
        self.bgp
            .apply(config, nodes, me, services, |name| secrets.get(name))
            .services
            .len()
    }

    fn announce_failed(&self, key: &ServiceKey, uid: Option<String>, why: String) {
        status::announce_failed(&self.events, key, uid, why);
    }

    fn voters(&self) -> Option<&voters::Link> {
        self.gossip.voters()
    }
}
