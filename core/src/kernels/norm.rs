//! Kernel family: normalisations, softmax and resize (placeholder until filled in).

use crate::provider::KernelDef;

pub(crate) const KERNELS: &[KernelDef] = &[];
