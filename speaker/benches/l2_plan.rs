//! The layer 2 plan step over a grid of cluster sizes (issue #40): a full plan from scratch
//! (what every step cost before the incremental planner, and what a new configuration still
//! costs), and the planner's update for one Service change, for one speaker leaving and coming
//! back, and for a step in which nothing changed.
//!
//! Each update is measured with its inputs already built and told which Services changed, as
//! the work loop's watches tell it. `l2_views` is what rebuilding every Service's view from
//! the caches costs, which the loop did at every step before it kept the views
//! (`service_views`) and now does only when a watch lists again.
//!
//! Before the timings it prints the heap the kept state takes (counted by a global allocator
//! that counts only while memory is measured): the views, and the planner on top of them.
//!
//! Run: `cargo bench -p ferrolb-speaker --bench l2_plan -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use criterion::{BatchSize, BenchmarkId, Criterion};
use ferrolb_config::allocator::ServiceKey;
use ferrolb_config::model::{Config, L2Advertisement, PoolSelection};
use ferrolb_layer2::liveness::Member;
use ferrolb_speaker::l2::plan::{self, Inputs};
use ferrolb_speaker::l2::planner::Planner;
use ferrolb_speaker::service_views::{Changed, ViewMap};
use ferrolb_speaker::view::{NodeMap, NodeView, ServiceObject, ServiceView, SliceObject};
use ferrolb_testkit::heap;
use ferrolb_testkit::model::pool;

#[global_allocator]
static HEAP: ferrolb_testkit::heap::Counting = ferrolb_testkit::heap::Counting;

/// Prints the heap of the views and of the planner over them (the views are shared with the
/// planner, so its figure is what it adds).
fn memory(node_counts: &[u32], service_counts: &[u32]) {
    let config = config();
    for &n in node_counts {
        let (nodes, members) = cluster(n);
        for &s in service_counts {
            let views = services(s, n);
            let (map, views_bytes) = heap::measure(|| -> ViewMap {
                views
                    .iter()
                    .map(|v| (v.key.clone(), Arc::new(v.clone())))
                    .collect()
            });
            let (planner, planner_bytes) = heap::measure(|| {
                let mut planner = Planner::new("node-00000");
                planner.update(&config, nodes.clone(), members.clone(), &map, &Changed::All);
                planner
            });
            println!(
                "l2_memory/{n}x{s}: views {:.1} MiB ({} B per Service), planner {:.1} MiB ({} B per Service)",
                views_bytes as f64 / 1048576.0,
                views_bytes / s as isize,
                planner_bytes as f64 / 1048576.0,
                planner_bytes / s as isize,
            );
            drop(planner);
        }
    }
}

/// One pool over the whole lab range and one advertisement for it.
fn config() -> Arc<Config> {
    let mut c = Config::default();
    c.pools
        .insert("l2".into(), pool("l2", &["198.18.0.0/15", "fd00:18::/96"]));
    let adv = L2Advertisement {
        name: "l2".into(),
        pools: PoolSelection {
            names: ["l2".to_string()].into(),
            selectors: vec![],
        },
        ..Default::default()
    };
    c.l2_advertisements.insert(adv.name.clone(), adv);
    Arc::new(c)
}

fn name(i: u32) -> String {
    format!("node-{i:05}")
}

/// `n` nodes, every one a live speaker with eth0. The Nodes come shared, as the speaker's Node
/// cache hands them to the planner while none changes.
fn cluster(n: u32) -> (Arc<NodeMap>, BTreeMap<String, Member>) {
    let nodes: NodeMap = (0..n)
        .map(|i| {
            let view = NodeView {
                name: name(i),
                ..Default::default()
            };
            (name(i), view)
        })
        .collect();
    let members = (0..n)
        .map(|i| {
            let member = Member {
                interfaces: ["eth0".to_string()].into(),
                interfaces_unknown: false,
            };
            (name(i), member)
        })
        .collect();
    (Arc::new(nodes), members)
}

/// `s` dual-stack Services, one in ten with `externalTrafficPolicy: Local` and endpoints on
/// three nodes.
fn services(s: u32, n: u32) -> Vec<ServiceView> {
    (0..s)
        .map(|i| {
            let local = i % 10 == 0;
            ServiceView {
                service: Arc::new(ServiceObject {
                    key: ServiceKey::new("bench", format!("svc-{i:05}").as_str()),
                    labels: Default::default(),
                    ips: vec![
                        IpAddr::V4(Ipv4Addr::from(0xC612_0000 + i)),
                        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x18, 0, 0, 0, 0, 0, i as u16)),
                    ],
                    local_traffic: local,
                    uid: None,
                }),
                serving_nodes: if local {
                    (0..3).map(|k| name((i + k) % n)).collect()
                } else {
                    Default::default()
                },
                any_serving: true,
            }
        })
        .collect()
}

