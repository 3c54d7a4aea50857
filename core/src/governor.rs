//! The memory governor: budgets per memory tier, and leases that hold part of them.
//!
//! Every allocation nxrt makes for a session (its weights, the activation arena of each memory
//! plan, the outputs kernels make on the heap) first takes a [`Lease`] of its size. A lease is
//! charged against two budgets of its [`Tier`] at once: the process's (one per tier, shared by
//! every session, [`set_process_limit`]) and the session's own [`Account`] (its limit,
//! `SessionOptions::memory_limit`). It is returned to both when it drops, exactly once (a
//! `Lease` is not `Clone`; tensors share one through an `Arc`).
//!
//! Taking a lease either charges both budgets or neither: when the process budget has room but
//! the session's has not, the process charge is returned before the error leaves, so a refused
//! lease changes no other holder's figures. Over a budget is [`Error::OutOfMemory`], raised
//! before the memory is allocated; the session stays usable (its next run with smaller inputs
//! succeeds).
//!
//! Everything here is atomics (no locks, no OS), so the governor is the same on every target.
//! Limits are `usize::MAX` (none) unless set; the figures are counted either way, for
//! [`Account::snapshot`] and `nxrt run --memory-report`.
//!
//! The allocation itself is fallible too ([`try_zeroed`]): a size the system allocator refuses
//! is an error, never an abort, whether or not a limit is set.

use alloc::alloc::{alloc_zeroed, Layout};
use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicUsize, Ordering};

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::tensor::Data;

/// A kind of memory with its own budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Host (CPU) memory.
    Host,
    /// Memory of the device of a session's provider `i` (see [`crate::Location::Device`]).
    Device(u16),
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tier::Host => f.write_str("host"),
            Tier::Device(i) => write!(f, "device {i}"),
        }
    }
}

/// The holder name of a lease a kernel takes for its output; the executor replaces it with the
/// node's name in an [`Error::OutOfMemory`].
pub const KERNEL: &str = "a kernel";

/// Heap outputs smaller than this take no lease: a lease costs a few atomic operations and an
/// allocation, which on a model of microseconds (a classifier's scalars) measured 20-35% of
/// its run; what goes unleased is bounded (under this many bytes per value, one value per
/// graph value alive at once). Weights and arenas are leased whatever their size.
pub const SMALL: usize = 256;

/// Device tiers with budgets of their own; devices past the last share its budget.
pub const MAX_DEVICES: usize = 8;
const TIERS: usize = 1 + MAX_DEVICES;

fn tier_index(t: Tier) -> usize {
    match t {
        Tier::Host => 0,
        Tier::Device(i) => 1 + (i as usize).min(MAX_DEVICES - 1),
    }
}

fn tier_at(i: usize) -> Tier {
    if i == 0 {
        Tier::Host
    } else {
        Tier::Device((i - 1) as u16)
    }
}

/// What a lease pays for; an account reports each apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    /// The model's initializers (constant weights).
    Weights,
    /// The activation arenas of the memory plans.
    Arena,
    /// Values kernels made on the heap (eager runs, graph outputs, what the plan does not
    /// place).
    Outputs,
    /// A decoder's key/value cache.
    Cache,
    /// Dense copies of block-quantized weights that kernels keep between runs (see
    /// [`crate::weight_cache`]): bounded by the session's weight cache limit, given back on
    /// `release_cached` and whenever the account refuses a lease.
    Dequantized,
    /// Anything else.
    Other,
}

const HOLDERS: [Holder; 6] = [
    Holder::Weights,
    Holder::Arena,
    Holder::Outputs,
    Holder::Cache,
    Holder::Dequantized,
    Holder::Other,
];

impl Holder {
    pub fn name(self) -> &'static str {
        match self {
            Holder::Weights => "weights",
            Holder::Arena => "arena",
            Holder::Outputs => "outputs",
            Holder::Cache => "cache",
            Holder::Dequantized => "dequantized",
            Holder::Other => "other",
        }
    }
    fn index(self) -> usize {
        self as usize
    }
}

/// A limit, what is in use under it, its peak and the number of live leases.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicUsize,
    in_use: AtomicUsize,
    peak: AtomicUsize,
    leases: AtomicUsize,
}

impl Budget {
    /// A budget with `limit` bytes (`None`: no limit).
    pub const fn new(limit: Option<usize>) -> Budget {
        Budget {
            limit: AtomicUsize::new(match limit {
                Some(l) => l,
                None => usize::MAX,
            }),
            in_use: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            leases: AtomicUsize::new(0),
        }
    }

