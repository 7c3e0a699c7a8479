//! Who may read the live report (issue 33, item 6). It names Services, their owners, MACs, BGP
//! peers and session errors, and the speaker serves it on the node's address, where any Pod can
//! connect: so the caller sends a bearer token, the speaker asks the API server whose it is
//! (TokenReview) and whether that subject may `get` this speaker's Pod's `pods/proxy`
//! (SubjectAccessReview), as kube-rbac-proxy does. That permission is the one the chart's
//! read-only Role `ferrolb-explain` grants and the API server checks itself before it proxies
//! `kubectl ferrolb explain`'s request to the Pod, so a reader of the report needs nothing new.
//! Answers are cached briefly (allowed a minute, refused ten seconds) in a bounded cache keyed by
//! the token's SHA-256, and few reviews run at once, so a flood of made-up tokens costs the API
//! server a bounded rate of reviews and this process bounded memory.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferrolb_explain::speaker_report::TOKEN_HEADER;
use futures::future::BoxFuture;
use http::HeaderMap;
use http::header::AUTHORIZATION;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

/// What the speaker answers a request for its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// 200: the caller may read it.
    Allowed,
    /// 401: no bearer token, or one the API server does not take.
    Unauthenticated,
    /// 403: the caller is known, and not allowed `get` on this speaker's `pods/proxy`.
    Forbidden,
    /// 503: not checked now (the API server did not answer, or too many checks run); not cached.
    Unavailable,
}

impl Decision {
    /// The HTTP status of the answer.
    pub fn status(self) -> http::StatusCode {
        match self {
            Decision::Allowed => http::StatusCode::OK,
            Decision::Unauthenticated => http::StatusCode::UNAUTHORIZED,
            Decision::Forbidden => http::StatusCode::FORBIDDEN,
            Decision::Unavailable => http::StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// A review could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ReviewError(String);

/// Asks whose a token is and whether that subject may read the report.
pub trait Reviewer: Send + Sync {
    /// [`Decision::Allowed`], [`Decision::Unauthenticated`] or [`Decision::Forbidden`].
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>>;
}

/// How long answers are kept, and how many.
#[derive(Clone, Copy, Debug)]
pub struct CachePolicy {
    /// How long an allowed token stays allowed without asking again: also how long a removed
    /// RoleBinding may still let its subject read.
    pub allowed: Duration,
    /// How long a refused token stays refused.
    pub refused: Duration,
    /// Tokens remembered at most.
    pub capacity: usize,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            allowed: Duration::from_secs(60),
            refused: Duration::from_secs(10),
            capacity: 1024,
        }
    }
}

/// Recent answers by the token's SHA-256 (the tokens themselves are not kept).
struct Cache {
    policy: CachePolicy,
    entries: HashMap<[u8; 32], (Decision, Instant)>,
}

impl Cache {
    fn get(&mut self, key: &[u8; 32], now: Instant) -> Option<Decision> {
        match self.entries.get(key) {
            Some(&(decision, until)) if until > now => Some(decision),
            Some(_) => {
                self.entries.remove(key);
                None
            }
            None => None,
        }
    }

    fn insert(&mut self, key: [u8; 32], decision: Decision, now: Instant) {
        let ttl = match decision {
            Decision::Allowed => self.policy.allowed,
            Decision::Unauthenticated | Decision::Forbidden => self.policy.refused,
            Decision::Unavailable => return,
        };
        if self.policy.capacity == 0 {
            return;
        }
        if self.entries.len() >= self.policy.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, until)| *until > now);
            if self.entries.len() >= self.policy.capacity {
                // Full of live answers: forget the one that would go first.
                let soonest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, until))| *until)
                    .map(|(k, _)| *k);
                if let Some(k) = soonest {
                    self.entries.remove(&k);
                }
            }
        }
        self.entries.insert(key, (decision, now + ttl));
    }
}

/// Reviews run at once at most; more callers get 503 until one ends.
const CONCURRENT_REVIEWS: usize = 4;

/// Decides each request for the report.
pub struct Authorizer {
    reviewer: Box<dyn Reviewer>,
    cache: Mutex<Cache>,
    reviews: tokio::sync::Semaphore,
}

impl Authorizer {
    /// Asks `reviewer`, keeping answers as `policy` says.
    pub fn new(reviewer: impl Reviewer + 'static, policy: CachePolicy) -> Self {
        Authorizer {
            reviewer: Box::new(reviewer),
            cache: Mutex::new(Cache {
                policy,
                entries: HashMap::new(),
            }),
            reviews: tokio::sync::Semaphore::new(CONCURRENT_REVIEWS),
        }
    }

