//! The host arena a planned run executes from, and the output buffers kernels write into.
//!
//! A planned run owns one [`HostArena`] per plan: a single zero-initialised allocation, sized by
//! the activation memory planner and reused run after run. Kernels ask the [`KernelCx`] for
//! their outputs ([`KernelCx::output`]); in a planned run an output the planner placed comes back
//! as its arena region, anywhere else as a fresh heap vector, so a kernel is written once for
//! both modes.
//!
//! Soundness rests on three checks, none of which trusts a kernel:
//! - a region is handed out only for the output it was planned for, only once per step, and only
//!   when the requested size is exactly the planned size;
//! - the planner never lets regions of values alive at the same step overlap, except a view or an
//!   in-place result with its own input, and an in-place region is handed out only through
//!   [`KernelCx::output_in_place`], which the kernel then reads instead of the input;
//! - after each step the executor checks every output that lives in the arena sits exactly at
//!   its planned region; anything else (a kernel returning some other view) is copied out.

use alloc::sync::Arc;
use alloc::vec::Vec;
use core::ops::{Deref, DerefMut};
use core::ptr::NonNull;
use core::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::governor::{Holder, Lease, Tier};
use crate::mechanism::{Block, HostMechanism, SystemHeap};
use crate::planner::Region;
use crate::planner::ALIGN;
use crate::provider::{CpuBackend, KernelCx};
use crate::tensor::{numel, Data, Elem, Tensor};

/// Element types the arena may hold: plain numbers, for which every bit pattern is valid.
pub fn arena_dtype(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::Float
            | DataType::Double
            | DataType::Float16
            | DataType::Bfloat16
            | DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Uint8
            | DataType::Uint16
            | DataType::Uint32
            | DataType::Uint64
    )
}

/// One 64-byte aligned block (zeroed when new) from a host mechanism, which it is released
/// through when the arena is freed.
pub struct HostArena {
    ptr: NonNull<u8>,
    bytes: usize,
    /// The block's size (`bytes` rounded up to the mechanism's size class).
    size: usize,
    mechanism: Arc<dyn HostMechanism>,
    /// The governor's lease on these bytes, returned when the arena is freed.
    _lease: Option<Lease>,
}

// SAFETY: the arena is plain memory; who may write which bytes when is governed by the plan
// (see the module docs), and writes happen only through `OutBuf`s the executor hands out.
unsafe impl Send for HostArena {}
unsafe impl Sync for HostArena {}

impl HostArena {
    /// Allocates `bytes` from the system heap (an error, not an abort, when refused).
    pub fn new(bytes: usize) -> Result<Arc<HostArena>> {
        Self::leased(bytes, None)
    }

    /// Allocates `bytes` from the system heap, held by `lease` (taken for them before), which
    /// the arena returns when it is freed.
    pub fn leased(bytes: usize, lease: Option<Lease>) -> Result<Arc<HostArena>> {
        Self::from_mechanism(SystemHeap::shared(), bytes, lease)
    }

    /// Allocates `bytes` from `mechanism`, held by `lease` (taken for
    /// `mechanism.block_size(bytes)` before); the block goes back to `mechanism` when the
    /// arena is freed, whatever is selected by then.
    pub fn from_mechanism(
        mechanism: Arc<dyn HostMechanism>,
        bytes: usize,
        lease: Option<Lease>,
    ) -> Result<Arc<HostArena>> {
        let b = mechanism.alloc(bytes)?;
        debug_assert!(b.size >= bytes && (b.ptr.as_ptr() as usize).is_multiple_of(ALIGN));
        Ok(Arc::new(HostArena {
            ptr: b.ptr,
            bytes,
            size: b.size,
            mechanism,
            _lease: lease,
        }))
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for HostArena {
    fn drop(&mut self) {
        self.mechanism.free(Block {
            ptr: self.ptr,
            size: self.size,
        });
    }
}

/// A byte range of an arena that one tensor (and its views) occupies.
#[derive(Clone)]
pub struct ArenaRegion {
    arena: Arc<HostArena>,
    offset: usize,
    bytes: usize,
}

impl core::fmt::Debug for ArenaRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "ArenaRegion({}+{})", self.offset, self.bytes)
    }
}