    pub fn limit(&self) -> Option<usize> {
        match self.limit.load(Ordering::Relaxed) {
            usize::MAX => None,
            l => Some(l),
        }
    }

    /// Sets the limit. Memory already leased stays leased (a limit below it refuses new leases
    /// until enough is returned).
    pub fn set_limit(&self, limit: Option<usize>) {
        self.limit
            .store(limit.unwrap_or(usize::MAX), Ordering::Relaxed);
    }

    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Acquire)
    }

    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Live leases.
    pub fn leases(&self) -> usize {
        self.leases.load(Ordering::Acquire)
    }

    /// Starts a new peak from what is in use now.
    pub fn reset_peak(&self) {
        self.peak.store(self.in_use(), Ordering::Relaxed);
    }

    /// Charges `bytes` if they fit under the limit; otherwise changes nothing and returns what
    /// was in use.
    fn take(&self, bytes: usize) -> core::result::Result<(), usize> {
        let limit = self.limit.load(Ordering::Relaxed);
        let new = if limit == usize::MAX && bytes <= HUGE {
            // no limit and a size any address space could hold: one add (2^16 leases of this
            // size at once could not overflow it)
            self.in_use
                .fetch_add(bytes, Ordering::AcqRel)
                .wrapping_add(bytes)
        } else {
            // a limit, or a hostile size: checked (an overflow is refused like an excess)
            let mut cur = self.in_use.load(Ordering::Relaxed);
            loop {
                let new = match cur.checked_add(bytes) {
                    Some(n) if n <= limit => n,
                    _ => return Err(cur),
                };
                match self.in_use.compare_exchange_weak(
                    cur,
                    new,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break new,
                    Err(c) => cur = c,
                }
            }
        };
        // a read first: raising the peak (a compare-and-swap loop) is rarely needed
        if new > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(new, Ordering::Relaxed);
        }
        self.leases.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn give(&self, bytes: usize) {
        self.in_use.fetch_sub(bytes, Ordering::AcqRel);
        self.leases.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Leases above this many bytes (256 TiB) are charged with checked arithmetic even without a
/// limit: no allocation that large can succeed, and summing such sizes could overflow.
const HUGE: usize = if usize::BITS >= 64 {
    1 << 48
} else {
    usize::MAX / (1 << 16)
};

static TEARDOWN_FAULTS: AtomicUsize = AtomicUsize::new(0);

/// How many times a session went while cache pages charged to it were still live (see
/// [`Account::close`]); 0 unless something tore down out of order.
pub fn teardown_faults() -> usize {
    TEARDOWN_FAULTS.load(Ordering::Acquire)
}

static PROCESS: [Budget; TIERS] = [const { Budget::new(None) }; TIERS];

/// The process-wide budget of `tier`, which every session's leases are charged against.
pub fn process_budget(tier: Tier) -> &'static Budget {
    &PROCESS[tier_index(tier)]
}

/// Sets the process-wide limit of `tier` (`None`: no limit).
pub fn set_process_limit(tier: Tier, limit: Option<usize>) {
    process_budget(tier).set_limit(limit);
}

/// A session's (or a shared pool's) memory: its own budget per tier, and per tier what each
/// [`Holder`] holds. A session in a [`MemoryPool`] has the pool's account as its parent: its
/// leases are charged to both (and to the process), so the pool's limit binds every session in
/// it together.
#[derive(Debug)]
pub struct Account {
    name: String,
    kind: &'static str,
    parent: Option<Arc<Account>>,
    tiers: [Budget; TIERS],
    holders: [[Budget; HOLDERS.len()]; TIERS],
    /// Caches whose kept memory is charged here (a pool's arena cache, sessions' dense weight
    /// caches): given back when a lease is refused here, before the refusal stands.
    reclaimers: Reclaimers,
}

impl Account {
    /// A session's account named `name` (errors and reports say whose memory it is) with a host
    /// limit.
    pub fn new(name: &str, host_limit: Option<usize>) -> Arc<Account> {
        Account::build(name, "session", host_limit, None)
    }

    /// A session's account whose leases are also charged to `parent` (a pool's account).
    pub fn with_parent(
        name: &str,
        host_limit: Option<usize>,
        parent: &Arc<Account>,
    ) -> Arc<Account> {
        Account::build(name, "session", host_limit, Some(parent.clone()))
    }

