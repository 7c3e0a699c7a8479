//! The node-address decision (decision 0024) over a grid of cluster sizes: how long deciding
//! every Service served by node addresses takes, which the controller does once per change of
//! its inputs (a Node's addresses, labels or readiness, a speaker coming or going, a member
//! Service or, with `Local`, its endpoints).
//!
//! Run: `cargo bench -p ferrolb-config --bench node_addresses -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrolb_config::address::Family;
use ferrolb_config::allocator::{ProtocolPort, ServiceKey};
use ferrolb_config::node_addresses::{
    HeldPorts, Node, Nodes, Service, TrafficPolicy, compute, compute_service_brief, priority,
};
use ferrolb_config::selector::Labels;

/// `n` Ready nodes with a live speaker, each with a dual-stack Internal IP.
fn nodes(n: u32) -> Nodes {
    Nodes::new((0..n).map(|i| Node {
        name: format!("node-{i:05}"),
        labels: Labels::new(),
        internal: vec![
            IpAddr::V4(Ipv4Addr::from(0xC612_0000 + i)),
            IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, i as u16)),
        ],
        external: Vec::new(),
        ready: true,
        speaker_alive: true,
    }))
    .unwrap()
}

/// `s` dual-stack Services, each on a port of its own (none is refused a node), one in ten with
/// `externalTrafficPolicy: Local` and endpoints on three nodes.
fn services(s: u32) -> Vec<Service> {
    (0..s)
        .map(|i| Service {
            key: ServiceKey::new("bench", format!("svc-{i:05}")),
            created: i64::from(i),
            labels: Labels::new(),
            ip_families: vec![Family::V4, Family::V6],
            ports: vec![ProtocolPort::tcp(1024 + (i % 60_000) as u16)],
            traffic: if i % 10 == 0 {
                TrafficPolicy::Local {
                    ready_endpoint_nodes: (0..3).map(|k| format!("node-{k:05}")).collect(),
                }
            } else {
                TrafficPolicy::Cluster
            },
            current_ingress: Vec::new(),
        })
        .collect()
}

/// The controller's loop (`controller/src/node_addresses.rs`): every Service in priority order,
/// without the per-node detail.
fn brief(nodes: &Nodes, services: &[Service]) -> usize {
    let mut order: Vec<&Service> = services.iter().collect();
    order.sort_by(|a, b| priority(a, b));
    let mut held = HeldPorts::new();
    let mut listed = 0;
    for service in order {
        let outcome = compute_service_brief(nodes, service, &held).unwrap();
        held.hold(service, &outcome.ingress);
        listed += outcome.ingress.len();
    }
    listed
}

fn decide_all(c: &mut Criterion, node_counts: &[u32], service_counts: &[u32]) {
    let mut group = c.benchmark_group("node_addresses/compute");
    group.sample_size(10);
    for &n in node_counts {
        let nodes = nodes(n);
        for &s in service_counts {
            let services = services(s);
            group.throughput(Throughput::Elements(u64::from(s)));
            group.bench_with_input(
                BenchmarkId::new(format!("{n}_nodes"), s),
                &services,
                |b, services| b.iter(|| black_box(compute(&nodes, services).unwrap())),
            );
            // As the controller runs it: without the per-node detail.
            group.bench_with_input(
                BenchmarkId::new(format!("{n}_nodes_brief"), s),
                &services,
                |b, services| b.iter(|| black_box(brief(&nodes, services))),
            );
        }
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs each bench once, in a
    // debug build, where the large grid would take minutes: a small grid checks it runs.
    let measuring = std::env::args().any(|a| a == "--bench");
    let (node_counts, service_counts): (&[u32], &[u32]) = if measuring {
        (&[3, 100, 1_000], &[1_000, 10_000])
    } else {
        (&[3, 100], &[100])
    };
    decide_all(&mut c, node_counts, service_counts);
    c.final_summary();
}
