//! Kernel family: signal (placeholder until filled in).

use crate::provider::KernelDef;

pub(crate) const KERNELS: &[KernelDef] = &[];