    fn build(
        name: &str,
        kind: &'static str,
        host_limit: Option<usize>,
        parent: Option<Arc<Account>>,
    ) -> Arc<Account> {
        let a = Account {
            name: name.to_string(),
            kind,
            parent,
            tiers: [const { Budget::new(None) }; TIERS],
            holders: [const { [const { Budget::new(None) }; HOLDERS.len()] }; TIERS],
            reclaimers: Reclaimers::new(),
        };
        a.tiers[0].set_limit(host_limit);
        Arc::new(a)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Marks the end of the account's owner (a session dropping). Cache pages (a KV pool's)
    /// depend on their session and must be returned before it goes; pages still charged here
    /// are a teardown-order fault, counted in [`teardown_faults`] (their memory stays valid:
    /// each lease pins this account). Returns the cache bytes still charged.
    pub fn close(&self) -> usize {
        let live: usize = (0..TIERS)
            .map(|i| self.holders[i][Holder::Cache.index()].in_use())
            .sum();
        if live != 0 {
            TEARDOWN_FAULTS.fetch_add(1, Ordering::AcqRel);
        }
        live
    }

    /// The account this one's leases are charged to as well (a pool's), if any.
    pub fn parent(&self) -> Option<&Arc<Account>> {
        self.parent.as_ref()
    }

    /// Adds a cache whose kept memory is charged to this account (a pool's arena cache, a
    /// session's weight cache): a lease this account refuses (one not for a cache) has every
    /// such cache give back what it keeps and is tried once more. Held weakly, and dropped from
    /// the list once gone.
    pub fn add_reclaimer(&self, m: Weak<dyn Reclaim>) {
        self.reclaimers.push(m);
    }

    /// Gives back what this account's reclaimers keep; the bytes freed.
    fn reclaim(&self) -> usize {
        self.reclaimers.reclaim()
    }

    /// Charges `bytes` of `tier` for `holder` here and in every parent, or charges none of
    /// them and returns the refusing account with what it had in use.
    fn charge(
        &self,
        tier: Tier,
        holder: Holder,
        bytes: usize,
    ) -> core::result::Result<(), (&Account, usize)> {
        let mut a = Some(self);
        while let Some(acc) = a {
            if let Err(in_use) = acc.budget(tier).take(bytes) {
                // give back what the accounts below this one took
                let mut b = Some(self);
                while let Some(done) = b {
                    if core::ptr::eq(done, acc) {
                        break;
                    }
                    done.budget(tier).give(bytes);
                    done.holder(tier, holder).give(bytes);
                    b = done.parent.as_deref();
                }
                return Err((acc, in_use));
            }
            // a holder's budget has no limit: this always succeeds
            let _ = acc.holder(tier, holder).take(bytes);
            a = acc.parent.as_deref();
        }
        Ok(())
    }

    /// Moves `bytes` of `tier` from holder `from` to `to` here and in every parent.
    fn move_holder(&self, tier: Tier, from: Holder, to: Holder, bytes: usize) {
        let mut a = Some(self);
        while let Some(acc) = a {
            // a holder's budget has no limit: this always succeeds
            let _ = acc.holder(tier, to).take(bytes);
            acc.holder(tier, from).give(bytes);
            a = acc.parent.as_deref();
        }
    }

    fn discharge(&self, tier: Tier, holder: Holder, bytes: usize) {
        let mut a = Some(self);
        while let Some(acc) = a {
            acc.budget(tier).give(bytes);
            acc.holder(tier, holder).give(bytes);
            a = acc.parent.as_deref();
        }
    }

    /// This account's budget of `tier`.
    pub fn budget(&self, tier: Tier) -> &Budget {
        &self.tiers[tier_index(tier)]
    }

    /// What `holder` holds of `tier` (its limit is never set).
    pub fn holder(&self, tier: Tier, holder: Holder) -> &Budget {
        &self.holders[tier_index(tier)][holder.index()]
    }

    /// The account's figures, tier by tier (tiers it never used are left out, except the host).
    pub fn snapshot(&self) -> MemorySnapshot {
        snapshot(&self.name, &self.tiers, |i| {
            HOLDERS
                .iter()
                .map(|&h| {
                    let hb = &self.holders[i][h.index()];
                    HolderUsage {
                        holder: h,
                        in_use: hb.in_use(),
                        peak: hb.peak(),
                        leases: hb.leases(),
                    }
                })
                .collect()
        })
    }
}

/// The process's figures, tier by tier (device tiers only where used or limited).
pub fn process_snapshot() -> MemorySnapshot {
    snapshot("process", &PROCESS, |_| Vec::new())
}

