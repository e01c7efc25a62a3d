//! BorrowMany and ReturnMany: several Borrows or Returns of one channel in one call, each
//! line a call of its own (its request id, answer and error) and all lines one batch of
//! the store (one transaction, items locked in id order).

use inventory_core::ledger::{MAX_BORROW_LINES, MAX_RETURN_LINES};
use inventory_core::{Channel, ItemId, Quantity, RequestId, ValidationError};
use inventory_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::{CenterService, Res, rate};
use crate::clock::now_ms;
use crate::error::CenterError;
use crate::events::LedgerEvent;
use crate::security::{authorize, own_channel};
use crate::store::{BorrowLine, BorrowRate, ReturnLine};

/// A ReturnMany line checked as Return checks its call, with its write sequences.
type CheckedReturn = Result<(ReturnLine, Vec<(u32, u64)>), CenterError>;

impl CenterService {
    pub(super) async fn borrow_many_inner(
        &self,
        request: Request<pb::BorrowManyRequest>,
    ) -> Res<pb::BorrowManyResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        if r.lines.is_empty() || r.lines.len() > MAX_BORROW_LINES {
            let reason = format!("must hold 1 to {MAX_BORROW_LINES} lines");
            return Err(CenterError::from(ValidationError::new("lines", r.lines.len() as u64, reason)).into());
        }
        // Each line is a Borrow of its own (and leaves a record of its own).
        self.limits.call(channel.as_str(), r.lines.len())?;
        let now = now_ms();
        let mut lines = Vec::with_capacity(r.lines.len());
        for (n, l) in r.lines.iter().enumerate() {
            let field = |name: &str| format!("lines[{n}].{name}");
            lines.push(BorrowLine {
                item: ItemId::parse(&field("item_id"), &l.item_id).map_err(CenterError::from)?,
                quantity: Quantity::parse(&field("quantity"), l.quantity).map_err(CenterError::from)?,
                request_id: RequestId::parse(&field("request_id"), &l.request_id).map_err(CenterError::from)?,
                rate: BorrowRate { sell_rate_milli: rate(&field("sell_rate_milli"), l.sell_rate_milli)?, now_ms: now },
            });
        }
        for l in &lines {
            self.refuse_if_too_old(&l.request_id)?;
            self.refuse_if_beyond_ledger(&l.item)?;
        }
        let answers = self.store.borrow_many(&channel, r.epoch, &lines).await?;
        let mut results = Vec::with_capacity(lines.len());
        for (line, answer) in lines.iter().zip(answers) {
            let mut result = pb::BorrowLineResult {
                item_id: line.item.to_string(),
                request_id: line.request_id.to_string(),
                ..Default::default()
            };
            match answer {
                Ok(out) => {
                    if !out.replayed && !out.capped && out.granted < line.quantity.get() && out.center_available == 0 {
                        self.events.publish(LedgerEvent::ReturnRequested {
                            item_id: line.item.to_string(),
                            starving: channel.to_string(),
                        });
                    }
                    result.granted = out.granted;
                    result.center_available = out.center_available;
                    result.replayed = out.replayed;
                    result.opens_at_unix_ms = out.opens_at_ms;
                }
                Err(e) => {
                    let status = Status::from(e);
                    result.code = status.code() as i32;
                    result.message = status.message().to_owned();
                }
            }
            results.push(result);
        }
        tracing::debug!(channel = %channel, lines = results.len(), "borrow many");
        Ok(Response::new(pb::BorrowManyResponse { results }))
    }

    pub(super) async fn return_many_inner(
        &self,
        request: Request<pb::ReturnManyRequest>,
    ) -> Res<pb::ReturnManyResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        if r.lines.is_empty() || r.lines.len() > MAX_RETURN_LINES {
            let reason = format!("must hold 1 to {MAX_RETURN_LINES} lines");
            return Err(CenterError::from(ValidationError::new("lines", r.lines.len() as u64, reason)).into());
        }
        // Each line is a Return of its own (and leaves a record of its own).
        self.limits.call(channel.as_str(), r.lines.len())?;
        // A line Return would refuse is answered alone; the others still apply (the lines
        // an agent sends together are unrelated pools' Returns).
        let checked: Vec<CheckedReturn> = r.lines.iter().enumerate().map(|(n, l)| self.return_line(n, l)).collect();
        let seqs: Vec<(&ItemId, u32, u64)> = checked
            .iter()
            .flatten()
            .flat_map(|(line, seqs)| seqs.iter().map(move |(s, w)| (&line.item, *s, *w)))
            .collect();
        if !seqs.is_empty() {
            self.store.raise_write_seqs(&channel, &seqs).await?;
        }
        // When every line was refused nothing reaches the store (nor its epoch check):
        // nothing applies either way.
        let lines: Vec<ReturnLine> = checked.iter().flatten().map(|(line, _)| line.clone()).collect();
        let answers =
            if lines.is_empty() { Vec::new() } else { self.store.give_back_many(&channel, r.epoch, &lines).await? };
        let mut answers = lines.iter().zip(answers);
        let mut results = Vec::with_capacity(r.lines.len());
        for (l, check) in r.lines.iter().zip(checked) {
            let mut result = pb::ReturnLineResult {
                item_id: l.item_id.clone(),
                request_id: l.request_id.clone(),
                ..Default::default()
            };
            let answer = match check {
                Err(e) => Err(e),
                Ok(_) => match answers.next() {
                    Some((line, answer)) => answer.inspect(|out| {
                        if !out.replayed {
                            self.events.publish(LedgerEvent::Restocked {
                                item_id: line.item.to_string(),
                                center_available: out.center_available,
                                from_channel: Some(channel.to_string()),
                            });
                        }
                    }),
                    None => Err(CenterError::Internal("a return line has no answer".into())),
                },
            };
            match answer {
                Ok(out) => {
                    result.center_available = out.center_available;
                    result.replayed = out.replayed;
                }
                Err(e) => {
                    let status = Status::from(e);
                    result.code = status.code() as i32;
                    result.message = status.message().to_owned();
                }
            }
            results.push(result);
        }
        tracing::debug!(channel = %channel, lines = results.len(), "return many");
        Ok(Response::new(pb::ReturnManyResponse { results }))
    }

    /// Line `n` of a ReturnMany checked as Return checks its call, fields named
    /// `lines[n].<field>`.
    fn return_line(&self, n: usize, l: &pb::ReturnLine) -> CheckedReturn {
        let field = |name: &str| format!("lines[{n}].{name}");
        let line = ReturnLine {
            item: ItemId::parse(&field("item_id"), &l.item_id)?,
            quantity: Quantity::parse(&field("quantity"), l.quantity)?,
            request_id: RequestId::parse(&field("request_id"), &l.request_id)?,
        };
        self.refuse_if_too_old(&line.request_id)?;
        let seqs = inventory_core::pool::return_write_seqs(&l.write_seq_floors)
            .map_err(|e| ValidationError { field: field(&e.field), ..e })?;
        Ok((line, seqs))
    }
}
