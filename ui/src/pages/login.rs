//! The login form, asked for when the dashboard listens beyond loopback.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Extension, Form};
use maud::html;
use pulse_shared::http::ClientIp;
use serde::Deserialize;

use crate::Dashboard;
use crate::layout::page;
use crate::security::{Login, over_https};

/// `GET /ui/login`.
pub(crate) async fn form(State(d): State<Dashboard>) -> Response {
    if !d.0.guard.needs_login() {
        return Redirect::to("/ui/").into_response();
    }
    login_page(None, StatusCode::OK)
}

fn login_page(error: Option<&str>, status: StatusCode) -> Response {
    let body = page(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(e) = error { p.error { (e) } }
            form.grid.card method="post" action="/ui/login" {
                label for="token" { "Dashboard token" }
                input #token type="password" name="token" autocomplete="current-password" required;
                span {}
                button type="submit" { "Sign in" }
            }
            p.muted { "The token is PULSE_DASHBOARD_TOKEN of the process serving this page." }
        },
    );
    (status, body).into_response()
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

/// `POST /ui/login`: a session of its own when the token is right.
pub(crate) async fn submit(
    State(d): State<Dashboard>,
    client: Option<Extension<ClientIp>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    let address = client.map_or_else(|| "unknown".to_owned(), |Extension(ip)| ip.0);
    let now = d.0.clock.now();
    match d
        .0
        .guard
        .login(&f.token, &address, now, over_https(&headers))
    {
        Login::Opened(cookie) => {
            ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/")).into_response()
        }
        Login::Wrong => login_page(Some("That is not the token."), StatusCode::UNAUTHORIZED),
        Login::Wait(wait) => {
            let secs = wait.as_secs().max(1) as u64;
            let mut r = login_page(
                Some(&format!(
                    "Too many wrong tokens from here: try again in {} minutes.",
                    secs.div_ceil(60)
                )),
                StatusCode::TOO_MANY_REQUESTS,
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            r
        }
        Login::NotAsked => Redirect::to("/ui/").into_response(),
    }
}

/// `POST /ui/logout`: ends the session; the cookie is cleared.
pub(crate) async fn logout(State(d): State<Dashboard>, headers: HeaderMap) -> Response {
    let cookie = d.0.guard.logout(&headers);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/login")).into_response()
}
