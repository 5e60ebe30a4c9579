//! `flashgen build-wheel`: the AOT build, packaged as a wheel.

use anyhow::{bail, Result};

use crate::cli::WheelArgs;
use crate::matrix::Matrix;

pub fn run(_matrix: &Matrix, _args: &WheelArgs) -> Result<()> {
    bail!("build-wheel is not implemented yet")
}
