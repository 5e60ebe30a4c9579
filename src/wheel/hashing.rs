//! A `Write` adapter that hashes and counts what passes through it, so each wheel entry's
//! RECORD line is computed while the entry is streamed into the archive, never by a second read.

use std::io::{self, Write};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

/// The digest and length of one stream of bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digested {
    pub sha256: [u8; 32],
    pub size: u64,
}

impl Digested {
    /// The form RECORD uses: `sha256=` + urlsafe base64 without `=` padding (PEP 376 / 427).
    pub fn record_hash(&self) -> String {
        format!("sha256={}", URL_SAFE_NO_PAD.encode(self.sha256))
    }

    /// Lower-case hex, the form flashgen's manifests use.
    pub fn hex(&self) -> String {
        hex(&self.sha256)
    }
}

/// Forwards every byte to `inner` and feeds the same bytes to SHA-256.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            size: 0,
        }
    }

    /// Ends the stream, giving back the inner writer and what was hashed.
    pub fn finish(self) -> (W, Digested) {
        let digest = Digested {
            sha256: self.hasher.finalize().into(),
            size: self.size,
        };
        (self.inner, digest)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Hash only what the inner writer accepted, so a short write is hashed once.
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// SHA-256 of a whole byte slice.
#[cfg(test)]
pub fn digest_bytes(bytes: &[u8]) -> Digested {
    let mut w = HashingWriter::new(io::sink());
    // Writing to a sink cannot fail.
    w.write_all(bytes).expect("io::sink never fails");
    w.finish().1
}

pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_input_matches_the_known_sha256() {
        let d = digest_bytes(b"");
        assert_eq!(
            d.hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            d.record_hash(),
            "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"
        );
        assert_eq!(d.size, 0);
    }

    #[test]
    fn forwards_bytes_and_counts_them() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        let (inner, d) = w.finish();
        assert_eq!(inner, b"hello world");
        assert_eq!(d, digest_bytes(b"hello world"));
        assert_eq!(d.size, 11);
        assert!(!d.record_hash()[7..].contains(['+', '/', '=']));
    }
}
