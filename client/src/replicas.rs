//! The replicas of one channel's agent: a connection to each, its health as last seen,
//! and which one a call goes to.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use inventory_proto::v1::agent_client::AgentClient as RawAgent;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::{Error, Options};

/// The service name the agent reports health for.
const AGENT_SERVICE: &str = "inventory.v1.Agent";

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
pub(crate) struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

pub(crate) type Conn = InterceptedService<Channel, Bearer>;
pub(crate) type Agent = RawAgent<Conn>;

pub(crate) struct Replica {
    pub url: String,
    pub agent: Agent,
    health: HealthClient<Conn>,
    healthy: AtomicBool,
}

pub(crate) struct Replicas {
    pub list: Vec<Replica>,
    next: AtomicUsize,
}

fn endpoint(url: &str, options: &Options) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| Error::Config(format!("invalid agent URL {url:?}: {e}")))?
        .connect_timeout(options.connect_timeout)
        .tcp_nodelay(true)
        // A replica that vanished without closing its connections (a cut cable, a frozen
        // host) is noticed within seconds, not at the next call's timeout.
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &options.ca_pem {
            tls = tls.ca_certificate(Certificate::from_pem(ca));
        }
        if let Some((cert, key)) = &options.identity_pem {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        endpoint = endpoint.tls_config(tls).map_err(|e| Error::Config(format!("TLS for {url:?}: {e}")))?;
    }
    Ok(endpoint)
}

impl Replicas {
    /// A lazy connection to each URL: a replica that is down now is tried again later.
    pub fn new(urls: Vec<String>, options: &Options) -> Result<Self, Error> {
        if urls.is_empty() {
            return Err(Error::Config("no agent URL given".into()));
        }
        let token = match &options.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Config("the token must be visible ASCII (a header value)".into()))?,
            ),
            None => None,
        };
        let list = urls
            .into_iter()
            .map(|url| {
                let channel = endpoint(&url, options)?.connect_lazy();
                let conn = InterceptedService::new(channel, Bearer(token.clone()));
                Ok(Replica {
                    agent: RawAgent::new(conn.clone()),
                    health: HealthClient::new(conn),
                    healthy: AtomicBool::new(true),
                    url,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Replicas { list, next: AtomicUsize::new(0) })
    }

    /// The replica a call starts on: the next healthy one in turn (any, if none is).
    pub fn first(&self) -> usize {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        self.healthy_from(start % self.list.len())
    }

    /// The replica a retry goes to: the next healthy one after `from` (or just the next).
    pub fn after(&self, from: usize) -> usize {
        self.healthy_from((from + 1) % self.list.len())
    }

    fn healthy_from(&self, start: usize) -> usize {
        let n = self.list.len();
        (0..n).map(|i| (start + i) % n).find(|&i| self.list[i].healthy.load(Ordering::Relaxed)).unwrap_or(start)
    }

    /// A replica that failed a call at the transport level is skipped until its health
    /// check passes again.
    pub fn mark_down(&self, i: usize) {
        self.list[i].healthy.store(false, Ordering::Relaxed);
    }

    /// The URLs of the replicas that are healthy as last seen.
    pub fn healthy(&self) -> Vec<String> {
        self.list.iter().filter(|r| r.healthy.load(Ordering::Relaxed)).map(|r| r.url.clone()).collect()
    }

    /// Asks every replica's health service at once; each answer (or its absence within
    /// `timeout`) sets that replica's flag.
    pub async fn check(&self, timeout: Duration) {
        let mut checks = tokio::task::JoinSet::new();
        for (i, r) in self.list.iter().enumerate() {
            let mut health = r.health.clone();
            checks.spawn(async move {
                let req = HealthCheckRequest { service: AGENT_SERVICE.into() };
                let answer = tokio::time::timeout(timeout, health.check(req)).await;
                (i, matches!(answer, Ok(Ok(a)) if a.get_ref().status() == ServingStatus::Serving))
            });
        }
        while let Some(Ok((i, serving))) = checks.join_next().await {
            let r = &self.list[i];
            if r.healthy.swap(serving, Ordering::Relaxed) != serving {
                tracing::info!(replica = %r.url, serving, "agent replica health changed");
            }
        }
    }
}

/// The health checker: every `interval` while the client lives.
pub(crate) async fn watch(replicas: Weak<Replicas>, interval: Duration, timeout: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let Some(replicas) = replicas.upgrade() else { return };
        replicas.check(timeout).await;
        drop::<Arc<Replicas>>(replicas);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn three() -> Replicas {
        let urls = ["http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"];
        Replicas::new(urls.map(String::from).to_vec(), &Options::default()).expect("replicas")
    }

    #[tokio::test]
    async fn calls_take_turns_and_skip_replicas_that_are_down() {
        let r = three();
        assert_eq!([r.first(), r.first(), r.first(), r.first()], [0, 1, 2, 0]);
        r.mark_down(1);
        assert_eq!(r.after(0), 2, "a retry skips the replica that is down");
        assert_eq!(r.first(), 2, "so does a new call whose turn it was");
        assert_eq!(r.healthy(), ["http://127.0.0.1:1", "http://127.0.0.1:3"]);
        r.mark_down(0);
        r.mark_down(2);
        assert_eq!(r.after(0), 1, "with every replica down, just the next one");
    }

    #[tokio::test]
    async fn bad_configuration_is_refused_at_once() {
        assert!(matches!(Replicas::new(Vec::new(), &Options::default()), Err(Error::Config(_))));
        assert!(matches!(Replicas::new(vec!["not a url".into()], &Options::default()), Err(Error::Config(_))));
        let bad_token = Options::default().token("two\nlines");
        assert!(matches!(Replicas::new(vec!["http://127.0.0.1:1".into()], &bad_token), Err(Error::Config(_))));
    }
}
