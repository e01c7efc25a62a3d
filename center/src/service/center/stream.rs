//! WatchChannel: the channel's events as they happen, after the schedules as they stand.
//!
//! A stream starts with an ItemSchedule for every scheduled item that has not closed, then
//! carries the live events. The subscription is taken before the schedules are read, so a
//! change made meanwhile is in the read, in the live events, or in both (applied twice, it
//! ends in the same state); a scheduled item created while an agent was not watching (a
//! reconnect, a center restart, the moment between RegisterAgent and WatchChannel) is
//! still loaded and stocked before its opening rather than on its first buyer.
//!
//! A stream never leaves an event out: a watcher that fell further behind than the center
//! keeps events for ([`crate::events::CAPACITY`]), an event the center could not read, or
//! a PostgreSQL listener that lost its connection ([`LedgerEvent::Gap`]) ends the stream
//! UNAVAILABLE, and the agent's next watch re-reads every item's settings.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use inventory_core::{Channel, ItemId};
use inventory_proto::v1 as pb;
use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tonic::{Request, Response, Status};

use super::{CenterService, Res, WatchStream};
use crate::error::CenterError;
use crate::events::LedgerEvent;
use crate::security::{authorize, own_channel};
use crate::service::{pb_schedule, pb_watermarks};
use crate::store::LedgerStore;

impl CenterService {
    pub(super) async fn watch_channel_inner(&self, request: Request<pb::WatchChannelRequest>) -> Res<WatchStream> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        if self.faults.refuse_watches.load(Ordering::SeqCst) {
            self.faults.watches_refused.fetch_add(1, Ordering::SeqCst);
            return Err(Status::unavailable("watch streams refused (fault injected)"));
        }
        match self.store.session(&channel).await? {
            Some(s) => s.check_epoch(&channel, r.epoch).map_err(CenterError::from)?,
            None => return Err(CenterError::Precondition(format!("channel {channel} is not registered")).into()),
        }
        // Held by the stream: its place is freed when the stream ends or its caller leaves.
        let open = self.limits.watch(channel.as_str())?;
        let live = BroadcastStream::new(self.events.subscribe());
        let standing: Vec<pb::ChannelEvent> = self
            .store
            .schedules()
            .await?
            .into_iter()
            .filter(|(_, _, closed)| !closed)
            .map(|(id, s, closed)| pb::ChannelEvent {
                event: Some(pb::channel_event::Event::ScheduleChanged(pb_schedule(id, s, closed))),
            })
            .collect();
        let store = Arc::clone(&self.store);
        let name = channel.to_string();
        let stall = self.faults.stall_watches.subscribe();
        let live = live
            // The channel's events, and a lag.
            .filter(move |e| std::future::ready(!matches!(e, Ok(e) if !e.concerns(&name))))
            .then(move |e| {
                let (store, channel, mut stall) = (Arc::clone(&store), channel.clone(), stall.clone());
                async move {
                    let _ = stall.wait_for(|stalled| !stalled).await;
                    match e {
                        Ok(e) => to_channel_event(store.as_ref(), &channel, e).await.transpose(),
                        // Missed events would leave the agent selling on stale settings
                        // for good: the stream ends, and the agent's next watch re-reads
                        // every item's settings.
                        Err(BroadcastStreamRecvError::Lagged(missed)) => {
                            tracing::warn!(channel = %channel, missed, "a watcher fell behind; its stream ends");
                            Some(Err(Status::unavailable(format!(
                                "this watch of channel {channel} fell {missed} events behind; watch again"
                            ))))
                        }
                    }
                }
            })
            // An error ends the response: tonic sends its status as the trailers.
            .filter_map(std::future::ready);
        // A stream never ends by itself; at shutdown the center ends it, so the server can
        // finish and the agent reconnects to another replica.
        let mut stop = self.stop.clone();
        let stopping = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let stream = futures::stream::iter(standing).map(Ok).chain(live).take_until(stopping);
        Ok(Response::new(Box::pin(stream.map(move |e| {
            let _open = &open;
            e
        }))))
    }
}

/// The wire's event; `None` for none to send, an error when the event could not be read
/// (the stream then ends, as for a lagging watcher: an event left out would never come).
async fn to_channel_event(
    store: &dyn LedgerStore,
    channel: &Channel,
    e: LedgerEvent,
) -> Result<Option<pb::ChannelEvent>, Status> {
    use pb::channel_event::Event;
    let event = match e {
        LedgerEvent::Watermarks { item_id, .. } => {
            // The effective value for this channel: its override wins over the default.
            let Ok(item) = ItemId::parse("item_id", &item_id) else {
                return Ok(None);
            };
            let policy = store.policy(&item, Some(channel)).await.map_err(|e| {
                tracing::warn!(channel = %channel, item = %item, error = %e, "watermark event unreadable; the watch ends");
                Status::unavailable(format!("the watermarks of item {item} could not be read ({e}); watch again"))
            })?;
            Event::WatermarksChanged(pb::WatermarksChanged {
                item_id,
                watermarks: Some(pb_watermarks(policy.watermarks)),
            })
        }
        LedgerEvent::Restocked { item_id, center_available, .. } => {
            Event::Restocked(pb::Restocked { item_id, center_available })
        }
        LedgerEvent::ReturnRequested { item_id, .. } => Event::ReturnRequested(pb::ReturnRequested { item_id }),
        LedgerEvent::InDoubtResolved { item_id, .. } => Event::InDoubtResolved(pb::InDoubtResolved { item_id }),
        LedgerEvent::Gap => {
            return Err(Status::unavailable(format!(
                "the center's event feed lost its database connection and may have missed events for channel \
                 {channel}; watch again"
            )));
        }
        LedgerEvent::Scheduled { item_id, opens_at_ms, closes_at_ms, prestock_lead_ms, closed } => {
            Event::ScheduleChanged(pb_schedule(
                item_id,
                inventory_core::schedule::Schedule { opens_at_ms, closes_at_ms, prestock_lead_ms },
                closed,
            ))
        }
    };
    Ok(Some(pb::ChannelEvent { event: Some(event) }))
}