/// The figures of `tiers` (the host always; a device tier where used or limited), with
/// `holders(i)` for tier `i`.
fn snapshot(
    name: &str,
    tiers: &[Budget; TIERS],
    holders: impl Fn(usize) -> Vec<HolderUsage>,
) -> MemorySnapshot {
    let tiers = tiers
        .iter()
        .enumerate()
        .filter(|(i, b)| *i == 0 || b.peak() != 0 || b.limit().is_some())
        .map(|(i, b)| TierUsage {
            tier: tier_at(i),
            in_use: b.in_use(),
            peak: b.peak(),
            limit: b.limit(),
            leases: b.leases(),
            holders: holders(i),
        })
        .collect();
    MemorySnapshot {
        name: name.to_string(),
        tiers,
    }
}

/// Figures of a process or of one session ([`Account::snapshot`], [`process_snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemorySnapshot {
    /// `process`, or the session's account name.
    pub name: String,
    pub tiers: Vec<TierUsage>,
}

/// One tier of a [`MemorySnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierUsage {
    pub tier: Tier,
    /// Bytes leased now.
    pub in_use: usize,
    /// The most bytes leased at once since the start (or [`Budget::reset_peak`]).
    pub peak: usize,
    pub limit: Option<usize>,
    /// Live leases.
    pub leases: usize,
    /// Per holder (a session's snapshot; empty for the process).
    pub holders: Vec<HolderUsage>,
}

/// What one [`Holder`] holds of a tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderUsage {
    pub holder: Holder,
    pub in_use: usize,
    pub peak: usize,
    pub leases: usize,
}

/// Memory shared by several sessions (opt in with `SessionOptions::pool`, as ONNX Runtime's
/// `session.use_env_allocators` does): one budget per tier that binds all of them together,
/// and one copy of each initializer they hold byte for byte the same (the same model loaded
/// twice holds its weights once).
///
/// A session in a pool charges its leases to its own account, the pool's and the process's.
/// Shared weights are charged to the pool alone (no one session holds them) and live until the
/// last session using them drops; the pool itself lives until its last session has gone
/// (every session holds it), whatever order the caller drops them in.
pub struct MemoryPool {
    account: Arc<Account>,
    /// Live shared weights by (storage kind, bytes, content hash): the storage and its lease,
    /// held weakly (the sessions hold them).
    weights: spin::Mutex<BTreeMap<(u8, usize, u64), Vec<SharedWeight>>>,
    /// Released activation arenas kept for the pool's sessions (those that select it).
    arenas: Arc<crate::mechanism::BlockCache>,
}

type SharedWeight = (Weak<Data>, Weak<Lease>);

impl fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemoryPool({:?})", self.account.name)
    }
}

impl MemoryPool {
    /// A pool named `name` with a host limit (`None`: only the process's).
    pub fn new(name: &str, host_limit: Option<usize>) -> Arc<MemoryPool> {
        let account = Account::build(name, "pool", host_limit, None);
        let arenas = crate::mechanism::BlockCache::new(name, usize::MAX, Some(account.clone()));
        let weak: Weak<dyn Reclaim> = Arc::downgrade(&arenas) as _;
        account.add_reclaimer(weak.clone());
        PROCESS_RECLAIMERS.push(weak);
        Arc::new(MemoryPool {
            account,
            weights: spin::Mutex::new(BTreeMap::new()),
            arenas,
        })
    }

    /// The pool's account: its budgets (set a device tier's limit on it) and figures.
    pub fn account(&self) -> &Arc<Account> {
        &self.account
    }

    /// The pool's arena cache: a host mechanism its sessions select
    /// (`SessionOptions::host_mechanism`) to share activation arenas, ONNX Runtime's shared
    /// arena. An arena a session frees is kept, charged to the pool as `cache`, for the next
    /// arena of its size class any of them allocates. The pool's limit bounds what it keeps:
    /// any lease the pool refuses has the cache given back first and is tried once more.
    pub fn arena_cache(&self) -> &Arc<crate::mechanism::BlockCache> {
        &self.arenas
    }

    /// Frees the arenas the pool keeps; returns the bytes freed.
    pub fn release_cached(&self) -> usize {
        crate::mechanism::Mechanism::release_cached(&*self.arenas)
    }

    /// What every session in the pool holds together, with the shared weights.
    pub fn snapshot(&self) -> MemorySnapshot {
        self.account.snapshot()
    }

