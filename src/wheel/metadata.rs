//! What the wheel says about itself: the core metadata (`METADATA`, version 2.1) and the
//! `WHEEL` file with its compatibility tags, rendered as the email-header text installers parse.

use std::fmt;

use crate::wheel::error::WheelError;
use crate::wheel::names::validate_tag_part;

/// Core metadata of the distribution. Empty strings leave their optional field out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WheelMetadata {
    pub name: String,
    pub version: String,
    pub summary: String,
    /// A version specifier such as `>=3.9`.
    pub requires_python: String,
    /// The license, e.g. the SPDX identifier `Apache-2.0`.
    pub license: String,
    /// `(content type, text)`, e.g. `("text/markdown", README.md)`; becomes the METADATA body.
    pub readme: Option<(String, String)>,
    /// PEP 508 requirement strings, one `Requires-Dist` line each (an extra's carry its
    /// `; extra == "name"` marker).
    pub requires_dist: Vec<String>,
    /// The extras the requirements name, one `Provides-Extra` line each.
    pub provides_extra: Vec<String>,
}

/// The three compatibility tags of a wheel, e.g. `py3`, `none`, `manylinux_2_17_x86_64`.
/// Each part may be a `.`-joined set (`manylinux_2_17_x86_64.manylinux2014_x86_64`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WheelTag {
    pub python: String,
    pub abi: String,
    pub platform: String,
}

impl WheelTag {
    pub fn new(python: &str, abi: &str, platform: &str) -> Self {
        WheelTag {
            python: python.to_string(),
            abi: abi.to_string(),
            platform: platform.to_string(),
        }
    }

    pub fn validate(&self) -> Result<(), WheelError> {
        validate_tag_part(&self.python)?;
        validate_tag_part(&self.abi)?;
        validate_tag_part(&self.platform)
    }

    /// Every single tag a compressed tag set stands for, in the order written; `WHEEL` lists
    /// each on its own `Tag:` line.
    pub fn expand(&self) -> Vec<String> {
        let mut tags = Vec::new();
        for py in self.python.split('.') {
            for abi in self.abi.split('.') {
                for plat in self.platform.split('.') {
                    tags.push(format!("{py}-{abi}-{plat}"));
                }
            }
        }
        tags
    }
}

impl fmt::Display for WheelTag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.python, self.abi, self.platform)
    }
}

/// The `.dist-info/WHEEL` text. flashgen wheels hold native code, so never purelib.
pub fn wheel_file(tag: &WheelTag, generator: &str) -> String {
    let mut out = format!("Wheel-Version: 1.0\nGenerator: {generator}\nRoot-Is-Purelib: false\n");
    for t in tag.expand() {
        out.push_str("Tag: ");
        out.push_str(&t);
        out.push('\n');
    }
    out
}

/// The `.dist-info/METADATA` text. 2.1 is the oldest version that has every field used here
/// (`Description-Content-Type` is new in 2.1), so the widest range of installers reads it.
pub fn metadata_file(meta: &WheelMetadata) -> Result<String, WheelError> {
    let mut out = String::new();
    let mut field = |name: &'static str, value: &str| -> Result<(), WheelError> {
        if value.contains(['\n', '\r']) {
            return Err(WheelError::MultiLineField {
                field: name,
                value: value.to_string(),
            });
        }
        if !value.is_empty() {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push('\n');
        }
        Ok(())
    };
    field("Metadata-Version", "2.1")?;
    field("Name", &meta.name)?;
    field("Version", &meta.version)?;
    field("Summary", &meta.summary)?;
    field("License", &meta.license)?;
    field("Requires-Python", &meta.requires_python)?;
    for extra in &meta.provides_extra {
        field("Provides-Extra", extra)?;
    }
    for req in &meta.requires_dist {
        field("Requires-Dist", req)?;
    }
    if let Some((content_type, _)) = &meta.readme {
        field("Description-Content-Type", content_type)?;
    }
    if let Some((_, text)) = &meta.readme {
        // The description is the message body: after one blank line, verbatim.
        out.push('\n');
        out.push_str(text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> WheelMetadata {
        WheelMetadata {
            name: "flashgen".into(),
            version: "0.1.0".into(),
            summary: "CUDA kernel variants".into(),
            requires_python: ">=3.9".into(),
            license: "Apache-2.0".into(),
            readme: Some(("text/markdown".into(), "# flashgen\n\nHello.".into())),
            requires_dist: vec!["numpy>=1.24".into(), "torch; extra == \"torch\"".into()],
            provides_extra: vec!["torch".into()],
        }
    }

    #[test]
    fn metadata_has_every_field_and_the_readme_as_body() {
        assert_eq!(
            metadata_file(&meta()).unwrap(),
            "Metadata-Version: 2.1\n\
             Name: flashgen\n\
             Version: 0.1.0\n\
             Summary: CUDA kernel variants\n\
             License: Apache-2.0\n\
             Requires-Python: >=3.9\n\
             Provides-Extra: torch\n\
             Requires-Dist: numpy>=1.24\n\
             Requires-Dist: torch; extra == \"torch\"\n\
             Description-Content-Type: text/markdown\n\
             \n\
             # flashgen\n\nHello.\n"
        );
    }

    #[test]
    fn empty_optional_fields_are_left_out() {
        let m = WheelMetadata {
            summary: String::new(),
            license: String::new(),
            requires_python: String::new(),
            readme: None,
            requires_dist: vec![],
            provides_extra: vec![],
            ..meta()
        };
        assert_eq!(
            metadata_file(&m).unwrap(),
            "Metadata-Version: 2.1\nName: flashgen\nVersion: 0.1.0\n"
        );
    }

    #[test]
    fn a_line_break_in_a_header_field_is_refused() {
        let m = WheelMetadata {
            summary: "two\nlines".into(),
            ..meta()
        };
        assert!(matches!(
            metadata_file(&m),
            Err(WheelError::MultiLineField {
                field: "Summary",
                ..
            })
        ));
    }

    #[test]
    fn wheel_file_lists_every_expanded_tag() {
        let tag = WheelTag::new("py3", "none", "manylinux_2_17_x86_64.manylinux2014_x86_64");
        assert_eq!(
            wheel_file(&tag, "flashgen 0.1.0"),
            "Wheel-Version: 1.0\n\
             Generator: flashgen 0.1.0\n\
             Root-Is-Purelib: false\n\
             Tag: py3-none-manylinux_2_17_x86_64\n\
             Tag: py3-none-manylinux2014_x86_64\n"
        );
        assert_eq!(
            tag.to_string(),
            "py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64"
        );
    }
}
