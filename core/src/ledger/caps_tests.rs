use super::*;

fn share(channel: &str, weight: u64, cap_units: u64, floor_units: u64) -> ChannelShare {
    ChannelShare { channel: channel.into(), weight, cap_units, floor_units }
}

fn plan(shares: &[ChannelShare]) -> ChannelShares {
    ChannelShares::parse(shares, 1_000, 100).unwrap()
}

const NOW: i64 = 1_800_000_000_000;

fn live(held: u64) -> Peer {
    Peer { held, lease_live: true, reported_at_ms: NOW - 1_000 }
}

#[test]
fn hostile_shares_are_refused_naming_the_field() {
    let err = |shares: &[ChannelShare]| ChannelShares::parse(shares, 1_000, 100).unwrap_err();
    assert_eq!(err(&[share("", 1, 0, 0)]).field, "channel_shares[0].channel");
    assert_eq!(err(&[share("has space", 1, 0, 0)]).field, "channel_shares[0].channel");
    let dup = err(&[share("app", 1, 0, 0), share("app", 2, 0, 0)]);
    assert_eq!((dup.field.as_str(), dup.value.as_str()), ("channel_shares[1].channel", "\"app\""));
    assert_eq!(err(&[share("app", MAX_WEIGHT + 1, 0, 0)]).field, "channel_shares[0].weight");
    assert_eq!(err(&[share("app", 1, 1_001, 0)]).field, "channel_shares[0].cap_units");
    assert_eq!(err(&[share("app", 1, u64::MAX, 0)]).field, "channel_shares[0].cap_units");
    let below = err(&[share("app", 1, 10, 11)]);
    assert_eq!(below.field, "channel_shares[0].floor_units");
    assert!(below.reason.contains("cap_units 10"), "{below:?}");
    assert_eq!(err(&[share("app", 1, 0, u64::MAX)]).field, "channel_shares[0].floor_units");
    let floors = err(&[share("app", 1, 0, 500), share("web", 1, 0, 401)]);
    assert_eq!(floors.field, "channel_shares[1].floor_units", "the floors exceed total - reserve");
    let many: Vec<ChannelShare> = (0..=MAX_SHARES).map(|i| share(&format!("c{i}"), 1, 0, 0)).collect();
    assert_eq!(err(&many).field, "channel_shares");
    // At the bounds: accepted.
    let ok = ChannelShares::parse(&[share("web", MAX_WEIGHT, 1_000, 500), share("app", 0, 0, 400)], 1_000, 100);
    assert_eq!(ok.unwrap().iter().map(|s| s.channel.as_str()).collect::<Vec<_>>(), ["app", "web"], "by name");
}

#[test]
fn the_opening_allocation_follows_weights_floors_and_caps() {
    let p = plan(&[share("app", 50, 0, 0), share("web", 30, 0, 0), share("partner", 20, 150, 100)]);
    let all = ["app", "web", "partner", "other"];
    let each = |live: &[&str]| -> Vec<u64> {
        ["app", "web", "partner", "other"].iter().map(|c| p.opening_allocation(1_000, 100, live, c)).collect()
    };
    // 900 shared: the floor 100 first, 800 by weight (400/240/160), partner capped at 150.
    assert_eq!(each(&all), [400, 240, 150, 0], "a channel without a share starts from the reserve");
    assert!(each(&all).iter().sum::<u64>() <= 900, "never more than the total less the reserve");
    // The partner not selling yet: its floor and weight go to the others.
    assert_eq!(each(&["app", "web"]), [563, 337, 0, 0]);
    assert_eq!(each(&[]), [0, 0, 0, 0]);
    // Weight 0: only the floor.
    let p = plan(&[share("app", 1, 0, 0), share("web", 0, 0, 50)]);
    assert_eq!(p.opening_allocation(1_000, 100, &["app", "web"], "web"), 50);
    assert_eq!(p.opening_allocation(1_000, 100, &["app", "web"], "app"), 850);
    // The remainder goes one unit each to the first weighted channels by name.
    let p = plan(&[share("a", 1, 0, 0), share("b", 1, 0, 0), share("c", 1, 0, 0)]);
    let split: Vec<u64> =
        ["a", "b", "c"].iter().map(|c| p.opening_allocation(1_000, 99, &["a", "b", "c"], c)).collect();
    assert_eq!(split, [301, 300, 300]);
}

#[test]
fn a_borrow_never_takes_a_channel_past_its_cap() {
    let p = plan(&[share("partner", 1, 100, 0), share("app", 1, 0, 0)]);
    let mut item = ItemState::new(Quantity::parse("total", 1_000).unwrap(), 1, 1);
    let mut alloc = Allocation::default();
    let mut granted = 0;
    for ask in [60, 60, 60, 1] {
        let l = limits(&p, "partner", alloc.held(), [], NOW, 0);
        granted += borrow_planned(&mut item, &mut alloc, Quantity::parse("q", ask).unwrap(), RateShare::default(), l);
        assert!(alloc.held() <= 100, "held {}", alloc.held());
    }
    assert_eq!((granted, alloc.held(), item.available), (100, 100, 900), "trimmed, then 0 at the cap");
    assert!(at_cap(&p, "partner", 100) && !at_cap(&p, "app", u64::MAX));
    // A return makes room again.
    alloc.returned += 30;
    item.available += 30;
    let l = limits(&p, "partner", alloc.held(), [], NOW, 0);
    assert_eq!(borrow_planned(&mut item, &mut alloc, Quantity::parse("q", 500).unwrap(), RateShare::default(), l), 30);
}

