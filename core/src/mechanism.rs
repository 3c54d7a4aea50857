//! Mechanisms: the allocators a session's memory of one tier comes from, and the bindings that
//! select one per tier.
//!
//! The governor ([`crate::governor`]) decides *whether* memory may be taken; a mechanism is
//! *where it comes from*: the system heap, a block cache several sessions share, a device's
//! buffer pool. A session holds one [`Binding`] per tier. Selecting a mechanism there affects
//! only what is allocated afterwards: everything already allocated keeps the mechanism that
//! made it (an arena block holds it) and is released through it, whatever is selected by then.
//!
//! A mechanism can die (its device was lost, its owner closed it). A binding never hands out a
//! dead mechanism: when the selected one has died, the binding drops it and restores the one
//! selected before it that is still healthy, and counts the restore ([`Binding::restores`]).
//! A binding's first mechanism stays as the last resort (for the host tier that is the
//! [`SystemHeap`], which cannot die).
//!
//! Host mechanisms ([`HostMechanism`]) hand out the blocks the activation arenas
//! ([`crate::arena::HostArena`]) run from: [`SystemHeap`] (allocate zeroed, free on release)
//! and [`BlockCache`] (keeps released blocks, by size class, for the next arena of that class:
//! ONNX Runtime's shared arena allocator, `session.use_env_allocators`). A
//! [`crate::governor::MemoryPool`] has one for the sessions it holds.

use alloc::alloc::{alloc_zeroed, dealloc, Layout};
use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, Result};
use crate::governor::{Account, Holder, Lease, Tier};

/// Alignment of every host block (the planner's region alignment).
pub const BLOCK_ALIGN: usize = crate::planner::ALIGN;

/// An allocator of one tier's memory.
pub trait Mechanism: Send + Sync + core::fmt::Debug {
    /// What reports and errors call it (`system heap`, `block cache of pool 'p'`,
    /// `webgpu buffer pool of device 0 (llvmpipe)`).
    fn name(&self) -> String;
    /// The tier it allocates.
    fn tier(&self) -> Tier;
    /// `None` while it can allocate; once it has died, why (sticky).
    fn failure(&self) -> Option<String>;
    /// Bytes it keeps for reuse, held by no tensor.
    fn cached_bytes(&self) -> usize {
        0
    }
    /// Frees what it keeps for reuse; returns the bytes freed.
    fn release_cached(&self) -> usize {
        0
    }
}

/// A host block: `size` bytes at `ptr`, aligned to [`BLOCK_ALIGN`], from a [`HostMechanism`].
pub struct Block {
    pub ptr: NonNull<u8>,
    pub size: usize,
}

// SAFETY: a block is plain memory owned by whoever holds the `Block`.
unsafe impl Send for Block {}

/// A mechanism of host memory: where activation arenas come from.
pub trait HostMechanism: Mechanism {
    /// The size of the block it hands out for a request of `bytes` (a size class): what the
    /// caller leases before [`HostMechanism::alloc`].
    fn block_size(&self, bytes: usize) -> usize {
        bytes
    }
    /// A block of `block_size(bytes)` bytes (zeroed when new; a reused block holds old
    /// values). An error, never an abort, when memory is refused or the mechanism has died.
    fn alloc(&self, bytes: usize) -> Result<Block>;
    /// Takes back a block this mechanism handed out (it caches or frees it). Must be called
    /// exactly once per block, on the mechanism that made it.
    fn free(&self, block: Block);
}

fn layout(size: usize) -> Result<Layout> {
    Layout::from_size_align(size, BLOCK_ALIGN)
        .map_err(|_| Error::Other(alloc::format!("a block of {size} bytes is too large")))
}

fn system_alloc(size: usize) -> Result<Block> {
    if size == 0 {
        return Ok(Block {
            ptr: NonNull::new(core::ptr::without_provenance_mut::<u8>(BLOCK_ALIGN))
                .expect("non-null"),
            size: 0,
        });
    }
    let l = layout(size)?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { alloc_zeroed(l) };
    let ptr = NonNull::new(p).ok_or_else(|| crate::governor::refused(size))?;
    Ok(Block { ptr, size })
}

