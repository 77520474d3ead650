//! A snapshot file's bytes, as recovery reads them: a snapshot is whole and decodes, or is
//! refused (`None`), never a panic. A snapshot that decodes rebuilds a state, and the state
//! is checked, without panics.
//!
//! An input starting with an even byte is read as it is. One starting with an odd byte is
//! `version` (a byte, taken modulo 7: formats 0 to 6) and a payload, given a valid header
//! with its true length and checksum here, so the fuzzer reaches the payload decoder of
//! each format.

#![no_main]

use ledger::State;
use libfuzzer_sys::fuzz_target;
use store::embedded::snapshot::parse_snapshot;

/// A snapshot file of format `version` holding `payload`.
fn framed(version: u8, payload: &[u8]) -> Vec<u8> {
    let mut file = b"CYCS".to_vec();
    file.extend_from_slice(&u32::from(version % 7).to_le_bytes());
    file.extend_from_slice(&7u64.to_le_bytes());
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    file.extend_from_slice(payload);
    file
}

fuzz_target!(|data: &[u8]| {
    let bytes = match data {
        [mode, version, payload @ ..] if mode % 2 == 1 => framed(*version, payload),
        [_, rest @ ..] => rest.to_vec(),
        [] => return,
    };
    if let Some((_, snapshot)) = parse_snapshot(&bytes) {
        let state = State::from_snapshot(snapshot);
        let _ = state.verify();
    }
});