impl ArenaRegion {
    pub(crate) fn new(arena: &Arc<HostArena>, r: Region) -> Result<ArenaRegion> {
        if r.offset
            .checked_add(r.bytes)
            .is_none_or(|e| e > arena.bytes)
        {
            return Err(Error::Other(alloc::format!(
                "planned region {}+{} lies outside an arena of {} bytes",
                r.offset,
                r.bytes,
                arena.bytes
            )));
        }
        Ok(ArenaRegion {
            arena: arena.clone(),
            offset: r.offset,
            bytes: r.bytes,
        })
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether this region is exactly `r` of `arena`.
    pub fn is(&self, arena: &Arc<HostArena>, r: Region) -> bool {
        Arc::ptr_eq(&self.arena, arena) && self.offset == r.offset && self.bytes == r.bytes
    }

    /// Whether two regions share bytes.
    pub fn overlaps(&self, o: &ArenaRegion) -> bool {
        Arc::ptr_eq(&self.arena, &o.arena)
            && self.offset < o.offset + o.bytes
            && o.offset < self.offset + self.bytes
    }

    /// The region's elements, read-only. Checks `T` against the tensor's type.
    pub(crate) fn elems<T: Elem>(&self, dt: DataType) -> Result<&[T]> {
        if T::DT != dt || !arena_dtype(dt) {
            return Err(Error::Other(alloc::format!(
                "expected a {} tensor, got {dt}",
                T::DT
            )));
        }
        let n = self.bytes / core::mem::size_of::<T>();
        // SAFETY: the region lies inside the arena (checked in `new`), is aligned for every
        // arena type (offsets are multiples of 64), T is a plain number type, and no `&mut` to
        // these bytes exists while tensors over them are read (see the module docs).
        Ok(unsafe {
            core::slice::from_raw_parts(self.arena.ptr.as_ptr().add(self.offset) as *const T, n)
        })
    }

    /// # Safety
    /// The caller must be the only one accessing these bytes while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn elems_mut<T: Elem>(&self) -> &mut [T] {
        let n = self.bytes / core::mem::size_of::<T>();
        core::slice::from_raw_parts_mut(self.arena.ptr.as_ptr().add(self.offset) as *mut T, n)
    }
}

/// Copies a region's elements into heap storage of type `dt`.
pub(crate) fn region_to_data(r: &ArenaRegion, dt: DataType) -> Result<Data> {
    macro_rules! take {
        ($t:ty) => {
            <$t as Elem>::wrap(r.elems::<$t>(dt)?.to_vec())
        };
    }
    Ok(match dt {
        DataType::Float => take!(f32),
        DataType::Double => take!(f64),
        DataType::Float16 => take!(half::f16),
        DataType::Bfloat16 => take!(half::bf16),
        DataType::Int8 => take!(i8),
        DataType::Int16 => take!(i16),
        DataType::Int32 => take!(i32),
        DataType::Int64 => take!(i64),
        DataType::Uint8 => take!(u8),
        DataType::Uint16 => take!(u16),
        DataType::Uint32 => take!(u32),
        DataType::Uint64 => take!(u64),
        other => {
            return Err(Error::Other(alloc::format!(
                "{other} tensors never live in the arena"
            )))
        }
    })
}

/// Bytes of `shape` elements of `dt` (an error when they overflow).
fn dt_bytes(dt: DataType, shape: &[usize]) -> Result<usize> {
    dt.storage_bytes(numel(shape)?)
        .ok_or_else(|| Error::Shape(alloc::format!("the bytes of {dt} {shape:?} overflow")))
}

