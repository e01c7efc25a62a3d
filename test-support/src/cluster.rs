//! A private Redis Cluster of local `redis-server --cluster-enabled yes` processes, for
//! tests that kill a master and watch a replica take over. Killed (and its directory
//! removed) when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a master may be unreachable before its replicas elect a new one (ms).
const NODE_TIMEOUT_MS: u64 = 1_000;

struct Node {
    port: u16,
    bus_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--cluster-enabled", "yes", "--cluster-port", &self.bus_port.to_string()])
            .args(["--cluster-config-file", "nodes.conf", "--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (is it installed? apt-get install redis-server): {e}")
            });
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub id: String,
    pub port: u16,
    pub master: bool,
    /// The id of the master a replica follows ("-" for a master).
    pub master_id: String,
    /// Up and serving (not marked fail or disconnected).
    pub healthy: bool,
    /// Slot ranges served (masters only).
    pub slots: Vec<(u16, u16)>,
}

pub struct RedisCluster {
    nodes: Vec<Node>,
    root: PathBuf,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until every slot is
    /// served and every replica is in sync.
    pub async fn start(masters: usize, replicas: usize) -> Self {
        let root = std::env::temp_dir().join(format!("inventory-cluster-{}", uuid::Uuid::new_v4().simple()));
        let count = masters * (1 + replicas);
        // Two distinct ports per node (client and cluster bus), all held while choosing so
        // none is handed out twice.
        let held: Vec<std::net::TcpListener> =
            (0..2 * count).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0")).collect();
        let ports: Vec<u16> = held.iter().map(|l| l.local_addr().expect("local addr").port()).collect();
        drop(held);
        let mut nodes = Vec::new();
        for n in 0..count {
            let dir = root.join(format!("node-{n}"));
            std::fs::create_dir_all(&dir).expect("create cluster node directory");
            let mut node = Node { port: ports[2 * n], bus_port: ports[2 * n + 1], dir, child: None };
            node.spawn();
            nodes.push(node);
        }
        let cluster = Self { nodes, root };
        for node in &cluster.nodes {
            cluster.wait_for_ping(node.port).await;
        }
        let addrs: Vec<String> = cluster.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let ready = crate::wait_until(Duration::from_secs(60), || cluster.healthy(masters)).await;
        assert!(ready, "the cluster never became healthy: {:?}", cluster.nodes_info().await);
        cluster
    }

    async fn wait_for_ping(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while query(port, &["PING"]).await.is_none() {
            assert!(Instant::now() < deadline, "redis-server on port {port} did not answer PING within 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Seed nodes for a cluster client (`redis://127.0.0.1:port` of every node).
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(|n| format!("redis://127.0.0.1:{}", n.port)).collect()
    }

    /// `CLUSTER NODES` as seen by the first live node.
    pub async fn nodes_info(&self) -> Vec<NodeInfo> {
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            if let Some(text) = query(node.port, &["CLUSTER", "NODES"]).await {
                return parse_nodes(&text);
            }
        }
        Vec::new()
    }

    /// Every slot served by a healthy master, `cluster_state:ok` on every live node, and
    /// every live replica in sync with its master.
    async fn healthy(&self, masters: usize) -> bool {
        let info = self.nodes_info().await;
        let served: u32 = info
            .iter()
            .filter(|n| n.master && n.healthy)
            .flat_map(|n| n.slots.iter())
            .map(|(a, b)| u32::from(b - a) + 1)
            .sum();
        if served != 16_384 || info.iter().filter(|n| n.master && n.healthy).count() != masters {
            return false;
        }
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            let Some(state) = query(node.port, &["CLUSTER", "INFO"]).await else { return false };
            if !state.contains("cluster_state:ok") {
                return false;
            }
            let Some(repl) = query(node.port, &["INFO", "replication"]).await else { return false };
            if repl.contains("role:slave") && !repl.contains("master_link_status:up") {
                return false;
            }
        }
        true
    }

