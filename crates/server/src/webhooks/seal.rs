//! Secrets at rest: a subscription's signing secret and custom header values are sealed
//! (ChaCha20-Poly1305) before they reach the ledger, so the journal, snapshots and backups
//! hold only ciphertext.
//!
//! The keys come from the operator (see `cycles serve --help`): the first seals, every one
//! opens, so a key is rotated by putting a new one first and keeping the old ones until
//! every secret sealed with them has been rotated too. A sealed value names its key by the
//! first bytes of the key's SHA-256.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

const PREFIX: &str = "v1";

pub struct Sealer {
    /// `(key id, cipher)`, the sealing key first.
    keys: Vec<([u8; 4], ChaCha20Poly1305)>,
}

impl Sealer {
    /// A sealer with `keys`, the first sealing; at least one key.
    pub fn new(keys: &[[u8; 32]]) -> Self {
        assert!(!keys.is_empty(), "a sealer needs a key");
        Sealer {
            keys: keys
                .iter()
                .map(|k| {
                    let digest = Sha256::digest(k);
                    let id = [digest[0], digest[1], digest[2], digest[3]];
                    (id, ChaCha20Poly1305::new(Key::from_slice(k)))
                })
                .collect(),
        }
    }

    pub fn seal(&self, plain: &str) -> String {
        let (id, cipher) = &self.keys[0];
        let mut nonce = [0u8; 12];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = cipher
            .encrypt(Nonce::from_slice(&nonce), plain.as_bytes())
            .expect("sealing an in-memory buffer cannot fail");
        format!(
            "{PREFIX}:{}:{}:{}",
            hex::encode(id),
            hex::encode(nonce),
            hex::encode(sealed)
        )
    }

    /// The plain text, if `sealed` was sealed by one of the keys and is intact.
    pub fn open(&self, sealed: &str) -> Option<String> {
        let mut parts = sealed.split(':');
        if parts.next()? != PREFIX {
            return None;
        }
        let id = hex::decode(parts.next()?).ok()?;
        let nonce = hex::decode(parts.next()?).ok()?;
        let body = hex::decode(parts.next()?).ok()?;
        if nonce.len() != 12 || parts.next().is_some() {
            return None;
        }
        let (_, cipher) = self.keys.iter().find(|(k, _)| k[..] == id[..])?;
        let plain = cipher.decrypt(Nonce::from_slice(&nonce), &body[..]).ok()?;
        String::from_utf8(plain).ok()
    }
}

/// A fresh random key.
pub fn new_key() -> [u8; 32] {
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_open_with_any_key_and_nothing_else() {
        let (old, new) = (new_key(), new_key());
        let before = Sealer::new(&[old]);
        let sealed_old = before.seal("whsec_old");
        assert!(!sealed_old.contains("whsec_old"));
        let rotated = Sealer::new(&[new, old]);
        assert_eq!(rotated.open(&sealed_old).as_deref(), Some("whsec_old"));
        let sealed_new = rotated.seal("whsec_new");
        assert_eq!(rotated.open(&sealed_new).as_deref(), Some("whsec_new"));
        assert_eq!(
            before.open(&sealed_new),
            None,
            "the old key alone cannot open it"
        );
        let mut tampered = sealed_new.clone();
        tampered.pop();
        tampered.push(if sealed_new.ends_with('0') { '1' } else { '0' });
        assert_eq!(rotated.open(&tampered), None);
        assert_eq!(rotated.open("plain"), None);
    }
}
