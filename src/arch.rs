//! GPU architecture lists as PyTorch users write them, turned into nvcc `-gencode` flags.
//!
//! Accepts `"8.0 9.0a"`, `"80;90a"`, `"sm_90a"`, and a `+PTX` suffix that also embeds PTX for
//! newer GPUs. Precedence: `--arch`, `FLASHGEN_CUDA_ARCH_LIST`, `TORCH_CUDA_ARCH_LIST`, then
//! `variants.json`.

use std::fmt;

use anyhow::Result;

use crate::error::UsageError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
    /// `a` (arch-specific, e.g. wgmma on sm_90a) or `f` (family), if any.
    pub suffix: Option<char>,
    /// Also embed PTX so newer GPUs can JIT it.
    pub ptx: bool,
}

impl Arch {
    fn digits(&self) -> String {
        let s = self.suffix.map(String::from).unwrap_or_default();
        format!("{}{}{s}", self.major, self.minor)
    }

    pub fn gencode(&self) -> Vec<String> {
        let d = self.digits();
        let mut flags = vec![format!("-gencode=arch=compute_{d},code=sm_{d}")];
        if self.ptx {
            flags.push(format!("-gencode=arch=compute_{d},code=compute_{d}"));
        }
        flags
    }

    /// What the binary holds, as the manifest lists it: `sm_90a`, plus `compute_90a` for PTX.
    pub fn targets(&self) -> Vec<String> {
        let d = self.digits();
        let mut t = vec![format!("sm_{d}")];
        if self.ptx {
            t.push(format!("compute_{d}"));
        }
        t
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.suffix.map(String::from).unwrap_or_default();
        write!(
            f,
            "{}.{}{s}{}",
            self.major,
            self.minor,
            if self.ptx { "+PTX" } else { "" }
        )
    }
}

/// Parses one list; `source` names where it came from, for the error message.
pub fn parse_list(list: &str, source: &str) -> Result<Vec<Arch>> {
    let mut out: Vec<Arch> = Vec::new();
    for item in list
        .split(|c: char| c == ';' || c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
    {
        let arch = parse_one(item).ok_or_else(|| {
            UsageError::new(format!("{source}: cannot read GPU architecture `{item}`"))
                .with_hint("write e.g. \"8.0 9.0a\", \"80;90a\" or \"9.0+PTX\"")
        })?;
        if !out.contains(&arch) {
            out.push(arch);
        }
    }
    if out.is_empty() {
        return Err(UsageError::new(format!("{source}: the architecture list is empty")).into());
    }
    Ok(out)
}

fn parse_one(item: &str) -> Option<Arch> {
    // Every spelling is ASCII; refusing anything else up front keeps the byte slicing below on
    // character boundaries (`9é` would otherwise split inside `é` and panic).
    if !item.is_ascii() {
        return None;
    }
    let (body, ptx) = match item.len().checked_sub(4).map(|i| item.split_at(i)) {
        Some((b, tail)) if tail.eq_ignore_ascii_case("+ptx") => (b, true),
        _ => (item, false),
    };
    let body = body
        .strip_prefix("sm_")
        .or_else(|| body.strip_prefix("compute_"))
        .unwrap_or(body);
    let (body, suffix) = match body.chars().last()? {
        c @ ('a' | 'f') => (&body[..body.len() - 1], Some(c)),
        _ => (body, None),
    };
    let (major, minor) = match body.split_once('.') {
        Some((ma, mi)) => (ma.parse().ok()?, mi.parse().ok()?),
        None if body.len() >= 2 => {
            let (ma, mi) = body.split_at(body.len() - 1);
            (ma.parse().ok()?, mi.parse().ok()?)
        }
        None => return None,
    };
    (major >= 3 && minor < 10).then_some(Arch {
        major,
        minor,
        suffix,
        ptx,
    })
}

/// Resolves the list by precedence; returns the archs and where they came from.
pub fn resolve(cli: Option<&str>, config: &[String]) -> Result<(Vec<Arch>, String)> {
    if let Some(list) = cli {
        return Ok((parse_list(list, "--arch")?, "--arch".into()));
    }
    for var in ["FLASHGEN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"] {
        if let Ok(list) = std::env::var(var) {
            if !list.trim().is_empty() {
                return Ok((parse_list(&list, var)?, var.into()));
            }
        }
    }
    if config.is_empty() {
        return Err(UsageError::new("no GPU architectures given")
            .with_hint(
                "set `archs` in variants.json, FLASHGEN_CUDA_ARCH_LIST, or pass --arch \"9.0a\"",
            )
            .into());
    }
    Ok((
        parse_list(&config.join(" "), "variants.json archs")?,
        "variants.json".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_agree() {
        let a = parse_list("8.0 9.0a", "t").unwrap();
        let b = parse_list("80;90a", "t").unwrap();
        assert_eq!(a, b);
        assert_eq!(
            a[1].gencode(),
            vec!["-gencode=arch=compute_90a,code=sm_90a"]
        );
    }

    #[test]
    fn ptx_suffix_adds_ptx() {
        let a = parse_list("9.0+PTX", "t").unwrap();
        assert_eq!(a[0].targets(), vec!["sm_90", "compute_90"]);
        assert!(parse_list("banana", "t").is_err());
    }
}
