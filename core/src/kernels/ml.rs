//! Kernel family: ml (placeholder until filled in).

use crate::provider::KernelDef;

pub(crate) const KERNELS: &[KernelDef] = &[];
