//! The operator token on the center's HTTP port. The console page and its feeds show what
//! `Admin.GetItem` and `ListChannels` guard (every item's stock, each channel's sales and
//! sell rate, agents, epochs and leases), so with operator tokens configured they need one
//! too: `authorization: Bearer <token>`, checked by [`Security::check_operator`] as the
//! Admin interceptor checks it (constant time, nothing logged). Without operator tokens
//! (`--insecure`, the quickstart) nothing is asked.
//!
//! A refused feed (`/api/...`) answers 401 with a JSON `{"error": ...}`; a refused page
//! (`/`) answers 401 with the console page itself, whose sign-in form takes the token,
//! keeps it in the tab's `sessionStorage` and sends it on every fetch. `/metrics` and
//! `/healthz` are not behind it (see [`crate::http::HttpRoutes`]).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use inventory_core::auth::bearer;

use crate::security::Security;

/// `console` (the console's routes) with every request checked for the operator token.
/// Only its routes: a path it does not serve is a 404 for anyone, token or not.
pub fn require_operator(console: Router, security: Arc<Security>) -> Router {
    console.route_layer(axum::middleware::from_fn_with_state(security, check))
}

async fn check(State(security): State<Arc<Security>>, request: Request, next: Next) -> Response {
    let presented = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    match security.check_operator(presented) {
        Ok(()) => next.run(request).await,
        Err(why) => refused(request.uri().path(), why),
    }
}

/// 401: the console page for a person, a JSON error for a script.
fn refused(path: &str, why: &str) -> Response {
    let mut response = if path.starts_with("/api/") {
        let body = serde_json::json!({ "error": why }).to_string();
        let headers = [
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ];
        (StatusCode::UNAUTHORIZED, headers, body).into_response()
    } else {
        crate::console::console_page(StatusCode::UNAUTHORIZED)
    };
    // A scheme browsers do not prompt for: the page's own form asks.
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(r#"Bearer realm="inventory-center""#));
    response
}
