//! The small model built into the `nxrt` binary (what `nxrt run` without a model runs). It is
//! defined in core ([`nxrt_core::embedded`]) so that every target runs the same bytes.

pub use nxrt_core::embedded::*;
