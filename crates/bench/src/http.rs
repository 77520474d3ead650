//! One HTTP/1.1 keep-alive connection per simulated client, on hyper's low-level client. The
//! same code sends the floor request and every case, so the ratios between them are fair.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Where the server is: a resolved socket address, the Host header and a path prefix.
#[derive(Clone, Debug)]
pub struct Target {
    pub url: String,
    pub addr: SocketAddr,
    authority: String,
    prefix: String,
}

impl Target {
    /// Resolves `http://host:port[/prefix]` once, so no request pays for a lookup.
    pub async fn resolve(url: &str) -> anyhow::Result<Target> {
        let uri: hyper::Uri = url.parse().with_context(|| format!("invalid URL {url}"))?;
        if uri.scheme_str() != Some("http") {
            bail!("{url}: only http:// URLs are supported (the suite measures plain HTTP/1.1)");
        }
        let authority = uri.authority().context("the URL has no host")?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = tokio::net::lookup_host((authority.host(), port))
            .await
            .with_context(|| format!("cannot resolve {}", authority.host()))?
            .next()
            .with_context(|| format!("{} resolves to no address", authority.host()))?;
        Ok(Target {
            url: url.trim_end_matches('/').to_string(),
            addr,
            authority: authority.to_string(),
            prefix: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

/// A response: status and the whole body.
pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Reply {
    /// The reply if its status is `expected`, else an error quoting the body.
    pub fn expect(self, expected: u16) -> anyhow::Result<Reply> {
        if self.status != expected {
            let body = String::from_utf8_lossy(&self.body);
            let cut: String = body.chars().take(300).collect();
            bail!("HTTP {} (expected {expected}): {cut}", self.status);
        }
        Ok(self)
    }
}

/// One keep-alive connection with fixed credentials. A transport error drops the
/// connection; the next request opens a new one.
pub struct Conn {
    target: Target,
    auth: Option<(&'static str, String)>,
    sender: Option<SendRequest<Full<Bytes>>>,
}

impl Conn {
    pub fn new(target: &Target, auth: Option<(&'static str, String)>) -> Conn {
        Conn {
            target: target.clone(),
            auth,
            sender: None,
        }
    }

    /// Opens the connection now (so that a measured loop does not pay for it).
    pub async fn connect(&mut self) -> anyhow::Result<()> {
        self.sender().await.map(|_| ())
    }

    async fn sender(&mut self) -> anyhow::Result<&mut SendRequest<Full<Bytes>>> {
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            self.sender = None;
            let tcp = TcpStream::connect(self.target.addr)
                .await
                .with_context(|| format!("cannot connect to {}", self.target.url))?;
            tcp.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(async move {
                let _ = connection.await;
            });
            self.sender = Some(sender);
        }
        self.sender
            .as_mut()
            .context("a connection was just opened (invariant)")
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<Reply> {
        self.send(Method::GET, path, None).await
    }

    pub async fn post(&mut self, path: &str, json: String) -> anyhow::Result<Reply> {
        self.send(Method::POST, path, Some(json)).await
    }

    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        json: Option<String>,
    ) -> anyhow::Result<Reply> {
        let mut builder = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.target.prefix))
            .header(HOST, &self.target.authority);
        if let Some((name, value)) = &self.auth {
            builder = builder.header(*name, value);
        }
        let body = match json {
            Some(json) => {
                builder = builder.header(CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(json))
            }
            None => Full::new(Bytes::new()),
        };
        let request = builder.body(body)?;
        let result = async {
            let sender = self.sender().await?;
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok(Reply { status, body })
        }
        .await;
        if result.is_err() {
            self.sender = None;
        }
        result
    }
}