/// What the executor tells a kernel about the current step's planned memory.
pub(crate) struct StepMem<'a> {
    pub arena: &'a Arc<HostArena>,
    /// Per node output: its planned region and element type.
    pub outs: &'a [Option<(Region, DataType)>],
    /// Output 0 reuses this input's bytes.
    pub in_place: Option<usize>,
    /// Outputs already handed out (bit k: output k).
    pub taken: AtomicU64,
}

enum Mem<T> {
    Heap(Vec<T>),
    Arena(ArenaRegion),
}

/// A kernel's output under construction: arena memory in a planned run, a heap vector
/// otherwise. Dereferences to the elements; [`OutBuf::into_tensor`] finishes it.
pub struct OutBuf<T: Elem> {
    dtype: DataType,
    shape: Vec<usize>,
    mem: Mem<T>,
    /// The governor's lease on heap memory, passed on to the tensor.
    lease: Option<Arc<Lease>>,
    /// Heap memory the caller bound (I/O binding): it holds old values, not zeros.
    reused: bool,
}

impl<T: Elem> OutBuf<T> {
    /// A heap buffer of zeros.
    pub fn heap(shape: &[usize]) -> Result<OutBuf<T>> {
        let n = numel(shape)?;
        let v = T::take(Data::zeros(T::DT, n)?)
            .ok_or_else(|| Error::Other(alloc::format!("no vector type for {}", T::DT)))?;
        Ok(OutBuf {
            dtype: T::DT,
            shape: shape.to_vec(),
            mem: Mem::Heap(v),
            lease: None,
            reused: false,
        })
    }

    /// A heap buffer holding `v`, which has the shape's element count.
    pub fn from_vec(shape: &[usize], v: Vec<T>) -> Result<OutBuf<T>> {
        if numel(shape)? != v.len() {
            return Err(Error::Shape(alloc::format!(
                "{} elements for shape {shape:?}",
                v.len()
            )));
        }
        Ok(OutBuf {
            dtype: T::DT,
            shape: shape.to_vec(),
            mem: Mem::Heap(v),
            lease: None,
            reused: false,
        })
    }

    /// Whether this buffer is planned arena memory.
    pub fn in_arena(&self) -> bool {
        matches!(self.mem, Mem::Arena(_))
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements as a heap vector (a copy when they are in the arena).
    pub fn into_vec(self) -> Vec<T> {
        match self.mem {
            Mem::Heap(v) => v,
            Mem::Arena(r) => r
                .elems::<T>(self.dtype)
                .map(|s| s.to_vec())
                .unwrap_or_default(),
        }
    }

    pub fn into_tensor(self) -> Tensor {
        match self.mem {
            Mem::Heap(v) => {
                let mut t = Tensor::from_vec(&self.shape, v)
                    .expect("an OutBuf's vector always matches its shape");
                if let Some(l) = self.lease {
                    t.set_lease(l);
                }
                t
            }
            Mem::Arena(r) => Tensor::from_arena(self.dtype, self.shape, r),
        }
    }
}

/// An output a kernel writes whole through a raw pointer (threads writing disjoint elements,
/// none read before written): its planned arena region, or a fresh vector that is never
/// zero-filled first (a graph output, an eager run).
pub struct RawOut<T: Elem> {
    planned: Option<OutBuf<T>>,
    fresh: Vec<T>,
    shape: Vec<usize>,
    n: usize,
    lease: Option<Arc<Lease>>,
}

impl<T: Elem> RawOut<T> {
    /// The element count.
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Fills a fresh vector with zeros (a planned region is left as it is), for a kernel that
    /// writes it through slices rather than the raw pointer.
    pub fn zero_fresh(&mut self)
    where
        T: Default + Clone,
    {
        if self.planned.is_none() {
            // a bound vector (I/O binding) is initialised already: left as it is, as a
            // planned region is
            self.fresh.resize(self.n, T::default());
        }
    }

