//! The `.dist-info/RECORD` file: one CSV line `path,sha256=<urlsafe-b64, no padding>,size` per
//! entry, and RECORD's own line `path,,` last, since a file cannot hold its own hash.

use crate::wheel::hashing::Digested;

#[derive(Debug, Default)]
pub struct Record {
    lines: Vec<(String, Digested)>,
}

impl Record {
    pub fn push(&mut self, path: &str, digest: Digested) {
        self.lines.push((path.to_string(), digest));
    }

    /// The RECORD text, entries in the order they were written, then `record_path,,`.
    pub fn render(&self, record_path: &str) -> String {
        let mut out = String::new();
        for (path, digest) in &self.lines {
            out.push_str(&csv_field(path));
            out.push(',');
            out.push_str(&digest.record_hash());
            out.push(',');
            out.push_str(&digest.size.to_string());
            out.push('\n');
        }
        out.push_str(&csv_field(record_path));
        out.push_str(",,\n");
        out
    }
}

/// Quotes a field the way Python's `csv` module reads it back; plain paths pass unchanged.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wheel::hashing::digest_bytes;

    #[test]
    fn renders_hash_size_and_its_own_empty_line_last() {
        let mut r = Record::default();
        r.push("pkg/__init__.py", digest_bytes(b""));
        r.push("pkg/a,b.txt", digest_bytes(b"x"));
        let text = r.render("pkg-1.0.dist-info/RECORD");
        assert_eq!(
            text,
            "pkg/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n\
             \"pkg/a,b.txt\",sha256=LXEWQrcmsEQBYnyp-6wy9chTD7GQPMTbAiWHF5IaSIE,1\n\
             pkg-1.0.dist-info/RECORD,,\n"
        );
    }
}