    /// The storage of a live shared weight holding exactly `data`'s bytes, or `data` itself,
    /// now shared, with a new lease of its bytes charged to the pool (an error over a budget).
    pub(crate) fn share(
        &self,
        data: Arc<Data>,
        what: &dyn Fn() -> String,
    ) -> Result<(Arc<Data>, Arc<Lease>)> {
        let Some(bytes) = data.as_bytes() else {
            let l = Lease::take(
                Some(&self.account),
                Tier::Host,
                Holder::Weights,
                data.storage_bytes(),
                what,
            )?;
            return Ok((data, Arc::new(l)));
        };
        let key = (data.kind_code(), bytes.len(), content_hash(bytes));
        let mut map = self.weights.lock();
        let list = map.entry(key).or_default();
        list.retain(|(d, l)| d.strong_count() > 0 && l.strong_count() > 0);
        for (d, l) in list.iter() {
            if let (Some(d), Some(l)) = (d.upgrade(), l.upgrade()) {
                // a hash names candidates; only the same bytes share
                if d.kind_code() == key.0 && d.as_bytes() == Some(bytes) {
                    return Ok((d, l));
                }
            }
        }
        let l = Arc::new(Lease::take(
            Some(&self.account),
            Tier::Host,
            Holder::Weights,
            bytes.len(),
            what,
        )?);
        list.push((Arc::downgrade(&data), Arc::downgrade(&l)));
        Ok((data, l))
    }

    /// Shared weights alive now (distinct storages).
    pub fn shared_weights(&self) -> usize {
        self.weights
            .lock()
            .values()
            .flatten()
            .filter(|(d, l)| d.strong_count() > 0 && l.strong_count() > 0)
            .count()
    }
}

/// A 64-bit hash of `b`, eight bytes at a time (it only picks candidates; equality is checked
/// byte for byte).
fn content_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = b.len() as u64;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    for &x in chunks.remainder() {
        h = (h.rotate_left(5) ^ x as u64).wrapping_mul(K);
    }
    h ^ (h >> 29)
}

/// Something that keeps memory for reuse and can give it back on demand (a mechanism's cache,
/// a session's dense weight cache).
pub trait Reclaim: Send + Sync {
    /// Frees what it keeps for reuse; returns the bytes freed.
    fn release_cached(&self) -> usize;
}

/// Caches that give back what they keep when a budget refuses a lease (an account's, or the
/// process's), held weakly.
#[derive(Debug)]
struct Reclaimers(spin::Mutex<Vec<Weak<dyn Reclaim>>>);

impl Reclaimers {
    const fn new() -> Reclaimers {
        Reclaimers(spin::Mutex::new(Vec::new()))
    }

    fn push(&self, r: Weak<dyn Reclaim>) {
        let mut list = self.0.lock();
        list.retain(|r| r.strong_count() > 0);
        list.push(r);
    }

    /// Has every live reclaimer give back what it keeps; the bytes freed. The list is copied
    /// out first: a reclaimer's own leases going back must not find the list locked.
    fn reclaim(&self) -> usize {
        let live: Vec<Arc<dyn Reclaim>> = self.0.lock().iter().filter_map(Weak::upgrade).collect();
        live.iter().map(|r| r.release_cached()).sum()
    }
}

/// Every pool's arena cache and every session's dense weight cache: what they keep is charged
/// to the process's budget too, so a lease that budget refuses has them give it back first.
static PROCESS_RECLAIMERS: Reclaimers = Reclaimers::new();

/// Adds a cache whose kept memory is charged to the process's budget (see
/// [`Account::add_reclaimer`]); held weakly.
pub fn add_process_reclaimer(m: Weak<dyn Reclaim>) {
    PROCESS_RECLAIMERS.push(m);
}

/// Bytes of a tier held for a holder: charged to the process and (with one) to a session's
/// account when taken, returned to both when dropped.
#[derive(Debug)]
pub struct Lease {
    tier: Tier,
    /// The holder's index in `HOLDERS` (a lease can change holder: [`Lease::relabel`]).
    holder: core::sync::atomic::AtomicU8,
    bytes: usize,
    account: Option<Arc<Account>>,
}

