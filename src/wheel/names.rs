//! Names inside and of a wheel: the escaped distribution name and version used in the file
//! name and the `.dist-info`/`.data` folders, and the checks that keep archive paths portable.

use crate::wheel::error::WheelError;

/// Checks a project name against the core metadata rule (ASCII letters, digits, `-_.`,
/// starting and ending with a letter or digit).
pub fn validate_project_name(name: &str) -> Result<(), WheelError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(WheelError::InvalidName(name.to_string()))
    }
}

/// The distribution name as it appears in a wheel's file name and folders: lower case, every
/// run of `-`, `_` and `.` replaced by one `_` (binary distribution format, "Escaping").
pub fn escape_distribution_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_run = false;
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !in_run {
                out.push('_');
            }
            in_run = true;
        } else {
            out.push(c.to_ascii_lowercase());
            in_run = false;
        }
    }
    out
}

/// The version as it appears in file names. flashgen's versions are already PEP 440 normal
/// forms; anything that could break the `-`-separated file name is refused rather than guessed.
pub fn escape_version(version: &str) -> Result<String, WheelError> {
    let ok = !version.is_empty()
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'!' | b'_'));
    if ok {
        Ok(version.to_string())
    } else {
        Err(WheelError::InvalidVersion(version.to_string()))
    }
}

/// Checks one tag component (`py3`, `none`, `manylinux_2_17_x86_64`, or a `.`-joined set).
pub fn validate_tag_part(part: &str) -> Result<(), WheelError> {
    let ok = !part.is_empty()
        && part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.'))
        && !part.starts_with('.')
        && !part.ends_with('.')
        && !part.contains("..");
    if ok {
        Ok(())
    } else {
        Err(WheelError::InvalidTag(part.to_string()))
    }
}

/// Refuses archive paths that an installer would reject or that would escape the install root:
/// absolute paths, `..` and `.` components, empty components, backslashes and folder entries.
pub fn validate_archive_path(path: &str) -> Result<(), WheelError> {
    let reason = if path.is_empty() {
        Some("it is empty")
    } else if path.starts_with('/') {
        Some("it is absolute")
    } else if path.ends_with('/') {
        Some("it names a folder; add files, folders follow from them")
    } else if path.contains('\\') {
        Some("it contains a backslash; use `/`")
    } else if path.contains(['\n', '\r', '\0']) {
        Some("it contains a line break or NUL")
    } else if path
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        Some("it has an empty, `.` or `..` component")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(WheelError::InvalidPath {
            path: path.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_runs_of_separators_and_lowercases() {
        assert_eq!(escape_distribution_name("flashgen"), "flashgen");
        assert_eq!(escape_distribution_name("Flash-Gen"), "flash_gen");
        assert_eq!(escape_distribution_name("flash.-_gen"), "flash_gen");
        assert_eq!(escape_distribution_name("a__b..c--d"), "a_b_c_d");
        assert_eq!(escape_distribution_name("FlashGen_CU13"), "flashgen_cu13");
    }

    #[test]
    fn project_names_follow_the_core_metadata_rule() {
        for good in ["flashgen", "Flash-Gen", "a", "a.b_c-d9"] {
            validate_project_name(good).unwrap();
        }
        for bad in ["", "-a", "a-", "a b", "é", "a/b"] {
            assert!(validate_project_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn versions_that_would_break_the_file_name_are_refused() {
        assert_eq!(escape_version("0.1.0").unwrap(), "0.1.0");
        assert_eq!(escape_version("1.0.dev3+cu13").unwrap(), "1.0.dev3+cu13");
        assert!(escape_version("1.0-1").is_err());
        assert!(escape_version("").is_err());
    }

    #[test]
    fn archive_paths_stay_inside_the_install_root() {
        validate_archive_path("flashgen/__init__.py").unwrap();
        validate_archive_path("flashgen/_lib/x.so").unwrap();
        for bad in [
            "",
            "/etc/passwd",
            "a/../b",
            "./a",
            "a//b",
            "a/",
            "a\\b",
            "a\nb",
        ] {
            assert!(validate_archive_path(bad).is_err(), "{bad:?} accepted");
        }
    }
}