    /// What to answer a request with these headers.
    pub async fn decide(&self, headers: &HeaderMap) -> Decision {
        let Some(token) = bearer(headers) else {
            return Decision::Unauthenticated;
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(decision) = self.lock().get(&key, Instant::now()) {
            return decision;
        }
        let Ok(_review) = self.reviews.try_acquire() else {
            return Decision::Unavailable;
        };
        match self.reviewer.review(token).await {
            Ok(decision) => {
                self.lock().insert(key, decision, Instant::now());
                decision
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not check a caller of the live report");
                Decision::Unavailable
            }
        }
    }

    /// Tokens remembered now.
    #[cfg(test)]
    fn cached(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The caller's bearer token: `Authorization: Bearer` from a direct caller, or [`TOKEN_HEADER`]
/// through the API server's proxy (which keeps `Authorization` for itself).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    [AUTHORIZATION.as_str(), TOKEN_HEADER]
        .into_iter()
        .flat_map(|name| headers.get_all(name))
        .filter_map(|value| value.to_str().ok())
        .find_map(|value| {
            let (scheme, token) = value.trim().split_once(' ')?;
            let token = token.trim();
            (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
        })
}

/// The [`Reviewer`] that asks the API server.
pub struct KubeReviewer {
    client: kube::Client,
    /// This speaker's namespace and Pod, whose `pods/proxy` the caller must be allowed to get.
    namespace: String,
    pod: Option<String>,
}

impl KubeReviewer {
    /// Reviews callers against `get` on `pods/proxy` of `pod` in `namespace` (any Pod of the
    /// namespace when the speaker does not know its own).
    pub fn new(client: kube::Client, namespace: &str, pod: Option<&str>) -> Self {
        KubeReviewer {
            client,
            namespace: namespace.into(),
            pod: pod.map(Into::into),
        }
    }

    /// What the caller must be allowed.
    fn attributes(&self) -> ResourceAttributes {
        ResourceAttributes {
            namespace: Some(self.namespace.clone()),
            verb: Some("get".into()),
            group: Some(String::new()),
            resource: Some("pods".into()),
            subresource: Some("proxy".into()),
            name: self.pod.clone(),
            ..ResourceAttributes::default()
        }
    }

    async fn ask(&self, token: &str) -> Result<Decision, ReviewError> {
        let error = |what: &str, e: kube::Error| ReviewError(format!("{what}: {e}"));
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.into()),
                // The API server's own audiences: the token the user's kubeconfig holds.
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| error("TokenReview", e))?;
        let Some(status) = reviewed.status else {
            return Ok(Decision::Unauthenticated);
        };
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => return Ok(Decision::Unauthenticated),
        };
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                groups: user.groups,
                uid: user.uid,
                extra: user.extra,
                resource_attributes: Some(self.attributes()),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
            .map_err(|e| error("SubjectAccessReview", e))?;
        Ok(if reviewed.status.is_some_and(|s| s.allowed) {
            Decision::Allowed
        } else {
            Decision::Forbidden
        })
    }
}

