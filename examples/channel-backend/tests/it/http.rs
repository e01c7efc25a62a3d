//! The backend's HTTP API end to end: a center, an agent, the backend on a free port, and
//! plain HTTP/1.1 requests as a front end sends them.

use std::net::SocketAddr;
use std::time::Duration;

use channel_backend::{Backend, router};
use inventory_client::{AgentClient, Options};
use inventory_test_support::free_port;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{Center, LocalAgent, Store, agent_config};

/// The backend on 127.0.0.1:0 over `agents`; its address.
async fn serve(agents: Vec<String>, options: Options) -> SocketAddr {
    let client = AgentClient::connect(agents, options).await.expect("client");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, router(Backend::new(client))).await });
    addr
}

struct Answer {
    status: u16,
    headers: String,
    body: Value,
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("answer in time")
        .expect("read");
    let text = String::from_utf8(raw).expect("utf-8");
    let (head, body) = text.split_once("\r\n\r\n").expect("http answer");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    let body =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{method} {path}: JSON body expected ({e}): {body}"));
    Answer { status, headers: head.to_lowercase(), body }
}

fn order(id: &str, item: &str, user: &str, qty: u64) -> String {
    format!(r#"{{"order_id":"{id}","item_id":"{item}","user_id":"{user}","quantity":{qty}}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_order_api_speaks_http_as_a_front_end_expects() {
    let center = Center::start().await;
    center.create_item("skin", 10, 3, (2, 8, 4)).await;
    center.create_item("rare", 1, 1, (0, 1, 1)).await;
    let agent = LocalAgent::start(agent_config(&center.url, "app", &Store::Memory)).await;
    let http = serve(vec![agent.url()], Options::default()).await;

    // A new order: 201 with the reservation; the same order again: 200, the same body.
    let created = send(http, "POST", "/orders", &order("o-1", "skin", "ann", 2)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["state"], "reserved");
    assert_eq!(created.body["quantity"], 2);
    assert!(created.body["reservation_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(created.body["expires_at_unix_ms"].as_i64().is_some_and(|t| t > 0));
    let replay = send(http, "POST", "/orders", &order("o-1", "skin", "ann", 2)).await;
    assert_eq!((replay.status, &replay.body), (200, &created.body), "a replay answers the first order");

    // The order id reused with another quantity, or another user: 409, nothing reserved.
    let reused = send(http, "POST", "/orders", &order("o-1", "skin", "ann", 3)).await;
    assert_eq!(reused.status, 409, "{}", reused.body);
    assert_eq!(reused.body["error"], "order_id_reused");
    let other_user = send(http, "POST", "/orders", &order("o-1", "skin", "bob", 2)).await;
    assert_eq!(other_user.status, 409, "{}", other_user.body);
    let mut raw = agent.raw().await;
    assert_eq!(crate::harness::stock(&mut raw, "skin").await.reserved, 2, "the reused ids reserved nothing");

    // Garbage: 400, naming the field.
    let wrong_type =
        send(http, "POST", "/orders", r#"{"order_id":"o-2","item_id":7,"user_id":"ann","quantity":1}"#).await;
    assert_eq!(wrong_type.status, 400);
    assert!(wrong_type.body["message"].as_str().unwrap().contains("item_id"), "{}", wrong_type.body);
    let missing = send(http, "POST", "/orders", r#"{"order_id":"o-2","item_id":"skin","user_id":"ann"}"#).await;
    assert_eq!(missing.status, 400);
    assert!(missing.body["message"].as_str().unwrap().contains("quantity is missing"), "{}", missing.body);
    let not_json = send(http, "POST", "/orders", "{order_id: o-2").await;
    assert_eq!(not_json.status, 400);
    assert!(not_json.body["message"].as_str().unwrap().starts_with("body is not JSON"), "{}", not_json.body);
    let bad_key = send(http, "POST", "/orders", &order("o 2", "skin", "ann", 1)).await;
    assert_eq!(bad_key.status, 400, "the agent's INVALID_ARGUMENT: {}", bad_key.body);
    assert!(bad_key.body["message"].as_str().unwrap().contains("idempotency_key"), "{}", bad_key.body);

    // Pay, look, refund; another order cancelled.
    let paid = send(http, "POST", "/orders/o-1/pay", "").await;
    assert_eq!((paid.status, &paid.body["state"]), (200, &Value::from("confirmed")), "{}", paid.body);
    let shown = send(http, "GET", "/orders/o-1", "").await;
    assert_eq!((shown.status, &shown.body["state"]), (200, &Value::from("confirmed")), "{}", shown.body);
    let refunded = send(http, "POST", "/orders/o-1/refund", "").await;
    assert_eq!(refunded.body["state"], "refunded", "{}", refunded.body);
    assert_eq!(send(http, "POST", "/orders", &order("o-3", "skin", "cid", 1)).await.status, 201);
    let cancelled = send(http, "POST", "/orders/o-3/cancel", "").await;
    assert_eq!(cancelled.body["state"], "cancelled", "{}", cancelled.body);
    let pay_cancelled = send(http, "POST", "/orders/o-3/pay", "").await;
    assert_eq!((pay_cancelled.status, &pay_cancelled.body["error"]), (409, &Value::from("wrong_state")));
    assert_eq!(send(http, "GET", "/orders/nope", "").await.status, 404);

    // Stock, then sold out: 410.
    let item = send(http, "GET", "/items/skin", "").await;
    assert_eq!(item.status, 200, "{}", item.body);
    assert_eq!(item.body["sold_out"], false);
    assert_eq!(send(http, "POST", "/orders", &order("r-1", "rare", "ann", 1)).await.status, 201);
    let gone = send(http, "POST", "/orders", &order("r-2", "rare", "bob", 1)).await;
    assert_eq!((gone.status, &gone.body["error"]), (410, &Value::from("sold_out")), "{}", gone.body);
    // A quantity above the per-user limit: 400 (the agent names the field).
    let over = send(http, "POST", "/orders", &order("o-4", "skin", "dan", 4)).await;
    assert_eq!(over.status, 400, "above the per-user limit is the agent's INVALID_ARGUMENT: {}", over.body);

    // No agent reachable: 503 with Retry-After, once the client's deadline ran out.
    let dead = serve(
        vec![format!("http://127.0.0.1:{}", free_port())],
        Options::default().deadline(Duration::from_millis(300)).connect_timeout(Duration::from_millis(200)),
    )
    .await;
    let down = send(dead, "POST", "/orders", &order("o-5", "skin", "eve", 1)).await;
    assert_eq!((down.status, &down.body["error"]), (503, &Value::from("retry_later")), "{}", down.body);
    assert!(down.headers.contains("retry-after: 1"), "{}", down.headers);
}

/// A user sending faster than the agent's per-user rate: the client retries within its
/// deadline, then the backend answers 429 with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_agents_rate_gets_429_with_retry_after() {
    let center = Center::start().await;
    center.create_item("skin", 10, 5, (2, 8, 4)).await;
    let mut config = agent_config(&center.url, "app", &Store::Memory);
    config.user_rate_per_sec = 1;
    config.user_burst = 1;
    let agent = LocalAgent::start(config).await;
    let http = serve(vec![agent.url()], Options::default().deadline(Duration::from_millis(300))).await;
    assert_eq!(send(http, "POST", "/orders", &order("o-1", "skin", "ann", 1)).await.status, 201);
    let limited = send(http, "POST", "/orders", &order("o-2", "skin", "ann", 1)).await;
    assert_eq!((limited.status, &limited.body["error"]), (429, &Value::from("rate_limited")), "{}", limited.body);
    assert!(limited.headers.contains("retry-after: "), "{}", limited.headers);
}
