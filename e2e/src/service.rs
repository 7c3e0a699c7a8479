//! LoadBalancer Services in tests: building them and waiting for what ferrolb writes.

use std::time::Duration;

use ferrolb_testkit::objects::{ServiceBuilder, service};
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;

use crate::cluster::wait_for;

/// A LoadBalancer Service `name` with HTTP port 80 to the pods' 8080, for a test to add to.
pub fn lb_service(name: &str) -> ServiceBuilder {
    service(name).named_port("http", 80, 8080, "TCP")
}

/// The IPs in a Service's `status.loadBalancer.ingress`.
pub fn ingress_ips(s: &Service) -> Vec<String> {
    s.status
        .as_ref()
        .and_then(|st| st.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|i| i.iter().filter_map(|x| x.ip.clone()).collect())
        .unwrap_or_default()
}

/// Waits until Service `name` holds `want` IPs and the pool annotation (or neither, for 0).
pub async fn wait_ips(api: &Api<Service>, name: &str, want: usize) -> anyhow::Result<Service> {
    // The controller writes the IPs, then the pool annotation: wait for both (or both gone).
    wait_for(
        &format!("Service {name} to get {want} IP(s) and the pool annotation"),
        Duration::from_secs(30),
        || async {
            let s = api.get(name).await.map_err(|e| e.to_string())?;
            let ips = ingress_ips(&s);
            let annotated = s
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("metallb.io/ip-allocated-from-pool"));
            if ips.len() == want && annotated == (want > 0) {
                Ok(Some(s))
            } else {
                Err(format!("ingress {ips:?}, annotated {annotated}"))
            }
        },
    )
    .await
}

/// The one node announcing Service `namespace/name` in layer 2, from the ServiceL2Status objects
/// the speakers write (in ferrolb's namespace), once there is exactly one.
pub async fn wait_l2_owner(
    lab: &crate::Lab,
    namespace: &str,
    name: &str,
) -> anyhow::Result<String> {
    let selector =
        format!("metallb.io/service-namespace={namespace},metallb.io/service-name={name}");
    crate::cluster::wait_for(
        &format!("a speaker to announce {namespace}/{name} (ServiceL2Status)"),
        std::time::Duration::from_secs(60),
        || async {
            let out = lab
                .kubectl(&[
                    "get",
                    "servicel2statuses",
                    "-n",
                    crate::ferrolb::NAMESPACE,
                    "-l",
                    &selector,
                    "-o",
                    "jsonpath={.items[*].status.node}",
                ])
                .map_err(|e| e.to_string())?;
            match out.split_whitespace().collect::<Vec<_>>()[..] {
                [one] => Ok(Some(one.to_string())),
                ref other => Err(format!("owners so far: {other:?}")),
            }
        },
    )
    .await
}
