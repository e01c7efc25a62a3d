//! What machine ran the benchmark, and where CPU time went during each measurement:
//! this process (load generator + in-process center and agents), redis-server, the
//! PostgreSQL processes, and the whole machine (other work on it shows here).

use std::time::Instant;

use serde::Serialize;

/// Linux reports process and machine CPU time in ticks of 1/100 s (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;

#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub memory_gib: f64,
    pub kernel: String,
    pub build: &'static str,
}

impl Machine {
    pub fn detect() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: field(&cpuinfo, "model name").unwrap_or_else(|| "unknown".to_owned()),
            memory_gib: field(&meminfo, "MemTotal")
                .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
                .map_or(0.0, |kib| (kib / 1024.0 / 1024.0 * 10.0).round() / 10.0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            build: if cfg!(debug_assertions) { "debug" } else { "release" },
        }
    }
}

/// The value of the first `name : value` line.
fn field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == name).then(|| v.trim().to_owned())
    })
}

/// utime + stime, in ticks, from the text of `/proc/<pid>/stat`.
pub fn process_ticks(stat: &str) -> Option<u64> {
    // The command name may contain spaces and parentheses; fields restart after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid ... utime is field 14 overall, i.e. index 11 here.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// (busy, total) ticks of all CPUs from the first line of `/proc/stat`.
pub fn machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest counts are inside user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn postgres_ticks() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "postgres"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|s| process_ticks(&s))
        .sum()
}

/// Ticks of this process's threads named `bench-client*` (the load generator) and
/// `bench-servers*` (the in-process center and agents).
fn thread_ticks() -> (u64, u64) {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return (0, 0) };
    let (mut client, mut servers) = (0, 0);
    for task in dir.filter_map(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let ticks = std::fs::read_to_string(task.path().join("stat")).ok().and_then(|s| process_ticks(&s)).unwrap_or(0);
        if comm.starts_with("bench-client") {
            client += ticks;
        } else if comm.starts_with("bench-servers") {
            servers += ticks;
        }
    }
    (client, servers)
}

#[derive(Debug, Clone, Copy)]
pub struct CpuSnapshot {
    at: Instant,
    bench: u64,
    client: u64,
    servers: u64,
    postgres: u64,
    redis_s: Option<f64>,
    machine: Option<(u64, u64)>,
}

/// CPU seconds spent during one measurement, and how busy the machine was.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    pub wall_s: f64,
    /// This process: load generator plus in-process center and agents.
    pub bench_s: f64,
    /// Of which the load generator's threads.
    pub client_s: f64,
    /// Of which the servers' threads (center and agents).
    pub servers_s: f64,
    pub redis_s: Option<f64>,
    /// Every process named postgres on the machine (all backends, any database).
    pub postgres_s: f64,
    /// Share of the machine's CPUs that were busy (1.0 = all cores, all the time).
    pub machine_busy: Option<f64>,
    /// Busy CPU seconds of everything else on the machine (other users' work).
    pub others_s: Option<f64>,
}

impl CpuSnapshot {
    pub async fn take(redis: Option<&mut redis::aio::MultiplexedConnection>) -> Self {
        let redis_s = match redis {
            Some(conn) => redis_cpu_seconds(conn).await,
            None => None,
        };
        let (client, servers) = thread_ticks();
        Self {
            at: Instant::now(),
            client,
            servers,
            bench: std::fs::read_to_string("/proc/self/stat").ok().and_then(|s| process_ticks(&s)).unwrap_or(0),
            postgres: postgres_ticks(),
            redis_s,
            machine: std::fs::read_to_string("/proc/stat").ok().and_then(|s| machine_ticks(&s)),
        }
    }

    pub fn since(&self, before: &CpuSnapshot) -> CpuUse {
        let secs = |a: u64, b: u64| a.saturating_sub(b) as f64 / TICKS_PER_SECOND;
        let bench_s = secs(self.bench, before.bench);
        let redis_s = self.redis_s.zip(before.redis_s).map(|(a, b)| a - b);
        let postgres_s = secs(self.postgres, before.postgres);
        let machine =
            self.machine.zip(before.machine).map(|((b1, t1), (b0, t0))| (b1.saturating_sub(b0), t1.saturating_sub(t0)));
        CpuUse {
            wall_s: self.at.duration_since(before.at).as_secs_f64(),
            bench_s,
            client_s: secs(self.client, before.client),
            servers_s: secs(self.servers, before.servers),
            redis_s,
            postgres_s,
            machine_busy: machine.and_then(|(busy, total)| crate::stats::ratio(busy as f64, total as f64)),
            others_s: machine.map(|(busy, _)| {
                (busy as f64 / TICKS_PER_SECOND - bench_s - redis_s.unwrap_or(0.0) - postgres_s).max(0.0)
            }),
        }
    }
}

async fn redis_cpu_seconds(conn: &mut redis::aio::MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.ok()?;
    let get = |name: &str| field(&info, name).and_then(|v| v.parse::<f64>().ok());
    Some(get("used_cpu_sys")? + get("used_cpu_user")?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_files() {
        let stat = "1234 (tokio (rt) x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3";
        assert_eq!(process_ticks(stat), Some(300));
        assert_eq!(machine_ticks("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3"), Some((150, 1000)));
        assert_eq!(field("model name\t: AMD EPYC\nflags : x", "model name"), Some("AMD EPYC".to_owned()));
    }
}
