//! The Kubernetes API requests the controller and the speaker make, each with the call that
//! makes it, so that the chart can grant exactly these (issue 33, item 9).
//!
//! Two tests keep this true: every call site in the binaries' sources (`controller/src`,
//! `speaker/src`, `runtime/src`, outside `#[cfg(test)]`) must be claimed by an entry, and every
//! entry's call must be in its file (`table_claims_every_call_site`); and the rules the chart
//! renders must grant exactly the entries, no verb more, none less (chart.rs).
//!
//! A call site is a line naming one of kube's request parameter types (`PostParams`,
//! `PatchParams`, `DeleteParams`, `ListParams`, `GetParams`), a `watcher(` (a list, then a watch),
//! or one of the reads `get_opt(`, `get_metadata(`, `get_metadata_opt(`, `get_status(`. `Api::get`
//! reads like a map's `get` and is not found: the code reads with `get_opt` or `get_metadata`.

/// Where the objects of a request are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Anywhere in the cluster (a ClusterRole).
    Cluster,
    /// In the release's namespace (a Role).
    Release,
}

/// One kind of request: a verb on a resource, from a call in the source.
pub struct Call {
    /// The binaries that make it (`controller`, `speaker`).
    pub by: &'static [&'static str],
    pub scope: Scope,
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Resources, `/status` for the status subresource.
    pub resources: &'static [&'static str],
    pub verbs: &'static [&'static str],
    /// The one object it names, as the RBAC files name it (release `ferrolb`), if RBAC can
    /// name it.
    pub name: Option<&'static str>,
    /// The source file (from the repository root) and a text of the call, found on the call
    /// site's line or up to three lines above it.
    pub file: &'static str,
    pub call: &'static str,
}

const C: &[&str] = &["controller"];
const S: &[&str] = &["speaker"];
const BOTH: &[&str] = &["controller", "speaker"];
const CONFIG: &[&str] = &[
    "ipaddresspools",
    "l2advertisements",
    "bgpadvertisements",
    "bgppeers",
    "communities",
    "bfdprofiles",
];
const STATUS_OBJECTS: &[&str] = &["servicel2statuses", "servicebgpstatuses"];
const STATUS_OBJECTS_STATUS: &[&str] = &["servicel2statuses/status", "servicebgpstatuses/status"];
const LIST_WATCH: &[&str] = &["list", "watch"];

