//! tests support
