//! Kernel family: reduce (placeholder until filled in).

use crate::provider::KernelDef;

pub(crate) const KERNELS: &[KernelDef] = &[];
