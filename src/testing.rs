//! Test support for the unit tests beside the code: a private copy of the toy fixture
//! (`tests/fixtures/toy`: one module, five axes, two variants) that a test may edit before
//! loading it as a [`Matrix`].

use std::path::{Path, PathBuf};

use serde_json::Value as Json;

use crate::matrix::Matrix;

pub(crate) struct Toy {
    pub dir: tempfile::TempDir,
}

impl Toy {
    pub fn new() -> Toy {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/toy"),
            dir.path(),
        );
        Toy { dir }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn config(&self) -> Json {
        serde_json::from_str(&std::fs::read_to_string(self.path("variants.json")).unwrap()).unwrap()
    }

    pub fn set_config(&self, config: &Json) {
        std::fs::write(
            self.path("variants.json"),
            serde_json::to_string_pretty(config).unwrap(),
        )
        .unwrap();
    }

    pub fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    /// The matrix of `variants.json` plus the `--variants-file`s `extra` (paths in the tree).
    pub fn matrix_with(&self, extra: &[&str]) -> anyhow::Result<Matrix> {
        let config = self.path("variants.json");
        let text = std::fs::read_to_string(&config).unwrap();
        let extra: Vec<(PathBuf, String)> = extra
            .iter()
            .map(|rel| {
                (
                    self.path(rel),
                    std::fs::read_to_string(self.path(rel)).unwrap(),
                )
            })
            .collect();
        Matrix::from_text(&config, text, &extra, crate::matrix::DEFAULT_MAX_INSTANCES)
    }

    pub fn matrix(&self) -> Matrix {
        self.matrix_with(&[]).unwrap()
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}
