//! The client against an agent that requires a backend token over TLS, as a deployed
//! agent runs: the token and the CA taken from files, as invctl takes them.

use std::time::Duration;

use inventory_client::{Acquired, AgentClient, Error, Options};
use inventory_test_support::pki::TestPki;

use crate::harness::{Center, LocalAgent, Store, agent_config};

const TOKEN: &str = "backend-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_and_tls_from_files_reach_a_secured_agent_and_a_missing_token_is_final() {
    let center = Center::start().await;
    center.create_item("skin", 10, 2, (2, 8, 4)).await;
    let pki = TestPki::generate();
    let mut config = agent_config(&center.url, "app", &Store::Memory);
    config.backend_tokens = Some(TOKEN.into());
    config.tls_cert = Some(pki.server.cert.clone());
    config.tls_key = Some(pki.server.key.clone());
    let agent = LocalAgent::start(config).await;
    let url = format!("https://localhost:{}", agent.addr.port());
    let token_file = pki.dir.join("backend.token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write the token file");

    let options = Options::default().ca_file(&pki.ca).expect("CA").deadline(Duration::from_secs(5));
    let client = AgentClient::connect([url.clone()], options.clone().token_file(&token_file).expect("token"))
        .await
        .expect("client");
    assert_eq!(client.healthy_replicas(), vec![url.clone()], "the health check passed over TLS");
    let answer = client.acquire("skin", "ann", 1, "order-1").await.expect("acquire");
    assert!(matches!(answer, Acquired::Reserved { .. }), "{answer:?}");

    let anonymous = AgentClient::connect([url], options).await.expect("client");
    let refused = anonymous.acquire("skin", "bob", 1, "order-2").await.expect_err("no token");
    assert!(matches!(refused, Error::Unauthenticated(_)), "{refused:?}");
    assert!(!refused.is_retry_safe());
    assert!(matches!(
        Options::default().token_file(pki.dir.join("missing")),
        Err(Error::Config(m)) if m.contains("cannot read token file")
    ));
}
