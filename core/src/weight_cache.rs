//! Dense copies of block-quantized weights, kept between runs: the "cached dense" arm of
//! block-quantized products, bounded by a limit and by the memory governor.
//!
//! A block-quantized weight (MXFP4's FLOAT4E2M1 codes with E8M0 scales, blocked int4/int8
//! DequantizeLinear, MatMulNBits with float activations) is multiplied in one of three arms:
//!
//! - **from the codes** ([`BlockWeights::Codes`]): one byte a weight is read on every call; few
//!   rows (decode's GEMV) read the codes directly, many rows (a prompt, an encoder's tokens)
//!   dequantize a panel of columns at a time into the SGEMM's panels, on every call;
//! - **cached dense** ([`BlockWeights::Cached`]): the first call dequantizes the whole weight
//!   into the SGEMM's packed panels and the kernel keeps them; later calls skip dequantizing.
//!   Each copy is leased from the session's account as [`Holder::Dequantized`] and the cache
//!   stops filling at its limit ([`WeightCache::limit`]) or when the account refuses the
//!   lease: a weight it cannot hold is computed from its codes, never an error. Everything it
//!   holds is given back by `Session::release_cached` and whenever the session's account (or
//!   its pool's) refuses another lease;
//! - **pre-expanded** ([`BlockWeights::Expanded`]): a standard-ONNX blocked DequantizeLinear
//!   feeding a MatMul is dequantized once at load into a dense float initializer (four bytes
//!   a weight for as long as the session lives; weights' budget, not the cache's).
//!
//! [`BlockWeights::Auto`] (the default) reads the codes for up to a few rows, where reading one
//! byte a weight beats reading four, and takes the cached arm for more, where the dequantizing
//! is the cost the cache saves. The answers of the cached and uncached many-row arms are the
//! same bits (the same panels reach the same SGEMM).

use alloc::string::String;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::governor::{try_zeroed, Account, Holder, Lease, Reclaim, Tier};

/// How block-quantized weights are multiplied (see the module's note).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockWeights {
    /// From the codes for few rows, the cached dense copy for many.
    #[default]
    Auto,
    /// Always from the codes: no dense copy is ever made.
    Codes,
    /// Always from the cached dense copy, where the cache can hold it.
    Cached,
    /// Dense float initializers made at load (standard-ONNX blocked DequantizeLinear);
    /// MatMulNBits nodes, whose codes are the model's own, take the cached arm.
    Expanded,
}

impl BlockWeights {
    /// The name the CLI and the bindings use.
    pub fn name(self) -> &'static str {
        match self {
            BlockWeights::Auto => "auto",
            BlockWeights::Codes => "codes",
            BlockWeights::Cached => "cached",
            BlockWeights::Expanded => "expanded",
        }
    }

    /// The policy named `s` (as [`BlockWeights::name`] writes it).
    pub fn parse(s: &str) -> Result<BlockWeights> {
        Ok(match s {
            "auto" => BlockWeights::Auto,
            "codes" => BlockWeights::Codes,
            "cached" => BlockWeights::Cached,
            "expanded" => BlockWeights::Expanded,
            _ => {
                return Err(Error::Other(alloc::format!(
                    "block weights '{s}': expected auto, codes, cached or expanded"
                )))
            }
        })
    }
}

/// The default limit of a session's dense weight cache: 256 MiB.
pub const DEFAULT_LIMIT: usize = 256 << 20;

/// A session's choice of arm and its cache's limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightCacheOptions {
    pub policy: BlockWeights,
    /// Bytes the session's dense copies may hold together (`None`: only the session's memory
    /// budget bounds them). Default [`DEFAULT_LIMIT`].
    pub limit: Option<usize>,
}

impl Default for WeightCacheOptions {
    fn default() -> Self {
        WeightCacheOptions {
            policy: BlockWeights::Auto,
            limit: Some(DEFAULT_LIMIT),
        }
    }
}

/// A dense copy of one weight, with the lease that pays for it.
pub struct Dense {
    /// The kernel's name for the copy's layout (a kernel that can lay out its weight in more
    /// than one way never reads a copy made for another).
    layout: u32,
    data: Vec<f32>,
    _lease: Lease,
}

impl Dense {
    pub fn data(&self) -> &[f32] {
        &self.data
    }
}

/// Where a kernel keeps one weight's dense copy (a MoE kernel keeps one per expert). Its
/// session's [`WeightCache`] fills it and can empty it at any time; a run holding the copy
/// keeps it alive (and paid for) until the run is done with it.
#[derive(Default)]
pub struct DenseSlot {
    dense: spin::Mutex<Option<Arc<Dense>>>,
}

impl DenseSlot {
    pub fn new() -> Arc<DenseSlot> {
        Arc::new(DenseSlot::default())
    }
}

/// A session's dense weight cache: its policy, its limit, the slots its kernels filled and
/// its counts.
pub struct WeightCache {
    policy: BlockWeights,
    limit: Option<usize>,
    slots: spin::Mutex<Vec<Weak<DenseSlot>>>,
    fills: AtomicUsize,
    hits: AtomicUsize,
    declined: AtomicUsize,
    released: AtomicUsize,
}

