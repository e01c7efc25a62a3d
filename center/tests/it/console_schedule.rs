//! A scheduled item as operators watch it before its opening: the countdown and each
//! channel's readiness (allocated, stocked, agent attached) on `/metrics`, `/api/items`,
//! GetItem and the console page in headless Chromium, where a channel still short inside
//! the lead is red until it stocks.

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use inventory_center::CenterConfig;
use inventory_proto::v1 as pb;
use inventory_test_support::free_port;

use crate::console::{SimulatedAgent, chromium_present, dump_dom, element, http_get, screenshot};
use crate::support::{Backend, TestCenter};

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.trim().parse().ok()))
}

/// `(channel, allocated, stocked, agent attached)` of GetItem's readiness.
fn readiness(r: &pb::GetItemResponse) -> Vec<(&str, u64, u64, bool)> {
    r.readiness.iter().map(|c| (c.channel.as_str(), c.allocated, c.stocked, c.agent_attached)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_item_counts_down_and_shows_each_channels_readiness_short_ones_in_red() {
    chromium_present();
    let http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    // Leases long enough that no channel lapses while the page renders.
    let center = TestCenter::start_with(Backend::Postgres, |c: &mut CenterConfig| {
        c.http_listen = http;
        c.lease_ttl_ms = 120_000;
    })
    .await;
    let mut admin = center.admin().await;
    let now = now_ms();
    let create = |item: &str, total: u64, opens_at: i64, lead: u64, reserve: Option<u64>| pb::CreateItemRequest {
        item_id: item.into(),
        total,
        opens_at_unix_ms: opens_at,
        prestock_lead_ms: lead,
        center_reserve: reserve,
        ..Default::default()
    };
    // Inside its lead: it opens in 10 minutes and its channels stock from 50 minutes ago.
    admin.create_item(create("launch", 1_000, now + 600_000, 3_600_000, Some(100))).await.expect("create launch");
    // Before its lead: opens in an hour, stocked 30 s before.
    admin.create_item(create("later", 10, now + 3_600_000, 30_000, None)).await.expect("create later");
    // On sale now: no countdown, no readiness.
    admin.create_item(create("plain", 10, 0, 0, None)).await.expect("create plain");
    let mut app = SimulatedAgent::register(&center, "app").await;
    let mut web = SimulatedAgent::register(&center, "web").await;
    // Two live channels share the 900 units beyond the reserve; only app has stocked.
    assert_eq!(app.borrow_of("launch", 450).await, 450);
    // Its pool holds them, as its heartbeat says (no drift to turn red on a slow machine).
    app.report_of("launch", 450, 0, 0).await;

    let view = admin.get_item(pb::GetItemRequest { item_id: "launch".into() }).await.unwrap().into_inner();
    assert_eq!(readiness(&view), [("app", 450, 450, true), ("web", 450, 0, true)]);
    let plain = admin.get_item(pb::GetItemRequest { item_id: "plain".into() }).await.unwrap().into_inner();
    assert!(plain.readiness.is_empty(), "an item on sale has no readiness: {:?}", plain.readiness);

    let (_, _, text) = http_get(http, "/metrics").await;
    let s = |series: &str| sample(&text, series).unwrap_or_else(|| panic!("no sample {series} in\n{text}"));
    let opens_in = s(r#"inventory_center_item_opens_in_seconds{item="launch"}"#);
    assert!((500.0..=600.0).contains(&opens_in), "opens in {opens_in} s");
    assert_eq!(s(r#"inventory_center_item_prestock_lead_seconds{item="launch"}"#), 3_600.0);
    assert_eq!(s(r#"inventory_center_channel_allocated_units{item="launch",channel="app"}"#), 450.0);
    assert_eq!(s(r#"inventory_center_channel_stocked_units{item="launch",channel="app"}"#), 450.0);
    assert_eq!(s(r#"inventory_center_channel_allocated_units{item="launch",channel="web"}"#), 450.0);
    assert_eq!(s(r#"inventory_center_channel_stocked_units{item="launch",channel="web"}"#), 0.0);
    assert_eq!(s(r#"inventory_center_channel_allocated_units{item="later",channel="web"}"#), 5.0);
    assert!(sample(&text, r#"inventory_center_item_opens_in_seconds{item="plain"}"#).is_none(), "{text}");

    let (status, _, body) = http_get(http, "/api/items").await;
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("json");
    let item = |id: &str| v["items"].as_array().and_then(|i| i.iter().find(|i| i["item_id"] == id).cloned()).unwrap();
    let launch = item("launch")["schedule"].clone();
    assert_eq!((launch["phase"].as_str(), launch["center_reserve"].as_u64()), (Some("not_started"), Some(100)));
    assert!(launch["stocking_in_ms"].is_null(), "the lead has begun: {launch}");
    assert!((500_000..=600_000).contains(&launch["opens_in_ms"].as_i64().unwrap()), "{launch}");
    assert_eq!(
        launch["readiness"],
        serde_json::json!([
            {"channel": "app", "allocated": 450, "stocked": 450, "agent_attached": true},
            {"channel": "web", "allocated": 450, "stocked": 0, "agent_attached": true},
        ])
    );
    let later = item("later")["schedule"].clone();
    assert!(later["stocking_in_ms"].as_i64().is_some_and(|ms| ms > 3_000_000), "{later}");
    assert!(item("plain").get("schedule").is_none(), "an unscheduled item has no schedule in the feed");

    let url = format!("http://{http}/");
    let dom = dump_dom(&url).await;
    let section = element(&dom, r#"<section class="item" data-item="launch">"#, "</section>");
    assert!(section.contains(r#"<span class="badge notstarted">not started</span>"#), "{section}");
    let countdown = element(section, r#"<div class="countdown" data-countdown="opens">"#, "</div>");
    assert!(countdown.contains("opens in <b>9m "), "a countdown of 9 minutes and some seconds:\n{countdown}");
    assert!(section.contains("channels stocking now"), "{section}");
    let row = |section: &str, channel: &str| {
        element(section, &format!(r#"<tr data-readiness="{channel}">"#), "</tr>").to_owned()
    };
    let app_row = row(section, "app");
    for cell in [r#"data-field="allocated">450<"#, r#"data-field="stocked">450<"#, r#"data-field="agent">attached<"#] {
        assert!(app_row.contains(cell), "{cell} in app's readiness:\n{app_row}");
    }
    assert!(app_row.contains(r#"<td data-field="state">ready</td>"#), "{app_row}");
    let web_row = row(section, "web");
    assert!(
        web_row.contains(r#"<td data-field="state" class="warn" data-alarm="not-stocked">short by 450</td>"#),
        "web is short inside the lead, in red:\n{web_row}"
    );
    // Before its lead a channel not yet stocked is expected: not red.
    let later = element(&dom, r#"<section class="item" data-item="later">"#, "</section>");
    assert!(later.contains("channels stock in 59m"), "{later}");
    assert!(row(later, "web").contains("stocks 5 at the lead") && !later.contains(r#"data-alarm=""#), "{later}");
    let plain = element(&dom, r#"<section class="item" data-item="plain">"#, "</section>");
    assert!(!plain.contains("data-schedule") && plain.contains(">open</span>"), "{plain}");

    screenshot(&url, "inventory-console-schedule.png").await;

    // Web stocks: nothing is red any more.
    assert_eq!(web.borrow_of("launch", 450).await, 450);
    web.report_of("launch", 450, 0, 0).await;
    let dom = dump_dom(&url).await;
    let section = element(&dom, r#"<section class="item" data-item="launch">"#, "</section>");
    assert!(row(section, "web").contains(r#"<td data-field="state">ready</td>"#), "{section}");
    assert!(!dom.contains(r#"data-alarm=""#), "every channel is ready:\n{dom}");
    let view = admin.get_item(pb::GetItemRequest { item_id: "launch".into() }).await.unwrap().into_inner();
    assert_eq!(readiness(&view), [("app", 450, 450, true), ("web", 450, 450, true)]);
}
