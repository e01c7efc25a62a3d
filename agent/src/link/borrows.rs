//! Borrows: those of many pools at once (stocking after a start) go as BorrowMany calls
//! ([`super::many`]); a lone Borrow on a miss waits for nothing.

use std::sync::Arc;

use inventory_core::ledger::MAX_BORROW_LINES;
use inventory_proto::v1 as pb;
use tonic::{Code, Status};

use super::many::{Kind, Lane};
use super::{CenterLink, with_traceparent};

pub(super) struct Borrows;

impl Kind for Borrows {
    type Line = pb::BorrowLine;
    type Answer = pb::BorrowResponse;
    type LineResult = pb::BorrowLineResult;
    const MANY: &'static str = "BorrowMany";
    const MAX_LINES: usize = MAX_BORROW_LINES;

    fn lane(link: &CenterLink) -> &Lane<Self> {
        &link.borrows
    }

    async fn one(link: &CenterLink, l: &pb::BorrowLine, epoch: u64) -> Result<pb::BorrowResponse, Status> {
        link.retry(epoch, |mut c, epoch| {
            let req = pb::BorrowRequest {
                item_id: l.item_id.clone(),
                channel: link.channel.to_string(),
                epoch,
                quantity: l.quantity,
                request_id: l.request_id.clone(),
                sell_rate_milli: l.sell_rate_milli,
            };
            let mut req = link.req(req);
            with_traceparent(&mut req, &l.request_id);
            async move { c.borrow(req).await.map(|r| r.into_inner()) }
        })
        .await
    }

    async fn many(
        link: &CenterLink,
        lines: Vec<pb::BorrowLine>,
        epoch: u64,
    ) -> Result<Vec<pb::BorrowLineResult>, Status> {
        link.retry(epoch, |mut c, epoch| {
            let mut req =
                link.req(pb::BorrowManyRequest { channel: link.channel.to_string(), epoch, lines: lines.clone() });
            with_traceparent(&mut req, &lines[0].request_id);
            async move { c.borrow_many(req).await.map(|r| r.into_inner().results) }
        })
        .await
    }

    fn answer(r: pb::BorrowLineResult) -> Result<pb::BorrowResponse, Status> {
        match Code::from_i32(r.code) {
            Code::Ok => Ok(pb::BorrowResponse {
                granted: r.granted,
                center_available: r.center_available,
                replayed: r.replayed,
                opens_at_unix_ms: r.opens_at_unix_ms,
            }),
            code => Err(Status::new(code, r.message)),
        }
    }
}

impl CenterLink {
    /// Borrows of many pools at once (stocking after a start) go to the center together:
    /// one alone is sent at once as a Borrow; those made while other calls are in flight
    /// gather for a few milliseconds (or until every sender is busy) and go together, a
    /// BorrowMany of their epoch, each line keeping its request id and its own answer or
    /// error. Against a center that answers BorrowMany UNIMPLEMENTED, every Borrow goes
    /// alone.
    pub async fn borrow(
        self: &Arc<Self>,
        item_id: &str,
        quantity: u64,
        request_id: &str,
        epoch: u64,
        sell_rate_milli: u64,
    ) -> Result<pb::BorrowResponse, Status> {
        let line = pb::BorrowLine {
            item_id: item_id.to_owned(),
            quantity,
            request_id: request_id.to_owned(),
            sell_rate_milli,
        };
        self.gathered::<Borrows>(line, epoch).await
    }

    /// BorrowMany calls the center answered.
    pub fn borrow_many_calls(&self) -> u64 {
        self.borrows.many_calls()
    }

    /// Borrow calls (one item each) the center answered.
    pub fn borrow_calls(&self) -> u64 {
        self.borrows.calls()
    }
}
