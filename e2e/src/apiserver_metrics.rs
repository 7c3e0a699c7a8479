//! Requests the lab's API server has served, from its own Prometheus counters
//! (`apiserver_request_total`): how a bench counts what a system writes at rest, and a test
//! what a change costs the API server. The counters
//! carry no client, so a bench takes the lab's own writers (node agent, kube-controller-manager)
//! as a baseline before the system starts and subtracts their rate.

use std::collections::BTreeMap;

/// Write requests per resource (`group/resource[/subresource]`, `core` for the core group):
/// every verb but reads (GET, LIST, WATCH, WATCHLIST) and CONNECT.
pub type Writes = BTreeMap<String, f64>;

/// Parses the `apiserver_request_total` samples of a metrics page into [`Writes`].
pub fn parse_writes(page: &str) -> Writes {
    let mut writes = Writes::new();
    for ((verb, what), value) in parse_requests(page) {
        if matches!(
            verb.as_str(),
            "GET" | "LIST" | "WATCH" | "WATCHLIST" | "CONNECT"
        ) {
            continue;
        }
        *writes.entry(what).or_default() += value;
    }
    writes
}

/// Requests per verb and resource (`group/resource[/subresource]`, as in [`Writes`]), reads
/// included, summed over response codes and scopes.
pub type Requests = BTreeMap<(String, String), f64>;

/// Parses the `apiserver_request_total` samples of a metrics page into [`Requests`].
pub fn parse_requests(page: &str) -> Requests {
    let mut requests = Requests::new();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let label = |name: &str| {
            labels.split(',').find_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                (k == name).then(|| v.trim_matches('"').to_string())
            })
        };
        let verb = label("verb").unwrap_or_default();
        let group = label("group").filter(|g| !g.is_empty());
        let mut what = format!(
            "{}/{}",
            group.as_deref().unwrap_or("core"),
            label("resource").unwrap_or_default()
        );
        if let Some(sub) = label("subresource").filter(|s| !s.is_empty()) {
            what = format!("{what}/{sub}");
        }
        *requests.entry((verb, what)).or_default() += value;
    }
    requests
}

/// The API server's request counters now, reads included.
pub async fn requests(client: &kube::Client) -> anyhow::Result<Requests> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(parse_requests(&client.request_text(request).await?))
}

/// The API server's write counters now.
pub async fn writes(client: &kube::Client) -> anyhow::Result<Writes> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(parse_writes(&client.request_text(request).await?))
}

/// The writes between two readings, per minute over `seconds`, leaving out resources with none.
pub fn per_minute(before: &Writes, after: &Writes, seconds: f64) -> Writes {
    after
        .iter()
        .filter_map(|(what, &n)| {
            let d = n - before.get(what).copied().unwrap_or(0.0);
            (d > 0.0).then(|| (what.clone(), d * 60.0 / seconds.max(1e-9)))
        })
        .collect()
}

/// The total of [`Writes`].
pub fn total(writes: &Writes) -> f64 {
    writes.values().sum()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const PAGE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="GET",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="PATCH",version="v1"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="services",scope="resource",subresource="status",verb="PUT",version="v1"} 1
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="events",scope="namespace",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 9
apiserver_request_duration_seconds_bucket{verb="PUT",le="0.1"} 5
"#;

    #[test]
    fn counts_writes_per_resource_and_leaves_reads_out() {
        let w = parse_writes(PAGE);
        assert_eq!(
            w,
            Writes::from([
                ("coordination.k8s.io/leases".to_string(), 40.0),
                ("core/events".to_string(), 3.0),
                ("core/services/status".to_string(), 8.0),
            ])
        );
        assert_eq!(total(&w), 51.0);
    }

    #[test]
    fn counts_every_request_per_verb_and_resource() {
        let r = parse_requests(PAGE);
        let get = |verb: &str, what: &str| r.get(&(verb.to_string(), what.to_string())).copied();
        assert_eq!(get("GET", "coordination.k8s.io/leases"), Some(40.0));
        assert_eq!(get("WATCH", "core/pods"), Some(9.0));
        assert_eq!(get("PUT", "core/services/status"), Some(1.0));
        assert_eq!(get("LIST", "core/pods"), None);
        assert_eq!(r.len(), 6);
    }

    #[test]
    fn rates_per_minute_between_readings() {
        let before = parse_writes(PAGE);
        let mut after = before.clone();
        *after.get_mut("core/events").unwrap() += 6.0;
        after.insert("metallb.io/servicel2statuses".into(), 2.0);
        let rate = per_minute(&before, &after, 30.0);
        assert_eq!(
            rate,
            Writes::from([
                ("core/events".to_string(), 12.0),
                ("metallb.io/servicel2statuses".to_string(), 4.0),
            ])
        );
    }
}
