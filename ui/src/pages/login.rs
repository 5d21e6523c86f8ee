//! The login form, asked for when the dashboard listens beyond loopback.

use axum::Form;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;
use serde::Deserialize;

use crate::Dashboard;
use crate::layout::{csrf, page};

/// `GET /ui/login`.
pub(crate) async fn form(State(d): State<Dashboard>) -> Response {
    if !d.0.guard.needs_login() {
        return Redirect::to("/ui/").into_response();
    }
    login_page(&d, None, StatusCode::OK)
}

fn login_page(d: &Dashboard, error: Option<&str>, status: StatusCode) -> Response {
    let body = page(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(e) = error { p.error { (e) } }
            form.grid.card method="post" action="/ui/login" {
                (csrf(d))
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

/// `POST /ui/login`.
pub(crate) async fn submit(State(d): State<Dashboard>, Form(f): Form<LoginForm>) -> Response {
    match d.0.guard.login(&f.token) {
        Some(cookie) => ([(header::SET_COOKIE, cookie)], Redirect::to("/ui/")).into_response(),
        None => login_page(&d, Some("That is not the token."), StatusCode::UNAUTHORIZED),
    }
}
