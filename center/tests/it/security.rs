//! Tokens bound to channels, and mutual TLS between agent and center.

use inventory_agent::config::StoreKind;
use inventory_agent::{AgentConfig, Application as AgentApp};
use inventory_center::{Application, CenterConfig};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::TestSqlite;
use inventory_test_support::pki::TestPki;
use std::time::Duration;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

const OPERATOR: &str = "operator-token-0123456789";
const APP: &str = "app-agent-token-0123456789";
const WEB: &str = "web-agent-token-0123456789";

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

async fn secured_center(
    db: &TestSqlite,
    tweak: impl FnOnce(&mut CenterConfig),
) -> (String, tokio::task::JoinHandle<()>) {
    let mut cfg = CenterConfig::for_tests(&db.url);
    cfg.insecure = false;
    cfg.operator_token = Some(OPERATOR.into());
    cfg.agent_tokens = Some(format!("app:{APP},web:{WEB}"));
    tweak(&mut cfg);
    let app = Application::build(cfg).await.expect("center starts");
    let addr = app.grpc_addr();
    let task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("runs") });
    (format!("{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_wrong_and_foreign_tokens_are_refused_and_change_nothing() {
    let db = TestSqlite::create();
    let (addr, _task) = secured_center(&db, |_| {}).await;
    let url = format!("http://{addr}");
    let mut admin = AdminClient::connect(url.clone()).await.unwrap();
    let mut center = CenterClient::connect(url).await.unwrap();
    let create = || pb::CreateItemRequest { item_id: "i".into(), total: 100, ..Default::default() };

    let none = admin.create_item(create()).await.unwrap_err();
    assert_eq!(none.code(), Code::Unauthenticated, "{none:?}");
    let wrong = admin.create_item(with_token(create(), "not-the-operator-token")).await.unwrap_err();
    assert_eq!(wrong.code(), Code::Unauthenticated);
    // An agent's token is not an operator's.
    let agent_as_operator = admin.create_item(with_token(create(), APP)).await.unwrap_err();
    assert_eq!(agent_as_operator.code(), Code::Unauthenticated);
    admin.create_item(with_token(create(), OPERATOR)).await.expect("operator may create");

    let register =
        |channel: &str| pb::RegisterAgentRequest { channel: channel.into(), agent_id: "a".into(), fenced_at: 0 };
    assert_eq!(center.register_agent(register("app")).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(
        center.register_agent(with_token(register("app"), OPERATOR)).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    let foreign = center.register_agent(with_token(register("app"), WEB)).await.unwrap_err();
    assert_eq!(foreign.code(), Code::PermissionDenied);
    assert!(foreign.message().contains("channel web may not act for channel \"app\""), "{foreign:?}");
    let epoch = center.register_agent(with_token(register("app"), APP)).await.unwrap().into_inner().epoch;

    let borrow = |rid: &str| pb::BorrowRequest {
        item_id: "i".into(),
        channel: "app".into(),
        epoch,
        quantity: 10,
        request_id: rid.into(),
        ..Default::default()
    };
    assert_eq!(center.borrow(borrow("b1")).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(
        center.borrow(with_token(borrow("b1"), "app-agent-token-0123456780")).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(center.borrow(with_token(borrow("b1"), WEB)).await.unwrap_err().code(), Code::PermissionDenied);
    let hb = pb::HeartbeatRequest { channel: "app".into(), epoch, pools: vec![], ..Default::default() };
    assert_eq!(center.heartbeat(with_token(hb, WEB)).await.unwrap_err().code(), Code::PermissionDenied);
    // Nothing changed: the item is untouched and only the legitimate registration exists.
    let view =
        admin.get_item(with_token(pb::GetItemRequest { item_id: "i".into() }, OPERATOR)).await.unwrap().into_inner();
    assert_eq!(view.item.unwrap().available, 100);
    assert!(view.channels.is_empty());
    let channels = admin.list_channels(with_token(pb::ListChannelsRequest::default(), OPERATOR)).await.unwrap();
    assert_eq!(channels.into_inner().channels[0].epoch, epoch, "no extra registration happened");
    // The right token works.
    let granted = center.borrow(with_token(borrow("b1"), APP)).await.unwrap().into_inner().granted;
    assert_eq!(granted, 10);
}

#[tokio::test]
async fn refuses_to_start_without_tokens_unless_insecure() {
    let db = TestSqlite::create();
    let mut cfg = CenterConfig::for_tests(&db.url);
    cfg.insecure = false;
    let err = Application::build(cfg).await.err().expect("refused").to_string();
    assert!(err.contains("refusing to start without tokens"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_between_agent_and_center_and_untrusted_clients_refused() {
    let pki = TestPki::generate();
    let db = TestSqlite::create();
    let (addr, _task) = secured_center(&db, |c| {
        c.tls_cert = Some(pki.server.cert.clone());
        c.tls_key = Some(pki.server.key.clone());
        c.tls_client_ca = Some(pki.ca.clone());
    })
    .await;
    let port = addr.rsplit(':').next().unwrap().to_owned();
    let url = format!("https://localhost:{port}");
    let ca = Certificate::from_pem(TestPki::read(&pki.ca));
    let tls = |pem: &inventory_test_support::pki::Pem| {
        ClientTlsConfig::new()
            .ca_certificate(ca.clone())
            .identity(Identity::from_pem(TestPki::read(&pem.cert), TestPki::read(&pem.key)))
    };

    // An operator with a trusted client certificate.
    let channel = Endpoint::from_shared(url.clone()).unwrap().tls_config(tls(&pki.client)).unwrap().connect().await;
    let mut admin = AdminClient::new(channel.expect("trusted client connects"));
    admin
        .create_item(with_token(
            pb::CreateItemRequest { item_id: "t".into(), total: 50, ..Default::default() },
            OPERATOR,
        ))
        .await
        .expect("call over mutual TLS");

    // An agent over mutual TLS: registers, borrows, sells.
    let mut cfg = AgentConfig::for_tests("app", &url, StoreKind::Memory, "redis://unused", "x:");
    cfg.insecure = true;
    cfg.center_token = Some(APP.into());
    cfg.center_ca = Some(pki.ca.clone());
    cfg.center_client_cert = Some(pki.client.cert.clone());
    cfg.center_client_key = Some(pki.client.key.clone());
    let agent = AgentApp::build(cfg).await.expect("agent registers over mutual TLS");
    let agent_addr = agent.grpc_addr();
    let _agent_task = tokio::spawn(agent.run_until(std::future::pending()));
    let mut buyer =
        inventory_proto::v1::agent_client::AgentClient::connect(format!("http://{agent_addr}")).await.unwrap();
    let r = buyer
        .acquire(pb::AcquireRequest {
            item_id: "t".into(),
            user_id: "u".into(),
            quantity: 1,
            idempotency_key: "k".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.outcome(), pb::AcquireOutcome::Reserved);

    // A client whose certificate another CA signed is refused, and so is one without any.
    // Bounded: a refused handshake must end in an error, never leave the test waiting.
    let bounded = |e: Endpoint| e.connect_timeout(Duration::from_secs(10)).timeout(Duration::from_secs(10));
    let rogue = bounded(Endpoint::from_shared(url.clone()).unwrap().tls_config(tls(&pki.untrusted_client)).unwrap());
    let refused = match rogue.connect().await {
        Err(_) => true,
        Ok(ch) => AdminClient::new(ch).list_items(with_token(pb::ListItemsRequest {}, OPERATOR)).await.is_err(),
    };
    assert!(refused, "a client with an untrusted certificate got through");
    let anonymous = bounded(
        Endpoint::from_shared(url).unwrap().tls_config(ClientTlsConfig::new().ca_certificate(ca.clone())).unwrap(),
    );
    let refused = match anonymous.connect().await {
        Err(_) => true,
        Ok(ch) => AdminClient::new(ch).list_items(with_token(pb::ListItemsRequest {}, OPERATOR)).await.is_err(),
    };
    assert!(refused, "a client without a certificate got through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_side_port_speaks_tls_when_configured() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

    let pki = TestPki::generate();
    let db = TestSqlite::create();
    let mut cfg = CenterConfig::for_tests(&db.url);
    cfg.tls_cert = Some(pki.server.cert.clone());
    cfg.tls_key = Some(pki.server.key.clone());
    let app = Application::build(cfg).await.expect("center starts");
    let http = app.http_addr();
    let _task = tokio::spawn(async move { app.run_until(std::future::pending()).await.expect("runs") });

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(&pki.ca).unwrap()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
    let mut tls = connector.connect(ServerName::try_from("localhost").unwrap(), tcp).await.expect("tls handshake");
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut body = String::new();
    tls.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200") && body.ends_with("ok\n"), "{body}");

    // Plain HTTP to the TLS port gets no answer.
    let mut plain = tokio::net::TcpStream::connect(http).await.unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), plain.read_to_end(&mut raw)).await;
    assert!(!String::from_utf8_lossy(&raw).contains("200 OK"), "plain HTTP was served");
}
