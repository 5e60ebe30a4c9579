//! The release: what `build-wheel --release` precompiles (every instance of the matrix) and for
//! which architectures, and the size every wheel must fit (`variants.json`'s `release`).
//!
//! The budget is PyPI's default limit on one file, 100 MiB, unless variants.json says otherwise;
//! `build-wheel` measures each wheel it writes against it and refuses one that is over, naming
//! what takes the room, so adding an architecture or an axis value to the release is one line of
//! variants.json and one build that says whether it still fits.

use anyhow::Result;
use serde::Deserialize;

use crate::arch;
use crate::error::UsageError;

/// PyPI's default limit on one uploaded file, in MiB.
pub const DEFAULT_WHEEL_BUDGET_MIB: u64 = 100;

/// The largest budget variants.json may declare (PyPI's largest per-file limit is 1 GiB).
const MAX_WHEEL_BUDGET_MIB: u64 = 1024;

/// variants.json's `release` object as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseDecl {
    /// The architectures a release precompiles, as `archs` is written; absent: `archs`.
    #[serde(default)]
    pub archs: Option<Vec<String>>,
    /// The most one wheel may weigh, in MiB; absent: [`DEFAULT_WHEEL_BUDGET_MIB`].
    #[serde(default)]
    pub max_wheel_mib: Option<serde_json::Value>,
}

/// The release, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The architecture list of a release build, spelled as variants.json wrote it.
    pub archs: Vec<String>,
    /// The most one wheel may weigh, in bytes.
    pub max_wheel_bytes: u64,
}

impl Release {
    /// Checks `decl` (from `file`); `default_archs` is variants.json's `archs`.
    pub fn from_decl(decl: &ReleaseDecl, default_archs: &[String], file: &str) -> Result<Release> {
        let archs = match &decl.archs {
            Some(list) => {
                let joined = list.join(" ");
                if list.is_empty() {
                    return Err(UsageError::new(format!(
                        "{file}: release.archs: the list is empty"
                    ))
                    .with_hint("name the architectures a release precompiles, e.g. [\"8.0+PTX\", \"9.0a\", \"10.0\", \"12.0\"], or leave release.archs out to use `archs`")
                    .into());
                }
                arch::parse_list(&joined, &format!("{file}: release.archs"))?;
                list.clone()
            }
            None => default_archs.to_vec(),
        };
        let mib = match &decl.max_wheel_mib {
            None => DEFAULT_WHEEL_BUDGET_MIB,
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_WHEEL_BUDGET_MIB).contains(n))
                .ok_or_else(|| {
                    UsageError::new(format!(
                        "{file}: release.max_wheel_mib: {v} is not a whole number of MiB from 1 to {MAX_WHEEL_BUDGET_MIB}"
                    ))
                    .with_hint(format!(
                        "write the most one wheel may weigh, e.g. {DEFAULT_WHEEL_BUDGET_MIB} (PyPI's default limit)"
                    ))
                })?,
        };
        Ok(Release {
            archs,
            max_wheel_bytes: mib << 20,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(json: &str) -> ReleaseDecl {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_are_the_matrix_archs_and_pypis_limit() {
        let r = Release::from_decl(&decl("{}"), &["8.0".into()], "v.json").unwrap();
        assert_eq!(r.archs, ["8.0"]);
        assert_eq!(r.max_wheel_bytes, 100 << 20);
    }

    #[test]
    fn declared_archs_and_budget_are_checked() {
        let r = Release::from_decl(
            &decl(r#"{"archs": ["8.0+PTX", "9.0a", "10.0", "12.0"], "max_wheel_mib": 3}"#),
            &[],
            "v.json",
        )
        .unwrap();
        assert_eq!(r.archs.len(), 4);
        assert_eq!(r.max_wheel_bytes, 3 << 20);
        for (json, says) in [
            (r#"{"archs": []}"#, "release.archs: the list is empty"),
            (r#"{"archs": ["9.9z"]}"#, "release.archs"),
            (r#"{"max_wheel_mib": 0}"#, "release.max_wheel_mib: 0 is not"),
            (
                r#"{"max_wheel_mib": 2.5}"#,
                "release.max_wheel_mib: 2.5 is not",
            ),
            (r#"{"max_wheel_mib": "big"}"#, "release.max_wheel_mib"),
        ] {
            let e = Release::from_decl(&decl(json), &[], "v.json").unwrap_err();
            assert!(format!("{e:#}").contains(says), "{json}: {e:#}");
        }
        assert!(serde_json::from_str::<ReleaseDecl>(r#"{"arch": []}"#).is_err());
    }
}
