//! A small HTTP client for the admin CLI: it works against any running Cycles server.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::serve::ADMIN_KEY_FILE;

/// Which server to talk to, and as whom.
#[derive(Args, Clone)]
pub struct Target {
    /// The server's base URL.
    #[arg(long, env = "CYCLES_URL", default_value = "http://127.0.0.1:7878")]
    pub url: String,
    /// The admin key. Defaults to the one stored in the data directory.
    #[arg(long, env = "CYCLES_ADMIN_API_KEY", hide_env_values = true)]
    pub admin_key: Option<String>,
    /// Where to look for a stored admin key when none is given.
    #[arg(long, env = "CYCLES_DATA_DIR", default_value = crate::serve::DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// The body of a request that has none (`GET`, `DELETE`).
pub const NO_BODY: Option<&()> = None;

pub struct Client {
    http: reqwest::Client,
    base: String,
    admin_key: String,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    pub fn new(target: &Target) -> anyhow::Result<Self> {
        let admin_key = match &target.admin_key {
            Some(k) => k.clone(),
            None => {
                let path = target.data_dir.join(ADMIN_KEY_FILE);
                std::fs::read_to_string(&path)
                    .with_context(|| {
                        format!(
                            "no admin key given (--admin-key or CYCLES_ADMIN_API_KEY) and none stored in {}",
                            path.display()
                        )
                    })?
                    .trim()
                    .to_string()
            }
        };
        Ok(Client {
            http: reqwest::Client::new(),
            base: target.url.trim_end_matches('/').to_string(),
            admin_key,
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?,
        })
    }

    /// Sends a request with the admin key and `body` (a `protocol` request) as JSON; returns
    /// the status and the JSON body.
    pub fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<(u16, Value)> {
        self.runtime.block_on(async {
            let mut req = self
                .http
                .request(method, format!("{}{path}", self.base))
                .header("X-Admin-API-Key", &self.admin_key);
            if let Some(body) = body {
                req = req.json(body);
            }
            let resp = req
                .send()
                .await
                .with_context(|| format!("cannot reach {}", self.base))?;
            let status = resp.status().as_u16();
            let text = resp.text().await?;
            let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
            Ok((status, json))
        })
    }

    /// Like [`Client::send`], but a non-2xx answer is an error showing the server's message,
    /// and a 2xx body is read as `R` (a `protocol` response, or `Value` to show it whole).
    pub fn call<R: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> anyhow::Result<R> {
        let (status, json) = self.send(method, path, body)?;
        if !(200..300).contains(&status) {
            bail!("HTTP {status}: {}", serde_json::to_string_pretty(&json)?);
        }
        serde_json::from_value(json).context("the server's answer is not the expected shape")
    }
}

/// Percent-encodes a query value.
pub fn q(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
