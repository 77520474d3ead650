//! Timestamps: the admin plane and events speak RFC 3339, the runtime epoch milliseconds.

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Epoch milliseconds as an RFC 3339 UTC timestamp with millisecond precision.
pub fn format_rfc3339(ms: i64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    let t = OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let t = t
        .replace_nanosecond((ms.rem_euclid(1000) as u32) * 1_000_000)
        .unwrap_or(t);
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Parses an RFC 3339 timestamp into epoch milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let ms = 1_767_225_600_123;
        let s = format_rfc3339(ms);
        assert_eq!(s, "2026-01-01T00:00:00.123Z");
        assert_eq!(parse_rfc3339(&s), Some(ms));
        assert_eq!(
            parse_rfc3339("2026-01-01T01:00:00+01:00"),
            Some(1_767_225_600_000)
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
