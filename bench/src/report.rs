//! The suite's results: one figure per phase and round, the choice of the representative
//! round (the median), the ratios and targets, and the printed tables. Pure: no I/O.

use serde::Serialize;

use crate::acquire::Outcome;
use crate::load::Counts;
use crate::stats::{self, Bound, Summary, Target as Goal, fmt_latency, fmt_rate, render_table};
use crate::sysinfo::{CpuUse, Machine};

/// The measurements of the suite, in the order they run in each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    A,
    B,
    C,
    D,
    D0,
    E,
    F,
    G,
    H,
    I,
    J,
}

impl Phase {
    pub const ALL: [Phase; 11] =
        [Phase::A, Phase::B, Phase::C, Phase::D, Phase::D0, Phase::E, Phase::F, Phase::G, Phase::H, Phase::I, Phase::J];

    pub fn id(self) -> &'static str {
        match self {
            Phase::A => "a",
            Phase::B => "b",
            Phase::C => "c",
            Phase::D => "d",
            Phase::D0 => "d0",
            Phase::E => "e",
            Phase::F => "f",
            Phase::G => "g",
            Phase::H => "h",
            Phase::I => "i",
            Phase::J => "j",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Phase::A => "floor: Health/Check on an agent",
            Phase::B => "Acquire, agent with memory store",
            Phase::C => "Acquire, agent with Redis store",
            Phase::D => "acquire.lua from Rust (EVALSHA), no gRPC",
            Phase::D0 => "bare script (return 1) over the store's connections",
            Phase::E => "naive: UPDATE one PostgreSQL row per purchase",
            Phase::F => "center Borrow on PostgreSQL, one item",
            Phase::G => "Acquire, Redis store, open loop at 70% of c",
            Phase::H => "Acquire, Redis store, sold out everywhere",
            Phase::I => "Acquire, Redis store, relay to JetStream on",
            Phase::J => "center Borrow on PostgreSQL, 100 items",
        }
    }

    /// The open-loop phase is judged by its latency, the others by their rate.
    fn by_latency(self) -> bool {
        self == Phase::G
    }
}

/// Which gRPC client drives the agents' figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// tonic's generated clients, as a channel backend would call (15–25 µs of client CPU
    /// per call).
    Tonic,
    /// Raw HTTP/2 with pre-encoded requests ([`crate::light`]): a few µs per call, so more
    /// of the machine is left to the agent and its own cost shows.
    Light,
}

/// CPU time per call (warm-up and measured calls), in µs, by where it was spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CpuPerCall {
    pub client_us: f64,
    pub servers_us: f64,
    pub redis_us: f64,
    pub postgres_us: f64,
}

impl CpuPerCall {
    /// All CPU one call cost on the machine: load generator, servers, Redis, PostgreSQL.
    pub fn total_us(&self) -> f64 {
        self.client_us + self.servers_us + self.redis_us + self.postgres_us
    }
}

/// One round's headline numbers of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RoundFigure {
    pub round: usize,
    pub throughput: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Share of the machine used by other work during the round (0..1).
    pub others_share: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PhaseResult {
    pub phase: Phase,
    pub id: &'static str,
    pub title: &'static str,
    /// The round these figures come from (the median one after [`aggregate`]).
    pub round: usize,
    /// Answered calls per second in the measured window.
    pub throughput: f64,
    pub latency_us: Summary,
    /// Open loop: latency from the actual send, without the wait for the schedule.
    pub service_latency_us: Option<Summary>,
    pub measured: Counts,
    pub warmup: Counts,
    pub elapsed_s: f64,
    /// Open loop: the scheduled rate.
    pub rate: Option<f64>,
    pub cpu: CpuUse,
    pub cpu_per_call: CpuPerCall,
    /// Acquire phases: the outcome check over every round (warm-up included).
    pub outcome: Option<Outcome>,
    /// Agent phases: Borrow + Return calls the agent made (after [`aggregate`]: all rounds).
    pub center_calls: Option<u64>,
    /// Acquires answered while those center calls were made.
    pub acquires: u64,
    pub center_calls_per_1000_acquires: Option<f64>,
    /// Agent phases: SOLD_OUT answers given from memory (after [`aggregate`]: all rounds).
    pub fast_path_answers: Option<u64>,
    /// Every round of this phase.
    pub rounds: Vec<RoundFigure>,
}