    /// The port of the master serving `key`'s slot.
    pub async fn master_of(&self, key: &str) -> u16 {
        let live = self.nodes.iter().find(|n| n.child.is_some()).expect("a live node");
        let slot: u16 = query(live.port, &["CLUSTER", "KEYSLOT", key])
            .await
            .and_then(|s| s.trim().parse().ok())
            .expect("CLUSTER KEYSLOT");
        self.nodes_info()
            .await
            .into_iter()
            .find(|n| n.master && n.healthy && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
            .expect("a master serves the slot")
    }

    /// A replica of the master on `port`.
    pub async fn replica_of(&self, port: u16) -> u16 {
        let text = query(port, &["INFO", "replication"]).await.expect("INFO replication");
        // slave0:ip=127.0.0.1,port=NNNN,state=online,...
        text.lines()
            .find_map(|l| l.strip_prefix("slave0:")?.split(',').find_map(|f| f.strip_prefix("port=")?.parse().ok()))
            .unwrap_or_else(|| panic!("the master on port {port} has no replica: {text}"))
    }

    /// One command to the node on `port` (`None`: no answer).
    pub async fn command(&self, port: u16, args: &[&str]) -> Option<String> {
        query(port, args).await
    }

    /// SIGKILL the node on `port`.
    pub fn kill(&mut self, port: u16) {
        self.nodes.iter_mut().find(|n| n.port == port).expect("node on port").kill();
    }

    /// The ports of the replicas of the master on `port`.
    pub async fn replicas_of(&self, port: u16) -> Vec<u16> {
        let info = self.nodes_info().await;
        let Some(master) = info.iter().find(|n| n.port == port) else { return Vec::new() };
        info.iter().filter(|n| !n.master && n.master_id == master.id).map(|n| n.port).collect()
    }

    /// SIGSTOP the node on `port`: it holds its connections and answers nothing (nor
    /// replicates) until [`RedisCluster::thaw`].
    pub fn freeze(&self, port: u16) {
        let node = self.nodes.iter().find(|n| n.port == port).expect("node on port");
        crate::stop_process(node.child.as_ref().expect("a live node").id());
    }

    /// SIGCONT the node on `port`.
    pub fn thaw(&self, port: u16) {
        self.signal(port, "-CONT");
    }

    fn signal(&self, port: u16, signal: &str) {
        let node = self.nodes.iter().find(|n| n.port == port).expect("node on port");
        let pid = node.child.as_ref().expect("a live node").id();
        let status = Command::new("kill").arg(signal).arg(pid.to_string()).status().expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Waits until another node serves `key`'s slot (a replica was promoted) and the cluster
    /// is whole again with `masters` masters. Returns the new master's port.
    pub async fn await_failover(&self, key: &str, old_master: u16, masters: usize) -> u16 {
        let promoted = crate::wait_until(Duration::from_secs(60), || async move {
            let info = self.nodes_info().await;
            let healthy_masters = info.iter().filter(|n| n.master && n.healthy).count();
            healthy_masters == masters && self.master_of_checked(key).await.is_some_and(|p| p != old_master)
        })
        .await;
        assert!(promoted, "no replica took over from the master on port {old_master}: {:?}", self.nodes_info().await);
        self.master_of(key).await
    }

    /// `SCRIPT FLUSH` on every live node; returns how many answered.
    pub async fn flush_scripts(&self) -> usize {
        let mut n = 0;
        for node in self.nodes.iter().filter(|n| n.child.is_some()) {
            if query(node.port, &["SCRIPT", "FLUSH"]).await.is_some() {
                n += 1;
            }
        }
        n
    }

    async fn master_of_checked(&self, key: &str) -> Option<u16> {
        let live = self.nodes.iter().find(|n| n.child.is_some())?;
        let slot: u16 = query(live.port, &["CLUSTER", "KEYSLOT", key]).await?.trim().parse().ok()?;
        self.nodes_info()
            .await
            .into_iter()
            .find(|n| n.master && n.healthy && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// One command to one node; `None` when the node does not answer.
async fn query(port: u16, args: &[&str]) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn =
        tokio::time::timeout(Duration::from_secs(2), client.get_multiplexed_async_connection()).await.ok()?.ok()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let v: redis::Value = tokio::time::timeout(Duration::from_secs(2), cmd.query_async(&mut conn)).await.ok()?.ok()?;
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b).ok(),
        redis::Value::SimpleString(s) => Some(s),
        redis::Value::VerbatimString { text, .. } => Some(text),
        redis::Value::Int(i) => Some(i.to_string()),
        redis::Value::Okay => Some("OK".to_owned()),
        _ => None,
    }
}

fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            // <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeInfo {
                id: f[0].to_owned(),
                port,
                master: flags.contains("master"),
                master_id: f[3].to_owned(),
                healthy: !flags.contains("fail") && f[7] == "connected",
                slots,
            })
        })
        .collect()
}
