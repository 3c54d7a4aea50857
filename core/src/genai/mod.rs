//! The target-free parts of generation: a decoder folder's description
//! ([`config::DecoderConfig`]), choosing tokens ([`sampling`]) and the decode loop
//! ([`engine::Generator`]), several sequences over paged KV ([`kvpool::PagedGenerator`]), stop strings over streamed text ([`stop::StopText`]). Reading the folder's files and blocking on the async runs are the
//! targets' (`nxrt::genai` natively).

pub mod config;
pub mod engine;
pub mod kvpool;
pub mod sampling;
pub mod stop;

pub use config::{DecoderConfig, SearchDefaults};
pub use engine::{Decoding, FinishReason, GenOptions, Generation, Generator};
pub use kvpool::{KvPool, PagedGenerator, PoolStats, SeqId};
pub use sampling::{LogitsProcessor, Sampler, SamplingOptions};
pub use stop::StopText;
