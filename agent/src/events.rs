//! The channel's events from the center (WatchChannel), applied to the items they name.

use std::sync::Arc;

use futures::StreamExt;

use inventory_core::channel::{OpKind, ResyncWhy};
use inventory_proto::v1 as pb;

use crate::items::Items;
use crate::link::CenterLink;
use crate::stocking::Stocking;

pub async fn apply(items: &Items, link: &Arc<CenterLink>, stocking: &Arc<Stocking>, event: pb::channel_event::Event) {
    use pb::channel_event::Event;
    match event {
        Event::WatermarksChanged(w) => {
            let Some(item) = items.get(&w.item_id) else { return };
            // Re-read the whole policy (watermarks, whether the item closed, its schedule).
            match link.describe(&w.item_id).await {
                Ok(d) => item.apply_describe(&d),
                Err(_) => {
                    if let Some(wm) = w.watermarks {
                        item.with(|c| {
                            let mut p = c.policy();
                            p.watermarks = inventory_core::watermarks::Watermarks {
                                low: wm.low,
                                high: wm.high,
                                batch: wm.batch.max(1),
                            };
                            c.set_policy(p);
                        });
                    }
                }
            }
            let p = item.policy();
            tracing::info!(item = %w.item_id, low = p.watermarks.low, high = p.watermarks.high, batch = p.watermarks.batch, closed = p.closed, "item settings changed");
            // Act at once (a raised low watermark borrows now).
            let _ = stocking.look(&item).await;
        }
        Event::Restocked(r) => {
            if let Some(item) = items.get(&r.item_id) {
                item.with(|c| c.on_restocked(r.center_available));
            }
        }
        Event::InDoubtResolved(r) => {
            if let Some(item) = items.get(&r.item_id) {
                // The center settled it: bring the pool to what the channel holds now
                // (nothing after a lost pool; what was not in doubt after a reclaim).
                if stocking.run(&item, OpKind::Resync(ResyncWhy::Resolved)).await.is_some() {
                    tracing::warn!(item = %r.item_id, mode = ?item.mode(), "in-doubt units resolved");
                }
            }
        }
        Event::ScheduleChanged(s) => schedule_changed(items, link, stocking, s).await,
        Event::ReturnRequested(r) => {
            if let Some(item) = items.get(&r.item_id) {
                let kind = item.with(|c| c.on_return_requested());
                if let OpKind::Return { max } = kind {
                    let given = stocking.give_back(&item, max).await;
                    if given > 0 {
                        tracing::info!(item = %r.item_id, given, "end of sale: returned idle units");
                    }
                }
            }
        }
    }
}

/// A scheduled item was created, rescheduled or closed: load it ahead of any buyer (the
/// item's settings with it), or take the new schedule.
async fn schedule_changed(items: &Items, link: &Arc<CenterLink>, stocking: &Arc<Stocking>, s: pb::ItemSchedule) {
    let schedule = inventory_core::schedule::Schedule {
        opens_at_ms: s.opens_at_unix_ms,
        closes_at_ms: s.closes_at_unix_ms,
        prestock_lead_ms: s.prestock_lead_ms,
    };
    let Ok(id) = inventory_core::ItemId::parse("item_id", &s.item_id) else { return };
    let known = items.get(&s.item_id);
    // A stream starts with every open schedule (`WatchChannel`): one the item already
    // follows is news to nobody.
    if !s.closed
        && let Some(item) = &known
        && item.with(|c| c.schedule()) == schedule
    {
        return;
    }
    tracing::info!(item = %s.item_id, opens_at = s.opens_at_unix_ms, closes_at = s.closes_at_unix_ms, closed = s.closed, "item schedule");
    match known {
        Some(item) => {
            item.with(|c| c.set_schedule(schedule));
            // The rest of the settings (a close sets the closed flag) come with a describe.
            if let Ok(d) = link.describe(&s.item_id).await {
                item.apply_describe(&d);
            }
            let _ = stocking.look(&item).await;
        }
        None if !s.closed => {
            if let Err(e) = items.load(&id, link, crate::clock::now_ms()).await {
                tracing::warn!(item = %s.item_id, error = %e, "scheduled item not loaded; it loads on first use");
            }
        }
        None => {}
    }
}

/// On (re)connecting to the event stream: re-read each item's settings and the center's
/// stock, so nothing missed while disconnected stays stale. Sent with the other reads
/// waiting (DescribeItems), many at once: a large catalogue is re-read in seconds.
pub async fn refresh_all(items: &Items, link: &Arc<CenterLink>) {
    futures::stream::iter(items.all())
        .for_each_concurrent(REFRESHES_IN_FLIGHT, |item| async move {
            if let Ok(d) = link.describe_to_load(&item.item_id).await {
                item.apply_describe(&d);
                item.with(|c| c.set_center_available(d.center_available));
            }
        })
        .await;
}

/// Items re-read at once by [`refresh_all`] (the link gathers them into few calls).
const REFRESHES_IN_FLIGHT: usize = 256;