impl PhaseResult {
    pub fn new(phase: Phase, round: usize, r: &crate::load::LoadReport, cpu: CpuUse) -> Self {
        let calls = (r.measured.total() + r.warmup.total()).max(1) as f64;
        let per_call = |s: f64| s * 1_000_000.0 / calls;
        Self {
            phase,
            id: phase.id(),
            title: phase.title(),
            round,
            throughput: r.throughput(),
            latency_us: r.summary(),
            service_latency_us: r.rate.map(|_| r.service_summary()),
            measured: r.measured,
            warmup: r.warmup,
            elapsed_s: r.elapsed.as_secs_f64(),
            rate: r.rate,
            cpu,
            cpu_per_call: CpuPerCall {
                client_us: per_call(cpu.client_s),
                servers_us: per_call(cpu.servers_s),
                redis_us: per_call(cpu.redis_s.unwrap_or(0.0)),
                postgres_us: per_call(cpu.postgres_s),
            },
            outcome: None,
            center_calls: None,
            acquires: r.measured.answered() + r.warmup.answered(),
            center_calls_per_1000_acquires: None,
            fast_path_answers: None,
            rounds: Vec::new(),
        }
    }

    fn figure(&self, nproc: usize) -> RoundFigure {
        RoundFigure {
            round: self.round,
            throughput: self.throughput,
            p99_us: self.latency_us.p99_us,
            p999_us: self.latency_us.p999_us,
            max_us: self.latency_us.max_us,
            others_share: self.cpu.others_s.and_then(|o| stats::ratio(o, self.cpu.wall_s * nproc as f64)),
        }
    }
}

