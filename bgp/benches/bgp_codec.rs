//! Encode and decode of a typical UPDATE: one prefix, and 1,000 prefixes (packed into as few
//! 4096-octet messages as fit), for IPv4 (NLRI field) and IPv6 (MP_REACH_NLRI).
//!
//! Run: `cargo bench -p ferrolb-bgp --bench bgp_codec`

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ferrolb_bgp::packet::{
    AsPath, CodecContext, Community, LargeCommunity, Message, MpNextHop, Origin, PathAttributes,
    Update,
};
use ipnet::{Ipv4Net, Ipv6Net};

/// What a speaker announces for a Service: eBGP path, next hop, a community and a large one.
fn attributes() -> PathAttributes {
    PathAttributes {
        origin: Some(Origin::Igp),
        as_path: Some(AsPath::sequence(&[64512])),
        next_hop: Some(Ipv4Addr::new(198, 18, 250, 2)),
        communities: vec![Community::new(64512, 100)],
        large_communities: vec![LargeCommunity {
            global_admin: 64512,
            local_data_1: 1,
            local_data_2: 2,
        }],
        ..PathAttributes::default()
    }
}

fn ipv4_updates(n: u32, ctx: &CodecContext) -> Vec<Message> {
    let prefixes: Vec<Ipv4Net> = (0..n)
        .filter_map(|i| Ipv4Net::new(Ipv4Addr::from(0xc612_0000 + i), 32).ok())
        .collect();
    Update::announce_ipv4(&attributes(), &prefixes, ctx)
        .unwrap_or_default()
        .into_iter()
        .map(Message::Update)
        .collect()
}

fn ipv6_updates(n: u128, ctx: &CodecContext) -> Vec<Message> {
    let base = 0xfd00_0018_00fa_u128 << 80;
    let prefixes: Vec<Ipv6Net> = (0..n)
        .filter_map(|i| Ipv6Net::new(Ipv6Addr::from(base | i), 128).ok())
        .collect();
    let attrs = PathAttributes {
        next_hop: None,
        ..attributes()
    };
    let nh = MpNextHop::Ipv6 {
        global: Ipv6Addr::from(base | 2),
        link_local: None,
    };
    Update::announce_ipv6(&attrs, nh, &prefixes, ctx)
        .unwrap_or_default()
        .into_iter()
        .map(Message::Update)
        .collect()
}

fn encode_all(messages: &[Message], ctx: &CodecContext, out: &mut Vec<u8>) {
    out.clear();
    for m in messages {
        let _ = m.encode(ctx, out);
    }
}

fn decode_all(mut stream: &[u8], ctx: &CodecContext) -> usize {
    let mut n = 0;
    while let Ok(Some(len)) = Message::frame_len(stream) {
        let (frame, rest) = stream.split_at(len.min(stream.len()));
        if Message::decode(frame, ctx).is_ok() {
            n += 1;
        }
        stream = rest;
    }
    n
}

fn bench(c: &mut Criterion) {
    let ctx = CodecContext::default();
    let cases = [
        ("ipv4/1 prefix", 1u64, ipv4_updates(1, &ctx)),
        ("ipv4/1000 prefixes", 1000, ipv4_updates(1000, &ctx)),
        ("ipv6/1 prefix", 1, ipv6_updates(1, &ctx)),
        ("ipv6/1000 prefixes", 1000, ipv6_updates(1000, &ctx)),
    ];
    let mut group = c.benchmark_group("bgp_update");
    for (name, prefixes, messages) in &cases {
        let mut out = Vec::with_capacity(16 * 4096);
        encode_all(messages, &ctx, &mut out);
        let bytes = out.clone();
        println!(
            "{name}: {} message(s), {} octets",
            messages.len(),
            bytes.len()
        );
        group.throughput(Throughput::Elements(*prefixes));
        group.bench_function(format!("encode {name}"), |b| {
            b.iter(|| encode_all(black_box(messages), &ctx, &mut out));
        });
        group.bench_function(format!("decode {name}"), |b| {
            b.iter(|| decode_all(black_box(&bytes), &ctx))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
