//! /metrics of a center and an agent after a sale agree with the ledger; error counters
//! count real failures; every gRPC call is counted by method and code on both servers;
//! both endpoints pass `promtool check metrics`; and the deployment's Grafana dashboard
//! and Prometheus rules query only metrics that the two binaries really export.

use std::collections::{BTreeSet, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::RedisServer;
use tonic::Code;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, agent_config, http_get, sample};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_match_the_ledger_after_a_sale_and_a_graceful_stop() {
    let center = Center::start_sqlite().await;
    center.create_item("m", 100, 1, (10, 40, 20)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    for i in 0..7 {
        let r = client.acquire(acquire_req("m", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    }
    let again = client.acquire(acquire_req("m", "u0", 1, "other-key")).await.unwrap().into_inner();
    assert_eq!(again.outcome(), pb::AcquireOutcome::LimitExceeded);
    let bad = client.acquire(acquire_req("not an id", "u0", 1, "k-bad")).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    center.await_quiescence().await;

    let text = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"inventory_agent_acquires_total{channel="app",outcome="reserved"}"#), Some(7.0));
    assert_eq!(sample(&text, r#"inventory_agent_acquires_total{channel="app",outcome="limit_exceeded"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_pool_units{channel="app",item="m",state="reserved"}"#), Some(7.0));
    let view = center.ledger("m").await;
    let app = &view.channels[0];
    let pool_available = sample(&text, r#"inventory_agent_pool_units{channel="app",item="m",state="available"}"#);
    assert_eq!(pool_available, Some(app.reported_available as f64));
    // Every Acquire is timed, the rejected one too; the histogram is cumulative.
    let calls = r#"inventory_agent_acquire_duration_seconds_count{channel="app"}"#;
    assert_eq!(sample(&text, calls), Some(9.0));
    let inf = r#"inventory_agent_acquire_duration_seconds_bucket{channel="app",le="+Inf"}"#;
    assert_eq!(sample(&text, inf), Some(9.0));
    let buckets: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with(r#"inventory_agent_acquire_duration_seconds_bucket{channel="app","#))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(buckets.len() > 5 && buckets.windows(2).all(|w| w[0] <= w[1]), "cumulative buckets: {buckets:?}");
    let rejected = r#"inventory_agent_rejected_calls_total{channel="app",method="acquire",code="invalid_argument"}"#;
    assert_eq!(sample(&text, rejected), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_pool_store_errors_total{channel="app"}"#), Some(0.0));
    assert_eq!(sample(&text, r#"inventory_agent_pool_frozen{channel="app",item="m"}"#), Some(0.0));
    assert_eq!(sample(&text, r#"inventory_agent_draining{channel="app"}"#), Some(0.0));
    assert_eq!(sample(&text, r#"inventory_agent_lease_valid{channel="app"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_center_reachable{channel="app"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_epoch{channel="app"}"#), Some(app.epoch as f64));
    let borrowed = sample(&text, r#"inventory_agent_borrowed_units_total{channel="app"}"#).unwrap();
    let returned = sample(&text, r#"inventory_agent_returned_units_total{channel="app"}"#).unwrap();
    assert_eq!(borrowed - returned, app.held as f64, "what the agent moved is what the center counts as held");
    // Every Borrow is timed; none failed here, so each timed one was counted as made.
    let borrows = sample(&text, r#"inventory_agent_borrows_total{channel="app"}"#).unwrap();
    assert!(borrows >= 1.0, "the sale borrowed: {borrows}");
    assert_eq!(sample(&text, r#"inventory_agent_borrow_duration_seconds_count{channel="app"}"#), Some(borrows));
    // The gRPC layer saw every Acquire: business outcomes are OK answers, the bad id is not.
    let agent_rpc = |method: &str, code: &str| {
        let series =
            format!(r#"inventory_rpc_requests_total{{service="inventory.v1.Agent",method="{method}",code="{code}"}}"#);
        sample(&text, &series)
    };
    assert_eq!(agent_rpc("Acquire", "ok"), Some(8.0), "{text}");
    assert_eq!(agent_rpc("Acquire", "invalid_argument"), Some(1.0), "{text}");
    let acquire_seconds = r#"inventory_rpc_duration_seconds_count{service="inventory.v1.Agent",method="Acquire"}"#;
    assert_eq!(sample(&text, acquire_seconds), Some(9.0));
    let build = format!(
        r#"inventory_build_info{{version="{}",git="{}"}}"#,
        inventory_net::metrics::VERSION,
        inventory_net::metrics::GIT_HASH
    );
    assert_eq!(sample(&text, &build), Some(1.0), "{text}");

    let text = http_get(center.http_addr, "/metrics").await;
    let item = view.item.as_ref().unwrap();
    assert_eq!(sample(&text, r#"inventory_center_available_units{item="m"}"#), Some(item.available as f64));
    assert_eq!(sample(&text, r#"inventory_center_held_units{item="m",channel="app"}"#), Some(app.held as f64));
    assert_eq!(sample(&text, r#"inventory_center_channel_drift_units{item="m",channel="app"}"#), Some(0.0));
    assert_eq!(sample(&text, r#"inventory_center_granted_units_total{item="m",channel="app"}"#), Some(borrowed));
    let lease = sample(&text, r#"inventory_center_lease_remaining_seconds{channel="app"}"#).unwrap();
    assert!(lease > 0.0, "a live agent's lease has time left: {lease}");
    assert!(http_get(center.http_addr, "/healthz").await.starts_with("ok"));
    // The center's layer saw the agent's calls: its registration and Borrows answered OK.
    let center_rpc = |text: &str, method: &str| {
        let series =
            format!(r#"inventory_rpc_requests_total{{service="inventory.v1.Center",method="{method}",code="ok"}}"#);
        sample(text, &series)
    };
    assert_eq!(center_rpc(&text, "RegisterAgent"), Some(1.0), "{text}");
    assert_eq!(center_rpc(&text, "Borrow"), Some(borrows), "{text}");
    assert_eq!(sample(&text, &build), Some(1.0), "{text}");
    // The agent's event stream is open, in flight and not finished, as long as the agent runs.
    let watching = r#"inventory_rpc_in_flight{service="inventory.v1.Center",method="WatchChannel"}"#;
    let open = inventory_test_support::wait_until(Duration::from_secs(10), || async {
        sample(&http_get(center.http_addr, "/metrics").await, watching) == Some(1.0)
    })
    .await;
    assert!(open, "the agent's WatchChannel stream is in flight at the center");

    // A graceful stop gives back everything not reserved.
    agent.stop().await;
    let view = center.ledger("m").await;
    assert_eq!((view.item.unwrap().available, view.channels[0].held), (93, 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_store_failures_are_counted_and_answered_unavailable() {
    let mut redis = RedisServer::start().await;
    let center = Center::start_sqlite().await;
    center.create_item("r", 50, 1, (5, 20, 10)).await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: "metrics:".into() };
    let agent = LocalAgent::start(&center.url, "web", &store).await;
    let mut client = agent.client().await;
    let ok = client.acquire(acquire_req("r", "u1", 1, "k1")).await.unwrap().into_inner();
    assert_eq!(ok.outcome(), pb::AcquireOutcome::Reserved);
    let text = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"inventory_agent_pool_store_errors_total{channel="web"}"#), Some(0.0));

    redis.kill();
    let err = client.acquire(acquire_req("r", "u2", 1, "k2")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    let text = http_get(agent.http_addr, "/metrics").await;
    let store_errors = sample(&text, r#"inventory_agent_pool_store_errors_total{channel="web"}"#).unwrap();
    assert!(store_errors >= 1.0, "store errors counted: {store_errors}\n{text}");
    let unavailable = r#"inventory_agent_rejected_calls_total{channel="web",method="acquire",code="unavailable"}"#;
    assert_eq!(sample(&text, unavailable), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_acquires_total{channel="web",outcome="reserved"}"#), Some(1.0));
    assert_eq!(sample(&text, r#"inventory_agent_acquire_duration_seconds_count{channel="web"}"#), Some(2.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_calls_are_counted_apart_from_business_outcomes() {
    let center = Center::start_sqlite().await;
    center.create_item("h", 50, 1, (5, 20, 10)).await;
    let mut config = agent_config(&center.url, "app", &StoreSpec::Memory);
    (config.user_rate_per_sec, config.user_burst) = (1, 2);
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    let mut exhausted = 0;
    for i in 0..10 {
        match client.acquire(acquire_req("h", "hot-user", 1, &format!("hot-{i}"))).await {
            Ok(_) => {}
            Err(s) if s.code() == Code::ResourceExhausted => exhausted += 1,
            Err(s) => panic!("unexpected {s:?}"),
        }
    }
    assert!(exhausted >= 5, "one user's burst is cut off: {exhausted} of 10 refused");
    let text = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"inventory_agent_rate_limited_total{channel="app"}"#), Some(exhausted as f64));
    let rejected = r#"inventory_agent_rejected_calls_total{channel="app",method="acquire",code="resource_exhausted"}"#;
    assert_eq!(sample(&text, rejected), Some(exhausted as f64));
    let answered: f64 = ["reserved", "sold_out", "limit_exceeded"]
        .iter()
        .filter_map(|o| sample(&text, &format!(r#"inventory_agent_acquires_total{{channel="app",outcome="{o}"}}"#)))
        .sum();
    assert_eq!(answered, f64::from(10 - exhausted), "refused calls are no business outcome");
    assert_eq!(sample(&text, r#"inventory_agent_acquire_duration_seconds_count{channel="app"}"#), Some(10.0));
}

// ---------------------------------------------------------------------------------------
// The deployment's dashboard and rules against what the code exports.

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Metric names in Prometheus text, from its `# TYPE` lines (present even before the
/// first sample); a histogram `h` exports `h_bucket`, `h_sum` and `h_count`.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        } else {
            names.insert(name.to_owned());
        }
    }
    names
}

const PROMQL_WORDS: &[&str] = &[
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "count",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "group",
];
const PROMQL_LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression selects: identifiers outside label matchers,
/// ranges and strings that are not functions, operators or label lists.
fn promql_metric_names(expr: &str) -> Vec<String> {
    let chars: Vec<char> = expr.chars().collect();
    let (mut names, mut i) = (Vec::new(), 0);
    let (mut braces, mut brackets, mut parens) = (0i32, 0i32, 0i32);
    let mut label_list_at: Option<i32> = None;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            '{' => braces += 1,
            '}' => braces -= 1,
            '[' => brackets += 1,
            ']' => brackets -= 1,
            '(' => parens += 1,
            ')' => {
                if label_list_at == Some(parens) {
                    label_list_at = None;
                }
                parens -= 1;
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i + 1 < chars.len() && (chars[i + 1].is_ascii_alphanumeric() || chars[i + 1] == '.') {
                    i += 1;
                }
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' => {
                let start = i;
                while i + 1 < chars.len() && (ident(chars[i + 1]) || chars[i + 1] == '$') {
                    i += 1;
                }
                let word: String = chars[start..=i].iter().collect();
                let next = chars[i + 1..].iter().find(|c| !c.is_whitespace()).copied();
                let in_selector = braces > 0 || brackets > 0 || label_list_at.is_some();
                if in_selector || word.starts_with('$') || PROMQL_WORDS.contains(&word.as_str()) {
                    // labels, durations, variables, operators
                } else if PROMQL_LABEL_LISTS.contains(&word.as_str()) {
                    if next == Some('(') {
                        label_list_at = Some(parens + 1);
                    }
                } else if next != Some('(') {
                    names.push(word);
                }
            }
            _ => {}
        }
        i += 1;
    }
    names
}

#[test]
fn promql_names_are_found_outside_labels_functions_and_label_lists() {
    let expr = r#"histogram_quantile(0.99, sum by (channel, le) (rate(a_bucket{channel=~"$channel",x="y(z)"}[$__rate_interval])))
        - on (item) group_left(channel) max by (item) (b:rec) * 1e3 > bool 0.5 or vector(0) unless c offset 5m"#;
    assert_eq!(promql_metric_names(expr), ["a_bucket", "b:rec", "c"]);
}

/// One rule of a Prometheus rules file: its recorded name (none for an alert) and its
/// expression.
struct Rule {
    record: Option<String>,
    expr: String,
}

/// The rules of a Prometheus rules file (a YAML subset: `record:`/`alert:` before `expr:`,
/// expressions on one line or in a `|`/`>-` block).
fn parse_rules(text: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    let mut record = None;
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        let indent = line.len() - line.trim_start().len();
        if let Some(name) = trimmed.strip_prefix("record:") {
            record = Some(name.trim().to_owned());
        } else if trimmed.starts_with("alert:") {
            record = None;
        } else if let Some(expr) = trimmed.strip_prefix("expr:") {
            let expr = expr.trim();
            let expr = if matches!(expr, "|" | "|-" | ">" | ">-") {
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                block.join(" ")
            } else {
                expr.trim_matches('\'').to_owned()
            };
            rules.push(Rule { record: record.take(), expr });
        }
        i += 1;
    }
    rules
}

/// Every panel of a Grafana dashboard, rows' nested panels included.
fn panels(v: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(panels(p));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grafana_dashboard_and_prometheus_rules_name_only_exported_metrics() {
    // What the code exports: scrape a running center and agent after a little selling.
    let center = Center::start_sqlite().await;
    center.create_item("g", 20, 1, (2, 8, 4)).await;
    // With a relay (to a broker nobody runs: its metrics are exported all the same).
    let mut config = agent_config(&center.url, "app", &StoreSpec::Memory);
    config.nats_url = Some(format!("nats://127.0.0.1:{}", inventory_test_support::free_port()));
    let agent = LocalAgent::start_with(config, None).await;
    let mut client = agent.client().await;
    let r = client.acquire(acquire_req("g", "u1", 1, "k1")).await.unwrap().into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);
    center.await_quiescence().await;
    let center_text = http_get(center.http_addr, "/metrics").await;
    let agent_text = http_get(agent.http_addr, "/metrics").await;
    let mut exported = exported_names(&center_text);
    exported.extend(exported_names(&agent_text));
    for name in &exported {
        let kind = [&center_text, &agent_text]
            .iter()
            .flat_map(|t| t.lines())
            .find_map(|l| l.strip_prefix(&format!("# TYPE {name} ")))
            .unwrap_or("histogram part");
        assert!(kind != "counter" || name.ends_with("_total"), "counter {name} must end in _total");
        let shared = name.starts_with("inventory_rpc_") || name == "inventory_build_info";
        assert!(shared || name.starts_with("inventory_center_") || name.starts_with("inventory_agent_"), "{name}");
    }

    // Prometheus' own series the rules may use.
    let builtin: HashSet<&str> = ["up"].into();
    let known = |name: &str, recorded: &BTreeSet<String>| {
        exported.contains(name) || recorded.contains(name) || builtin.contains(name)
    };

    let rules_dir = deploy_dir().join("prometheus/rules");
    let mut rules = Vec::new();
    for entry in std::fs::read_dir(&rules_dir).unwrap_or_else(|e| panic!("{}: {e}", rules_dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.extension().is_some_and(|e| e == "yml") {
            rules.extend(parse_rules(&std::fs::read_to_string(&path).expect("read rules")));
        }
    }
    let recorded: BTreeSet<String> = rules.iter().filter_map(|r| r.record.clone()).collect();
    assert!(recorded.len() >= 5 && rules.len() >= 15, "rules parsed: {recorded:?} of {}", rules.len());
    let mut unknown = Vec::new();
    for rule in &rules {
        let names = promql_metric_names(&rule.expr);
        assert!(!names.is_empty(), "a rule selects no metric: {}", rule.expr);
        unknown
            .extend(names.into_iter().filter(|n| !known(n, &recorded)).map(|n| format!("rule {:?}: {n}", rule.expr)));
    }

    let path = deploy_dir().join("grafana/dashboards/inventory.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read dashboard")).expect("dashboard is JSON");
    let mut used = BTreeSet::new();
    let all_panels = panels(&dashboard);
    assert!(all_panels.len() >= 10, "dashboard has {} panels", all_panels.len());
    for panel in all_panels {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("?");
        let targets = panel["targets"].as_array().unwrap_or_else(|| panic!("panel {title:?} has no targets"));
        assert!(!targets.is_empty(), "panel {title:?} has no queries");
        assert_eq!(panel["datasource"]["uid"], "prometheus", "panel {title:?} uses the provisioned datasource");
        for t in targets {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
            let names = promql_metric_names(expr);
            assert!(!names.is_empty(), "panel {title:?} selects no metric: {expr}");
            for n in names {
                if !known(&n, &recorded) {
                    unknown.push(format!("dashboard panel {title:?}: {n}"));
                }
                used.insert(n);
            }
        }
    }
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        let query = var["query"]["query"].as_str().or(var["query"].as_str()).unwrap_or_default();
        if let Some(args) = query.strip_prefix("label_values(") {
            let metric = args.split([',', '(', '{']).next().unwrap_or_default().trim();
            if !known(metric, &recorded) {
                unknown.push(format!("dashboard variable {}: {metric}", var["name"]));
            }
        }
    }
    assert!(unknown.is_empty(), "queries name metrics the code does not export: {unknown:#?}\nexported: {exported:#?}");

    // And the other way round: every exported metric is on the dashboard, directly or
    // through a recording rule it shows (histograms through their buckets).
    for rule in &rules {
        if rule.record.as_ref().is_some_and(|r| used.contains(r)) {
            used.extend(promql_metric_names(&rule.expr));
        }
    }
    let missing: Vec<&String> = exported
        .iter()
        .filter(|n| !n.ends_with("_sum") && !n.ends_with("_count") && !used.contains(n.as_str()))
        .collect();
    assert!(missing.is_empty(), "exported but on no dashboard panel: {missing:?}");
}

/// Runs `promtool check metrics` on `text`; `Err` with promtool's complaint when it has one.
pub fn promtool_check(text: &str) -> Result<(), String> {
    let mut child = match std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "promtool is not on PATH; it checks the /metrics text of both servers. Install it with \
             `apt-get install prometheus` (Debian/Ubuntu; .ci/run does this) or put Prometheus' promtool on PATH"
        ),
        Err(e) => panic!("cannot run promtool: {e}"),
    };
    child.stdin.take().expect("stdin").write_all(text.as_bytes()).expect("write to promtool");
    let out = child.wait_with_output().expect("promtool finishes");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && said.trim().is_empty() { Ok(()) } else { Err(said) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metrics_endpoint_passes_promtool_check_metrics() {
    // Every family with samples: a sale, a rejected call, a fast sold-out answer.
    let center = Center::start_sqlite().await;
    center.create_item("p", 2, 1, (1, 2, 1)).await;
    let agent = LocalAgent::start(&center.url, "app", &StoreSpec::Memory).await;
    let mut client = agent.client().await;
    for i in 0..4 {
        client.acquire(acquire_req("p", &format!("u{i}"), 1, &format!("k{i}"))).await.expect("answered");
    }
    let bad = client.acquire(acquire_req("not an id", "u0", 1, "k-bad")).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    center.await_quiescence().await;

    for (server, addr) in [("center", center.http_addr), ("agent", agent.http_addr)] {
        let text = http_get(addr, "/metrics").await;
        assert!(text.contains("inventory_rpc_requests_total{"), "{server} exports RPC metrics:\n{text}");
        if let Err(complaint) = promtool_check(&text) {
            panic!("promtool check metrics on the {server}'s /metrics:\n{complaint}\n--- the text:\n{text}");
        }
    }
    // The check itself catches a broken exposition (so a pass above means something).
    assert!(promtool_check("# TYPE broken counter\nbroken 1\n").is_err());
}

#[test]
fn version_names_the_git_commit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-agent"))
        .arg("--version")
        .output()
        .expect("run inventory-agent --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let expected =
        format!("inventory-agent {} (git {})", inventory_net::metrics::VERSION, inventory_net::metrics::GIT_HASH);
    assert_eq!(text.trim(), expected);
    if Path::new(env!("CARGO_MANIFEST_DIR")).join("../.git").exists() {
        assert_ne!(inventory_net::metrics::GIT_HASH, "unknown", "a build from a git checkout knows its commit");
    }
}

/// The outbox gauges follow sales with nothing but the rebalancer's looks reading the pool:
/// a look reads the outbox's size with the pool, and the outbox reader skips a pool so read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_gauges_follow_sales_through_the_looks_alone() {
    let redis = inventory_test_support::TestRedis::create().await;
    let center = Center::start_sqlite().await;
    center.create_item("o", 100, 1, (10, 40, 20)).await;
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let mut cfg = agent_config(&center.url, "app", &store);
    cfg.outbox_max_events = 3;
    let agent = LocalAgent::start_with(cfg, None).await;
    let mut client = agent.client().await;
    for i in 0..5 {
        let r = client.acquire(acquire_req("o", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "the bound never fails a sale");
    }
    // The outbox reader reads only sizes older than two idle looks and a pass (over 5 s):
    // within 5 s of the sales, only a look can have read them.
    let gauges = |text: &str| {
        (
            sample(text, r#"inventory_agent_outbox_events{channel="app",item="o"}"#),
            sample(text, r#"inventory_agent_outbox_events_dropped_total{channel="app",item="o"}"#),
        )
    };
    let addr = agent.http_addr;
    let followed = inventory_test_support::wait_until(Duration::from_secs(5), || async move {
        gauges(&http_get(addr, "/metrics").await) == (Some(3.0), Some(2.0))
    })
    .await;
    assert!(followed, "gauges {:?}", gauges(&http_get(addr, "/metrics").await));
}

/// The outbox gauges: events kept against the bound, and those the bound dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_size_and_drops_are_exported_against_the_bound() {
    let center = Center::start_sqlite().await;
    center.create_item("o", 100, 1, (10, 40, 20)).await;
    let mut cfg = agent_config(&center.url, "app", &StoreSpec::Memory);
    cfg.outbox_max_events = 3;
    let agent = LocalAgent::start_with(cfg, None).await;
    let mut client = agent.client().await;
    for i in 0..5 {
        let r = client.acquire(acquire_req("o", &format!("u{i}"), 1, &format!("k{i}"))).await.unwrap().into_inner();
        assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved, "the bound never fails a sale");
    }
    let s = client.get_stock(pb::GetStockRequest { item_id: "o".into() }).await.unwrap().into_inner();
    assert_eq!((s.last_event_sequence, s.published_event_sequence), (5, 0));
    let text = http_get(agent.http_addr, "/metrics").await;
    assert_eq!(sample(&text, r#"inventory_agent_outbox_events{channel="app",item="o"}"#), Some(3.0));
    assert_eq!(sample(&text, r#"inventory_agent_outbox_events_dropped_total{channel="app",item="o"}"#), Some(2.0));
    assert_eq!(sample(&text, r#"inventory_agent_outbox_max_events{channel="app"}"#), Some(3.0));
}