/// One result per phase: the median round (by rate; by p99 for the open-loop phase),
/// with every round's figures attached and counters summed over the rounds.
pub fn aggregate(results: Vec<PhaseResult>, nproc: usize) -> Vec<PhaseResult> {
    let mut out = Vec::new();
    for phase in Phase::ALL {
        let mut rounds: Vec<PhaseResult> = results.iter().filter(|r| r.phase == phase).cloned().collect();
        if rounds.is_empty() {
            continue;
        }
        let figures: Vec<RoundFigure> = rounds.iter().map(|r| r.figure(nproc)).collect();
        let center_calls = rounds.iter().try_fold(0u64, |acc, r| r.center_calls.map(|c| acc + c));
        let fast_path = rounds.iter().try_fold(0u64, |acc, r| r.fast_path_answers.map(|c| acc + c));
        let acquires: u64 = rounds.iter().map(|r| r.acquires).sum();
        let key = |r: &PhaseResult| if phase.by_latency() { r.latency_us.p99_us } else { r.throughput };
        rounds.sort_by(|x, y| key(x).total_cmp(&key(y)));
        let mut median = rounds.swap_remove((rounds.len() - 1) / 2);
        median.rounds = figures;
        median.center_calls = center_calls;
        median.acquires = acquires;
        median.center_calls_per_1000_acquires = center_calls.and_then(|c| stats::per_thousand(c, acquires));
        median.fast_path_answers = fast_path;
        out.push(median);
    }
    out
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Ratios {
    pub b_over_a: Option<f64>,
    pub c_over_a: Option<f64>,
    pub c_over_e: Option<f64>,
    pub c_over_d: Option<f64>,
    pub f_over_e: Option<f64>,
    pub sold_out_over_in_stock: Option<f64>,
    /// Sold-out answers vs the floor: what an Acquire the agent answers from memory costs.
    pub h_over_a: Option<f64>,
    /// Acquire with the JetStream relay on vs off (Redis store): the events' cost.
    pub relay_on_over_off: Option<f64>,
    /// g's p99 from the schedule: a stall's backlog counts for every call it delays.
    pub p99_ms_at_70pct: Option<f64>,
    /// g's p99 from the actual send: what a caller waits once its call is sent (the goal).
    pub p99_ms_at_70pct_from_send: Option<f64>,
    pub center_calls_per_1000_acquires: Option<f64>,
    /// The same ratios from CPU cost per call (x/y = cpu(y) / cpu(x)): what the rate
    /// ratios would be if every figure were CPU-bound on a machine of its own. Robust to
    /// other work on a shared machine, which moves rates but not CPU per call.
    pub b_over_a_by_cpu: Option<f64>,
    pub c_over_a_by_cpu: Option<f64>,
    pub sold_out_over_in_stock_by_cpu: Option<f64>,
    pub h_over_a_by_cpu: Option<f64>,
    /// Redis CPU per Acquire on the agent's Redis store (c) over Redis CPU per bare script
    /// call (d0): what the reservation's data costs Redis beyond the call itself.
    pub redis_cpu_c_over_d0: Option<f64>,
    /// The servers' threads' CPU per Acquire on the Redis store over their CPU per floor
    /// call (x/y = cpu(x) / cpu(y), a cost ratio: lower is better): what the agent itself
    /// adds to a call, Redis and the load generator left out.
    pub servers_cpu_c_over_a: Option<f64>,
    /// The same for the memory store.
    pub servers_cpu_b_over_a: Option<f64>,
}

pub fn ratios(phases: &[PhaseResult]) -> Ratios {
    let get = |p: Phase| phases.iter().find(|r| r.phase == p);
    let rate = |p: Phase| get(p).map(|r| r.throughput);
    let over = |x: Phase, y: Phase| rate(x).zip(rate(y)).and_then(|(a, b)| stats::ratio(a, b));
    let cpu = |p: Phase| get(p).map(|r| r.cpu_per_call.total_us());
    let by_cpu = |x: Phase, y: Phase| cpu(y).zip(cpu(x)).and_then(|(a, b)| stats::ratio(a, b));
    let servers = |p: Phase| get(p).map(|r| r.cpu_per_call.servers_us);
    let servers_cost = |x: Phase, y: Phase| servers(x).zip(servers(y)).and_then(|(a, b)| stats::ratio(a, b));
    let g = get(Phase::G);
    let redis_cpu = |p: Phase| get(p).map(|r| r.cpu_per_call.redis_us);
    Ratios {
        redis_cpu_c_over_d0: redis_cpu(Phase::C).zip(redis_cpu(Phase::D0)).and_then(|(c, d0)| stats::ratio(c, d0)),
        servers_cpu_c_over_a: servers_cost(Phase::C, Phase::A),
        servers_cpu_b_over_a: servers_cost(Phase::B, Phase::A),
        b_over_a_by_cpu: by_cpu(Phase::B, Phase::A),
        c_over_a_by_cpu: by_cpu(Phase::C, Phase::A),
        sold_out_over_in_stock_by_cpu: by_cpu(Phase::H, Phase::C),
        h_over_a_by_cpu: by_cpu(Phase::H, Phase::A),
        h_over_a: over(Phase::H, Phase::A),
        b_over_a: over(Phase::B, Phase::A),
        c_over_a: over(Phase::C, Phase::A),
        c_over_e: over(Phase::C, Phase::E),
        c_over_d: over(Phase::C, Phase::D),
        f_over_e: over(Phase::F, Phase::E),
        sold_out_over_in_stock: over(Phase::H, Phase::C),
        relay_on_over_off: over(Phase::I, Phase::C),
        p99_ms_at_70pct: g.filter(|r| r.latency_us.count > 0).map(|r| r.latency_us.p99_us / 1_000.0),
        p99_ms_at_70pct_from_send: g
            .and_then(|r| r.service_latency_us.as_ref())
            .filter(|l| l.count > 0)
            .map(|l| l.p99_us / 1_000.0),
        center_calls_per_1000_acquires: g.and_then(|r| r.center_calls_per_1000_acquires),
    }
}

/// The targets of the performance issues, as costs measured in the same run: CPU per call
/// of each process against the floor (a), a bare script call (d0) and the naive row (e);
/// with the light client also the sold-out answer against the floor. The rate ratio c/a
/// is no longer a goal: on a small machine the load generator, the agent and Redis share
/// the CPUs, so it says more about the machine than about the agent.
pub fn targets(q: &Ratios, client: ClientKind) -> Vec<Goal> {
    let mut goals = vec![
        Goal::check("servers' CPU per call c/a (cost)", q.servers_cpu_c_over_a, Bound::AtMost, 1.3),
        Goal::check("c/d0 (Redis CPU per Acquire vs bare script)", q.redis_cpu_c_over_d0, Bound::AtMost, 1.0),
        Goal::check("b/a by CPU per call", q.b_over_a_by_cpu, Bound::AtLeast, 0.8),
        Goal::check("f/e (center Borrow vs naive)", q.f_over_e, Bound::AtLeast, 2.0),
        Goal::check("c/e (Acquire Redis vs naive PostgreSQL)", q.c_over_e, Bound::AtLeast, 10.0),
        Goal::check(
            "p99 of Acquire (Redis) at 70% of c, from the send, ms",
            q.p99_ms_at_70pct_from_send,
            Bound::AtMost,
            10.0,
        ),
        Goal::check("center calls per 1,000 acquires (g)", q.center_calls_per_1000_acquires, Bound::AtMost, 20.0),
        Goal::check("h/c (sold-out rate vs in-stock rate)", q.sold_out_over_in_stock, Bound::AtLeast, 1.5),
    ];
    if client == ClientKind::Light {
        goals.push(Goal::check("h/a (sold-out answers vs floor)", q.h_over_a, Bound::AtLeast, 0.9));
    }
    goals
}

#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    pub quick: bool,
    pub rounds: usize,
    pub concurrency: usize,
    pub connections: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub users: u64,
    pub skew: String,
    pub replay_share: f64,
    pub steady_share: f64,
    /// Watermarks of phase g's item as LOW/HIGH/BATCH; `None`: derived from its total.
    pub steady_watermarks: Option<String>,
    pub seed: u64,
    pub naive_pool_connections: u32,
    pub redis_version: Option<String>,
    pub postgres_version: Option<String>,
    pub client: ClientKind,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub started_at_unix_ms: u128,
    pub machine: Machine,
    pub settings: Settings,
    pub phases: Vec<PhaseResult>,
    pub ratios: Ratios,
    pub targets: Vec<Goal>,
    /// No oversell and consistent replays in every Acquire phase.
    pub checks_ok: bool,
    /// Phases that could not be measured, and why.
    pub failures: Vec<String>,
    /// Figure (ii): center calls per 1,000 acquires, fixed vs rate-following batches.
    pub batching: Vec<crate::batching::BatchingFigure>,
    /// Figure (iii): stocking many items through one agent.
    pub stocking: Option<crate::stocking::StockingFigure>,
    /// Figure (iv): the opening second, scheduled and unscheduled.
    pub opening: Option<crate::opening::OpeningFigure>,
}

