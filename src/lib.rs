//! flashgen: one source of truth for CUDA kernel variants.
//!
//! The pipeline reads top to bottom: [`config`] mirrors `variants.json`, [`matrix`] validates it
//! and expands [`instance`]s, [`codegen`] writes each instance's macro header, [`fingerprint`]
//! keys it, [`build`] compiles it ([`compile`], [`toolchain`], [`arch`]) through the [`cache`],
//! and [`wheel`] packages the result. [`commands`] are the thin CLI verbs over that library.

pub mod arch;
pub mod build;
pub mod c_ident;
pub mod cache;
pub mod cli;
pub mod codegen;
pub mod commands;
pub mod compile;
pub mod config;
pub mod cuda_packages;
pub mod error;
pub mod filter;
pub mod fingerprint;
pub mod fsutil;
pub mod instance;
pub mod manylinux;
pub mod matrix;
pub mod param_types;
pub mod python_env;
pub mod records;
pub mod release;
pub mod stamp;
pub mod toolchain;
pub mod ui;
pub mod wheel;
