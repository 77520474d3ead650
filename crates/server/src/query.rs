//! Query strings. Parameters a server does not implement are ignored (the spec's
//! additive-parameter rule); the ones it implements are validated.

use protocol::{ApiError, DEFAULT_PAGE_SIZE};

pub struct Query(Vec<(String, String)>);

impl Query {
    pub fn parse(raw: Option<&str>) -> Self {
        Query(
            form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    /// The first value of `name`; blank values count as absent.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// `limit`: 1..=max, default 50.
    pub fn limit(&self, max: usize) -> Result<usize, ApiError> {
        let Some(raw) = self.get("limit") else {
            return Ok(DEFAULT_PAGE_SIZE.min(max));
        };
        match raw.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(format!(
                "limit: must be an integer between 1 and {max}"
            ))),
        }
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(_) => Err(ApiError::invalid(format!("{name}: must be true or false"))),
        }
    }
}