impl Lease {
    /// Charges `bytes` of `tier` for `holder` to the process and to `account`, or returns
    /// [`Error::OutOfMemory`] naming the budget that refused, with nothing charged.
    /// `what` names the holder in that error (a node's output, say).
    pub fn take(
        account: Option<&Arc<Account>>,
        tier: Tier,
        holder: Holder,
        bytes: usize,
        what: &dyn Fn() -> String,
    ) -> Result<Lease> {
        let process = process_budget(tier);
        let mut took = process.take(bytes);
        // the caches charged to the process give back what they keep (never for a cache's own
        // lease, as below)
        if took.is_err()
            && !matches!(holder, Holder::Cache | Holder::Dequantized)
            && PROCESS_RECLAIMERS.reclaim() > 0
        {
            took = process.take(bytes);
        }
        if let Err(in_use) = took {
            return Err(Error::OutOfMemory {
                tier: alloc::format!("{tier} memory of the process"),
                requested: bytes as u64,
                in_use: in_use as u64,
                limit: process.limit().map_or(u64::MAX, |l| l as u64),
                holder: what(),
            });
        }
        if let Some(a) = account {
            let mut charged = a.charge(tier, holder, bytes);
            if let Err((refused, _)) = charged {
                // a cache charged to the refusing account gives back what it keeps (never
                // for a cache's own lease: it is taken under that cache's lock, and one
                // cache filling does not empty another)
                if !matches!(holder, Holder::Cache | Holder::Dequantized) && refused.reclaim() > 0 {
                    charged = a.charge(tier, holder, bytes);
                }
            }
            if let Err((refused, in_use)) = charged {
                process.give(bytes);
                return Err(Error::OutOfMemory {
                    tier: alloc::format!("{tier} memory of {} '{}'", refused.kind, refused.name),
                    requested: bytes as u64,
                    in_use: in_use as u64,
                    limit: refused.budget(tier).limit().map_or(u64::MAX, |l| l as u64),
                    holder: what(),
                });
            }
        }
        Ok(Lease {
            tier,
            holder: core::sync::atomic::AtomicU8::new(holder.index() as u8),
            bytes,
            account: account.cloned(),
        })
    }

