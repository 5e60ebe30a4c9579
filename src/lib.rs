//! flashgen: one source of truth for CUDA kernel variants.
//!
//! `variants.json` declares a matrix of kernel variants; one `csrc/` + `include/` tree holds each
//! kernel once; what differs between instances is a small generated macro header. This crate is
//! the `flashgen` binary's library. Read it in pipeline order; each stage names the module where
//! its rules live.
//!
//! 1. **Config**: [`config`] is the plain serde mirror of `variants.json` (unknown keys,
//!    duplicated names and syntax errors are refused with `file:line:column`; nothing else).
//! 2. **Matrix**: [`matrix`] turns it into checked data. `matrix/validate.rs` holds every rule
//!    that refuses a config (C names via [`c_ident`], parameter types via [`param_types`],
//!    architecture limits via [`arch`], the instance and URI bounds); `tests/validation.rs` pins
//!    their messages. The release set (which archs `build-wheel --release` builds, each wheel's
//!    size budget) is [`release`].
//! 3. **Instances**: `matrix/expand.rs` walks every module's axes into [`instance::Instance`]s,
//!    each with its URI and whether it is in the AOT subset; [`filter`] selects among them
//!    (`--module`, `--where`, `--aot`).
//! 4. **Codegen**: [`codegen`] writes an instance's `flashgen_instance.cuh` (or a module's
//!    dispatching header): a pure function of the matrix, documented in DEVELOPERS.md.
//! 5. **Compile**: [`toolchain`] finds nvcc and the host compiler (and the CUDA runtime beside
//!    them; [`python_env`] for pip-installed ones), [`manylinux`] swaps the host compiler for
//!    `zig c++` targeting an old glibc, [`arch`] turns arch lists into `-gencode` flags, and
//!    [`compile`] spells and runs the nvcc steps (one call, or compile + link through a
//!    launcher) in a guard's process group, so that no nvcc outlives a build that dies.
//! 6. **Cache**: [`fingerprint`] keys an instance (its header, every file its translation unit
//!    includes, the toolchain's versions, the flags); [`cache`] stores `<key>.so` beside a record
//!    and refuses any object whose owner, mode or sha256 is off.
//! 7. **Build**: [`build`] plans which instances to compile (a cache hit is placed, a miss is
//!    compiled in parallel), places the `.so` files and the manifest ([`records`]) in `--out`;
//!    [`stamp`] answers an unchanged rebuild without hashing anything.
//! 8. **Wheel and release**: `commands/build_wheel.rs` packs the build with the loader, the
//!    sources and this binary through [`wheel`] (a PEP 427 writer that also picks the manylinux
//!    tag); [`cuda_packages`] names the CUDA packages the wheel requires; `--release` builds
//!    [`release`]'s set and holds every wheel to its budget; within it [`host_once`] compiles
//!    each instance's host code once for all its architectures (the same `.so` bytes).
//! 9. **JIT and loader**: the Python package (`python/flashgen/`, `_loader.py`) loads a
//!    precompiled instance when one runs on the device, else asks `flashgen jit`
//!    (`commands/jit.rs`), which builds through the same [`build`] and [`cache`] and answers with
//!    the verified object ([`records::JitAnswer`]); `flashgen describe` ([`records::Describe`])
//!    is the matrix the loader reads.
//!
//! Around them: [`cli`] declares the arguments (its doc comments are `--help`), [`commands`] are
//! the verbs (one short file each), [`ui`] is the only place that prints, [`error`] decides the
//! exit code, and [`fsutil`] writes files atomically.
//!
//! Only what the binary (`src/main.rs`) and the integration tests (`tests/*.rs`) use is public;
//! the rest is `pub(crate)`, except [`wheel`]: a self-contained wheel writer whose whole API
//! (files and scripts read from disk too) is tested, though `build-wheel` adds bytes only.
//! `cargo doc --document-private-items` renders this walk with every link working.

// The walk above links to crate-private modules on purpose.
#![allow(rustdoc::private_intra_doc_links)]

pub mod arch;
pub(crate) mod build;
pub(crate) mod c_ident;
pub(crate) mod cache;
pub mod cli;
pub mod codegen;
pub mod commands;
pub(crate) mod compile;
pub(crate) mod config;
pub(crate) mod cuda_packages;
pub mod error;
pub(crate) mod filter;
pub(crate) mod fingerprint;
pub(crate) mod fsutil;
pub(crate) mod host_once;
pub(crate) mod instance;
pub(crate) mod manylinux;
pub mod matrix;
pub(crate) mod param_types;
pub(crate) mod python_env;
pub(crate) mod records;
pub(crate) mod release;
pub(crate) mod stamp;
pub(crate) mod toolchain;
pub(crate) mod ui;
pub mod wheel;

#[cfg(test)]
mod testing;

pub use compile::{guard_main, GUARD_ARG};
pub use toolchain::drop_relative_search_paths;
pub use ui::set_verbose;