impl Report {
    pub fn new(
        started_at_unix_ms: u128,
        machine: Machine,
        settings: Settings,
        results: Vec<PhaseResult>,
        failures: Vec<String>,
    ) -> Self {
        let phases = aggregate(results, machine.nproc);
        let ratios = ratios(&phases);
        let targets = targets(&ratios, settings.client);
        let checks_ok = phases.iter().filter_map(|p| p.outcome.as_ref()).all(|o| o.ok);
        Self {
            started_at_unix_ms,
            machine,
            settings,
            phases,
            ratios,
            targets,
            checks_ok,
            failures,
            batching: Vec::new(),
            stocking: None,
            opening: None,
        }
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn kilo(v: f64) -> String {
    if v >= 1_000.0 { format!("{:.1}k", v / 1_000.0) } else { format!("{v:.0}") }
}

/// The tables of a report, as printed and as pasted into BENCHMARKS.md.
pub fn render(report: &Report) -> String {
    let s = &report.settings;
    let m = &report.machine;
    let mut out = format!(
        "inventory-bench suite: {} build; {} client, {} callers over {} connections; {} round(s) of {:.1} s warm-up + {:.1} s \
         per figure (median round shown); {} users {}, replay share {}\n\
         machine: {} cores ({}), {} GiB, Linux {}; Redis {}, PostgreSQL {}\n\n",
        m.build,
        match s.client {
            ClientKind::Tonic => "tonic",
            ClientKind::Light => "light (raw HTTP/2, pre-encoded requests)",
        },
        s.concurrency,
        s.connections,
        s.rounds,
        s.warmup_s,
        s.duration_s,
        s.users,
        s.skew,
        s.replay_share,
        m.nproc,
        m.cpu_model,
        m.memory_gib,
        m.kernel,
        s.redis_version.as_deref().unwrap_or("?"),
        s.postgres_version.as_deref().unwrap_or("?")
    );
    let mut rows = vec![
        [
            "id",
            "figure",
            "calls/s",
            "p50",
            "p90",
            "p99",
            "p99.9",
            "max",
            "sold out",
            "errors",
            "CPU µs/call client+servers+redis+pg",
            "others",
            "rounds calls/s",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for p in &report.phases {
        let l = &p.latency_us;
        let c = &p.cpu_per_call;
        let others = p.rounds.iter().find(|f| f.round == p.round).and_then(|f| f.others_share);
        rows.push(vec![
            p.id.to_owned(),
            p.title.to_owned(),
            fmt_rate(p.throughput),
            fmt_latency(l.p50_us),
            fmt_latency(l.p90_us),
            fmt_latency(l.p99_us),
            fmt_latency(l.p999_us),
            fmt_latency(l.max_us),
            p.measured.sold_out.to_string(),
            p.measured.errors.to_string(),
            format!("{:.0}+{:.0}+{:.0}+{:.0}", c.client_us, c.servers_us, c.redis_us, c.postgres_us),
            others.map_or_else(|| "-".to_owned(), |o| format!("{:.0}%", o * 100.0)),
            p.rounds.iter().map(|f| kilo(f.throughput)).collect::<Vec<_>>().join(" "),
        ]);
    }
    out.push_str(&render_table(&rows));
    out.push('\n');

    let mut goals = vec![["target", "value", "goal", "met"].map(String::from).to_vec()];
    for t in &report.targets {
        goals.push(vec![
            t.name.clone(),
            opt(t.value, 2),
            t.describe_bound(),
            if t.met { "yes" } else { "NO" }.to_owned(),
        ]);
    }
    let q = &report.ratios;
    goals.push(vec!["p99 of g from the schedule, ms".into(), opt(q.p99_ms_at_70pct, 2), "info".into(), String::new()]);
    goals.push(vec!["b/a (Acquire memory vs floor)".into(), opt(q.b_over_a, 2), "info".into(), String::new()]);
    goals.push(vec!["c/a (Acquire Redis vs floor)".into(), opt(q.c_over_a, 2), "info".into(), String::new()]);
    goals.push(vec!["c/d (Acquire Redis vs Lua straight)".into(), opt(q.c_over_d, 2), "info".into(), String::new()]);
    goals.push(vec!["i/c (relay on vs off)".into(), opt(q.relay_on_over_off, 2), "info".into(), String::new()]);
    if s.client == ClientKind::Tonic {
        goals.push(vec!["h/a (sold-out answers vs floor)".into(), opt(q.h_over_a, 2), "info".into(), String::new()]);
    }
    for (name, v) in [
        ("c/a by CPU per call", q.c_over_a_by_cpu),
        ("h/c by CPU per call", q.sold_out_over_in_stock_by_cpu),
        ("h/a by CPU per call", q.h_over_a_by_cpu),
        ("servers' CPU per call b/a (cost)", q.servers_cpu_b_over_a),
    ] {
        goals.push(vec![name.into(), opt(v, 2), "info".into(), String::new()]);
    }
    out.push_str(&render_table(&goals));
    out.push('\n');

    for p in &report.phases {
        if let Some(o) = &p.outcome {
            out.push_str(&format!(
                "{}: outcome check {}: {} units reserved{} in {} distinct reservations, {} replays ({} mismatched), \
                 {} sold-out answers\n",
                p.id,
                if o.ok { "ok" } else { "FAILED" },
                o.units_reserved,
                o.stock.map_or(String::new(), |s| format!(" of {s}")),
                o.distinct_reservations,
                o.replayed_answers,
                o.replay_mismatches,
                o.sold_out_answers
            ));
        }
        if let (Some(s), Some(rate)) = (&p.service_latency_us, p.rate) {
            out.push_str(&format!(
                "{}: open loop at {}/s; latency from the actual send (no wait for the schedule): p50 {}, p99 {}, \
                 p99.9 {}\n",
                p.id,
                fmt_rate(rate),
                fmt_latency(s.p50_us),
                fmt_latency(s.p99_us),
                fmt_latency(s.p999_us)
            ));
        }
        if let Some(calls) = p.center_calls {
            out.push_str(&format!(
                "{}: the agent made {calls} center calls (Borrow + Return) for {} acquires: {} per 1,000{}\n",
                p.id,
                p.acquires,
                opt(p.center_calls_per_1000_acquires, 2),
                p.fast_path_answers
                    .filter(|n| *n > 0)
                    .map_or(String::new(), |n| format!("; {n} SOLD_OUT answers from memory"))
            ));
        }
    }
    for f in &report.failures {
        out.push_str(&format!("FAILED {f}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(phase: Phase, round: usize, throughput: f64, p99_us: f64, center_calls: Option<u64>) -> PhaseResult {
        PhaseResult {
            phase,
            id: phase.id(),
            title: phase.title(),
            round,
            throughput,
            latency_us: Summary { count: 10, p99_us, ..Summary::default() },
            service_latency_us: None,
            measured: Counts::default(),
            warmup: Counts::default(),
            elapsed_s: 1.0,
            rate: None,
            cpu: CpuUse { wall_s: 1.0, others_s: Some(0.5), ..CpuUse::default() },
            cpu_per_call: CpuPerCall::default(),
            outcome: None,
            center_calls,
            acquires: 1_000,
            center_calls_per_1000_acquires: None,
            fast_path_answers: None,
            rounds: Vec::new(),
        }
    }

    #[test]
    fn aggregate_takes_the_median_round_and_sums_counters() {
        let results = vec![
            result(Phase::A, 0, 100.0, 1.0, None),
            result(Phase::C, 0, 50.0, 1.0, Some(1)),
            result(Phase::A, 1, 300.0, 1.0, None),
            result(Phase::C, 1, 70.0, 1.0, Some(2)),
            result(Phase::A, 2, 200.0, 1.0, None),
            result(Phase::C, 2, 60.0, 1.0, Some(3)),
            result(Phase::G, 0, 40.0, 9_000.0, Some(4)),
            result(Phase::G, 1, 40.0, 5_000.0, Some(0)),
            result(Phase::G, 2, 40.0, 20_000.0, Some(2)),
            result(Phase::D0, 0, 80.0, 1.0, None),
        ];
        let mut phases = aggregate(results, 2);
        phases[0].cpu_per_call = CpuPerCall { client_us: 20.0, servers_us: 20.0, ..CpuPerCall::default() };
        phases[1].cpu_per_call = CpuPerCall { client_us: 30.0, servers_us: 40.0, redis_us: 30.0, postgres_us: 0.0 };
        assert_eq!(phases[2].id, "d0");
        phases[2].cpu_per_call = CpuPerCall { redis_us: 12.0, ..CpuPerCall::default() };
        let a = &phases[0];
        assert_eq!((a.id, a.round, a.throughput), ("a", 2, 200.0));
        assert_eq!(a.rounds.iter().map(|f| f.throughput).collect::<Vec<_>>(), [100.0, 300.0, 200.0]);
        assert_eq!(a.rounds[0].others_share, Some(0.25));
        let c = &phases[1];
        assert_eq!((c.throughput, c.center_calls, c.acquires), (60.0, Some(6), 3_000));
        assert_eq!(c.center_calls_per_1000_acquires, Some(2.0));
        let g = &phases[3];
        assert_eq!(g.latency_us.p99_us, 9_000.0, "the open-loop phase takes its median p99");

        phases[3].service_latency_us = Some(Summary { count: 10, p99_us: 12_000.0, ..Summary::default() });
        let q = ratios(&phases);
        assert_eq!(q.c_over_a, Some(0.3));
        assert_eq!(q.b_over_a, None);
        assert_eq!(q.c_over_a_by_cpu, Some(0.4), "a costs 40 µs of CPU per call, c 100 µs");
        assert_eq!(q.servers_cpu_c_over_a, Some(2.0), "the servers' part: 40 µs against 20 µs");
        assert_eq!(q.p99_ms_at_70pct, Some(9.0));
        assert_eq!(q.p99_ms_at_70pct_from_send, Some(12.0));
        assert_eq!(q.redis_cpu_c_over_d0, Some(2.5), "c costs Redis 30 µs per call, a bare script 12 µs");
        assert_eq!(q.center_calls_per_1000_acquires, Some(2.0));
        let t = targets(&q, ClientKind::Tonic);
        let met = |name: &str| t.iter().find(|t| t.name.starts_with(name)).map(|t| t.met);
        assert_eq!(met("p99"), Some(false), "g is judged from the send: 12 ms against 10");
        assert_eq!(met("servers' CPU per call c/a"), Some(false), "2.0 against at most 1.3");
        assert_eq!(met("c/d0"), Some(false), "2.5 against at most 1.0");
        assert_eq!(met("c/a (Acquire"), None, "the rate ratio c/a is no longer a goal");
    }

    #[test]
    fn even_round_counts_take_the_lower_median() {
        let phases = aggregate(vec![result(Phase::E, 0, 10.0, 1.0, None), result(Phase::E, 1, 20.0, 1.0, None)], 2);
        assert_eq!(phases[0].throughput, 10.0);
    }
}