/// Every request, by the call that makes it.
pub const CALLS: &[Call] = &[
    // ---- both: the configuration, Events
    Call {
        by: BOTH,
        scope: Scope::Release,
        group: "metallb.io",
        resources: CONFIG,
        verbs: LIST_WATCH,
        name: None,
        file: "runtime/src/watch.rs",
        call: "watcher::Config::default().page_size(",
    },
    Call {
        by: BOTH,
        scope: Scope::Cluster,
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["patch"],
        name: None,
        file: "runtime/src/events.rs",
        call: "api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))",
    },
    Call {
        by: BOTH,
        scope: Scope::Cluster,
        group: "events.k8s.io",
        resources: &["events"],
        verbs: &["create"],
        name: None,
        file: "runtime/src/events.rs",
        call: "api.create(&PostParams::default(), &event)",
    },
    // ---- controller
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["services"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/run/watches.rs",
        call: "Api::<Service>::all(client.clone())",
    },
    // The first list at start-up, before the watch.
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["services"],
        verbs: &["list"],
        name: None,
        file: "controller/src/run/mod.rs",
        call: "ListParams::default().limit(FRESH_READ_PAGE)",
    },
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["services/status"],
        verbs: &["patch"],
        name: None,
        file: "controller/src/run/writes/service.rs",
        call: ".patch_status(",
    },
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["namespaces", "nodes"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/run/watches.rs",
        call: "Api::<PartialObjectMeta<K>>::all(self.client.clone())",
    },
    // Node addresses (controller.nodeAddresses): Nodes' addresses and readiness, and which
    // nodes hold a Service's ready endpoints.
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["nodes"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/run/watches.rs",
        call: "Api::<K>::all(client)",
    },
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "discovery.k8s.io",
        resources: &["endpointslices"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/run/watches.rs",
        call: "Api::<K>::all(client)",
    },
    // Which speakers are alive (node addresses, layer 2 voters): their presence Leases.
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/presence.rs",
        call: "watcher(api, watcher::Config::default().labels(&selector))",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["ipaddresspools/status"],
        verbs: &["patch"],
        name: None,
        file: "controller/src/run/writes/mod.rs",
        call: ".patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))",
    },
    // The finalizer of a BFDProfile a BGPPeer names.
    Call {
        by: C,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["bfdprofiles"],
        verbs: &["patch"],
        name: None,
        file: "controller/src/run/writes/report.rs",
        call: ".patch(name, &PatchParams::default(), &Patch::Merge(&patch))",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["configurationstates"],
        verbs: &["create"],
        name: None,
        file: "controller/src/run/writes/report.rs",
        call: "api.create(&PostParams::default(), &object)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["configurationstates/status"],
        verbs: &["patch"],
        name: None,
        file: "controller/src/run/writes/report.rs",
        call: "api.patch_status(STATE_NAME, &PatchParams::default(), &Patch::Merge(&patch))",
    },
    // Its owner; delete too, which clusters enforcing owner-reference permissions
    // (OwnerReferencesPermissionEnforcement) require for any change of ownerReferences.
    Call {
        by: C,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["configurationstates"],
        verbs: &["patch", "delete"],
        name: Some("controller"),
        file: "controller/src/run/writes/report.rs",
        call: ".patch(STATE_NAME, &PatchParams::default(), &owner.merge_patch())",
    },
    // The leader Lease: read, created (RBAC cannot name the object of a create), renewed and
    // taken over, released; its owner set (patch, and delete as above).
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "campaign.lease.api.get_opt(&name)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        name: None,
        file: "controller/src/leader.rs",
        call: "api.create(&PostParams::default(), &object)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["update"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "api.replace(name, &PostParams::default(), &renewed)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["update"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "api.replace(name, &PostParams::default(), &object)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["patch", "delete"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "api.patch(name, &PatchParams::default(), &owner.merge_patch())",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "api.get_opt(name)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["update"],
        name: Some("ferrolb-controller"),
        file: "controller/src/leader.rs",
        call: "api.replace(name, &PostParams::default(), &released)",
    },
    // Its own ServiceAccount, the owner of what it writes.
    Call {
        by: C,
        scope: Scope::Release,
        group: "",
        resources: &["serviceaccounts"],
        verbs: &["get"],
        name: Some("ferrolb-controller"),
        file: "controller/src/owner.rs",
        call: "api.get_metadata(&name)",
    },
    // The speakers' gossip key, created once if missing, never read.
    Call {
        by: C,
        scope: Scope::Release,
        group: "",
        resources: &["secrets"],
        verbs: &["create"],
        name: None,
        file: "controller/src/gossip_secret.rs",
        call: ".create(",
    },
    // Layer 2 voters: the Nodes and the speakers' presence Leases (who may vote), the voter
    // configuration (read afresh, created, replaced on its version), the voters' duty records
    // (read afresh, fenced on their version).
    Call {
        by: C,
        scope: Scope::Cluster,
        group: "",
        resources: &["nodes"],
        verbs: LIST_WATCH,
        name: None,
        file: "controller/src/voters.rs",
        call: "watcher(nodes, watcher::Config::default().page_size(500))",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "",
        resources: &["configmaps"],
        verbs: &["get"],
        name: None,
        file: "controller/src/voters.rs",
        call: "self.configs.get_opt(&self.settings.object)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["list"],
        name: None,
        file: "controller/src/voters.rs",
        call: ".list(&ListParams::default().labels(&selector))",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "",
        resources: &["configmaps"],
        verbs: &["create"],
        name: None,
        file: "controller/src/voters.rs",
        call: "configs.create(&PostParams::default(), &map)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "",
        resources: &["configmaps"],
        verbs: &["update"],
        name: None,
        file: "controller/src/voters.rs",
        call: "configs.replace(&name, &PostParams::default(), &map)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get"],
        name: None,
        file: "controller/src/voters.rs",
        call: "self.records.get_opt(&name)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        name: None,
        file: "controller/src/voters.rs",
        call: "records.create(&PostParams::default(), &lease)",
    },
    Call {
        by: C,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["update"],
        name: None,
        file: "controller/src/voters.rs",
        call: "records.replace(&name, &PostParams::default(), &lease)",
    },
    // ---- speaker
    // The presence Leases (by a label selector) into a reflector cache; Nodes, Services and
    // EndpointSlices into reduced caches.
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "",
        resources: &["nodes"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/watch.rs",
        call: "watcher(api, all())",
    },
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "",
        resources: &["services"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/watch.rs",
        call: "watcher(api, all())",
    },
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "discovery.k8s.io",
        resources: &["endpointslices"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/watch.rs",
        call: "watcher(api, all())",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "",
        resources: &["secrets"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/watch.rs",
        call: "watcher::Config::default().fields(&format!(\"metadata.name={name}\"))",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/watch.rs",
        call: "watcher(api, selector)",
    },
    // Layer 2 voters chosen by the controller: the voter configuration (watched; read afresh on
    // a voter node) and the node's duty record (read, created, replaced on its version).
    Call {
        by: S,
        scope: Scope::Release,
        group: "",
        resources: &["configmaps"],
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/l2/voter_object.rs",
        call: "watcher(self.configs.clone(), config)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "",
        resources: &["configmaps"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/l2/voter_object.rs",
        call: "self.configs.get_opt(&self.name)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/l2/voter_object.rs",
        call: "self.records.get_opt(&name)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["create"],
        name: None,
        file: "speaker/src/l2/voter_object.rs",
        call: "self.records.create(&PostParams::default(), &lease)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["update"],
        name: None,
        file: "speaker/src/l2/voter_object.rs",
        call: "self.records.replace(&name, &PostParams::default(), &lease)",
    },
    // Its own presence Lease: server-side apply (a patch, which needs create when the Lease is
    // missing), deleted on a clean stop.
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["patch", "create"],
        name: None,
        file: "speaker/src/l2/presence.rs",
        call: "&PatchParams::apply(MANAGER).force()",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "coordination.k8s.io",
        resources: &["leases"],
        verbs: &["delete"],
        name: None,
        file: "speaker/src/l2/presence.rs",
        call: "self.api.delete(&self.name, &DeleteParams::default())",
    },
    // Its Node's UID (the presence Lease's owner outside a pod).
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "",
        resources: &["nodes"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/l2/presence.rs",
        call: ".get_metadata_opt(&self.node)",
    },
    // Its own Pod: its DaemonSet, and whether it is being deleted.
    Call {
        by: S,
        scope: Scope::Release,
        group: "",
        resources: &["pods"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/run/mod.rs",
        call: "pods.get_metadata(&pod)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "",
        resources: &["pods"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/l2/restart.rs",
        call: "pods.get_opt(name)",
    },
    // The ServiceL2Status / ServiceBGPStatus objects of this node.
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: LIST_WATCH,
        name: None,
        file: "speaker/src/status_objects.rs",
        call: "let own = watcher(",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: &["list"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: ".list(&ListParams::default().labels(&selector))",
    },
    // The other nodes' objects of Services taken at a speaker's first plan, from the cache.
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: &["list"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: ".list(&ListParams::default().match_any().labels(&selector))",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: &["delete"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: ".delete(name, &DeleteParams::default())",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: &["create"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: "self.api.create(&PostParams::default(), &object)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS_STATUS,
        verbs: &["patch"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: ".patch_status(",
    },
    // Callers of its live report: their token reviewed, then their access (docs/explain.md).
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "authentication.k8s.io",
        resources: &["tokenreviews"],
        verbs: &["create"],
        name: None,
        file: "speaker/src/report/auth.rs",
        call: "Api::<TokenReview>::all(self.client.clone())",
    },
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "authorization.k8s.io",
        resources: &["subjectaccessreviews"],
        verbs: &["create"],
        name: None,
        file: "speaker/src/report/auth.rs",
        call: "Api::<SubjectAccessReview>::all(self.client.clone())",
    },
    // The ServiceBGPStatus objects of nodes gone: listed, each node asked for, deleted.
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["servicebgpstatuses"],
        verbs: &["list"],
        name: None,
        file: "speaker/src/bgp/status.rs",
        call: "api.list(&ListParams::default().labels(NODE_LABEL))",
    },
    Call {
        by: S,
        scope: Scope::Cluster,
        group: "",
        resources: &["nodes"],
        verbs: &["get"],
        name: None,
        file: "speaker/src/bgp/status.rs",
        call: "node_api.get_opt(node)",
    },
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: &["servicebgpstatuses"],
        verbs: &["delete"],
        name: None,
        file: "speaker/src/bgp/status.rs",
        call: "api.delete(name, &DeleteParams::default())",
    },
    // Its owner (delete for owner-reference enforcement is granted above).
    Call {
        by: S,
        scope: Scope::Release,
        group: "metallb.io",
        resources: STATUS_OBJECTS,
        verbs: &["patch"],
        name: None,
        file: "speaker/src/status_objects.rs",
        call: ".patch(name, &PatchParams::default(), &owner.merge_patch())",
    },
];

/// The source directories of the two binaries.
pub const SOURCES: &[&str] = &["controller/src", "speaker/src", "runtime/src"];

/// Whether `line` is a call site (see the module docs).
pub fn is_call_site(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or_default();
    if code.trim_start().starts_with("use ") || code.trim_start().starts_with("pub use ") {
        return false;
    }
    [
        "PostParams",
        "PatchParams",
        "DeleteParams",
        "ListParams",
        "GetParams",
        "watcher(",
        ".get_opt(",
        ".get_metadata(",
        ".get_metadata_opt(",
        ".get_status(",
    ]
    .iter()
    .any(|p| code.contains(p))
}

/// The code of a source file: up to its `#[cfg(test)]` module (a test-only item before it is
/// searched too: it can only claim more).
pub fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}
