//! Returns: a drain giving back many pools at once sends a ReturnMany per few dozen pools
//! (up to 500 lines), not a Return per pool ([`super::many`]).

use std::sync::Arc;

use inventory_core::ledger::MAX_RETURN_LINES;
use inventory_proto::v1 as pb;
use tonic::{Code, Status};

use super::many::{Kind, Lane};
use super::{CenterLink, with_traceparent};

pub(super) struct Returns;

impl Kind for Returns {
    type Line = pb::ReturnLine;
    type Answer = pb::ReturnResponse;
    type LineResult = pb::ReturnLineResult;
    const MANY: &'static str = "ReturnMany";
    const MAX_LINES: usize = MAX_RETURN_LINES;

    fn lane(link: &CenterLink) -> &Lane<Self> {
        &link.returns
    }

    async fn one(link: &CenterLink, l: &pb::ReturnLine, epoch: u64) -> Result<pb::ReturnResponse, Status> {
        link.retry(epoch, |mut c, epoch| {
            let req = pb::ReturnRequest {
                item_id: l.item_id.clone(),
                channel: link.channel.to_string(),
                epoch,
                quantity: l.quantity,
                request_id: l.request_id.clone(),
                write_seq_floors: l.write_seq_floors.clone(),
            };
            let mut req = link.req(req);
            with_traceparent(&mut req, &l.request_id);
            async move { c.r#return(req).await.map(|r| r.into_inner()) }
        })
        .await
    }

    async fn many(
        link: &CenterLink,
        lines: Vec<pb::ReturnLine>,
        epoch: u64,
    ) -> Result<Vec<pb::ReturnLineResult>, Status> {
        link.retry(epoch, |mut c, epoch| {
            let mut req =
                link.req(pb::ReturnManyRequest { channel: link.channel.to_string(), epoch, lines: lines.clone() });
            with_traceparent(&mut req, &lines[0].request_id);
            async move { c.return_many(req).await.map(|r| r.into_inner().results) }
        })
        .await
    }

    fn answer(r: pb::ReturnLineResult) -> Result<pb::ReturnResponse, Status> {
        match Code::from_i32(r.code) {
            Code::Ok => Ok(pb::ReturnResponse { center_available: r.center_available, replayed: r.replayed }),
            code => Err(Status::new(code, r.message)),
        }
    }
}

impl CenterLink {
    /// A Return under `epoch`: the epoch under which its units were taken out of the pool.
    /// Sent under a later epoch, it could be accepted after another incarnation's resync
    /// already counted those units back into the pool. `write_seq_floors`: the pool's
    /// segments' floors once the take was acknowledged, which the center keeps.
    ///
    /// Returns made while other calls are in flight gather as Borrows do
    /// ([`CenterLink::borrow`]) and go as one ReturnMany of their epoch.
    pub async fn give_back(
        self: &Arc<Self>,
        item_id: &str,
        quantity: u64,
        request_id: &str,
        epoch: u64,
        write_seq_floors: &[u64],
    ) -> Result<pb::ReturnResponse, Status> {
        let line = pb::ReturnLine {
            item_id: item_id.to_owned(),
            quantity,
            request_id: request_id.to_owned(),
            write_seq_floors: write_seq_floors.to_vec(),
        };
        self.gathered::<Returns>(line, epoch).await
    }

    /// ReturnMany calls the center answered.
    pub fn return_many_calls(&self) -> u64 {
        self.returns.many_calls()
    }

    /// Return calls (one item each) the center answered.
    pub fn return_calls(&self) -> u64 {
        self.returns.calls()
    }
}
