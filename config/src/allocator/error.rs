//! Why the allocator cannot give a Service an address, in words for the Service's owner.

use std::net::IpAddr;

use crate::address::Family;

use super::request::ServiceKey;
use super::sharing::ShareConflict;

/// Why an allocation, an assignment, or a kept assignment failed. Messages go into the
/// `AllocationFailed` / `ClearAssignment` Events of the Service as they are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocationError {
    /// The named pool has no free address of the family.
    #[error("pool {pool:?} has no free {family} address")]
    PoolExhausted {
        /// The pool.
        pool: String,
        /// The family that ran out.
        family: Family,
    },
    /// Every pool the Service may use automatically is full.
    #[error("no free address: every pool this Service may use is full ({})", pools.join(", "))]
    AllPoolsExhausted {
        /// The pools tried, in the order they were tried.
        pools: Vec<String>,
    },
    /// No pool with `autoAssign: true` admits the Service.
    #[error(
        "no pool with autoAssign: true admits {service} (check the pools' serviceAllocation namespaces and selectors, or name a pool with metallb.io/address-pool)"
    )]
    NoPoolAdmits {
        /// The Service.
        service: ServiceKey,
    },
    /// Pools admit the Service, but none has addresses of the family it needs.
    #[error("no pool this Service may use has {family} addresses")]
    NoPoolForFamily {
        /// The family needed.
        family: Family,
    },
    /// RequireDualStack, and no usable pool has both families.
    #[error("RequireDualStack: no pool this Service may use has both IPv4 and IPv6 addresses")]
    DualStackNotPossible,
    /// The annotation names a pool that does not exist.
    #[error("metallb.io/address-pool: pool {pool:?} does not exist")]
    UnknownPool {
        /// The pool named.
        pool: String,
    },
    /// The pool's `serviceAllocation` does not admit the Service.
    #[error(
        "pool {pool:?} does not admit {service}: its serviceAllocation restricts namespaces or Services"
    )]
    PoolDoesNotAdmit {
        /// The pool.
        pool: String,
        /// The Service.
        service: ServiceKey,
    },
    /// The pool has no address of a family the Service needs.
    #[error("pool {pool:?} has no {family} addresses")]
    FamilyNotInPool {
        /// The pool.
        pool: String,
        /// The family.
        family: Family,
    },
    /// A requested (or restored) IP is in no pool.
    #[error("{ip} is not in any IPAddressPool")]
    IpNotInAnyPool {
        /// The address.
        ip: IpAddr,
    },
    /// A requested (or restored) IP is outside the pool the annotation names.
    #[error("{ip} is not in pool {pool:?} named by metallb.io/address-pool")]
    IpNotInAnnotatedPool {
        /// The address.
        ip: IpAddr,
        /// The annotated pool.
        pool: String,
    },
    /// The IPs of one Service are in different pools.
    #[error(
        "{first} (pool {first_pool:?}) and {second} (pool {second_pool:?}) are in different pools; a Service's addresses come from one pool"
    )]
    IpsInDifferentPools {
        /// First address.
        first: IpAddr,
        /// Its pool.
        first_pool: String,
        /// Second address.
        second: IpAddr,
        /// Its pool.
        second_pool: String,
    },
    /// The IP ends in .0 or .255 and the pool avoids those.
    #[error("{ip} ends in .0 or .255, which pool {pool:?} skips (avoidBuggyIPs: true)")]
    BuggyIp {
        /// The address.
        ip: IpAddr,
        /// The pool.
        pool: String,
    },
    /// The IP is held by another Service and cannot be shared.
    #[error("{ip} is in use by {holder} and cannot be shared: {conflict}")]
    IpInUse {
        /// The address.
        ip: IpAddr,
        /// A Service holding it.
        holder: ServiceKey,
        /// Why sharing is refused.
        conflict: ShareConflict,
    },
    /// An IP of a family the Service does not ask for.
    #[error("{ip} is {}, a family this Service does not ask for", Family::of(*.ip))]
    FamilyNotRequested {
        /// The address.
        ip: IpAddr,
    },
    /// Two IPs of one family for one Service.
    #[error("{first} and {second} are both {}; a Service holds at most one address per family", Family::of(*.first))]
    TwoOfOneFamily {
        /// First address.
        first: IpAddr,
        /// Second address.
        second: IpAddr,
    },
    /// RequireDualStack with requested (or restored) IPs of one family only.
    #[error("RequireDualStack needs one address of each family; the {family} address is missing")]
    MissingFamily {
        /// The family without an address.
        family: Family,
    },
    /// The IPs to assign are not the ones the Service requests.
    #[error("the Service holds {} but requests {} (metallb.io/loadBalancerIPs or spec.loadBalancerIP)", list_ips(.ips), list_ips(.requested))]
    NotRequested {
        /// The addresses offered.
        ips: Vec<IpAddr>,
        /// The addresses requested.
        requested: Vec<IpAddr>,
    },
    /// Nothing to assign.
    #[error("no address given")]
    NoAddress,
    /// The pool the Service's IPs came from was deleted.
    #[error("pool {pool:?} was deleted")]
    PoolDeleted {
        /// The pool.
        pool: String,
    },
    /// The pool no longer holds the Service's IP.
    #[error("{ip} is no longer in pool {pool:?}")]
    IpLeftPool {
        /// The address.
        ip: IpAddr,
        /// The pool.
        pool: String,
    },
}

fn list_ips(ips: &[IpAddr]) -> String {
    let list: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
    list.join(",")
}
