//! Tells the cluster what this node announces in layer 2 mode: a ServiceL2Status object per
//! Service it owns (MetalLB's status API) and a `nodeAssigned` Event when it takes one, through
//! the shared writer in [`crate::status_objects`]. One node owns a Service's IPs, so taking a
//! Service deletes the object of the node it took it from (by name, no list), or, when this
//! node's plans never saw the previous owner, the objects any other node left.

use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::crd::{
    InterfaceInfo, ServiceL2Status, ServiceL2StatusSpec, ServiceL2StatusStatus,
};
use ferrolb_runtime::events::{EventQueue, Queued};

use crate::status_objects::{StatusKind, service_reference};

/// What the node announces, by Service (the pure step decides it).
pub use crate::l2::step::{Owned, Reported as Desired};

/// ServiceL2Status, as the shared writer writes it.
pub struct Layer2;

impl StatusKind for Layer2 {
    type Object = ServiceL2Status;
    type Value = Owned;
    const KIND: &'static str = "ServiceL2Status";
    const PREFIX: &'static str = "l2";
    const PROTOCOL: &'static str = "layer2";
    const EXCLUSIVE: bool = true;

    fn object(name: &str) -> ServiceL2Status {
        ServiceL2Status::new(name, ServiceL2StatusSpec {})
    }

    fn status(key: &ServiceKey, node: &str, owned: &Owned) -> serde_json::Value {
        serde_json::json!(ServiceL2StatusStatus {
            node: node.to_string(),
            service_name: key.name().to_string(),
            service_namespace: key.namespace().to_string(),
            interfaces: owned
                .interfaces
                .iter()
                .map(|i| InterfaceInfo { name: i.clone() })
                .collect(),
        })
    }

    fn uid(owned: &Owned) -> Option<String> {
        owned.uid.clone()
    }

    fn taken_from(owned: &Owned) -> Option<&str> {
        owned.taken_from.as_deref()
    }
}

/// Queues an `announceFailed` Event on a Service (never waits: the loop goes on announcing).
pub fn announce_failed(events: &EventQueue, key: &ServiceKey, uid: Option<String>, why: String) {
    events.push(Queued {
        warning: true,
        reason: "announceFailed",
        message: why,
        action: "Announce",
        regarding: service_reference(key, uid),
    });
}