#[test]
fn floors_are_kept_from_a_fast_channel_while_their_channel_sells() {
    let p = plan(&[share("fast", 1, 0, 0), share("slow", 1, 0, 200)]);
    let mut item = ItemState::new(Quantity::parse("total", 1_000).unwrap(), 1, 1);
    let mut fast = Allocation::default();
    let rates = RateShare { own_milli: 100_000, others_milli: 1_000 };
    let ask = |n| Quantity::parse("q", n).unwrap();
    // The slow channel holds 50 of its floor: 150 more are kept.
    let l = limits(&p, "fast", 0, [("slow", live(50)), ("fast", live(0))], NOW, 0);
    assert_eq!(l, Limits { room: u64::MAX, kept: 150, own_floor: 0 });
    assert_eq!(borrow_planned(&mut item, &mut fast, ask(10_000), rates, l), 841, "its rate share of 850");
    let mut more = 0;
    for _ in 0..20 {
        more += borrow_planned(&mut item, &mut fast, ask(10_000), rates, l);
    }
    assert_eq!(more, 9, "asking again takes the rest, never the floor");
    assert_eq!(item.available, 150);
    // The slow channel itself takes its floor.
    let mut slow = Allocation::default();
    let own = limits(&p, "slow", 50, [("fast", live(850))], NOW, 0);
    assert_eq!(borrow_planned(&mut item, &mut slow, ask(500), RateShare::default(), own), 150);

    // Released: lease lapsed, idle for FLOOR_IDLE_MS since its last report (or the
    // opening), or a channel that holds its floor already.
    let s = p.get("slow").unwrap();
    assert_eq!(floor_kept(s, &Peer { lease_live: false, ..live(0) }, NOW, 0), 0);
    let stale = Peer { reported_at_ms: NOW - FLOOR_IDLE_MS, ..live(0) };
    assert_eq!(floor_kept(s, &stale, NOW, 0), 0, "idle");
    assert_eq!(floor_kept(s, &stale, NOW, NOW - 10), 200, "the idle time counts from the opening");
    assert_eq!(floor_kept(s, &live(250), NOW, 0), 0);
    assert_eq!(limits(&ChannelShares::default(), "fast", 0, [("slow", live(0))], NOW, 0), Limits::NONE);
}

#[test]
fn rate_shares_apply_within_the_floors() {
    // 300 at the center, 100 kept for the slow channel's floor: the fast channel's short
    // Borrow gets its rate share of the other 200.
    let p = plan(&[share("fast", 1, 0, 0), share("slow", 1, 0, 100), share("mid", 1, 0, 0)]);
    let mut item = ItemState::new(Quantity::parse("total", 1_000).unwrap(), 1, 1);
    item.available = 300;
    let mut a = Allocation::default();
    let l = limits(&p, "fast", 0, [("slow", live(0))], NOW, 0);
    let rates = RateShare { own_milli: 3_000, others_milli: 1_000 };
    assert_eq!(borrow_planned(&mut item, &mut a, Quantity::parse("q", 1_000).unwrap(), rates, l), 150);
}

#[test]
fn floor_channels_short_of_units_share_what_is_left_instead_of_waiting_on_each_other() {
    // Units lost since the plan was made: 6 left, web lacks 6 of its floor, partner 6.
    let p = plan(&[share("web", 1, 0, 11), share("partner", 1, 37, 33), share("app", 1, 0, 0)]);
    let mut item = ItemState::new(Quantity::parse("total", 48).unwrap(), 1, 1);
    item.available = 6;
    let ask = |n| Quantity::parse("q", n).unwrap();
    let mut web = Allocation { granted: 5, ..Default::default() };
    let mut partner = Allocation { granted: 27, ..Default::default() };
    let app = limits(&p, "app", 0, [("web", live(5)), ("partner", live(27))], NOW, 0);
    assert_eq!(app.usable(item.available), 0, "a channel without a floor takes nothing kept for floors");
    let l = limits(&p, "web", web.held(), [("partner", live(partner.held())), ("app", live(0))], NOW, 0);
    assert_eq!(l, Limits { room: u64::MAX, kept: 6, own_floor: 6 });
    assert_eq!(borrow_planned(&mut item, &mut web, ask(10), RateShare::default(), l), 3, "half of what is left");
    let l = limits(&p, "partner", partner.held(), [("web", live(web.held())), ("app", live(0))], NOW, 0);
    assert_eq!(borrow_planned(&mut item, &mut partner, ask(10), RateShare::default(), l), 2, "3 by 6 of 9 lacking");
    let l = limits(&p, "web", web.held(), [("partner", live(partner.held())), ("app", live(0))], NOW, 0);
    assert_eq!(borrow_planned(&mut item, &mut web, ask(10), RateShare::default(), l), 1, "the last unit");
    assert_eq!(item.available, 0);
}
