//! Allocator benchmarks: allocations per second, how cost depends on pool size, and the
//! allocator's heap memory (measured with a counting global allocator and printed first).
//!
//! Run: `cargo bench -p ferrolb-config --bench allocator -- --warm-up-time 1 --measurement-time 3`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::net::IpAddr;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use ferrolb_config::address::Family;
use ferrolb_config::allocator::{
    Allocator, FamilyPolicy, ProtocolPort, ServiceKey, ServiceRequest,
};
use ferrolb_config::model::Pool;
use ferrolb_config::selector::Labels;

#[global_allocator]
static HEAP: ferrolb_testkit::heap::Counting = ferrolb_testkit::heap::Counting;

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

#[allow(unsafe_code)]
unsafe extern "C" {
    fn clock_gettime(clock: i32, time: *mut Timespec) -> i32;
}

/// Linux `CLOCK_THREAD_CPUTIME_ID`.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

/// CPU time this thread has run. The benchmarks time with it rather than the wall clock because
/// the 2-core machine they run on is shared with builds: time spent waiting for a core is not
/// the allocator's.
fn cpu_time() -> Duration {
    let mut now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec (x86_64/aarch64 Linux layout).
    #[allow(unsafe_code)]
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

use ferrolb_testkit::heap::live_bytes;

fn pool(cidr: &str) -> Pool {
    let name = format!("pool-{}", cidr.replace(['/', ':', '.'], "-"));
    ferrolb_testkit::model::pool(&name, &[cidr])
}

fn family_of(cidr: &str) -> Family {
    if cidr.contains(':') {
        Family::V6
    } else {
        Family::V4
    }
}

/// `n` Services in 50 namespaces as `ServiceRequest::from_service` would build them: one TCP
/// port, no annotation, no Service labels, and a fresh copy of the namespace's labels each.
fn requests(n: usize, family: Family) -> Vec<ServiceRequest> {
    (0..n)
        .map(|i| {
            let namespace = format!("ns-{}", i % 50);
            let namespace_labels: Labels =
                [("kubernetes.io/metadata.name".to_string(), namespace.clone())].into();
            ServiceRequest::new(namespace, format!("svc-{i}"))
                .with_families(FamilyPolicy::SingleStack, &[family])
                .with_ports(&[ProtocolPort::tcp(443)])
                .with_namespace_labels(namespace_labels)
        })
        .collect()
}

fn fill(cidr: &str, reqs: &[ServiceRequest]) -> Allocator {
    let mut a = Allocator::new(vec![pool(cidr)]);
    for r in reqs {
        a.allocate(r).unwrap();
    }
    a
}

/// CPU time of `n` allocations into a fresh allocator, `iters` times (setup and drop not timed).
fn time_fill(cidr: &str, reqs: &[ServiceRequest], iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let mut a = Allocator::new(vec![pool(cidr)]);
        let start = cpu_time();
        for r in reqs {
            black_box(a.allocate(r).unwrap());
        }
        total += cpu_time() - start;
        drop(a);
    }
    total
}

/// Heap bytes the allocator keeps for `n` Services, requests dropped (as in the controller,
/// where the allocator then owns the keys and label maps it holds).
fn memory_of(cidr: &str, n: usize) -> (isize, usize) {
    let before = live_bytes();
    let reqs = requests(n, family_of(cidr));
    let a = fill(cidr, &reqs);
    drop(reqs);
    let bytes = live_bytes() - before;
    let intervals = a.free_space_intervals();
    drop(a);
    (bytes, intervals)
}

