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
    for (labels, value) in samples(page, "apiserver_request_total") {
        let verb = labels.get("verb").unwrap_or_default();
        let mut what = format!(
            "{}/{}",
            labels.group(),
            labels.get("resource").unwrap_or_default()
        );
        if let Some(sub) = labels.get("subresource").filter(|s| !s.is_empty()) {
            what = format!("{what}/{sub}");
        }
        *requests.entry((verb, what)).or_default() += value;
    }
    requests
}

/// The label set of one sample, as written on the metrics page.
struct Labels<'a>(&'a str);

impl Labels<'_> {
    /// The value of label `name`.
    fn get(&self, name: &str) -> Option<String> {
        self.0.split(',').find_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            (k == name).then(|| v.trim_matches('"').to_string())
        })
    }

    /// The API group, `core` for the core group.
    fn group(&self) -> String {
        self.get("group")
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| "core".to_string())
    }
}

/// The samples of counter `metric` on a metrics page, with their labels.
fn samples<'a>(page: &'a str, metric: &str) -> Vec<(Labels<'a>, f64)> {
    let prefix = format!("{metric}{{");
    page.lines()
        .filter_map(|line| {
            let (labels, value) = line.strip_prefix(&prefix)?.rsplit_once("} ")?;
            Some((Labels(labels), value.trim().parse::<f64>().ok()?))
        })
        .collect()
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

/// Watch events the API server has sent so far, per kind (`group/kind`, `core` for the core
/// group, from `apiserver_watch_events_total`), summed over versions.
pub type WatchEvents = BTreeMap<String, f64>;

/// Parses the `apiserver_watch_events_total` samples of a metrics page into [`WatchEvents`].
/// The kind's label is `kind` up to Kubernetes 1.32 and `resource` after.
pub fn parse_watch_events(page: &str) -> WatchEvents {
    let mut events = WatchEvents::new();
    for (labels, value) in samples(page, "apiserver_watch_events_total") {
        let kind = labels
            .get("resource")
            .or_else(|| labels.get("kind"))
            .unwrap_or_default();
        *events
            .entry(format!("{}/{kind}", labels.group()))
            .or_default() += value;
    }
    events
}

/// The API server's watch event counters now.
pub async fn watch_events(client: &kube::Client) -> anyhow::Result<WatchEvents> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    Ok(parse_watch_events(&client.request_text(request).await?))
}

/// The change of each counter between two readings, per second over `seconds`, leaving out
/// those that did not grow.
pub fn per_second(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    seconds: f64,
) -> BTreeMap<String, f64> {
    per_minute(before, after, seconds)
        .into_iter()
        .map(|(k, v)| (k, v / 60.0))
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

    #[test]
    fn counts_watch_events_per_kind_under_either_label() {
        let page = r#"apiserver_watch_events_total{group="",kind="Node",version="v1"} 5
apiserver_watch_events_total{group="coordination.k8s.io",resource="leases",version="v1"} 7
apiserver_watch_events_total{group="coordination.k8s.io",resource="leases",version="v1beta1"} 1
apiserver_watch_events_sizes_bucket{group="",kind="Node",version="v1",le="1024"} 3
"#;
        assert_eq!(
            parse_watch_events(page),
            WatchEvents::from([
                ("core/Node".to_string(), 5.0),
                ("coordination.k8s.io/leases".to_string(), 8.0),
            ])
        );
    }
}
