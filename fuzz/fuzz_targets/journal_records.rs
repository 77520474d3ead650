//! A journal segment's bytes, as recovery reads them after a crash or from a damaged disk.
//! Reading must answer the records it could check, where they end, or a refusal, never
//! panic, and what it reports as valid must lie within the bytes given.
//!
//! An input starting with an even byte is read as it is. One starting with an odd byte is a
//! list of frame payloads (each a little-endian `u16` length and its bytes), framed here
//! behind a valid segment header with their true lengths and checksums, so the fuzzer
//! reaches the record decoder rather than stopping at the checksums.

#![no_main]

use libfuzzer_sys::fuzz_target;
use store::embedded::journal::{read_records, segment_header};

/// A segment of `payloads`, each framed with its length and CRC32C.
fn framed(mut input: &[u8]) -> Vec<u8> {
    let mut segment = segment_header().to_vec();
    while input.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([input[0], input[1]])).min(input.len() - 2);
        let payload = &input[2..2 + len];
        segment.extend_from_slice(&(len as u32).to_le_bytes());
        segment.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
        segment.extend_from_slice(payload);
        input = &input[2 + len..];
    }
    segment
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        framed(rest)
    };
    let mut records = 0usize;
    let read = read_records(&mut &bytes[..], bytes.len() as u64, 0, |_record| {
        records += 1;
        true
    });
    match read {
        Ok(Some(valid_len)) => {
            assert!(
                valid_len <= bytes.len() as u64,
                "valid {valid_len} of {}",
                bytes.len()
            );
        }
        Ok(None) => assert_eq!(records, 0, "records from a segment without a header"),
        Err(_) => {}
    }
});
