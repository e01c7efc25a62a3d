//! Starts a real center on port 0 over a fresh database and hands out clients.

use std::net::SocketAddr;
use std::sync::Arc;

use inventory_center::service::center::FaultHooks;
use inventory_center::store::LedgerStore;
use inventory_center::{Application, CenterConfig};
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::center_client::CenterClient;
use inventory_test_support::{TestDatabase, TestSqlite};
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

enum Db {
    Pg(TestDatabase),
    Lite(TestSqlite),
}

pub struct TestCenter {
    pub addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub database_url: String,
    pub faults: Arc<FaultHooks>,
    pub store: Arc<dyn LedgerStore>,
    task: tokio::task::JoinHandle<()>,
    _db: Db,
}

impl TestCenter {
    pub async fn start(backend: Backend) -> Self {
        Self::start_with(backend, |_| {}).await
    }

    pub async fn start_with(backend: Backend, tweak: impl FnOnce(&mut CenterConfig)) -> Self {
        let db = match backend {
            Backend::Postgres => Db::Pg(TestDatabase::create().await),
            Backend::Sqlite => Db::Lite(TestSqlite::create()),
        };
        let database_url = match &db {
            Db::Pg(d) => d.url.clone(),
            Db::Lite(d) => d.url.clone(),
        };
        let mut config = CenterConfig::for_tests(&database_url);
        tweak(&mut config);
        let app = Application::build(config).await.expect("center starts");
        let addr = app.grpc_addr();
        let http_addr = app.http_addr();
        let faults = app.faults();
        let store = app.store();
        let task = tokio::spawn(async move {
            app.run_until(std::future::pending()).await.expect("center runs");
        });
        Self { addr, http_addr, database_url, faults, store, task, _db: db }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn admin(&self) -> AdminClient<Channel> {
        AdminClient::connect(self.url()).await.expect("connect admin")
    }

    pub async fn center(&self) -> CenterClient<Channel> {
        CenterClient::connect(self.url()).await.expect("connect center")
    }
}

impl Drop for TestCenter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Generates one `#[tokio::test]` per backend for each named async fn taking a
/// `TestCenter`: the same contract runs against PostgreSQL and SQLite.
#[macro_export]
macro_rules! for_each_backend {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::TestCenter::start($crate::support::Backend::Postgres).await).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::TestCenter::start($crate::support::Backend::Sqlite).await).await;
                }
            )*
        }
    };
}
