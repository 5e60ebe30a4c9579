//! One point of the matrix: a module with one value per axis, and its canonical URI.
//!
//! Built by [`crate::matrix`]'s expansion, which also spells the URI.
//!
//! The URI (`single_decode_dtype_bf16_head_dim_128_variant_soft_cap`) names the instance
//! everywhere: the generated folder, the `.so`, the manifest, the loader's cache.

#[derive(Debug, Clone)]
pub struct Instance {
    /// Index into `Matrix::modules`.
    pub module: usize,
    /// One value index per axis of the module, in axis order.
    pub choice: Vec<usize>,
    pub uri: String,
    /// In the precompiled (AOT) subset.
    pub aot: bool,
}