    /// The first element's address; `len()` elements from it are the output's.
    pub fn as_mut_ptr(&mut self) -> *mut T {
        match &mut self.planned {
            Some(b) => b.as_mut_ptr(),
            None => self.fresh.as_mut_ptr(),
        }
    }

    /// The output buffer, once every element is written.
    ///
    /// # Safety
    /// Every one of the `len()` elements from [`RawOut::as_mut_ptr`] must have been written.
    pub unsafe fn assume_written(self) -> Result<OutBuf<T>> {
        match self.planned {
            Some(b) => Ok(b),
            None => {
                let mut v = self.fresh;
                // SAFETY: capacity n (reserved in output_raw), all n written (the caller's
                // promise)
                unsafe { v.set_len(self.n) };
                let mut b = OutBuf::from_vec(&self.shape, v)?;
                b.lease = self.lease;
                Ok(b)
            }
        }
    }
}

impl<T: Elem> Deref for OutBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.mem {
            Mem::Heap(v) => v,
            Mem::Arena(r) => r
                .elems::<T>(self.dtype)
                .expect("an OutBuf's region holds its own type"),
        }
    }
}

impl<T: Elem> DerefMut for OutBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.mem {
            Mem::Heap(v) => v,
            // SAFETY: the executor hands each planned region out once per step, to the output
            // it was planned for; no live value overlaps it (planner invariant) except the input
            // of an in-place step, which the kernel reads through this buffer instead.
            Mem::Arena(r) => unsafe { r.elems_mut::<T>() },
        }
    }
}