    /// Moves this lease's bytes to `to` among its account's holders (and its parents'): the
    /// budgets' totals do not change. Outputs a decoder keeps as its KV cache become `cache`.
    pub fn relabel(&self, to: Holder) {
        let from = HOLDERS[self.holder.swap(to.index() as u8, Ordering::AcqRel) as usize];
        if from != to {
            if let Some(a) = &self.account {
                a.move_holder(self.tier, from, to, self.bytes);
            }
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn tier(&self) -> Tier {
        self.tier
    }

    pub fn holder(&self) -> Holder {
        HOLDERS[self.holder.load(Ordering::Acquire) as usize]
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        process_budget(self.tier).give(self.bytes);
        if let Some(a) = &self.account {
            a.discharge(self.tier, self.holder(), self.bytes);
        }
    }
}

/// Element types whose all-zero bit pattern is a valid value (zero, or `false`).
///
/// # Safety
/// Implementors must be plain data for which every zero byte pattern is a valid value.
pub unsafe trait ZeroBits: Sized {}

macro_rules! zero_bits {
    ($($t:ty),*) => { $(unsafe impl ZeroBits for $t {})* };
}
zero_bits!(f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64, bool);

/// A vector of `n` zeros, or an error (never an abort) when its size overflows or the system
/// allocator refuses it. Large blocks come zeroed from the allocator (untouched pages), as
/// `vec![0; n]` does.
pub fn try_zeroed<T: ZeroBits>(n: usize) -> Result<Vec<T>> {
    let layout = Layout::array::<T>(n).map_err(|_| {
        Error::Shape(alloc::format!(
            "{n} elements of {} bytes overflow the address space",
            core::mem::size_of::<T>()
        ))
    })?;
    if layout.size() == 0 {
        let mut v = Vec::new();
        v.resize_with(n, || {
            // SAFETY: `T: ZeroBits` (and zero-sized here)
            unsafe { core::mem::zeroed() }
        });
        return Ok(v);
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return Err(refused(layout.size()));
    }
    // SAFETY: allocated by the global allocator with `Layout::array::<T>(n)`, so a `Vec` of
    // capacity `n` owns it; its `n` elements are zero bits, valid for `T: ZeroBits`.
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// An empty vector with room for `n` elements, or an error where `try_reserve` fails.
pub fn try_with_capacity<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| refused(n.saturating_mul(core::mem::size_of::<T>())))?;
    Ok(v)
}

/// The error of an allocation the system allocator refused.
pub fn refused(bytes: usize) -> Error {
    Error::OutOfMemory {
        tier: "host memory (the system allocator refused it)".into(),
        requested: bytes as u64,
        in_use: process_budget(Tier::Host).in_use() as u64,
        limit: u64::MAX,
        holder: KERNEL.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what() -> String {
        "test".into()
    }

    #[test]
    fn a_lease_is_returned_exactly_once_to_both_budgets() {
        let a = Account::new("t", Some(1000));
        let p0 = process_budget(Tier::Device(5)).in_use();
        let l = Lease::take(Some(&a), Tier::Device(5), Holder::Arena, 300, &what).unwrap();
        assert_eq!(a.budget(Tier::Device(5)).in_use(), 300);
        assert_eq!(a.holder(Tier::Device(5), Holder::Arena).in_use(), 300);
        assert_eq!(a.budget(Tier::Device(5)).leases(), 1);
        assert!(process_budget(Tier::Device(5)).in_use() >= p0 + 300);
        drop(l);
        assert_eq!(a.budget(Tier::Device(5)).in_use(), 0);
        assert_eq!(a.budget(Tier::Device(5)).leases(), 0);
        assert_eq!(a.holder(Tier::Device(5), Holder::Arena).in_use(), 0);
        assert_eq!(a.budget(Tier::Device(5)).peak(), 300);
    }

    #[test]
    fn a_relabelled_lease_moves_between_holders_and_returns_from_the_new_one() {
        let t = Tier::Device(4);
        let pool = MemoryPool::new("r", None);
        let a = Account::with_parent("a", None, pool.account());
        let l = Lease::take(Some(&a), t, Holder::Outputs, 500, &what).unwrap();
        l.relabel(Holder::Cache);
        l.relabel(Holder::Cache); // a second move to the same holder changes nothing
        assert_eq!(l.holder(), Holder::Cache);
        for acc in [&a, pool.account()] {
            assert_eq!(acc.budget(t).in_use(), 500, "totals unchanged");
            assert_eq!(acc.holder(t, Holder::Outputs).in_use(), 0);
            assert_eq!(acc.holder(t, Holder::Outputs).leases(), 0);
            assert_eq!(acc.holder(t, Holder::Cache).in_use(), 500);
            assert_eq!(acc.holder(t, Holder::Cache).leases(), 1);
        }
        drop(l);
        for acc in [&a, pool.account()] {
            assert_eq!(acc.budget(t).in_use(), 0);
            assert_eq!(acc.holder(t, Holder::Cache).in_use(), 0);
            assert_eq!(acc.holder(t, Holder::Outputs).in_use(), 0);
        }
    }

    #[test]
    fn a_refused_lease_charges_nothing_and_names_the_budget() {
        let a = Account::new("small", None);
        a.budget(Tier::Device(6)).set_limit(Some(100));
        let held = Lease::take(Some(&a), Tier::Device(6), Holder::Weights, 60, &what).unwrap();
        let p = process_budget(Tier::Device(6)).in_use();
        let e = Lease::take(Some(&a), Tier::Device(6), Holder::Outputs, 41, &what).unwrap_err();
        match e {
            Error::OutOfMemory {
                tier,
                requested,
                in_use,
                limit,
                holder,
            } => {
                assert_eq!((requested, in_use, limit), (41, 60, 100));
                assert!(tier.contains("session 'small'"), "{tier}");
                assert_eq!(holder, "test");
            }
            e => panic!("{e}"),
        }
        // nothing moved: not the session, not the process, not the other holder
        assert_eq!(process_budget(Tier::Device(6)).in_use(), p);
        assert_eq!(a.budget(Tier::Device(6)).in_use(), 60);
        assert_eq!(a.holder(Tier::Device(6), Holder::Outputs).in_use(), 0);
        assert_eq!(a.holder(Tier::Device(6), Holder::Weights).in_use(), 60);
        // what fits still fits
        let l = Lease::take(Some(&a), Tier::Device(6), Holder::Outputs, 40, &what).unwrap();
        drop((l, held));
        assert_eq!(a.budget(Tier::Device(6)).in_use(), 0);
    }

    #[test]
    fn the_process_limit_binds_every_account() {
        let t = Tier::Device(7);
        set_process_limit(t, Some(process_budget(t).in_use() + 50));
        let (a, b) = (Account::new("a", None), Account::new("b", None));
        let la = Lease::take(Some(&a), t, Holder::Other, 30, &what).unwrap();
        let e = Lease::take(Some(&b), t, Holder::Other, 30, &what).unwrap_err();
        assert!(matches!(&e, Error::OutOfMemory { tier, .. } if tier.contains("process")));
        assert_eq!(b.budget(t).in_use(), 0);
        drop(la);
        let lb = Lease::take(Some(&b), t, Holder::Other, 30, &what).unwrap();
        drop(lb);
        set_process_limit(t, None);
    }

    #[test]
    fn concurrent_leases_never_oversubscribe() {
        extern crate std;
        let a = Account::new("c", None);
        let t = Tier::Device(4);
        a.budget(t).set_limit(Some(1000));
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let a = a.clone();
                std::thread::spawn(move || {
                    let mut ok = 0;
                    for j in 0..2000 {
                        let n = 1 + (i * 37 + j * 11) % 300;
                        if let Ok(l) = Lease::take(Some(&a), t, Holder::Other, n, &what) {
                            assert!(a.budget(t).in_use() <= 1000);
                            ok += 1;
                            drop(l);
                        }
                    }
                    ok
                })
            })
            .collect();
        let ok: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert!(ok > 0);
        assert!(a.budget(t).peak() <= 1000);
        assert_eq!((a.budget(t).in_use(), a.budget(t).leases()), (0, 0));
    }