fn system_free(b: Block) {
    if b.size > 0 {
        // SAFETY: allocated by `system_alloc` with this size and alignment.
        unsafe {
            dealloc(
                b.ptr.as_ptr(),
                Layout::from_size_align_unchecked(b.size, BLOCK_ALIGN),
            )
        }
    }
}

/// The system heap: every block allocated zeroed and freed when released. Never dies.
#[derive(Debug, Default)]
pub struct SystemHeap;

impl SystemHeap {
    /// The process's one system heap mechanism.
    pub fn shared() -> Arc<dyn HostMechanism> {
        static HEAP: spin::Once<Arc<SystemHeap>> = spin::Once::new();
        HEAP.call_once(|| Arc::new(SystemHeap)).clone()
    }
}

impl Mechanism for SystemHeap {
    fn name(&self) -> String {
        "system heap".into()
    }
    fn tier(&self) -> Tier {
        Tier::Host
    }
    fn failure(&self) -> Option<String> {
        None
    }
}

impl HostMechanism for SystemHeap {
    fn alloc(&self, bytes: usize) -> Result<Block> {
        system_alloc(bytes)
    }
    fn free(&self, block: Block) {
        system_free(block)
    }
}

/// The size class of `bytes`: a multiple of 64 up to 4 KiB, above that the next of
/// 2^k x {1, 1.25, 1.5, 1.75} (at most a quarter more than asked), so arenas of nearly the
/// same size reuse one another's blocks.
pub fn size_class(bytes: usize) -> usize {
    if bytes <= 4096 {
        return bytes.div_ceil(64) * 64;
    }
    let top = usize::BITS - 1 - bytes.leading_zeros(); // 2^top <= bytes
    let quarter = 1usize << (top - 2);
    let base = 1usize << top;
    let steps = (bytes - base).div_ceil(quarter);
    base.saturating_add(steps.saturating_mul(quarter))
}

/// A cache of released host blocks by size class, which several sessions can share (a
/// [`crate::governor::MemoryPool`]'s, or one made here and selected by sessions).
///
/// A released block is kept (up to `keep` bytes in all) for the next arena of its class and
/// leased meanwhile as `cache` of the cache's account (a pool's) and of the process, so the
/// figures show it; when the lease is refused or the cache is full, the block is freed.
/// [`BlockCache::close`] kills it: it frees what it keeps, hands out nothing more (bindings
/// restore the mechanism selected before it), and frees the blocks released to it later.
pub struct BlockCache {
    name: String,
    account: Option<Arc<Account>>,
    keep: usize,
    state: spin::Mutex<CacheState>,
    cached: AtomicUsize,
    hits: AtomicUsize,
    misses: AtomicUsize,
}

#[derive(Default)]
struct CacheState {
    blocks: BTreeMap<usize, Vec<(Block, Lease)>>,
    closed: Option<String>,
}

impl core::fmt::Debug for BlockCache {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "BlockCache({:?})", self.name)
    }
}

impl BlockCache {
    /// A cache named `name` keeping at most `keep` bytes of released blocks, charged to
    /// `account` (and the process) while kept.
    pub fn new(name: &str, keep: usize, account: Option<Arc<Account>>) -> Arc<BlockCache> {
        Arc::new(BlockCache {
            name: name.to_string(),
            account,
            keep,
            state: spin::Mutex::new(CacheState::default()),
            cached: AtomicUsize::new(0),
            hits: AtomicUsize::new(0),
            misses: AtomicUsize::new(0),
        })
    }

    /// Blocks handed out from the cache, and allocated new.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }
    pub fn misses(&self) -> usize {
        self.misses.load(Ordering::Relaxed)
    }

    /// Kills the cache (`why` says so in reports): what it keeps is freed now, it hands out
    /// nothing more, and blocks released to it later are freed. Sessions that selected it
    /// go back to the mechanism they had before.
    pub fn close(&self, why: &str) {
        let drained = {
            let mut st = self.state.lock();
            if st.closed.is_none() {
                st.closed = Some(why.to_string());
            }
            core::mem::take(&mut st.blocks)
        };
        self.drop_blocks(drained);
    }

