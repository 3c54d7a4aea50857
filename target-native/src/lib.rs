//! nxrt