    #[test]
    fn a_pool_charges_with_its_sessions_and_refuses_for_all_of_them() {
        let t = Tier::Device(3);
        let pool = MemoryPool::new("shared", None);
        pool.account().budget(t).set_limit(Some(100));
        let a = Account::with_parent("a", None, pool.account());
        let b = Account::with_parent("b", None, pool.account());
        b.budget(t).set_limit(Some(30));
        let la = Lease::take(Some(&a), t, Holder::Arena, 80, &what).unwrap();
        assert_eq!(pool.account().budget(t).in_use(), 80);
        assert_eq!(pool.account().holder(t, Holder::Arena).in_use(), 80);
        // b's own budget refuses first; then the pool's; neither charges anything
        let e = Lease::take(Some(&b), t, Holder::Other, 31, &what).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory { tier, .. } if tier.contains("session 'b'")),
            "{e}"
        );
        let e = Lease::take(Some(&b), t, Holder::Other, 30, &what).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory { tier, in_use: 80, limit: 100, .. } if tier.contains("pool 'shared'")),
            "{e}"
        );
        assert_eq!(
            (b.budget(t).in_use(), b.holder(t, Holder::Other).in_use()),
            (0, 0)
        );
        assert_eq!(pool.account().budget(t).in_use(), 80);
        drop(la);
        let lb = Lease::take(Some(&b), t, Holder::Other, 30, &what).unwrap();
        assert_eq!(
            (pool.account().budget(t).in_use(), a.budget(t).in_use()),
            (30, 0)
        );
        drop(lb);
        assert_eq!(pool.account().budget(t).leases(), 0);
    }

    #[test]
    fn a_pool_shares_only_the_same_bytes_of_the_same_kind() {
        let pool = MemoryPool::new("w", None);
        let x = Arc::new(Data::F32(alloc::vec![1.0, -0.0, 3.0]));
        let (d1, l1) = pool.share(x.clone(), &what).unwrap();
        assert!(Arc::ptr_eq(&d1, &x));
        // equal values, but -0.0 and 0.0 are different bytes
        let (d2, _l2) = pool
            .share(Arc::new(Data::F32(alloc::vec![1.0, 0.0, 3.0])), &what)
            .unwrap();
        assert!(!Arc::ptr_eq(&d2, &x));
        // the same bytes as another kind of storage
        let bits = alloc::vec![
            1.0f32.to_bits() as i32,
            (-0.0f32).to_bits() as i32,
            3.0f32.to_bits() as i32
        ];
        let (d3, _l3) = pool.share(Arc::new(Data::I32(bits)), &what).unwrap();
        assert!(!Arc::ptr_eq(&d3, &x));
        // the same bytes and kind: the first copy and its lease
        let (d4, l4) = pool
            .share(Arc::new(Data::F32(alloc::vec![1.0, -0.0, 3.0])), &what)
            .unwrap();
        assert!(Arc::ptr_eq(&d4, &x) && Arc::ptr_eq(&l4, &l1));
        assert_eq!(pool.shared_weights(), 3);
        assert_eq!(
            pool.account().holder(Tier::Host, Holder::Weights).in_use(),
            36
        );
        drop((d1, l1, d4, l4, x));
        assert_eq!(pool.shared_weights(), 2);
    }

    #[test]
    fn hostile_sizes_never_wrap_a_budget() {
        let a = Account::new("huge", None);
        let t = Tier::Device(2);
        let l = Lease::take(Some(&a), t, Holder::Other, 100, &what).unwrap();
        // without a limit, a size near usize::MAX is refused, not added (which would wrap)
        let e = Lease::take(Some(&a), t, Holder::Other, usize::MAX - 10, &what).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
        assert_eq!(a.budget(t).in_use(), 100);
        drop(l);
        assert_eq!((a.budget(t).in_use(), a.budget(t).leases()), (0, 0));
    }

    #[test]
    fn refused_allocations_are_errors() {
        assert!(try_zeroed::<u64>(usize::MAX / 4).is_err());
        assert!(try_zeroed::<u8>(usize::MAX / 2).is_err());
        assert!(try_with_capacity::<u32>(usize::MAX / 2).is_err());
        let v = try_zeroed::<f32>(1 << 20).unwrap();
        assert!(v.len() == 1 << 20 && v.iter().all(|&x| x == 0.0));
    }
}