/// Prints the allocator's memory. Everything measured is allocated and freed while counting is
/// on, so the differences are exact.
fn report_memory() {
    ferrolb_testkit::heap::start();
    println!("== allocator heap memory (counting global allocator, requests dropped) ==");
    for cidr in ["10.0.0.0/8", "fd00::/64", "::/0"] {
        let before = live_bytes();
        let a = Allocator::new(vec![pool(cidr)]);
        println!(
            "empty allocator, one {cidr:>11} pool: {:>7} bytes, {} free-space interval(s)",
            live_bytes() - before,
            a.free_space_intervals()
        );
    }
    for (cidr, n) in [
        ("10.0.0.0/16", 10_000),
        ("10.0.0.0/14", 100_000),
        ("fd00::/64", 10_000),
        ("fd00::/64", 100_000),
    ] {
        let (bytes, intervals) = memory_of(cidr, n);
        println!(
            "{n:>7} Services on {cidr:>11}: {bytes:>11} bytes total, {:>4} bytes/Service, {intervals} free-space interval(s)",
            bytes / n as isize
        );
    }
    // Holes: release every other Service of 100k.
    let before = live_bytes();
    let reqs = requests(100_000, Family::V4);
    let mut a = fill("10.0.0.0/14", &reqs);
    let keys: Vec<ServiceKey> = reqs.iter().map(|r| r.key.clone()).collect();
    drop(reqs);
    for k in keys.iter().step_by(2) {
        a.release(k);
    }
    drop(keys);
    println!(
        " 50,000 Services left after releasing every other of 100k on /14: {} bytes, {} free-space intervals",
        live_bytes() - before,
        a.free_space_intervals()
    );
    drop(a);
    ferrolb_testkit::heap::stop();
    println!();
}

fn bench_allocate(c: &mut Criterion) {
    let mut group = c.benchmark_group("allocate");
    group.sample_size(10);
    // A /16 holds 65,536 addresses, so 100k Services use a /14.
    for (cidr, n) in [
        ("10.0.0.0/16", 10_000),
        ("10.0.0.0/14", 100_000),
        ("fd00::/64", 10_000),
        ("fd00::/64", 100_000),
    ] {
        let reqs = requests(n, family_of(cidr));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::new(cidr, n), |b| {
            b.iter_custom(|iters| time_fill(cidr, &reqs, iters))
        });
    }
    group.finish();
}

fn bench_pool_size(c: &mut Criterion) {
    // 10k allocations need at least 10,000 addresses: the smallest pools are a /18 and a /114.
    let mut group = c.benchmark_group("pool_size_10k");
    group.sample_size(10);
    let n = 10_000;
    for cidr in [
        "10.0.0.0/18",
        "10.0.0.0/16",
        "10.0.0.0/12",
        "10.0.0.0/8",
        "fd00::/114",
        "fd00::/96",
        "fd00::/64",
        "fd00::/48",
    ] {
        let reqs = requests(n, family_of(cidr));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_function(BenchmarkId::from_parameter(cidr), |b| {
            b.iter_custom(|iters| time_fill(cidr, &reqs, iters))
        });
    }
    group.finish();
}

fn bench_steady_state(c: &mut Criterion) {
    let mut group = c.benchmark_group("steady_100k");
    group.sample_size(10);
    let n = 100_000;
    let reqs = requests(n, Family::V4);

    // The controller re-reconciles every Service: allocate() on an unchanged request.
    group.throughput(Throughput::Elements(n as u64));
    let mut full = fill("10.0.0.0/14", &reqs);
    group.bench_function("reallocate_unchanged", |b| {
        b.iter_custom(|iters| {
            let start = cpu_time();
            for _ in 0..iters {
                for r in &reqs {
                    black_box(full.allocate(r).unwrap());
                }
            }
            cpu_time() - start
        })
    });
    drop(full);

    // Restart: re-claim 100k addresses from Service status with assign().
    let status: Vec<(ServiceRequest, Vec<IpAddr>)> = {
        let a = fill("10.0.0.0/14", &reqs);
        reqs.iter()
            .map(|r| (r.clone(), a.assignment(&r.key).unwrap().ips.to_vec()))
            .collect()
    };
    group.bench_function("restore_with_assign", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut a = Allocator::new(vec![pool("10.0.0.0/14")]);
                let start = cpu_time();
                for (r, ips) in &status {
                    black_box(a.assign(r, ips).unwrap());
                }
                total += cpu_time() - start;
            }
            total
        })
    });

    // Churn in a fragmented pool: release one Service and allocate another, 100k times.
    let mut churn = fill("10.0.0.0/14", &reqs);
    for r in reqs.iter().step_by(3) {
        churn.release(&r.key);
    }
    group.bench_function("release_then_allocate", |b| {
        b.iter_custom(|iters| {
            let start = cpu_time();
            for _ in 0..iters {
                for r in &reqs {
                    churn.release(&r.key);
                    black_box(churn.allocate(r).unwrap());
                }
            }
            cpu_time() - start
        })
    });
    group.finish();
}

fn main() {
    report_memory();
    let mut c = Criterion::default().configure_from_args();
    bench_allocate(&mut c);
    bench_pool_size(&mut c);
    bench_steady_state(&mut c);
    c.final_summary();
}