impl<'a> KernelCx<'a> {
    /// A context for running a kernel outside a planned run (outputs on the heap).
    pub fn new(cpu: &'a dyn CpuBackend) -> KernelCx<'a> {
        KernelCx {
            cpu,
            mem: None,
            account: None,
            bound: None,
            weights: None,
        }
    }

    /// The storage bound to output `k` (I/O binding) as a vector of `shape`'s element count,
    /// with its lease: only when it is unshared, contiguous host storage of type `T` and of
    /// that many elements. Its contents are the previous run's.
    fn bound<T: Elem>(&self, k: usize, shape: &[usize]) -> Option<(Vec<T>, Option<Arc<Lease>>)> {
        let slot = self.bound?.lock().get_mut(k)?.take()?;
        if slot.dtype() != T::DT || slot.len() != numel(shape).ok()? {
            return None;
        }
        slot.take_storage::<T>()
    }

    fn planned(&self, k: usize, dt: DataType, shape: &[usize]) -> Option<ArenaRegion> {
        let m = self.mem.as_ref()?;
        if k >= 64 || (k == 0 && m.in_place.is_some()) || !arena_dtype(dt) {
            return None;
        }
        let (r, pdt) = (*m.outs.get(k)?)?;
        if pdt != dt {
            return None;
        }
        let bytes = dt.storage_bytes(numel(shape).ok()?)?;
        if bytes != r.bytes || bytes == 0 {
            return None;
        }
        if m.taken.fetch_or(1 << k, Ordering::Relaxed) & (1 << k) != 0 {
            return None;
        }
        ArenaRegion::new(m.arena, r).ok()
    }

    /// Memory for output `k` of `shape`. Its contents are unspecified (zeros, or what the arena
    /// held before): the kernel must write every element.
    pub fn output<T: Elem>(&self, k: usize, shape: &[usize]) -> Result<OutBuf<T>> {
        match self.planned(k, T::DT, shape) {
            Some(r) => Ok(OutBuf {
                dtype: T::DT,
                shape: shape.to_vec(),
                mem: Mem::Arena(r),
                lease: None,
                reused: false,
            }),
            None => {
                if let Some((v, lease)) = self.bound::<T>(k, shape) {
                    return Ok(OutBuf {
                        dtype: T::DT,
                        shape: shape.to_vec(),
                        mem: Mem::Heap(v),
                        lease,
                        reused: true,
                    });
                }
                let lease = self.lease_output(dt_bytes(T::DT, shape)?)?;
                let mut b = OutBuf::heap(shape)?;
                b.lease = lease;
                Ok(b)
            }
        }
    }

    /// Leases `bytes` of host memory for an output this kernel is about to make on the heap
    /// (from the session's account, or the process's budget alone): over a budget, the error
    /// comes before the memory is allocated. [`KernelCx::output`] and
    /// [`KernelCx::output_raw`] do it themselves.
    /// Storage under [`crate::governor::SMALL`] bytes takes no lease (`None`).
    pub fn lease_output(&self, bytes: usize) -> Result<Option<Arc<Lease>>> {
        if bytes < crate::governor::SMALL {
            return Ok(None);
        }
        Lease::take(self.account, Tier::Host, Holder::Outputs, bytes, &|| {
            crate::governor::KERNEL.into()
        })
        .map(|l| Some(Arc::new(l)))
    }

    /// Memory for output `k` of `shape` that the kernel writes whole through a raw pointer
    /// (see [`RawOut`]): never zero-filled.
    pub fn output_raw<T: Elem>(&self, k: usize, shape: &[usize]) -> Result<RawOut<T>> {
        let n = numel(shape)?;
        let planned = self.output_planned::<T>(k, shape);
        let bound = if planned.is_none() {
            self.bound::<T>(k, shape)
        } else {
            None
        };
        let (fresh, lease) = if planned.is_some() {
            (Vec::new(), None)
        } else if let Some(b) = bound {
            b
        } else {
            let lease = self.lease_output(dt_bytes(T::DT, shape)?)?;
            (crate::governor::try_with_capacity(n)?, lease)
        };
        Ok(RawOut {
            planned,
            fresh,
            shape: shape.to_vec(),
            n,
            lease,
        })
    }

    /// Memory for output `k` of `shape`, filled with zeros.
    pub fn output_zeroed<T: Elem + Default>(&self, k: usize, shape: &[usize]) -> Result<OutBuf<T>> {
        let mut b = self.output::<T>(k, shape)?;
        if b.in_arena() || b.reused {
            b.fill(T::default());
        }
        Ok(b)
    }

    /// Output `k` in its planned arena region, or `None` where it has none (a graph output,
    /// an eager run): the kernel then makes its own vector (see [`OutBuf::from_vec`]).
    pub fn output_planned<T: Elem>(&self, k: usize, shape: &[usize]) -> Option<OutBuf<T>> {
        let r = self.planned(k, T::DT, shape)?;
        Some(OutBuf {
            dtype: T::DT,
            shape: shape.to_vec(),
            mem: Mem::Arena(r),
            lease: None,
            reused: false,
        })
    }

    /// Output 0 written over input `input` (which is `x`), when the plan made this step
    /// in-place and `x` is exactly its planned arena region. The buffer then holds `x`'s
    /// elements; the kernel must read them from the buffer, never from `x`.
    pub fn output_in_place<T: Elem>(&self, input: usize, x: &Tensor) -> Option<OutBuf<T>> {
        let m = self.mem.as_ref()?;
        if m.in_place != Some(input) || x.dtype() != T::DT || !x.is_whole_storage() {
            return None;
        }
        let (r, pdt) = (*m.outs.first()?)?;
        if pdt != T::DT {
            return None;
        }
        let xr = x.arena_region()?;
        if !xr.is(m.arena, r) {
            return None;
        }
        if m.taken.fetch_or(1, Ordering::Relaxed) & 1 != 0 {
            return None;
        }
        Some(OutBuf {
            dtype: T::DT,
            shape: x.shape().to_vec(),
            mem: Mem::Arena(xr.clone()),
            lease: None,
            reused: false,
        })
    }
}