    fn drop_blocks(&self, blocks: BTreeMap<usize, Vec<(Block, Lease)>>) -> usize {
        let mut n = 0;
        for (b, lease) in blocks.into_values().flatten() {
            n += b.size;
            self.cached.fetch_sub(b.size, Ordering::Relaxed);
            system_free(b);
            drop(lease);
        }
        n
    }
}

impl Mechanism for BlockCache {
    fn name(&self) -> String {
        alloc::format!("block cache '{}'", self.name)
    }
    fn tier(&self) -> Tier {
        Tier::Host
    }
    fn failure(&self) -> Option<String> {
        self.state.lock().closed.clone()
    }
    fn cached_bytes(&self) -> usize {
        self.cached.load(Ordering::Relaxed)
    }
    fn release_cached(&self) -> usize {
        let drained = core::mem::take(&mut self.state.lock().blocks);
        self.drop_blocks(drained)
    }
}

impl crate::governor::Reclaim for BlockCache {
    /// What [`Mechanism::release_cached`] gives back (an account's and the process's refusals
    /// reclaim through this).
    fn release_cached(&self) -> usize {
        Mechanism::release_cached(self)
    }
}

impl HostMechanism for BlockCache {
    fn block_size(&self, bytes: usize) -> usize {
        size_class(bytes)
    }
    fn alloc(&self, bytes: usize) -> Result<Block> {
        let size = size_class(bytes);
        let reused = {
            let mut st = self.state.lock();
            if let Some(why) = &st.closed {
                return Err(Error::Other(alloc::format!(
                    "{} cannot allocate: {why}",
                    self.name()
                )));
            }
            st.blocks.get_mut(&size).and_then(|v| v.pop())
        };
        match reused {
            Some((b, lease)) => {
                self.cached.fetch_sub(b.size, Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                drop(lease);
                Ok(b)
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                system_alloc(size)
            }
        }
    }
    fn free(&self, block: Block) {
        if block.size == 0 {
            return;
        }
        let mut st = self.state.lock();
        let room = self
            .cached
            .load(Ordering::Relaxed)
            .saturating_add(block.size)
            <= self.keep;
        if st.closed.is_some() || !room {
            drop(st);
            return system_free(block);
        }
        let lease = Lease::take(
            self.account.as_ref(),
            Tier::Host,
            Holder::Cache,
            block.size,
            &|| "a cached arena block".into(),
        );
        match lease {
            Ok(lease) => {
                self.cached.fetch_add(block.size, Ordering::Relaxed);
                st.blocks
                    .entry(block.size)
                    .or_default()
                    .push((block, lease));
            }
            Err(_) => {
                drop(st);
                system_free(block)
            }
        }
    }
}

impl Drop for BlockCache {
    fn drop(&mut self) {
        let drained = core::mem::take(&mut self.state.lock().blocks);
        self.drop_blocks(drained);
    }
}

/// The mechanisms selected for one tier of a session, newest last.
///
/// [`Binding::current`] is the newest healthy one: dead ones above it are dropped (each a
/// restore). The first one is never dropped (the fallback of last resort).
pub struct Binding<M: ?Sized + Mechanism> {
    stack: spin::Mutex<Vec<Arc<M>>>,
    restores: AtomicUsize,
    last_failure: spin::Mutex<Option<String>>,
}

impl<M: ?Sized + Mechanism> Binding<M> {
    /// A binding whose first (fallback) mechanism is `first`.
    pub fn new(first: Arc<M>) -> Binding<M> {
        Binding {
            stack: spin::Mutex::new(alloc::vec![first]),
            restores: AtomicUsize::new(0),
            last_failure: spin::Mutex::new(None),
        }
    }

