//! Kernel family: shape (placeholder until filled in).

use crate::provider::KernelDef;

pub(crate) const KERNELS: &[KernelDef] = &[];
