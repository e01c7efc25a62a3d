//! Whether the pool store keeps what it acknowledged, read at start-up.
//!
//! A pool that goes back in time (a Redis restarted from a snapshot or an AOF older than
//! its last writes) is caught while a witness of the later writes remains: the running
//! agent (its floor of write sequences), or the center (the floors it keeps from reports,
//! Returns and a drain's first report). Sales acknowledged after the channel's last word
//! to the center are known to the agent process alone; if Redis and that process die
//! together (one host, one power cut), nothing is left that knows them: the restarted
//! Redis sells them again. Only a store that acknowledges no write it could lose closes
//! that, so the agent reads how each node of its pool store persists, and judges it with
//! [`judge`]:
//!
//! - with `--redis-replica-acks` of 1 or more, every write is on a replica before it is
//!   answered (a failover keeps it);
//! - `appendonly yes` with `appendfsync always`: every write is on disk before it is
//!   answered;
//! - no persistence at all (`appendonly no`, `save ""`): a restart comes back empty, and
//!   a pool that vanished is a lost pool the agent finds (generation, markers), never an
//!   older one.
//!
//! Anything else (snapshots, `appendfsync everysec` or `no`) draws one warning at start-up
//! naming the node and setting, or with `--require-durable-redis` refuses the start. A
//! node whose settings cannot be read (CONFIG refused, as managed services do) counts as
//! unknown: a warning, or refused under the flag.

use redis::Value;

use super::policy::{RedisNodes, refusal, text};

/// One node's persistence settings, or why they could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub node: String,
    pub settings: Result<Settings, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub appendonly: String,
    pub appendfsync: String,
    /// `save`: snapshot points ("3600 1 300 100 60 10000"); empty: no snapshots.
    pub save: String,
}

/// Why acknowledged writes may be lost, per node; empty when none may be.
pub fn judge(nodes: &[Persistence], replica_acks: u32) -> Vec<String> {
    if replica_acks > 0 {
        return Vec::new();
    }
    let mut risks = Vec::new();
    for n in nodes {
        match &n.settings {
            Err(e) => risks.push(format!("pool store {}: cannot read its persistence settings: {e}", n.node)),
            Ok(s) if s.appendonly.eq_ignore_ascii_case("yes") && s.appendfsync.eq_ignore_ascii_case("always") => {}
            Ok(s) if s.appendonly.eq_ignore_ascii_case("no") && s.save.trim().is_empty() => {}
            Ok(s) if s.appendonly.eq_ignore_ascii_case("yes") => risks.push(format!(
                "pool store {} acknowledges writes before they are on disk (appendfsync {})",
                n.node, s.appendfsync
            )),
            Ok(s) => risks.push(format!("pool store {} keeps only snapshots (save \"{}\")", n.node, s.save.trim())),
        }
    }
    risks
}

/// What the risk means, and what closes it.
const CONSEQUENCE: &str = "a restart can bring back pools older than their acknowledged writes; the agent and \
                           the center catch that while one of them saw the later writes, but if Redis and this \
                           agent die together, sales made since the channel's last report are forgotten and can be \
                           sold again. Use --redis-replica-acks 1 with a replica, or appendfsync always, or no \
                           persistence at all";

/// Reads every node's settings and warns, or refuses when `require` is set. A store that
/// cannot be asked at all is refused only under `require` (the policy check already
/// answered for its reachability).
pub async fn check(nodes: &RedisNodes, replica_acks: u32, require: bool) -> Result<(), String> {
    let read = read(nodes).await;
    let risks = match read {
        Ok(found) => judge(&found, replica_acks),
        Err(e) if replica_acks > 0 => {
            tracing::debug!(error = %e, "persistence settings not read; replica acks cover them");
            Vec::new()
        }
        Err(e) => vec![format!("pool store: cannot read its persistence settings: {e}")],
    };
    if risks.is_empty() {
        return Ok(());
    }
    let line = risks.join("; ");
    if require {
        return Err(format!("--require-durable-redis: {line}: {CONSEQUENCE}"));
    }
    tracing::warn!(problem = %line, "{CONSEQUENCE}");
    Ok(())
}