impl Reviewer for KubeReviewer {
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>> {
        Box::pin(self.ask(token))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// The API server of the tests: `alice` may read, `bob` is known and may not, anything
    /// else is no token it issued. Counts the reviews it makes.
    #[derive(Clone, Default)]
    struct Fake(Arc<AtomicUsize>);

    impl Reviewer for Fake {
        fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Decision, ReviewError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                match token {
                    "alice" => Ok(Decision::Allowed),
                    "bob" => Ok(Decision::Forbidden),
                    "down" => Err(ReviewError("connection refused".into())),
                    _ => Ok(Decision::Unauthenticated),
                }
            })
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        h
    }

    fn decide(auth: &Authorizer, pairs: &[(&str, &str)]) -> Decision {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(auth.decide(&headers(pairs)))
    }

    /// No token → 401, a token the API server does not take → 401, a subject not allowed →
    /// 403, an allowed one → 200, by either header; an API server that does not answer → 503.
    #[test]
    fn each_caller_gets_its_answer() {
        let fake = Fake::default();
        let auth = Authorizer::new(fake.clone(), CachePolicy::default());
        let status = |pairs: &[(&str, &str)]| decide(&auth, pairs).status().as_u16();
        assert_eq!(status(&[]), 401);
        assert_eq!(status(&[("authorization", "Basic YWxpY2U6eA==")]), 401);
        assert_eq!(status(&[("authorization", "Bearer ")]), 401);
        assert_eq!(fake.0.load(Ordering::Relaxed), 0, "no token, no review");
        assert_eq!(status(&[("authorization", "Bearer forged")]), 401);
        assert_eq!(status(&[("authorization", "Bearer bob")]), 403);
        assert_eq!(status(&[("authorization", "bearer alice")]), 200);
        assert_eq!(status(&[(TOKEN_HEADER, "Bearer alice")]), 200);
        assert_eq!(status(&[(TOKEN_HEADER, "Bearer bob")]), 403);
        assert_eq!(status(&[("authorization", "Bearer down")]), 503);
    }

    /// Answers are reused within their time, refused ones for less long, and an API server
    /// that did not answer is asked again next time.
    #[test]
    fn answers_are_cached_briefly() {
        let fake = Fake::default();
        let auth = Authorizer::new(fake.clone(), CachePolicy::default());
        let reviews = || fake.0.load(Ordering::Relaxed);
        for _ in 0..3 {
            assert_eq!(
                decide(&auth, &[("authorization", "Bearer alice")]),
                Decision::Allowed
            );
            assert_eq!(
                decide(&auth, &[("authorization", "Bearer forged")]),
                Decision::Unauthenticated
            );
            assert_eq!(
                decide(&auth, &[("authorization", "Bearer down")]),
                Decision::Unavailable
            );
        }
        assert_eq!(reviews(), 2 + 3, "alice and forged once, down every time");

        let mut cache = Cache {
            policy: CachePolicy::default(),
            entries: HashMap::new(),
        };
        let t0 = Instant::now();
        cache.insert([1; 32], Decision::Allowed, t0);
        cache.insert([2; 32], Decision::Forbidden, t0);
        cache.insert([3; 32], Decision::Unavailable, t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(cache.get(&[2; 32], at(9)), Some(Decision::Forbidden));
        assert_eq!(cache.get(&[2; 32], at(10)), None);
        assert_eq!(cache.get(&[1; 32], at(59)), Some(Decision::Allowed));
        assert_eq!(cache.get(&[1; 32], at(60)), None);
        assert_eq!(cache.get(&[3; 32], t0), None);
        assert!(cache.entries.is_empty(), "expired entries are dropped");
    }

    /// However many tokens are tried, at most `capacity` answers are kept: expired ones go
    /// first, then the one that would expire soonest.
    #[test]
    fn the_cache_is_bounded() {
        let fake = Fake::default();
        let policy = CachePolicy {
            capacity: 16,
            ..CachePolicy::default()
        };
        let auth = Authorizer::new(fake.clone(), policy);
        for i in 0..1000 {
            let value = format!("Bearer forged-{i}");
            decide(&auth, &[("authorization", value.as_str())]);
            assert!(auth.cached() <= 16, "{} answers kept", auth.cached());
        }
        assert_eq!(auth.cached(), 16);

        let mut cache = Cache {
            policy: CachePolicy {
                capacity: 2,
                ..CachePolicy::default()
            },
            entries: HashMap::new(),
        };
        let t0 = Instant::now();
        cache.insert([1; 32], Decision::Allowed, t0);
        cache.insert([2; 32], Decision::Forbidden, t0);
        // Full: the refused answer expires first and goes.
        cache.insert([3; 32], Decision::Allowed, t0);
        assert_eq!(cache.entries.len(), 2);
        assert_eq!(cache.get(&[1; 32], t0), Some(Decision::Allowed));
        assert_eq!(cache.get(&[2; 32], t0), None);
        // Once the allowed ones have expired they make room for a new one, all at once.
        cache.insert([4; 32], Decision::Forbidden, t0 + Duration::from_secs(61));
        assert_eq!(cache.entries.len(), 1);
    }

    /// The caller must be allowed `get` on this speaker's Pod's `pods/proxy`: what the chart's
    /// read-only Role grants and what the API server checks before proxying.
    #[test]
    fn the_permission_asked_is_get_on_the_pods_proxy() {
        let attributes = |pod: Option<&str>| ResourceAttributes {
            namespace: Some("metallb-system".into()),
            verb: Some("get".into()),
            group: Some(String::new()),
            resource: Some("pods".into()),
            subresource: Some("proxy".into()),
            name: pod.map(Into::into),
            ..ResourceAttributes::default()
        };
        // A client that is never used: building one needs no server.
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let client = kube::Client::try_from(config).unwrap();
        let reviewer = KubeReviewer::new(client.clone(), "metallb-system", Some("speaker-x"));
        assert_eq!(reviewer.attributes(), attributes(Some("speaker-x")));
        let reviewer = KubeReviewer::new(client, "metallb-system", None);
        assert_eq!(reviewer.attributes(), attributes(None));
    }
}
