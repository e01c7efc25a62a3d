//! invctl against a real center (SQLite ledger): output, JSON and exit codes.

use std::process::Output;

use inventory_center::{Application, CenterConfig};
use inventory_test_support::TestSqlite;

struct Center {
    url: String,
    db: TestSqlite,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Center {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start_center() -> Center {
    let db = TestSqlite::create();
    let app = Application::build(CenterConfig::for_tests(&db.url)).await.expect("center starts");
    let url = format!("http://{}", app.grpc_addr());
    let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("center runs") });
    Center { url, db, task }
}

async fn invctl(center: &str, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_invctl"));
    cmd.arg("--center").arg(center).args(args).env_remove("INVENTORY_OUTPUT");
    cmd.output().await.expect("invctl runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_is_created_and_shown() {
    let c = start_center().await;
    let args =
        ["item", "create", "drop-1", "--total", "10", "--limit-scope", "global", "--registry-fallback", "channel"];
    let o = invctl(&c.url, &args).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "show", "drop-1"]).await;
    assert!(stdout(&o).contains("1 over all channels (registry down: channel)"), "{}", stdout(&o));
    let o = invctl(&c.url, &["--output", "json", "item", "show", "drop-1"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!((v["limit_scope"].as_str(), v["registry_fallback"].as_str()), (Some("global"), Some("channel")));
    // A fallback means nothing for a per-channel limit: the center refuses it, by name.
    let args = ["item", "create", "drop-2", "--total", "10", "--registry-fallback", "channel"];
    let o = invctl(&c.url, &args).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("registry_fallback"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "drop-3", "--total", "10", "--limit-scope", "everywhere"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--limit-scope"), "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_lifecycle_in_table_and_json() {
    let c = start_center().await;
    let o = invctl(&c.url, &["item", "create", "skin-9", "--total", "500", "--per-user-limit", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("item \"skin-9\" created"), "{}", stdout(&o));

    let o = invctl(&c.url, &["item", "add-stock", "skin-9", "--quantity", "50", "--request-id", "r-1"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "add-stock", "skin-9", "--quantity", "50", "--request-id", "r-1"]).await;
    assert!(stdout(&o).contains("replay: already applied"), "{}", stdout(&o));

    let o = invctl(&c.url, &["--output", "json", "item", "show", "skin-9"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(
        (v["total"].as_u64(), v["available"].as_u64(), v["per_user_limit"].as_u64()),
        (Some(550), Some(550), Some(2))
    );
    assert_eq!(v["segments"].as_u64(), Some(1), "{v}");

    let o = invctl(&c.url, &["item", "list"]).await;
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[0].starts_with("ITEM") && lines[1].starts_with("skin-9"), "{text}");
    // Columns line up: each header starts where its value starts.
    let col = lines[0].find("AVAILABLE").unwrap();
    assert_eq!(&lines[1][col..col + 3], "550", "{text}");

    let o = invctl(
        &c.url,
        &["watermark", "set", "skin-9", "--channel", "app", "--low", "20", "--high", "80", "--batch", "50"],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["-o", "json", "watermark", "get", "skin-9"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(v["overrides"][0]["channel"], "app");
    assert_eq!(v["overrides"][0]["watermarks"]["low"], 20);
    // Per channel: its override, else the item default (the README shows both).
    let o = invctl(&c.url, &["-o", "json", "watermark", "get", "skin-9", "--channel", "app"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!((v["source"].as_str(), v["watermarks"]["low"].as_u64()), (Some("channel"), Some(20)), "{v}");
    let o = invctl(&c.url, &["watermark", "get", "skin-9", "--channel", "web"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).lines().nth(1).is_some_and(|l| l.starts_with("web") && l.ends_with("item default")),
        "{}",
        stdout(&o)
    );

    // Batches that follow the sell rate: on with bounds, shown, off again.
    let o =
        invctl(&c.url, &["-o", "json", "watermark", "auto", "skin-9", "--min-batch", "2", "--target-ms", "500"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(
        (v["rate_batching"]["min_batch"].as_u64(), v["rate_batching"]["target_ms"].as_u64()),
        (Some(2), Some(500))
    );
    let o = invctl(&c.url, &["watermark", "get", "skin-9"]).await;
    assert!(stdout(&o).contains("batches: follows the sell rate: 500 ms of sales"), "{}", stdout(&o));
    let o = invctl(&c.url, &["-o", "json", "watermark", "auto", "skin-9", "--off"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert!(v["rate_batching"].is_null(), "{v}");
    let o = invctl(&c.url, &["watermark", "auto", "skin-9", "--min-batch", "9", "--max-batch", "3"]).await;
    assert_eq!(
        stderr(&o),
        "invctl: invalid argument: invalid rate_batching.max_batch 3: must be at least min_batch 9\n"
    );

    // Segments: shown in JSON and text; above the bound refused.
    let o = invctl(&c.url, &["-o", "json", "item", "create", "hot-9", "--total", "3000", "--segments", "1"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(v["segments"].as_u64(), Some(1), "{v}");
    let o = invctl(&c.url, &["item", "show", "hot-9"]).await;
    assert!(stdout(&o).lines().any(|l| l.starts_with("segments") && l.trim_end().ends_with('1')), "{}", stdout(&o));
    let o = invctl(&c.url, &["-o", "json", "item", "create", "hot-8", "--total", "3000", "--segments", "8"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(v["segments"].as_u64(), Some(8), "{v}");
    let o = invctl(&c.url, &["item", "create", "hot-65", "--total", "3000", "--segments", "65"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: invalid argument: invalid segments 65: must be between 1 and 64\n");

    let o = invctl(&c.url, &["reconcile"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("ok"), "{}", stdout(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_one_line_and_exit_non_zero() {
    let c = start_center().await;
    let o = invctl(&c.url, &["watermark", "set", "nope", "--low", "1", "--high", "2", "--batch", "1"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: not found: item \"nope\" not found\n");
    invctl(&c.url, &["item", "create", "i", "--total", "5"]).await;
    let o = invctl(&c.url, &["watermark", "set", "i", "--low", "9", "--high", "2", "--batch", "1"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: failed precondition: low watermark 9 must be below high watermark 2\n");
    let o = invctl(&c.url, &["item", "create", "bad id", "--total", "5"]).await;
    assert!(stderr(&o).starts_with("invctl: invalid argument: invalid item_id \"bad id\""), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "hot", "--total", "5", "--segments", "65"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: invalid argument: invalid segments 65: must be between 1 and 64\n");
    let o = invctl("http://127.0.0.1:1", &["item", "list"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "invctl: cannot connect to --center \"http://127.0.0.1:1\": connection refused (nothing listens there)\n"
    );
    // An https:// URL against this plaintext center: said as such, not as a raw TLS error.
    let tls_url = c.url.replacen("http://", "https://", 1);
    let o = invctl(&tls_url, &["item", "list"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "invctl: cannot connect to --center {tls_url:?}: TLS handshake failed: the server does not speak TLS (use http://)\n"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_exits_1_on_a_violation() {
    let c = start_center().await;
    invctl(&c.url, &["item", "create", "i", "--total", "5"]).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&c.db.url).await.unwrap();
    sqlx::query("UPDATE items SET available = 4 WHERE item_id = 'i'").execute(&pool).await.unwrap();
    pool.close().await;
    let o = invctl(&c.url, &["reconcile", "--item", "i"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("VIOLATED") && stdout(&o).contains("conservation"), "{}", stdout(&o));
}

#[tokio::test]
async fn completions_are_generated() {
    let o = invctl("http://127.0.0.1:1", &["completions", "bash"]).await;
    assert!(o.status.success());
    assert!(stdout(&o).contains("invctl"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_list_show_close_and_resolve() {
    use inventory_proto::v1 as pb;
    let c = start_center().await;
    invctl(&c.url, &["item", "create", "i", "--total", "50"]).await;
    let mut center = inventory_proto::v1::center_client::CenterClient::connect(c.url.clone()).await.unwrap();
    let epoch = center
        .register_agent(pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-7".into(), fenced_at: 0 })
        .await
        .unwrap()
        .into_inner()
        .epoch;
    center
        .borrow(pb::BorrowRequest {
            item_id: "i".into(),
            channel: "app".into(),
            epoch,
            quantity: 20,
            request_id: "b".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let o = invctl(&c.url, &["channel", "list"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("CHANNEL") && text.contains("app-7") && text.contains("live"), "{text}");
    let o = invctl(&c.url, &["-o", "json", "channel", "show", "app"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v[0]["items"][0]["held"], 20);
    assert_eq!(v[0]["epoch"], epoch);

    // The pool is reported lost: reconcile shows it, resolve settles it.
    center
        .heartbeat(pb::HeartbeatRequest {
            channel: "app".into(),
            epoch,
            pools: vec![pb::PoolReport { item_id: "i".into(), generation: 7, lost: true, ..Default::default() }],
            ..Default::default()
        })
        .await
        .unwrap();
    // In doubt is no violation, but not "all well" either: a distinct exit code.
    let o = invctl(&c.url, &["reconcile"]).await;
    assert_eq!(o.status.code(), Some(3), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("IN DOUBT") && stdout(&o).contains("invctl resolve"), "{}", stdout(&o));
    // item show: the channel's units in doubt and its pool generation, in their columns.
    let o = invctl(&c.url, &["item", "show", "i"]).await;
    let text = stdout(&o);
    let header = text.lines().find(|l| l.starts_with("CHANNEL")).expect("channel table");
    let row = text.lines().find(|l| l.starts_with("app")).expect("app row");
    let cell = |name: &str| {
        let at = header.find(name).unwrap_or_else(|| panic!("no {name} column: {text}"));
        row[at..].split_whitespace().next().unwrap_or_default().to_owned()
    };
    assert_eq!((cell("IN DOUBT"), cell("GENERATION")), ("20".to_owned(), "7".to_owned()), "{text}");
    let o = invctl(&c.url, &["-o", "json", "item", "show", "i"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["channels"][0]["in_doubt"].as_u64(), v["channels"][0]["generation"].as_u64()), (Some(20), Some(7)));
    let o = invctl(&c.url, &["resolve", "--item", "i", "--channel", "app", "--sold", "5"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "\"i\" in channel \"app\": 5 written off as sold, 15 back at the center\n");
    let o = invctl(&c.url, &["reconcile"]).await;
    assert_eq!(o.status.code(), Some(0), "settled: {}", stdout(&o));

    let o = invctl(&c.url, &["item", "close", "i"]).await;
    assert_eq!(stdout(&o), "item \"i\" closed: no more grants\n");
    let o = invctl(&c.url, &["-o", "json", "item", "close", "i", "--reopen"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["closed"].as_bool(), v["total"].as_u64()), (Some(false), Some(45)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_remove_is_refused_while_the_channel_holds_stock() {
    use inventory_proto::v1 as pb;
    let c = start_center().await;
    invctl(&c.url, &["item", "create", "i", "--total", "50"]).await;
    let mut center = inventory_proto::v1::center_client::CenterClient::connect(c.url.clone()).await.unwrap();
    let mut register = async |channel: &str| {
        let r = pb::RegisterAgentRequest { channel: channel.into(), agent_id: format!("{channel}-1"), fenced_at: 0 };
        let epoch = center.register_agent(r).await.unwrap().into_inner().epoch;
        // The agent's drain: its last word, so no agent is attached any more.
        let last = pb::HeartbeatRequest { channel: channel.into(), epoch, last_report: true, ..Default::default() };
        center.heartbeat(last).await.unwrap();
        epoch
    };
    let epoch = register("app").await;
    register("ghost").await;
    let (item_id, channel) = (String::from("i"), String::from("app"));
    let (quantity, request_id) = (20, String::from("b-1"));
    let borrow = pb::BorrowRequest { item_id, channel, epoch, quantity, request_id, ..Default::default() };
    center.borrow(borrow).await.unwrap();

    let o = invctl(&c.url, &["channel", "remove", "app"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "invctl: failed precondition: channel \"app\" still holds 20 units of item \"i\": give them back first \
         (drain its agent, reclaim, resolve)\n"
    );
    let (item_id, channel) = (String::from("i"), String::from("app"));
    let (quantity, request_id) = (20, String::from("r-1"));
    let give_back = pb::ReturnRequest { item_id, channel, epoch, quantity, request_id, write_seq_floors: vec![] };
    center.r#return(give_back).await.unwrap();
    let o = invctl(&c.url, &["channel", "remove", "app"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), format!("channel \"app\" removed (last epoch {epoch}; settled items: \"i\")\n"));
    let o = invctl(&c.url, &["channel", "remove", "app"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: not found: channel \"app\" not found\n");

    let o = invctl(&c.url, &["-o", "json", "channel", "remove", "ghost"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v, serde_json::json!({ "channel": "ghost", "last_epoch": 1, "item_ids": [] }));
    let o = invctl(&c.url, &["-o", "json", "channel", "list"]).await;
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&o.stdout).expect("json"), serde_json::json!([]));
}

#[tokio::test]
async fn bad_numbers_get_a_plain_error_before_any_call() {
    // The center address is never reached: the command line is refused first.
    for (args, says) in [
        (&["item", "create", "x", "--total", "-5"][..], "invalid value '-5' for '--total <TOTAL>': cannot be negative"),
        (&["item", "add-stock", "x", "--quantity", "-1"][..], "'--quantity <QUANTITY>': cannot be negative"),
        (&["item", "add-stock", "x", "--quantity", "0"][..], "'--quantity <QUANTITY>': must be at least 1"),
        (&["agent", "acquire", "x", "--user", "u", "--quantity", "0"][..], "must be at least 1"),
        (&["resolve", "--item", "x", "--channel", "app", "--sold", "-3"][..], "cannot be negative"),
        (&["watermark", "set", "x", "--low", "1", "--high", "-2", "--batch", "1"][..], "cannot be negative"),
    ] {
        let o = invctl("http://127.0.0.1:1", args).await;
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = stderr(&o);
        assert!(err.starts_with("invctl: ") && err.contains(says), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

/// A stand-in agent that answers Confirm and Cancel with the reservation it was sent.
#[derive(Default)]
struct EchoAgent {
    seen: std::sync::Mutex<Vec<(String, String)>>,
}

#[tonic::async_trait]
impl inventory_proto::v1::agent_server::Agent for EchoAgent {
    /// Reserves, answering the generation it was told to expect as the pool's; with
    /// allow_partial, at most 2 units.
    async fn acquire(
        &self,
        r: tonic::Request<inventory_proto::v1::AcquireRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::AcquireResponse>, tonic::Status> {
        let r = r.into_inner();
        let what = if r.allow_partial { "acquire-partial" } else { "acquire" };
        self.seen.lock().unwrap().push((what.into(), r.expect_pool_generation.to_string()));
        Ok(tonic::Response::new(inventory_proto::v1::AcquireResponse {
            outcome: inventory_proto::v1::AcquireOutcome::Reserved as i32,
            reservation_id: "r-a".into(),
            quantity: if r.allow_partial { r.quantity.min(2) } else { r.quantity },
            pool_generation: r.expect_pool_generation,
            ..Default::default()
        }))
    }

    async fn confirm(
        &self,
        r: tonic::Request<inventory_proto::v1::ConfirmRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::ConfirmResponse>, tonic::Status> {
        let r = r.into_inner();
        self.seen.lock().unwrap().push(("confirm".into(), r.reservation_id));
        let state = inventory_proto::v1::ReservationState::Confirmed as i32;
        Ok(tonic::Response::new(inventory_proto::v1::ConfirmResponse { state }))
    }

    async fn cancel(
        &self,
        r: tonic::Request<inventory_proto::v1::CancelRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::CancelResponse>, tonic::Status> {
        let r = r.into_inner();
        self.seen.lock().unwrap().push(("cancel".into(), r.reservation_id));
        let state = inventory_proto::v1::ReservationState::Cancelled as i32;
        Ok(tonic::Response::new(inventory_proto::v1::CancelResponse { state }))
    }

    async fn get_stock(
        &self,
        _: tonic::Request<inventory_proto::v1::GetStockRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::GetStockResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    async fn refund(
        &self,
        r: tonic::Request<inventory_proto::v1::RefundRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::RefundResponse>, tonic::Status> {
        let r = r.into_inner();
        self.seen.lock().unwrap().push(("refund".into(), format!("{}/{}", r.item_id, r.reservation_id)));
        if r.reservation_id == "open" {
            return Err(tonic::Status::failed_precondition("cannot refund reservation \"open\": it is reserved"));
        }
        let state = inventory_proto::v1::ReservationState::Refunded as i32;
        Ok(tonic::Response::new(inventory_proto::v1::RefundResponse { state }))
    }

    /// Found by id or by key, echoing which one was asked.
    async fn get_reservation(
        &self,
        r: tonic::Request<inventory_proto::v1::GetReservationRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::GetReservationResponse>, tonic::Status> {
        let r = r.into_inner();
        self.seen
            .lock()
            .unwrap()
            .push(("get_reservation".into(), format!("{}|{}", r.reservation_id, r.idempotency_key)));
        let reservation = inventory_proto::v1::Reservation {
            reservation_id: if r.reservation_id.is_empty() { "r-by-key".into() } else { r.reservation_id },
            idempotency_key: if r.idempotency_key.is_empty() { "k-by-id".into() } else { r.idempotency_key },
            user_id: "u".into(),
            quantity: 2,
            state: inventory_proto::v1::ReservationState::Confirmed as i32,
            expires_at_unix_ms: 1_000,
            pool_generation: 7,
        };
        Ok(tonic::Response::new(inventory_proto::v1::GetReservationResponse { reservation: Some(reservation) }))
    }

    async fn extend(
        &self,
        _: tonic::Request<inventory_proto::v1::ExtendRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::ExtendResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("not in this test"))
    }

    type StreamEventsStream = std::pin::Pin<
        Box<dyn tokio_stream::Stream<Item = Result<inventory_proto::v1::ReservationEvent, tonic::Status>> + Send>,
    >;

    /// Three events from the asked sequence, then the stream stays open (like an agent's).
    async fn stream_events(
        &self,
        r: tonic::Request<inventory_proto::v1::StreamEventsRequest>,
    ) -> Result<tonic::Response<Self::StreamEventsStream>, tonic::Status> {
        let r = r.into_inner();
        self.seen.lock().unwrap().push(("stream_events".into(), format!("{}|{}", r.item_id, r.from_sequence)));
        let from = r.from_sequence.max(1);
        let events: Vec<_> = (from..from + 3)
            .map(|sequence| {
                Ok(inventory_proto::v1::ReservationEvent {
                    event_id: format!("app:i:0:7:{sequence}"),
                    channel: "app".into(),
                    item_id: "i".into(),
                    sequence,
                    reservation_id: format!("r{sequence}"),
                    user_id: "u".into(),
                    quantity: 1,
                    state: inventory_proto::v1::ReservationState::Reserved as i32,
                    pool_generation: 7,
                    ..Default::default()
                })
            })
            .collect();
        let open = tokio_stream::StreamExt::chain(tokio_stream::iter(events), tokio_stream::pending());
        Ok(tonic::Response::new(Box::pin(open)))
    }

    /// Reserves one reservation per line (`r-<item>`), the basket id `b-<key>`.
    async fn acquire_basket(
        &self,
        r: tonic::Request<inventory_proto::v1::AcquireBasketRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::AcquireBasketResponse>, tonic::Status> {
        let r = r.into_inner();
        let lines: Vec<String> = r.lines.iter().map(|l| format!("{}={}", l.item_id, l.quantity)).collect();
        self.seen.lock().unwrap().push(("acquire_basket".into(), format!("{}|{}", r.user_id, lines.join(","))));
        Ok(tonic::Response::new(inventory_proto::v1::AcquireBasketResponse {
            outcome: inventory_proto::v1::AcquireOutcome::Reserved as i32,
            basket_id: format!("b-{}", r.idempotency_key),
            reservations: r
                .lines
                .iter()
                .map(|l| inventory_proto::v1::BasketReservation {
                    item_id: l.item_id.clone(),
                    reservation_id: format!("r-{}", l.item_id),
                    quantity: l.quantity,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }))
    }

    async fn confirm_basket(
        &self,
        r: tonic::Request<inventory_proto::v1::ConfirmBasketRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::ConfirmBasketResponse>, tonic::Status> {
        self.seen.lock().unwrap().push(("confirm_basket".into(), r.into_inner().basket_id));
        let state = inventory_proto::v1::ReservationState::Confirmed as i32;
        Ok(tonic::Response::new(inventory_proto::v1::ConfirmBasketResponse { state }))
    }

    async fn cancel_basket(
        &self,
        r: tonic::Request<inventory_proto::v1::CancelBasketRequest>,
    ) -> Result<tonic::Response<inventory_proto::v1::CancelBasketResponse>, tonic::Status> {
        let id = r.into_inner().basket_id;
        self.seen.lock().unwrap().push(("cancel_basket".into(), id.clone()));
        if id == "unknown" {
            return Err(tonic::Status::not_found("basket \"unknown\" not found"));
        }
        let state = inventory_proto::v1::ReservationState::Cancelled as i32;
        Ok(tonic::Response::new(inventory_proto::v1::CancelBasketResponse { state }))
    }
}

/// An [`EchoAgent`] served on a local port: its URL, and the server task.
async fn echo_agent(agent: std::sync::Arc<EchoAgent>) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = inventory_proto::v1::agent_server::AgentServer::from_arc(agent);
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await;
    });
    (url, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basket_acquire_confirm_and_cancel() {
    let agent = std::sync::Arc::new(EchoAgent::default());
    let (url, server) = echo_agent(std::sync::Arc::clone(&agent)).await;
    let run = |args: &[&str]| {
        let mut full = vec!["--agent".to_owned(), url.clone(), "agent".to_owned(), "basket".to_owned()];
        full.extend(args.iter().map(|a| (*a).to_owned()));
        async move { invctl("http://127.0.0.1:1", &full.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let o = run(&["-o", "json", "acquire", "console=2", "pad", "--user", "u1", "--key", "k1"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["outcome"].as_str(), v["basket_id"].as_str()), (Some("reserved"), Some("b-k1")), "{v}");
    assert_eq!(v["reservations"][0]["quantity"].as_u64(), Some(2), "{v}");
    assert_eq!(v["reservations"][1]["reservation_id"].as_str(), Some("r-pad"), "{v}");
    let o = run(&["acquire", "pad", "--user", "u1", "--key", "k2"]).await;
    assert!(stdout(&o).starts_with("reserved basket \"b-k2\" for \"u1\" (key \"k2\")\n"), "{}", stdout(&o));
    let o = run(&["confirm", "b-k1"]).await;
    assert_eq!(stdout(&o), "basket \"b-k1\": confirmed\n", "{}", stderr(&o));
    let o = run(&["-o", "json", "cancel", "b-k2"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["basket_id"].as_str(), v["state"].as_str()), (Some("b-k2"), Some("cancelled")));
    let o = run(&["cancel", "unknown"]).await;
    assert!(!o.status.success());
    assert_eq!(stderr(&o).lines().count(), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("not found"), "{}", stderr(&o));
    // A bad quantity is refused before any call; no line at all too.
    let o = run(&["acquire", "pad=0", "--user", "u1"]).await;
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("must be at least 1"), "{}", stderr(&o));
    assert_eq!(run(&["acquire", "--user", "u1"]).await.status.code(), Some(2));
    let seen = agent.seen.lock().unwrap().clone();
    let expected = [
        ("acquire_basket", "u1|console=2,pad=1"),
        ("acquire_basket", "u1|pad=1"),
        ("confirm_basket", "b-k1"),
        ("cancel_basket", "b-k2"),
        ("cancel_basket", "unknown"),
    ];
    assert_eq!(seen, expected.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec());
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirm_and_cancel_take_the_reservation_either_way() {
    let agent = std::sync::Arc::new(EchoAgent::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = inventory_proto::v1::agent_server::AgentServer::from_arc(std::sync::Arc::clone(&agent));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let run = |args: Vec<&str>| {
        let mut full = vec!["--agent", url.as_str(), "agent"];
        full.extend(args);
        let full: Vec<String> = full.into_iter().map(str::to_owned).collect();
        async move { invctl("http://127.0.0.1:1", &full.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    let o = run(vec!["confirm", "i", "--reservation", "r-flag"]).await;
    assert_eq!(stdout(&o), "reservation \"r-flag\": confirmed\n", "{}", stderr(&o));
    let o = run(vec!["confirm", "i", "r-positional"]).await;
    assert_eq!(stdout(&o), "reservation \"r-positional\": confirmed\n", "{}", stderr(&o));
    let o = run(vec!["-o", "json", "cancel", "i", "--reservation", "r-3"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["reservation_id"].as_str(), v["state"].as_str()), (Some("r-3"), Some("cancelled")));
    let o = run(vec!["cancel", "i"]).await;
    assert_eq!(o.status.code(), Some(2), "a reservation is required");
    assert_eq!(stderr(&o), "invctl: the following required arguments were not provided: <RESERVATION> (see --help)\n");
    let o = run(vec!["cancel", "i", "a", "--reservation", "b"]).await;
    assert_eq!(o.status.code(), Some(2), "only one of the two forms");
    // A replay that must not reserve in a pool of another generation.
    let o =
        run(vec!["-o", "json", "acquire", "i", "--user", "u", "--key", "k", "--expect-pool-generation", "42"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["reservation_id"].as_str(), v["pool_generation"].as_u64()), (Some("r-a"), Some(42)), "{v}");
    // A partial acquire says how many of how many.
    let o = run(vec!["acquire", "i", "--user", "u", "--key", "p", "--quantity", "5", "--allow-partial"]).await;
    assert_eq!(
        stdout(&o),
        "reserved 2 (of 5 asked) of \"i\" for \"u\": reservation \"r-a\" (key \"p\")\n",
        "{}",
        stderr(&o)
    );
    let seen = agent.seen.lock().unwrap().clone();
    let expected = [
        ("confirm", "r-flag"),
        ("confirm", "r-positional"),
        ("cancel", "r-3"),
        ("acquire", "42"),
        ("acquire-partial", "0"),
    ];
    assert_eq!(seen, expected.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec());
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_tail_reservation_show_and_refund() {
    let agent = std::sync::Arc::new(EchoAgent::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let service = inventory_proto::v1::agent_server::AgentServer::from_arc(std::sync::Arc::clone(&agent));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let run = |args: Vec<&str>| {
        let mut full = vec!["--agent", url.as_str()];
        full.extend(args);
        let full: Vec<String> = full.into_iter().map(str::to_owned).collect();
        async move { invctl("http://127.0.0.1:1", &full.iter().map(String::as_str).collect::<Vec<_>>()).await }
    };
    // The kept events, then it stops once the stream is idle (it never ends by itself).
    let o = run(vec!["-o", "json", "events", "tail", "--item", "i", "--from", "5", "--idle-ms", "300"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<serde_json::Value> =
        stdout(&o).lines().map(|l| serde_json::from_str(l).expect("one json object per line")).collect();
    let seqs: Vec<u64> = lines.iter().map(|v| v["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [5, 6, 7]);
    assert_eq!((lines[0]["event_id"].as_str(), lines[0]["state"].as_str()), (Some("app:i:0:7:5"), Some("reserved")));
    assert_eq!(lines[0]["previous_state"].as_str(), Some(""));
    // --limit bounds a --follow.
    let o = run(vec!["events", "tail", "--follow", "--limit", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert_eq!(text.lines().count(), 3, "a header and two events: {text}");
    assert!(text.starts_with("ITEM") && text.contains("r1") && text.contains("r2") && !text.contains("r3"), "{text}");

    let o = run(vec!["-o", "json", "reservation", "show", "--item", "i", "--key", "k9"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!((v["reservation_id"].as_str(), v["state"].as_str()), (Some("r-by-key"), Some("confirmed")), "{v}");
    assert_eq!((v["idempotency_key"].as_str(), v["pool_generation"].as_u64()), (Some("k9"), Some(7)));
    let o = run(vec!["reservation", "show", "--item", "i", "--id", "r9"]).await;
    assert!(stdout(&o).contains("reservation      \"r9\"") && stdout(&o).contains("confirmed"), "{}", stdout(&o));
    let o = run(vec!["reservation", "show", "--item", "i"]).await;
    assert_eq!(o.status.code(), Some(2), "--id or --key is required");
    let o = run(vec!["reservation", "show", "--item", "i", "--id", "a", "--key", "b"]).await;
    assert_eq!(o.status.code(), Some(2), "not both");

    let o = run(vec!["refund", "--item", "i", "--id", "r-paid"]).await;
    assert_eq!(stdout(&o), "reservation \"r-paid\": refunded\n", "{}", stderr(&o));
    let o = run(vec!["refund", "--item", "i", "--id", "open"]).await;
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "invctl: failed precondition: cannot refund reservation \"open\": it is reserved\n");

    let seen = agent.seen.lock().unwrap().clone();
    let expected = [
        ("stream_events", "i|5"),
        ("stream_events", "|0"),
        ("get_reservation", "|k9"),
        ("get_reservation", "r9|"),
        ("refund", "i/r-paid"),
        ("refund", "i/open"),
    ];
    assert_eq!(seen, expected.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec());
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_show_lists_a_segmented_pools_segments_and_the_lost_one() {
    use inventory_proto::v1 as pb;
    let c = start_center().await;
    let o = invctl(&c.url, &["item", "create", "hot", "--total", "50", "--segments", "2"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let mut center = pb::center_client::CenterClient::connect(c.url.clone()).await.unwrap();
    let r = pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-1".into(), fenced_at: 0 };
    let epoch = center.register_agent(r).await.unwrap().into_inner().epoch;
    let b = pb::BorrowRequest {
        item_id: "hot".into(),
        channel: "app".into(),
        epoch,
        quantity: 10,
        request_id: "b".into(),
        ..Default::default()
    };
    center.borrow(b).await.unwrap();
    let seg = |segment, available, lost| pb::SegmentCounts { segment, available, lost, ..Default::default() };
    let pool = pb::PoolReport {
        item_id: "hot".into(),
        available: 4,
        sold: 1,
        generation: 9,
        lost_segments: vec![1],
        segments: vec![pb::SegmentCounts { sold: 1, ..seg(0, 4, false) }, seg(1, 0, true)],
        ..Default::default()
    };
    let hb = pb::HeartbeatRequest { channel: "app".into(), epoch, pools: vec![pool], ..Default::default() };
    center.heartbeat(hb).await.unwrap();

    let o = invctl(&c.url, &["channel", "show", "app"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let row = |start: &str| {
        let line =
            text.lines().find(|l| l.trim_start().starts_with(start)).unwrap_or_else(|| panic!("{start}: {text}"));
        line.split_whitespace().map(str::to_owned).collect::<Vec<_>>()
    };
    // The item's sums, 5 in doubt (the lost segment's share of the 10 held), then a row
    // per segment.
    assert_eq!(row("hot")[..7], ["hot", "10", "4", "0", "1", "5", "5"], "{text}");
    assert_eq!(row("segment 0")[2..], ["4", "0", "1"], "{text}");
    assert_eq!(row("segment 1")[..3], ["segment", "1", "(lost)"], "{text}");
    let o = invctl(&c.url, &["-o", "json", "channel", "show", "app"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
    let segments = &v[0]["items"][0]["segments"];
    assert_eq!((segments[0]["sold"].as_u64(), segments[1]["lost"].as_bool()), (Some(1), Some(true)), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_is_planned_moved_and_shown_with_a_countdown() {
    let c = start_center().await;
    let args = [
        "item",
        "create",
        "launch",
        "--total",
        "3000",
        "--opens-at",
        "+1h",
        "--closes-at",
        "+2h",
        "--prestock-lead",
        "20s",
        "--reserve",
        "300",
    ];
    let o = invctl(&c.url, &args).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "show", "launch"]).await;
    let text = stdout(&o);
    for needle in ["not started", "(in 59m", "20.0s before the opening (in 59m"] {
        assert!(text.contains(needle), "{needle:?} in {text}");
    }
    assert!(text.lines().any(|l| l.starts_with("center reserve") && l.ends_with(" 300")), "{text}");
    let o = invctl(&c.url, &["--output", "json", "item", "show", "launch"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(
        (v["phase"].as_str(), v["prestock_lead_ms"].as_u64(), v["center_reserve"].as_u64()),
        (Some("not_started"), Some(20_000), Some(300))
    );
    let opens_in = v["opens_in_ms"].as_i64().expect("a countdown");
    assert!((3_500_000..=3_600_000).contains(&opens_in), "{v}");
    assert_eq!(v["stocking_in_ms"].as_i64(), Some(opens_in - 20_000));
    let closes_in = v["closes_in_ms"].as_i64().expect("an end");
    assert!((7_100_000..=7_200_000).contains(&closes_in), "{v}");

    // Moved later than its end: refused by name; with the end removed: moved.
    let o = invctl(&c.url, &["item", "schedule", "launch", "--opens-at", "2099-01-01T00:00:00Z"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("closes_at_unix_ms"), "{}", stderr(&o));
    let args = ["item", "schedule", "launch", "--opens-at", "2099-01-01T00:00:00Z", "--closes-at", "none"];
    let o = invctl(&c.url, &args).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("2099-01-01T00:00:00Z (in "), "{}", stdout(&o));
    assert!(stdout(&o).contains("no end"), "{}", stdout(&o));

    // Opened now; from then on the opening stays and only the end moves.
    let o = invctl(&c.url, &["item", "schedule", "launch", "--opens-at", "now"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["--output", "json", "item", "show", "launch"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!((v["phase"].as_str(), v["opens_at_unix_ms"].as_i64()), (Some("open"), Some(0)));
    let o = invctl(&c.url, &["item", "schedule", "launch", "--opens-at", "+1h"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("only closes_at_unix_ms may move"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "schedule", "launch", "--closes-at", "+30m"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    // Counted from the center's clock in the answer: 30m 00.0s when no whole tenth of a
    // second passed between the center's answer and the print.
    let moved = stdout(&o);
    assert!(moved.contains("(in 29m") || moved.contains("(in 30m 00.0s)"), "{moved}");

    // Bad times and durations are named before anything is sent.
    let o = invctl(&c.url, &["item", "create", "x", "--total", "1", "--opens-at", "tomorrow"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--opens-at") && stderr(&o).contains("RFC 3339"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "x", "--total", "1", "--prestock-lead", "2days"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--prestock-lead"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "x", "--total", "1", "--prestock-lead", "2d"]).await;
    assert!(stderr(&o).contains("prestock_lead_ms"), "the center's bound, by name: {}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn item_show_lists_each_channels_readiness_beside_the_countdown() {
    use inventory_proto::v1 as pb;
    use inventory_proto::v1::center_client::CenterClient;

    let c = start_center().await;
    // Opens in an hour, its channels stock from an hour before: the lead has begun.
    let args = ["item", "create", "drop", "--total", "1000", "--opens-at", "+1h", "--prestock-lead", "2h"];
    let o = invctl(&c.url, &args).await;
    assert!(o.status.success(), "{}", stderr(&o));
    // Two channels attached; app stocks its share of the 950 beyond the default reserve.
    let mut center = CenterClient::connect(c.url.clone()).await.expect("connect center");
    let mut epochs = Vec::new();
    for channel in ["app", "web"] {
        let reg = pb::RegisterAgentRequest { channel: channel.into(), agent_id: format!("{channel}-1"), fenced_at: 0 };
        epochs.push(center.register_agent(reg).await.expect("register").into_inner().epoch);
    }
    let borrow = pb::BorrowRequest {
        item_id: "drop".into(),
        channel: "app".into(),
        epoch: epochs[0],
        quantity: 475,
        request_id: "app-open".into(),
        ..Default::default()
    };
    assert_eq!(center.borrow(borrow).await.expect("borrow").into_inner().granted, 475);

    let o = invctl(&c.url, &["item", "show", "drop"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("not started") && text.contains("(in 59m"), "the countdown: {text}");
    let (_, readiness) = text.split_once("readiness for the opening\n").expect("a readiness table");
    let rows: Vec<Vec<&str>> = readiness.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["CHANNEL", "ALLOCATED", "STOCKED", "AGENT", "READINESS"], "{text}");
    assert_eq!(rows[1], ["app", "475", "475", "attached", "ready"], "{text}");
    assert_eq!(rows[2], ["web", "475", "0", "attached", "short", "by", "475"], "{text}");

    let o = invctl(&c.url, &["--output", "json", "item", "show", "drop"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(v["phase"], "not_started");
    assert_eq!(
        v["readiness"],
        serde_json::json!([
            {"channel": "app", "allocated": 475, "stocked": 475, "agent_attached": true, "ready": true},
            {"channel": "web", "allocated": 475, "stocked": 0, "agent_attached": true, "ready": false},
        ])
    );

    // Once open, the plan is spent: no readiness.
    let o = invctl(&c.url, &["item", "schedule", "drop", "--opens-at", "now"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["--output", "json", "item", "show", "drop"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!((v["phase"].as_str(), v["readiness"].as_array().map(Vec::len)), (Some("open"), Some(0)));
    let o = invctl(&c.url, &["item", "show", "drop"]).await;
    assert!(!stdout(&o).contains("readiness for the opening"), "{}", stdout(&o));

    // Before its lead a channel not yet stocked is waiting for it, not short.
    let args = ["item", "create", "later", "--total", "10", "--opens-at", "+1h", "--reserve", "0"];
    assert!(invctl(&c.url, &args).await.status.success());
    let text = stdout(&invctl(&c.url, &["item", "show", "later"]).await);
    let web = text.lines().find(|l| l.starts_with("web ")).unwrap_or_else(|| panic!("no row of web: {text}"));
    assert!(web.ends_with("stocks 5 at the lead"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_shares_are_created_and_shown() {
    let c = start_center().await;
    let args = [
        "item",
        "create",
        "launch",
        "--total",
        "3000",
        "--opens-at",
        "+1h",
        "--reserve",
        "300",
        "--share",
        "app=50",
        "--share",
        "web=30",
        "--share",
        "partner=20:cap=300:floor=100",
    ];
    let o = invctl(&c.url, &args).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "show", "launch"]).await;
    let text = stdout(&o);
    let line = text.lines().find(|l| l.starts_with("shares")).unwrap_or_default();
    assert!(line.ends_with("app 50, partner 20 (cap 300, floor 100), web 30"), "{text}");
    let o = invctl(&c.url, &["--output", "json", "item", "show", "launch"]).await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    let partner = &v["channel_shares"][1];
    assert_eq!(
        (partner["channel"].as_str(), partner["weight"].as_u64(), partner["cap_units"].as_u64()),
        (Some("partner"), Some(20), Some(300)),
        "{v}"
    );
    assert_eq!(partner["floor_units"].as_u64(), Some(100), "{v}");

    // A malformed share is named before anything is sent; the center's checks by field.
    let o = invctl(&c.url, &["item", "create", "x", "--total", "10", "--share", "app"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--share") && stderr(&o).contains("CHANNEL=WEIGHT"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "x", "--total", "10", "--share", "app=1:cap=2:floor=3"]).await;
    assert!(!o.status.success());
    assert!(stderr(&o).contains("channel_shares[0].floor_units"), "{}", stderr(&o));
    let o = invctl(&c.url, &["item", "create", "y", "--total", "10"]).await;
    assert!(o.status.success());
    let o = invctl(&c.url, &["item", "show", "y"]).await;
    assert!(stdout(&o).contains("none: an even split"), "{}", stdout(&o));
}