async fn read(nodes: &RedisNodes) -> Result<Vec<Persistence>, String> {
    let get = |name: &str| {
        let mut c = redis::cmd("CONFIG");
        c.arg("GET").arg(name);
        c
    };
    let ask = |name: &'static str| {
        let cmd = get(name);
        async move { nodes.ask(&cmd).await.map(|answers| (name, answers)) }
    };
    let bounded = async { futures::future::try_join3(ask("appendonly"), ask("appendfsync"), ask("save")).await };
    let (appendonly, appendfsync, save) = tokio::time::timeout(std::time::Duration::from_secs(3), bounded)
        .await
        .map_err(|_| "no answer within 3 s".to_owned())??;
    Ok(appendonly
        .1
        .iter()
        .map(|(node, v)| {
            let of = |answers: &[(String, Value)], name: &str| {
                answers.iter().find(|(n, _)| n == node).map_or(Err("no answer".to_owned()), |(_, v)| setting(v, name))
            };
            let settings = (|| {
                Ok(Settings {
                    appendonly: setting(v, "appendonly")?,
                    appendfsync: of(&appendfsync.1, "appendfsync")?,
                    save: of(&save.1, "save")?,
                })
            })();
            Persistence { node: node.clone(), settings }
        })
        .collect())
}

/// The value in a `CONFIG GET name` answer (an array or, on RESP3, a map).
fn setting(v: &Value, name: &str) -> Result<String, String> {
    if let Some(e) = refusal(v) {
        return Err(format!("CONFIG GET {name} refused ({e})"));
    }
    let flat: Vec<String> = match v {
        Value::Array(items) => items.iter().filter_map(text).collect(),
        Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [text(k), text(v)]).flatten().collect(),
        _ => Vec::new(),
    };
    match flat.as_slice() {
        [n, value] if n.eq_ignore_ascii_case(name) => Ok(value.clone()),
        _ => Err(format!("CONFIG GET {name}: unexpected answer {v:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(appendonly: &str, appendfsync: &str, save: &str) -> Persistence {
        let settings = Settings { appendonly: appendonly.into(), appendfsync: appendfsync.into(), save: save.into() };
        Persistence { node: "redis://a".into(), settings: Ok(settings) }
    }

    #[test]
    fn only_a_store_that_loses_no_acknowledged_write_passes() {
        assert!(judge(&[node("yes", "always", "3600 1")], 0).is_empty(), "every write on disk first");
        assert!(
            judge(&[node("no", "everysec", "")], 0).is_empty(),
            "nothing kept: a restart is a loss the agent finds"
        );
        let snapshots = judge(&[node("no", "everysec", "3600 1 300 100")], 0);
        assert_eq!(snapshots, ["pool store redis://a keeps only snapshots (save \"3600 1 300 100\")"]);
        let everysec = judge(&[node("yes", "everysec", "")], 0);
        assert_eq!(
            everysec,
            ["pool store redis://a acknowledges writes before they are on disk (appendfsync everysec)"]
        );
        let unknown = Persistence { node: "redis://b".into(), settings: Err("CONFIG GET save refused".into()) };
        let both = judge(&[node("yes", "no", ""), unknown.clone()], 0);
        assert_eq!(both.len(), 2, "{both:?}");
        assert!(both[1].contains("redis://b") && both[1].contains("refused"), "{both:?}");
        assert!(judge(&[node("no", "everysec", "3600 1"), unknown], 1).is_empty(), "a replica has every write");
    }

    #[test]
    fn settings_come_from_config_get_in_either_protocol() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(setting(&Value::Array(vec![bulk("save"), bulk("")]), "save").as_deref(), Ok(""));
        let map = Value::Map(vec![(bulk("appendfsync"), bulk("always"))]);
        assert_eq!(setting(&map, "appendfsync").as_deref(), Ok("always"));
        let refused = Value::SimpleString(format!("{}unknown command 'CONFIG'", super::super::policy::ERROR_MARK));
        assert!(setting(&refused, "save").unwrap_err().contains("refused"));
        assert!(setting(&Value::Array(vec![]), "save").is_err());
    }
}
