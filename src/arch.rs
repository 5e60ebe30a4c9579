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
        Some((ma, mi)) => (digits(ma)?, digits(mi)?),
        None if body.len() >= 2 => {
            let (ma, mi) = body.split_at(body.len() - 1);
            (digits(ma)?, digits(mi)?)
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

/// A number written in ASCII digits only (`str::parse` also takes a leading `+`).
fn digits(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// A GPU's compute capability, as the driver reports it (`9.0` on Hopper).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Capability {
    pub major: u32,
    pub minor: u32,
}

impl Capability {
    /// `9.0` (the only spelling: this is a device, not an arch list).
    pub fn parse(text: &str, source: &str) -> Result<Capability> {
        let bad = || {
            UsageError::new(format!("{source}: `{text}` is not a compute capability"))
                .with_hint("write MAJOR.MINOR as the driver reports it, e.g. 9.0 or 8.6")
        };
        let (ma, mi) = text.trim().split_once('.').ok_or_else(bad)?;
        let (major, minor) = (digits(ma).ok_or_else(bad)?, digits(mi).ok_or_else(bad)?);
        if major == 0 || major > 99 || minor > 9 {
            return Err(bad().into());
        }
        Ok(Capability { major, minor })
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The capabilities one compiled target runs on: `min <= cc <= max` (no `max`: any newer GPU).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunsOn {
    pub target: String,
    pub min: [u32; 2],
    pub max: Option<[u32; 2]>,
}

impl Arch {
    /// CUDA's compatibility rules, per target this arch embeds: a cubin `sm_XY` runs on X.y with
    /// y >= Y (same major); an arch-specific `sm_XYa` (and its PTX) only on exactly X.Y; a family
    /// `sm_XYf` like a plain cubin; PTX `compute_XY` is JIT-compiled by the driver on any X.Y or
    /// newer.
    pub fn runs_on(&self) -> Vec<RunsOn> {
        let min = [self.major, self.minor];
        let exact = self.suffix == Some('a');
        let same_major = [self.major, 9];
        let mut out = Vec::new();
        for target in self.targets() {
            let ptx = target.starts_with("compute_");
            let max = match (exact, ptx) {
                (true, _) => Some(min),
                (false, true) => None,
                (false, false) => Some(same_major),
            };
            out.push(RunsOn { target, min, max });
        }
        out
    }

    /// Whether some target of this arch runs on a GPU of capability `cc`.
    pub fn runs_on_device(&self, cc: Capability) -> bool {
        let cc = [cc.major, cc.minor];
        self.runs_on()
            .iter()
            .any(|r| r.min <= cc && r.max.is_none_or(|max| cc <= max))
    }
}

/// What the JIT builds for a device: its own capability, arch-specific (`9.0a`) on Hopper,
/// whose wgmma/TMA instructions exist only in `sm_90a` code.
pub fn jit_arch_for(cc: Capability) -> Arch {
    Arch {
        major: cc.major,
        minor: cc.minor,
        suffix: (cc.major == 9 && cc.minor == 0).then_some('a'),
        ptx: false,
    }
}

/// The archs a JIT build for device `cc` uses: `--arch`, else `FLASHGEN_CUDA_ARCH_LIST`, else
/// [`jit_arch_for`]. An explicit list must run on the device: a kernel the device cannot load is
/// refused here rather than at launch.
pub fn resolve_for_device(cli: Option<&str>, cc: Capability) -> Result<(Vec<Arch>, String)> {
    let env = std::env::var("FLASHGEN_CUDA_ARCH_LIST")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (archs, from) = match (cli, env) {
        (Some(list), _) => (parse_list(list, "--arch")?, "--arch".to_string()),
        (None, Some(list)) => (
            parse_list(&list, "FLASHGEN_CUDA_ARCH_LIST")?,
            format!("FLASHGEN_CUDA_ARCH_LIST={list}"),
        ),
        (None, None) => (vec![jit_arch_for(cc)], format!("the device ({cc})")),
    };
    if !archs.iter().any(|a| a.runs_on_device(cc)) {
        return Err(UsageError::new(format!(
            "{from}: none of {} runs on a GPU of compute capability {cc}",
            archs
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" ")
        ))
        .with_hint(format!(
            "build for the device ({}), or unset FLASHGEN_CUDA_ARCH_LIST",
            jit_arch_for(cc)
        ))
        .into());
    }
    Ok((archs, from))
}

/// One architecture of an arch limit (`modules.<m>.archs`, a backend value's `archs`): a compile
/// target such as `9.0a`; `+PTX` is the build's choice (`--arch`), not the limit's.
pub fn parse_limit_item(item: &str) -> Result<Arch, String> {
    let arch = parse_one(item.trim()).ok_or_else(|| {
        format!("cannot read GPU architecture `{item}` (write e.g. \"9.0a\" or \"8.0\")")
    })?;
    if arch.ptx {
        return Err(format!(
            "`{item}`: a limit names compile targets such as 9.0a; +PTX is chosen by the build \
             (--arch, FLASHGEN_CUDA_ARCH_LIST)"
        ));
    }
    Ok(arch)
}

impl Arch {
    /// Whether `self` compiles the same target as `other` (`9.0a+PTX` and `9.0a` do; `9.0` and
    /// `9.0a` do not): how an arch of a build is matched against an arch limit.
    pub fn same_target(&self, other: &Arch) -> bool {
        (self.major, self.minor, self.suffix) == (other.major, other.minor, other.suffix)
    }
}

/// The archs of `requested` an instance limited to `limit` is built for (all of them without a
/// limit), in the requested order, each with its requested `+PTX`.
pub fn restrict(requested: &[Arch], limit: Option<&[Arch]>) -> Vec<Arch> {
    requested
        .iter()
        .filter(|a| limit.is_none_or(|l| l.iter().any(|b| b.same_target(a))))
        .cloned()
        .collect()
}

/// The common archs of two limits (`None`: every arch).
pub fn intersect(a: Option<&[Arch]>, b: Option<&[Arch]>) -> Option<Vec<Arch>> {
    match (a, b) {
        (None, None) => None,
        (Some(x), None) | (None, Some(x)) => Some(x.to_vec()),
        (Some(x), Some(y)) => Some(restrict(x, Some(y))),
    }
}

/// Whether an instance limited to `limit` can run on a GPU of capability `cc`: without a limit
/// it can (the JIT builds for the device); with one, when one of its archs runs there.
pub fn limit_runs_on_device(limit: Option<&[Arch]>, cc: Capability) -> bool {
    limit.is_none_or(|l| l.iter().any(|a| a.runs_on_device(cc)))
}

/// The archs a JIT build of an instance limited to `limit` uses on device `cc`, given the archs
/// `requested` for the device ([`resolve_for_device`]): those the limit allows, when one of them
/// runs on the device; else the limit's own archs that run there (a limit of `8.0` on an 8.6
/// device builds `8.0`); `None` when no arch of the limit runs on the device.
pub fn for_device_limited(
    requested: &[Arch],
    limit: Option<&[Arch]>,
    cc: Capability,
) -> Option<Vec<Arch>> {
    let allowed = restrict(requested, limit);
    if allowed.iter().any(|a| a.runs_on_device(cc)) {
        return Some(allowed);
    }
    let own: Vec<Arch> = limit?
        .iter()
        .filter(|a| a.runs_on_device(cc))
        .cloned()
        .collect();
    (!own.is_empty()).then_some(own)
}

/// An arch list as `--arch` spells it: `8.0 9.0a+PTX`.
pub fn spell(archs: &[Arch]) -> String {
    archs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The `runs_on` rows of a whole list, as the manifest records them for the loader.
pub fn runs_on_all(archs: &[Arch]) -> Vec<RunsOn> {
    archs.iter().flat_map(Arch::runs_on).collect()
}

/// Resolves the list by precedence; returns the archs and where they came from.
pub fn resolve(cli: Option<&str>, config: &[String]) -> Result<(Vec<Arch>, String)> {
    resolve_given(cli, config)?.ok_or_else(|| {
        UsageError::new("no GPU architectures given")
            .with_hint(
                "set `archs` in variants.json, FLASHGEN_CUDA_ARCH_LIST, or pass --arch \"9.0a\"",
            )
            .into()
    })
}

/// [`resolve`], with None when no list is given anywhere (a view such as `list-variants` then
/// shows no archs); a list that is given but cannot be read is an error all the same.
pub fn resolve_given(cli: Option<&str>, config: &[String]) -> Result<Option<(Vec<Arch>, String)>> {
    if let Some(list) = cli {
        return Ok(Some((parse_list(list, "--arch")?, "--arch".into())));
    }
    for var in ["FLASHGEN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"] {
        if let Ok(list) = std::env::var(var) {
            if !list.trim().is_empty() {
                return Ok(Some((parse_list(&list, var)?, var.into())));
            }
        }
    }
    if config.is_empty() {
        return Ok(None);
    }
    Ok(Some((
        parse_list(&config.join(" "), "variants.json archs")?,
        "variants.json".into(),
    )))
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
    fn compatibility_follows_cuda() {
        let cc = |s: &str| Capability::parse(s, "t").unwrap();
        let a = |s: &str| parse_list(s, "t").unwrap().remove(0);
        assert!(a("9.0a").runs_on_device(cc("9.0")));
        assert!(!a("9.0a").runs_on_device(cc("10.0")));
        assert!(a("8.0").runs_on_device(cc("8.6")));
        assert!(!a("8.0").runs_on_device(cc("9.0")));
        assert!(a("8.0+PTX").runs_on_device(cc("9.0")));
        assert!(!a("8.6").runs_on_device(cc("8.0")));
        assert!(!a("9.0a+PTX").runs_on_device(cc("10.0")));
        assert_eq!(jit_arch_for(cc("9.0")).to_string(), "9.0a");
        assert_eq!(jit_arch_for(cc("8.6")).to_string(), "8.6");
        for bad in ["9", "9.10", "x.0", "", "0.0", "9é.0"] {
            assert!(Capability::parse(bad, "t").is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_match_targets_and_keep_the_builds_ptx() {
        let l = |s: &str| parse_list(s, "t").unwrap();
        let cc = |s: &str| Capability::parse(s, "t").unwrap();
        let sm90 = vec![parse_limit_item("9.0a").unwrap()];
        assert_eq!(
            spell(&restrict(&l("8.0 9.0a+PTX"), Some(&sm90))),
            "9.0a+PTX"
        );
        assert!(
            restrict(&l("8.0 9.0"), Some(&sm90)).is_empty(),
            "9.0 is not 9.0a"
        );
        assert_eq!(spell(&restrict(&l("8.0 9.0a"), None)), "8.0 9.0a");
        assert!(parse_limit_item("9.0a+PTX").is_err() && parse_limit_item("x").is_err());
        assert!(limit_runs_on_device(Some(&sm90), cc("9.0")));
        assert!(!limit_runs_on_device(Some(&sm90), cc("8.0")));
        assert!(limit_runs_on_device(None, cc("12.0")));
        // The JIT: the device's own arch when the limit allows it, else the limit's that runs.
        let sm80 = vec![parse_limit_item("8.0").unwrap()];
        assert_eq!(
            spell(&for_device_limited(&l("9.0a"), Some(&sm90), cc("9.0")).unwrap()),
            "9.0a"
        );
        assert_eq!(
            spell(&for_device_limited(&l("8.6"), Some(&sm80), cc("8.6")).unwrap()),
            "8.0"
        );
        assert_eq!(for_device_limited(&l("8.0"), Some(&sm90), cc("8.0")), None);
        assert_eq!(
            intersect(Some(&sm80), Some(&sm90)),
            Some(Vec::new()),
            "disjoint limits leave nothing"
        );
    }

    #[test]
    fn ptx_suffix_adds_ptx() {
        let a = parse_list("9.0+PTX", "t").unwrap();
        assert_eq!(a[0].targets(), vec!["sm_90", "compute_90"]);
        assert!(parse_list("banana", "t").is_err());
    }
}