    /// Selects `m` for what is allocated from now on (what was allocated keeps its
    /// mechanism). A dead mechanism is refused; selecting one selected before moves it on top.
    pub fn select(&self, m: Arc<M>) -> Result<()> {
        if let Some(why) = m.failure() {
            return Err(Error::Other(alloc::format!(
                "cannot select {}: {why}",
                m.name()
            )));
        }
        let mut st = self.stack.lock();
        // the first entry stays where it is (the last resort); any later one moves on top
        let rest: Vec<Arc<M>> = st.drain(1..).filter(|x| !Arc::ptr_eq(x, &m)).collect();
        st.extend(rest);
        if !(st.len() == 1 && Arc::ptr_eq(&st[0], &m)) {
            st.push(m);
        }
        Ok(())
    }

    /// The mechanism to allocate from now: the newest selected one that is healthy. Dead
    /// ones selected after it are dropped (counted in [`Binding::restores`]); when every one
    /// has died the first is returned (its allocations then fail with its reason).
    pub fn current(&self) -> Arc<M> {
        let mut st = self.stack.lock();
        while st.len() > 1 {
            let top = st.last().expect("non-empty");
            match top.failure() {
                None => break,
                Some(why) => {
                    *self.last_failure.lock() = Some(alloc::format!("{}: {why}", top.name()));
                    self.restores.fetch_add(1, Ordering::Relaxed);
                    st.pop();
                }
            }
        }
        st.last().expect("non-empty").clone()
    }

    /// How many times a dead mechanism was dropped and an earlier one restored.
    pub fn restores(&self) -> usize {
        self.restores.load(Ordering::Relaxed)
    }

    /// The last dead mechanism dropped, and why.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure.lock().clone()
    }

    /// The mechanisms selected, oldest first (dead ones not yet dropped included).
    pub fn selected(&self) -> Vec<Arc<M>> {
        self.stack.lock().clone()
    }
}

/// One tier's binding in a report ([`crate::session::Session::mechanisms`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MechanismReport {
    pub tier: Tier,
    /// The mechanism allocating now.
    pub current: String,
    /// Why it cannot allocate, when even the fallback has died.
    pub failure: Option<String>,
    /// Bytes it keeps for reuse.
    pub cached: usize,
    /// Dead mechanisms dropped from this binding, and the last one with its reason.
    pub restores: usize,
    pub last_failure: Option<String>,
}

impl MechanismReport {
    /// The line of a mechanism allocating alone (no binding, so nothing restored).
    pub fn of<M: ?Sized + Mechanism>(m: &M) -> MechanismReport {
        MechanismReport {
            tier: m.tier(),
            current: m.name(),
            failure: m.failure(),
            cached: m.cached_bytes(),
            restores: 0,
            last_failure: None,
        }
    }
}

impl<M: ?Sized + Mechanism> Binding<M> {
    /// This binding's line of a report.
    pub fn report(&self) -> MechanismReport {
        MechanismReport {
            restores: self.restores(),
            last_failure: self.last_failure(),
            ..MechanismReport::of(&*self.current())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::AtomicBool;

    #[test]
    fn size_classes_round_up_by_at_most_a_quarter() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 64);
        assert_eq!(size_class(4096), 4096);
        assert_eq!(size_class(4097), 5120);
        assert_eq!(size_class(8192), 8192);
        assert_eq!(size_class(8193), 10240);
        for b in [5000usize, 70_001, 1 << 20, (1 << 20) + 1, 123_456_789] {
            let c = size_class(b);
            assert!(c >= b && c - b <= b / 4 + 64, "{b} -> {c}");
            assert_eq!(size_class(c), c, "a class is its own class");
        }
    }