/// The cost the work loop pays before planning: reducing `s` cached Services and their
/// EndpointSlices to views (`l2::step::views`).
fn views(c: &mut Criterion, service_counts: &[u32]) {
    use ferrolb_testkit::objects;
    let mut group = c.benchmark_group("l2_views");
    group.sample_size(10);
    for &s in service_counts {
        let svcs: Vec<_> = (0..s)
            .map(|i| {
                let ip = Ipv4Addr::from(0xC612_0000 + i).to_string();
                Arc::new(
                    objects::service(&format!("svc-{i:05}"))
                        .namespace("bench")
                        .uid(&format!("uid-{i}"))
                        .port(80, "TCP")
                        .ingress(&[ip.as_str()])
                        .build(),
                )
            })
            .collect();
        let slices: Vec<_> = (0..s)
            .map(|i| {
                Arc::new(
                    objects::endpoint_slice(&format!("svc-{i:05}-x"))
                        .namespace("bench")
                        .service(&format!("svc-{i:05}"))
                        .endpoint(objects::endpoint("10.0.0.1").node(&name(i % 3)).ready(true))
                        .build(),
                )
            })
            .collect();
        // Reduced as the watches reduce them on arrival.
        let svcs = ServiceObject::reduce_all(&svcs, None);
        let slices = SliceObject::reduce_all(&slices);
        group.bench_function(BenchmarkId::from_parameter(s), |b| {
            b.iter(|| black_box(ferrolb_speaker::l2::step::views(&svcs, &slices)))
        });
    }
    group.finish();
}

fn grid(c: &mut Criterion, node_counts: &[u32], service_counts: &[u32]) {
    let config = config();
    let mut group = c.benchmark_group("l2_plan");
    group.sample_size(10);
    for &n in node_counts {
        let (nodes, members) = cluster(n);
        for &s in service_counts {
            let views = services(s, n);
            let id = format!("{n}x{s}");
            group.bench_with_input(BenchmarkId::new("full", &id), &views, |b, views| {
                b.iter(|| {
                    let inputs = Inputs {
                        config: &config,
                        nodes: &nodes,
                        members: &members,
                        me: "node-00000",
                    };
                    black_box(plan::plan(inputs, views))
                })
            });
            let map: ViewMap = views
                .iter()
                .map(|v| (v.key.clone(), Arc::new(v.clone())))
                .collect();
            let none = Changed::Keys(Default::default());
            let mut planner = Planner::new("node-00000");
            planner.update(&config, nodes.clone(), members.clone(), &map, &Changed::All);
            let inputs = || (nodes.clone(), members.clone());
            group.bench_function(BenchmarkId::new("nothing_changed", &id), |b| {
                b.iter_batched(
                    inputs,
                    |(nodes, members)| {
                        black_box(planner.update(&config, nodes, members, &map, &none))
                    },
                    BatchSize::LargeInput,
                )
            });
            // One Service's endpoints go and come back, alternately.
            let key = views[s as usize / 2].key.clone();
            let mut off = map.clone();
            let mut view = (*off[&key]).clone();
            view.any_serving = false;
            off.insert(key.clone(), Arc::new(view));
            let one = Changed::Keys([key].into());
            let mut flip = false;
            group.bench_function(BenchmarkId::new("one_service", &id), |b| {
                b.iter_batched(
                    || {
                        flip = !flip;
                        let (nodes, members) = inputs();
                        (nodes, members, if flip { &off } else { &map })
                    },
                    |(nodes, members, views)| {
                        black_box(planner.update(&config, nodes, members, views, &one))
                    },
                    BatchSize::LargeInput,
                )
            });
            // One speaker leaves and comes back, alternately.
            let mut gone = false;
            group.bench_function(BenchmarkId::new("one_speaker", &id), |b| {
                b.iter_batched(
                    || {
                        gone = !gone;
                        let (nodes, mut members) = inputs();
                        if gone {
                            members.remove(&name(n / 2));
                        }
                        (nodes, members)
                    },
                    |(nodes, members)| {
                        black_box(planner.update(&config, nodes, members, &map, &none))
                    },
                    BatchSize::LargeInput,
                )
            });
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
    memory(node_counts, service_counts);
    views(&mut c, service_counts);
    grid(&mut c, node_counts, service_counts);
    c.final_summary();
}
