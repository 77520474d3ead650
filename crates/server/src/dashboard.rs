//! The operator dashboard (`cycles serve --dashboard-dir`): a built single-page app served from
//! the API's own listener, so the official dashboard runs with nothing in front of the server.
//!
//! The build is served unmodified, byte for byte: its module scripts carry subresource
//! integrity hashes, and browsers refuse a module script without a JavaScript content type.
//! The app routes in the browser's history (`/tenants/acme`), so a `GET` of any path that is
//! neither a file nor the API's answers `index.html`, and the app renders the route itself.
//!
//! The dashboard is the router's fallback: every route of the API is matched before it, and
//! the paths under the API's prefixes that no route matches stay the API's 404.

use std::io;
use std::path::PathBuf;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tower_http::services::{ServeDir, ServeFile};

use crate::openapi::{OPENAPI_PATH, SWAGGER_UI_PATH};

/// The entry point of the build: the page every app route answers.
const INDEX: &str = "index.html";

/// Where the build keeps its content-hashed files (Vite's `[name]-[hash].js`).
const ASSETS_PREFIX: &str = "/assets/";

/// Paths that belong to the API, with everything under them: never the dashboard's.
const API_PREFIXES: [&str; 5] = [
    "/v1",
    "/actuator",
    "/metrics",
    OPENAPI_PATH,
    SWAGGER_UI_PATH,
];

/// A hashed file never changes under its name: a new build names it anew.
const CACHE_IMMUTABLE: HeaderValue =
    HeaderValue::from_static("public, max-age=31536000, immutable");
/// Everything else is revalidated on each use (a conditional GET, answered 304 when unchanged),
/// so a new build reaches browsers on their next load.
const CACHE_REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");

/// A dashboard build directory, checked when opened.
#[derive(Debug, Clone)]
pub struct Dashboard {
    /// `/assets/*`: the file or 404. A page of an older build asking for a chunk that is gone
    /// must fail visibly; `index.html` in its place would be refused as a script anyway.
    assets: ServeDir,
    /// Any other path: the file, else `index.html`. Directories are not listed or redirected
    /// (`/` is the app's root route, not a folder).
    pages: ServeDir<ServeFile>,
}

impl Dashboard {
    /// Opens the build in `dir`, which must be a directory holding `index.html`.
    pub fn open(dir: impl Into<PathBuf>) -> io::Result<Self> {
        let dir = dir.into();
        if !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("dashboard directory {} does not exist", dir.display()),
            ));
        }
        let index = dir.join(INDEX);
        if !index.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "dashboard directory {} has no {INDEX}: expected a dashboard build \
                     (the dist directory of cycles-dashboard)",
                    dir.display()
                ),
            ));
        }
        Ok(Dashboard {
            assets: ServeDir::new(&dir).append_index_html_on_directories(false),
            pages: ServeDir::new(&dir)
                .append_index_html_on_directories(false)
                .fallback(ServeFile::new(index)),
        })
    }
}

/// The router's fallback: a `GET` or `HEAD` outside the API is the dashboard's; anything else
/// is the API's unknown route (404, given its error body by the request middleware).
pub async fn serve(State(mut dashboard): State<Dashboard>, request: Request) -> Response {
    let path = request.uri().path();
    let is_read = matches!(*request.method(), Method::GET | Method::HEAD);
    if !is_read || is_api_path(path) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let hashed = path.starts_with(ASSETS_PREFIX);
    let served = if hashed {
        dashboard.assets.try_call(request).await
    } else {
        dashboard.pages.try_call(request).await
    };
    // A missing file is already an answer (404, or `index.html`); an error here is a file
    // that exists but cannot be read, which is the server's fault.
    let mut response = match served {
        Ok(response) => response,
        Err(error) => {
            tracing::error!(%error, "reading a dashboard file");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
    };
    let found = response.status().is_success() || response.status() == StatusCode::NOT_MODIFIED;
    let cache = if hashed && found {
        CACHE_IMMUTABLE
    } else {
        CACHE_REVALIDATE
    };
    response.headers_mut().insert(header::CACHE_CONTROL, cache);
    response.map(Body::new)
}

fn is_api_path(path: &str) -> bool {
    API_PREFIXES.iter().any(|prefix| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

#[cfg(test)]
mod tests {
    use super::is_api_path;

    #[test]
    fn the_api_prefixes_are_whole_segments() {
        for path in [
            "/v1",
            "/v1/",
            "/v1/nope",
            "/actuator/x",
            "/metrics",
            "/swagger-ui/x",
        ] {
            assert!(is_api_path(path), "{path}");
        }
        for path in [
            "/",
            "/v1x",
            "/tenants/acme",
            "/metricsboard",
            "/assets/x.js",
        ] {
            assert!(!is_api_path(path), "{path}");
        }
    }
}