/// A [`WeightCache`]'s figures.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WeightCacheStats {
    pub policy: String,
    /// The cache's own limit in bytes (`None`: only the session's budget).
    pub limit: Option<usize>,
    /// Bytes its copies hold now, and how many copies.
    pub bytes: usize,
    pub copies: usize,
    /// Copies made, calls that found theirs made, copies it declined to make (limit, budget or
    /// a slot busy filling), bytes given back (release or reclaim).
    pub fills: usize,
    pub hits: usize,
    pub declined: usize,
    pub released: usize,
}

impl WeightCache {
    pub fn new(policy: BlockWeights, limit: Option<usize>) -> WeightCache {
        WeightCache {
            policy,
            limit,
            slots: spin::Mutex::new(Vec::new()),
            fills: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
            declined: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        }
    }

    pub fn policy(&self) -> BlockWeights {
        self.policy
    }

    pub fn limit(&self) -> Option<usize> {
        self.limit
    }

    /// Whether a product of `rows` rows should take the dense copy; `few` is the kernel's row
    /// count up to which reading the codes wins.
    pub fn wants(&self, rows: usize, few: usize) -> bool {
        match self.policy {
            BlockWeights::Auto => rows > few,
            BlockWeights::Codes => false,
            BlockWeights::Cached | BlockWeights::Expanded => rows > 0,
        }
    }

    /// `slot`'s dense copy of `len` floats laid out as `layout` (the kernel's own tag): the
    /// one kept, or a new one `fill` writes (given zeros) where the limit and `account` allow.
    /// `None` (the caller computes from the codes) where they do not, or where another run is
    /// filling the slot now.
    pub fn get(
        &self,
        slot: &Arc<DenseSlot>,
        layout: u32,
        account: Option<&Arc<Account>>,
        len: usize,
        fill: &dyn Fn(&mut [f32]),
    ) -> Option<Arc<Dense>> {
        let account = account?;
        let Some(mut held) = slot.dense.try_lock() else {
            self.declined.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if let Some(d) = held
            .as_ref()
            .filter(|d| d.layout == layout && d.data.len() == len)
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Some(d.clone());
        }
        let bytes = len.checked_mul(4)?;
        let decline = || {
            self.declined.fetch_add(1, Ordering::Relaxed);
            None
        };
        if self.limit.is_some_and(|l| bytes > l) {
            return decline();
        }
        let Ok(lease) = Lease::take(
            Some(account),
            Tier::Host,
            Holder::Dequantized,
            bytes,
            &|| "a dense weight copy".into(),
        ) else {
            return decline();
        };
        // a copy of another layout goes first
        *held = None;
        // the limit binds what every slot holds together (this copy's lease is counted)
        let held_now = account.holder(Tier::Host, Holder::Dequantized).in_use();
        if self.limit.is_some_and(|l| held_now > l) {
            return decline();
        }
        let Ok(mut data) = try_zeroed::<f32>(len) else {
            return decline();
        };
        fill(&mut data);
        let d = Arc::new(Dense {
            layout,
            data,
            _lease: lease,
        });
        *held = Some(d.clone());
        drop(held);
        self.fills.fetch_add(1, Ordering::Relaxed);
        let mut slots = self.slots.lock();
        slots.retain(|s| s.strong_count() > 0);
        if !slots
            .iter()
            .any(|s| core::ptr::eq(s.as_ptr(), Arc::as_ptr(slot)))
        {
            slots.push(Arc::downgrade(slot));
        }
        Some(d)
    }

    /// The cache's figures now.
    pub fn stats(&self) -> WeightCacheStats {
        let (mut bytes, mut copies) = (0, 0);
        for s in self.slots.lock().iter().filter_map(Weak::upgrade) {
            if let Some(held) = s.dense.try_lock() {
                if let Some(d) = held.as_ref() {
                    bytes += 4 * d.data.len();
                    copies += 1;
                }
            }
        }
        WeightCacheStats {
            policy: self.policy.name().into(),
            limit: self.limit,
            bytes,
            copies,
            fills: self.fills.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            declined: self.declined.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
        }
    }
}

impl Reclaim for WeightCache {
    /// Drops every copy no run is filling now (a slot being filled is left: waiting for it
    /// could wait on the thread pool the reclaiming run's own thread belongs to). A copy a run
    /// still reads stays alive, and paid for, until that run is done with it.
    fn release_cached(&self) -> usize {
        let slots: Vec<Arc<DenseSlot>> =
            self.slots.lock().iter().filter_map(Weak::upgrade).collect();
        let mut freed = 0;
        for s in slots {
            let taken = s.dense.try_lock().and_then(|mut h| h.take());
            if let Some(d) = taken {
                freed += 4 * d.data.len();
            }
        }
        self.released.fetch_add(freed, Ordering::Relaxed);
        freed
    }
}
