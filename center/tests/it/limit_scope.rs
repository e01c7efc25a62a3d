//! An item's limit scope and registry fallback, against PostgreSQL and SQLite: stored,
//! shown by GetItem and ListItems, delivered to agents by DescribeItem, part of the
//! item's definition, and validated.

use inventory_proto::v1 as pb;
use tonic::Code;

use crate::contract::{assert_status, register};
use crate::support::TestCenter;

crate::for_each_backend!(limit_scope_is_stored_shown_and_validated,);

async fn limit_scope_is_stored_shown_and_validated(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let create = |item: &str, scope: i32, fallback: i32| pb::CreateItemRequest {
        item_id: item.into(),
        total: 100,
        per_user_limit: 2,
        limit_scope: scope,
        registry_fallback: fallback,
        ..Default::default()
    };
    let global = i32::from(pb::LimitScope::Global);
    let to_channel = i32::from(pb::RegistryFallback::Channel);
    let plain = admin.create_item(create("plain", 0, 0)).await.unwrap().into_inner().item.unwrap();
    assert_eq!(
        (plain.limit_scope(), plain.registry_fallback()),
        (pb::LimitScope::Channel, pb::RegistryFallback::Refuse)
    );
    let g = admin.create_item(create("g", global, to_channel)).await.unwrap().into_inner();
    assert!(g.created);
    let g = g.item.unwrap();
    assert_eq!((g.limit_scope(), g.registry_fallback()), (pb::LimitScope::Global, pb::RegistryFallback::Channel));

    // Read back from the ledger, not echoed from the request.
    let got = admin.get_item(pb::GetItemRequest { item_id: "g".into() }).await.unwrap().into_inner();
    assert_eq!(got.item.unwrap().limit_scope(), pb::LimitScope::Global);
    let list = admin.list_items(pb::ListItemsRequest::default()).await.unwrap().into_inner();
    let scopes: Vec<_> = list.items.iter().map(|i| (i.item_id.as_str(), i.limit_scope())).collect();
    assert_eq!(scopes, [("g", pb::LimitScope::Global), ("plain", pb::LimitScope::Channel)]);

    // Agents learn it the way they learn the limit itself.
    register(&mut center, "app").await;
    let describe = |item: &str| pb::DescribeItemRequest { item_id: item.into(), channel: "app".into() };
    let d = center.describe_item(describe("g")).await.unwrap().into_inner();
    assert_eq!(
        (d.per_user_limit, d.limit_scope(), d.registry_fallback()),
        (2, pb::LimitScope::Global, pb::RegistryFallback::Channel)
    );
    let d = center.describe_item(describe("plain")).await.unwrap().into_inner();
    assert_eq!(d.limit_scope(), pb::LimitScope::Channel);

    // Part of the definition: the same is a replay, another scope is ALREADY_EXISTS.
    let again = admin.create_item(create("g", global, to_channel)).await.unwrap().into_inner();
    assert!(!again.created);
    assert_status(admin.create_item(create("g", 0, 0)).await, Code::AlreadyExists, "limit_scope global");
    assert_status(admin.create_item(create("g", global, 0)).await, Code::AlreadyExists, "registry_fallback channel");

    // Unknown numbers and a fallback without a global limit name their field.
    assert_status(admin.create_item(create("x", 7, 0)).await, Code::InvalidArgument, "limit_scope 7");
    assert_status(admin.create_item(create("x", global, 9)).await, Code::InvalidArgument, "registry_fallback 9");
    assert_status(
        admin.create_item(create("x", 0, to_channel)).await,
        Code::InvalidArgument,
        "registry_fallback 1: applies to LIMIT_SCOPE_GLOBAL items only",
    );
}
