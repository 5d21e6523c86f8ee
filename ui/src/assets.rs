//! The dashboard's static files, embedded in the binary and served under a name that
//! carries a hash of their content, so a browser may cache them for good.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

/// One embedded file.
pub(crate) struct Asset {
    /// Its path under `/ui/assets/`, with the content hash.
    pub(crate) path: String,
    content_type: &'static str,
    bytes: &'static [u8],
}

fn asset(stem: &str, ext: &str, content_type: &'static str, bytes: &'static [u8]) -> Asset {
    let hash = hex::encode(&Sha256::digest(bytes)[..6]);
    Asset {
        path: format!("/ui/assets/{stem}-{hash}.{ext}"),
        content_type,
        bytes,
    }
}

/// htmx 2.0.11 (0BSD, `assets/htmx.LICENSE`), vendored from the npm package `htmx.org`.
pub(crate) static HTMX: LazyLock<Asset> = LazyLock::new(|| {
    asset(
        "htmx",
        "min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/htmx.min.js"),
    )
});
/// Live updates and copy buttons.
pub(crate) static SCRIPT: LazyLock<Asset> = LazyLock::new(|| {
    asset(
        "pulse",
        "js",
        "text/javascript; charset=utf-8",
        include_bytes!("../assets/pulse.js"),
    )
});
/// The one style sheet.
pub(crate) static STYLE: LazyLock<Asset> = LazyLock::new(|| {
    asset(
        "pulse",
        "css",
        "text/css; charset=utf-8",
        include_bytes!("../assets/pulse.css"),
    )
});

/// `GET /ui/assets/{file}`.
pub(crate) async fn serve(Path(file): Path<String>) -> Response {
    let wanted = format!("/ui/assets/{file}");
    for a in [&*HTMX, &*SCRIPT, &*STYLE] {
        if a.path == wanted {
            return (
                [
                    (header::CONTENT_TYPE, a.content_type),
                    (header::CACHE_CONTROL, "public, max-age=31536000, immutable"),
                ],
                a.bytes,
            )
                .into_response();
        }
    }
    (StatusCode::NOT_FOUND, "no such file").into_response()
}