    #[test]
    fn a_cache_reuses_released_blocks_and_charges_them_while_kept() {
        let acc = Account::new("cache-test", None);
        let c = BlockCache::new("t", 1 << 20, Some(acc.clone()));
        let b = c.alloc(100_000).unwrap();
        assert_eq!(b.size, size_class(100_000));
        let p = b.ptr;
        let size = b.size;
        c.free(b);
        assert_eq!(c.cached_bytes(), size);
        assert_eq!(acc.holder(Tier::Host, Holder::Cache).in_use(), size);
        // a request of the same class takes the same block back
        let b2 = c.alloc(size - 10).unwrap();
        assert_eq!(b2.ptr, p);
        assert_eq!((c.hits(), c.misses()), (1, 1));
        assert_eq!(acc.holder(Tier::Host, Holder::Cache).in_use(), 0);
        // over `keep` a released block is freed, not kept
        let big = c.alloc(2 << 20).unwrap();
        c.free(big);
        assert_eq!(c.cached_bytes(), 0);
        c.free(b2);
        assert_eq!(c.release_cached(), size);
        assert_eq!(acc.holder(Tier::Host, Holder::Cache).in_use(), 0);
    }

    #[test]
    fn a_cache_over_its_accounts_budget_frees_instead_of_keeping() {
        let acc = Account::new("tight", Some(1000));
        let c = BlockCache::new("t", 1 << 20, Some(acc.clone()));
        let b = c.alloc(8192).unwrap();
        c.free(b);
        assert_eq!(c.cached_bytes(), 0);
        assert_eq!(acc.budget(Tier::Host).in_use(), 0);
    }

    #[derive(Debug)]
    struct Fake {
        name: &'static str,
        dead: AtomicBool,
    }
    impl Mechanism for Fake {
        fn name(&self) -> String {
            self.name.into()
        }
        fn tier(&self) -> Tier {
            Tier::Device(0)
        }
        fn failure(&self) -> Option<String> {
            self.dead.load(Ordering::Relaxed).then(|| "lost".into())
        }
    }
    fn fake(name: &'static str) -> Arc<Fake> {
        Arc::new(Fake {
            name,
            dead: AtomicBool::new(false),
        })
    }

    #[test]
    fn a_dead_selection_restores_the_previous_healthy_one() {
        let (a, b, c) = (fake("a"), fake("b"), fake("c"));
        let bind: Binding<Fake> = Binding::new(a.clone());
        bind.select(b.clone()).unwrap();
        bind.select(c.clone()).unwrap();
        assert_eq!(bind.current().name, "c");
        // c dies while selected, and so does b under it: a is restored, never a dead one
        c.dead.store(true, Ordering::Relaxed);
        b.dead.store(true, Ordering::Relaxed);
        assert_eq!(bind.current().name, "a");
        assert_eq!(bind.restores(), 2);
        assert_eq!(bind.last_failure().as_deref(), Some("b: lost"));
        // a dead mechanism cannot be selected again
        assert!(bind.select(c.clone()).is_err());
        assert_eq!(bind.current().name, "a");
        // reselecting one already selected moves it on top
        let d = fake("d");
        bind.select(d.clone()).unwrap();
        bind.select(a.clone()).unwrap();
        assert_eq!(bind.current().name, "a");
        d.dead.store(true, Ordering::Relaxed);
        assert_eq!(bind.current().name, "a");
        assert_eq!(bind.selected().len(), 3, "a, d, a");
        // the first one stays as the last resort even when dead
        a.dead.store(true, Ordering::Relaxed);
        assert_eq!(bind.current().name, "a");
        assert_eq!(bind.selected().len(), 1);
        bind.select(fake("e")).unwrap();
        assert_eq!(bind.current().name, "e");
    }

    #[test]
    fn a_closed_cache_hands_out_nothing_and_frees_what_comes_back() {
        let c = BlockCache::new("t", 1 << 20, None);
        let held = c.alloc(10_000).unwrap();
        let kept = c.alloc(20_000).unwrap();
        c.free(kept);
        assert!(c.cached_bytes() > 0);
        c.close("pool shut down");
        assert_eq!(c.cached_bytes(), 0);
        assert_eq!(c.failure().as_deref(), Some("pool shut down"));
        let e = c.alloc(10).err().expect("a closed cache refuses");
        assert!(e.to_string().contains("pool shut down"), "{e}");
        c.free(held); // released through the mechanism that made it: freed, not kept
        assert_eq!(c.cached_bytes(), 0);
    }
}
