//! Tensors: element type + shape + strides over shared storage, so reshapes and friends are views.
//!
//! Host storage is a typed vector behind an `Arc`; device storage (WebGPU, CUDA) is an opaque
//! provider buffer. A tensor always knows where its bytes live ([`Location`]); moving between
//! locations is an explicit provider copy, never implicit.

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::any::Any;
use core::fmt;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::{Error, Result};

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory, readable by the CPU kernels.
    Host,
    /// Memory of a device provider, identified by the provider's index in the session.
    Device(u16),
}

/// Typed host storage.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I8(Vec<i8>),
    I16(Vec<i16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    U32(Vec<u32>),
    U64(Vec<u64>),
    Bool(Vec<bool>),
    Str(Vec<String>),
    /// Raw little-endian bytes for types without a native Rust element (complex, float8,
    /// packed 4- and 2-bit types; packed low bits first).
    Raw(Vec<u8>),
}

impl Data {
    /// Byte size of the storage (strings: sum of their lengths).
    pub fn byte_len(&self) -> usize {
        match self {
            Data::F32(v) => v.len() * 4,
            Data::F64(v) => v.len() * 8,
            Data::F16(v) => v.len() * 2,
            Data::BF16(v) => v.len() * 2,
            Data::I8(v) => v.len(),
            Data::I16(v) => v.len() * 2,
            Data::I32(v) => v.len() * 4,
            Data::I64(v) => v.len() * 8,
            Data::U8(v) => v.len(),
            Data::U16(v) => v.len() * 2,
            Data::U32(v) => v.len() * 4,
            Data::U64(v) => v.len() * 8,
            Data::Bool(v) => v.len(),
            Data::Str(v) => v.iter().map(|s| s.len()).sum(),
            Data::Raw(v) => v.len(),
        }
    }

    /// Bytes the storage holds for the memory governor (strings count their `String`
    /// values, not the text they hold).
    pub fn storage_bytes(&self) -> usize {
        match self {
            Data::Str(v) => v.len() * core::mem::size_of::<String>(),
            d => d.byte_len(),
        }
    }

    /// The storage's bytes (numeric and raw storage; `None` for strings).
    pub fn as_bytes(&self) -> Option<&[u8]> {
        fn b<T: Copy>(v: &[T]) -> &[u8] {
            // SAFETY: every T here is plain data without padding (numbers, bool, half floats);
            // the bytes are read only, for as long as `v` is borrowed
            unsafe {
                core::slice::from_raw_parts(v.as_ptr().cast::<u8>(), core::mem::size_of_val(v))
            }
        }
        Some(match self {
            Data::F32(v) => b(v),
            Data::F64(v) => b(v),
            Data::F16(v) => b(v),
            Data::BF16(v) => b(v),
            Data::I8(v) => b(v),
            Data::I16(v) => b(v),
            Data::I32(v) => b(v),
            Data::I64(v) => b(v),
            Data::U8(v) => v,
            Data::U16(v) => b(v),
            Data::U32(v) => b(v),
            Data::U64(v) => b(v),
            Data::Bool(v) => b(v),
            Data::Raw(v) => v,
            Data::Str(_) => return None,
        })
    }

    /// A number per storage variant (two storages hold the same values only when the variant
    /// and the bytes agree).
    pub(crate) fn kind_code(&self) -> u8 {
        match self {
            Data::F32(_) => 0,
            Data::F64(_) => 1,
            Data::F16(_) => 2,
            Data::BF16(_) => 3,
            Data::I8(_) => 4,
            Data::I16(_) => 5,
            Data::I32(_) => 6,
            Data::I64(_) => 7,
            Data::U8(_) => 8,
            Data::U16(_) => 9,
            Data::U32(_) => 10,
            Data::U64(_) => 11,
            Data::Bool(_) => 12,
            Data::Str(_) => 13,
            Data::Raw(_) => 14,
        }
    }

    /// Zero-filled storage for `n` elements of `dt`: an error, never an abort, when the
    /// system allocator refuses it ([`crate::governor::try_zeroed`]).
    pub fn zeros(dt: DataType, n: usize) -> Result<Data> {
        use crate::governor::try_zeroed as z;
        Ok(match dt {
            DataType::Float => Data::F32(z(n)?),
            DataType::Double => Data::F64(z(n)?),
            DataType::Float16 => Data::F16(z(n)?),
            DataType::Bfloat16 => Data::BF16(z(n)?),
            DataType::Int8 => Data::I8(z(n)?),
            DataType::Int16 => Data::I16(z(n)?),
            DataType::Int32 => Data::I32(z(n)?),
            DataType::Int64 => Data::I64(z(n)?),
            DataType::Uint8 => Data::U8(z(n)?),
            DataType::Uint16 => Data::U16(z(n)?),
            DataType::Uint32 => Data::U32(z(n)?),
            DataType::Uint64 => Data::U64(z(n)?),
            DataType::Bool => Data::Bool(z(n)?),
            DataType::String => {
                let mut v = crate::governor::try_with_capacity(n)?;
                v.resize(n, String::new());
                Data::Str(v)
            }
            other => Data::Raw(z(other
                .storage_bytes(n)
                .ok_or_else(|| Error::Shape("size overflow".into()))?)?),
        })
    }
}

/// A Rust element type that maps to one ONNX element type and one [`Data`] variant.
pub trait Elem: Clone + Send + Sync + 'static + fmt::Debug {
    const DT: DataType;
    fn slice(d: &Data) -> Option<&[Self]>;
    fn slice_mut(d: &mut Data) -> Option<&mut Vec<Self>>;
    fn wrap(v: Vec<Self>) -> Data;
    fn take(d: Data) -> Option<Vec<Self>>;
}

macro_rules! elem {
    ($t:ty, $dt:ident, $var:ident) => {
        impl Elem for $t {
            const DT: DataType = DataType::$dt;
            #[inline]
            fn slice(d: &Data) -> Option<&[Self]> {
                if let Data::$var(v) = d {
                    Some(v)
                } else {
                    None
                }
            }
            #[inline]
            fn slice_mut(d: &mut Data) -> Option<&mut Vec<Self>> {
                if let Data::$var(v) = d {
                    Some(v)
                } else {
                    None
                }
            }
            #[inline]
            fn wrap(v: Vec<Self>) -> Data {
                Data::$var(v)
            }
            #[inline]
            fn take(d: Data) -> Option<Vec<Self>> {
                if let Data::$var(v) = d {
                    Some(v)
                } else {
                    None
                }
            }
        }
    };
}
elem!(f32, Float, F32);
elem!(f64, Double, F64);
elem!(f16, Float16, F16);
elem!(bf16, Bfloat16, BF16);
elem!(i8, Int8, I8);
elem!(i16, Int16, I16);
elem!(i32, Int32, I32);
elem!(i64, Int64, I64);
elem!(u8, Uint8, U8);
elem!(u16, Uint16, U16);
elem!(u32, Uint32, U32);
elem!(u64, Uint64, U64);
elem!(bool, Bool, Bool);
elem!(String, String, Str);

/// A buffer owned by a device provider. Providers downcast through `as_any`.
pub trait DeviceBuffer: Send + Sync + fmt::Debug {
    fn as_any(&self) -> &dyn Any;
    fn byte_len(&self) -> usize;
    /// The governor's lease on this buffer's device memory, if its provider took one.
    fn lease(&self) -> Option<&crate::governor::Lease> {
        None
    }
}

/// The storage behind a tensor.
#[derive(Clone, Debug)]
pub enum Buffer {
    /// Heap storage, with the memory governor's lease on it when a session's executor or a
    /// kernel took one ([`crate::governor`]; shared by every view, returned when the last
    /// one drops).
    Host(Arc<Data>, Option<Arc<crate::governor::Lease>>),
    /// A region of a planned run's host arena (see [`crate::arena`]); numeric types only.
    Arena(crate::arena::ArenaRegion),
    Device {
        provider: u16,
        buf: Arc<dyn DeviceBuffer>,
    },
}

/// Checked product of dims: an error, not an overflow, for absurd shapes.
pub fn numel(shape: &[usize]) -> Result<usize> {
    shape.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| Error::Shape(alloc::format!("element count of {shape:?} overflows")))
    })
}

/// Row-major strides (in elements) for a shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = acc;
        acc = acc.wrapping_mul(shape[i] as isize);
    }
    s
}

/// An n-dimensional array: element type, shape and strides over shared storage.
#[derive(Clone)]
pub struct Tensor {
    dtype: DataType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    offset: usize,
    buf: Buffer,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor<{}>{:?}", self.dtype, self.shape)
    }
}

impl Tensor {
    /// A contiguous tensor over typed data; checks that the length matches the shape.
    pub fn from_vec<T: Elem>(shape: &[usize], v: Vec<T>) -> Result<Tensor> {
        let n = numel(shape)?;
        if n != v.len() {
            return Err(Error::Shape(alloc::format!(
                "data has {} elements but shape {:?} needs {}",
                v.len(),
                shape,
                n
            )));
        }
        Ok(Self::from_data_unchecked(T::DT, shape.to_vec(), T::wrap(v)))
    }

    /// A contiguous tensor over [`Data`]; checks the variant and length against `dtype`/`shape`.
    pub fn from_data(dtype: DataType, shape: Vec<usize>, data: Data) -> Result<Tensor> {
        let n = numel(&shape)?;
        let ok = match (&data, dtype) {
            (Data::Raw(v), dt) => {
                !matches!(
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
                        | DataType::Bool
                        | DataType::String
                ) && Some(v.len()) == dt.storage_bytes(n)
            }
            (d, dt) => data_dtype(d) == Some(dt) && data_len(d) == n,
        };
        if !ok {
            return Err(Error::Shape(alloc::format!(
                "storage does not match {dtype} tensor of shape {shape:?}"
            )));
        }
        Ok(Self::from_data_unchecked(dtype, shape, data))
    }

    fn from_data_unchecked(dtype: DataType, shape: Vec<usize>, data: Data) -> Tensor {
        let strides = contiguous_strides(&shape);
        Tensor {
            dtype,
            shape,
            strides,
            offset: 0,
            buf: Buffer::Host(Arc::new(data), None),
        }
    }

    /// A zero-filled host tensor.
    pub fn zeros(dtype: DataType, shape: &[usize]) -> Result<Tensor> {
        let n = numel(shape)?;
        Ok(Self::from_data_unchecked(
            dtype,
            shape.to_vec(),
            Data::zeros(dtype, n)?,
        ))
    }

    pub fn scalar<T: Elem>(v: T) -> Tensor {
        Self::from_data_unchecked(T::DT, Vec::new(), T::wrap(vec![v]))
    }

    /// A tensor in device memory (built by providers).
    pub fn from_device(
        dtype: DataType,
        shape: Vec<usize>,
        provider: u16,
        buf: Arc<dyn DeviceBuffer>,
    ) -> Tensor {
        let strides = contiguous_strides(&shape);
        Tensor {
            dtype,
            shape,
            strides,
            offset: 0,
            buf: Buffer::Device { provider, buf },
        }
    }

    #[inline]
    pub fn dtype(&self) -> DataType {
        self.dtype
    }
    #[inline]
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    #[inline]
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }
    #[inline]
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Number of elements (shapes are validated at construction, so this cannot overflow).
    #[inline]
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn location(&self) -> Location {
        match &self.buf {
            Buffer::Host(..) | Buffer::Arena(_) => Location::Host,
            Buffer::Device { provider, .. } => Location::Device(*provider),
        }
    }
    /// The device buffer behind a device tensor (`None` for host and arena tensors).
    pub fn device_buffer(&self) -> Option<&Arc<dyn DeviceBuffer>> {
        match &self.buf {
            Buffer::Device { buf, .. } => Some(buf),
            _ => None,
        }
    }

    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }
    /// The memory governor's lease on this tensor's storage, if one was taken.
    pub fn lease(&self) -> Option<&crate::governor::Lease> {
        match &self.buf {
            Buffer::Host(_, l) => l.as_deref(),
            _ => None,
        }
    }
    /// Charges this tensor's storage to `holder`: a lease it has (host or device) is moved
    /// there ([`crate::governor::Lease::relabel`]), heap storage without one is leased from
    /// `account` (fallible: over a budget, [`Error::OutOfMemory`] naming `what`).
    pub fn hold_as(
        &mut self,
        account: Option<&Arc<crate::governor::Account>>,
        holder: crate::governor::Holder,
        what: &dyn Fn() -> alloc::string::String,
    ) -> Result<()> {
        match &self.buf {
            Buffer::Host(_, Some(l)) => l.relabel(holder),
            Buffer::Host(_, None) => self.lease_unleased(account, holder, what)?,
            Buffer::Device { buf, .. } => {
                if let Some(l) = buf.lease() {
                    l.relabel(holder);
                }
            }
            Buffer::Arena(_) => {}
        }
        Ok(())
    }

    /// Leases heap storage no lease covers yet (from `account` for `holder`; storage under
    /// [`crate::governor::SMALL`] bytes takes none); a lease it has is left as it is.
    pub(crate) fn lease_unleased(
        &mut self,
        account: Option<&Arc<crate::governor::Account>>,
        holder: crate::governor::Holder,
        what: &dyn Fn() -> alloc::string::String,
    ) -> Result<()> {
        if self.needs_lease() {
            let bytes = self.storage_bytes();
            if bytes >= crate::governor::SMALL {
                let l = crate::governor::Lease::take(
                    account,
                    crate::governor::Tier::Host,
                    holder,
                    bytes,
                    what,
                )?;
                self.set_lease(Arc::new(l));
            }
        }
        Ok(())
    }

    /// Whether this is heap storage no lease covers yet.
    pub(crate) fn needs_lease(&self) -> bool {
        matches!(self.buf, Buffer::Host(_, None))
    }
    /// Gives this tensor's storage `lease` (its views made from now on share it).
    pub(crate) fn set_lease(&mut self, lease: impl Into<Option<Arc<crate::governor::Lease>>>) {
        if let (Some(l), Buffer::Host(_, slot)) = (lease.into(), &mut self.buf) {
            *slot = Some(l);
        }
    }
    /// Replaces the heap storage behind this tensor with `data` and its `lease` (the same
    /// bytes, shared with other holders).
    pub(crate) fn set_host_storage(&mut self, data: Arc<Data>, lease: Arc<crate::governor::Lease>) {
        if let Buffer::Host(d, l) = &mut self.buf {
            *d = data;
            *l = Some(lease);
        }
    }
    /// The heap storage behind this tensor.
    pub(crate) fn host_storage(&self) -> Option<&Arc<Data>> {
        match &self.buf {
            Buffer::Host(d, _) => Some(d),
            _ => None,
        }
    }
    /// Bytes of the whole storage behind this tensor (all of it, not only this view's).
    /// (Strings count their `String` values, not the text they hold.)
    pub fn storage_bytes(&self) -> usize {
        match &self.buf {
            Buffer::Host(d, _) => d.storage_bytes(),
            Buffer::Arena(r) => r.bytes(),
            Buffer::Device { buf, .. } => buf.byte_len(),
        }
    }
    /// Host storage, or `None` for device tensors.
    pub fn host_data(&self) -> Option<&Data> {
        match &self.buf {
            Buffer::Host(d, _) => Some(d),
            _ => None,
        }
    }
    /// True when both tensors view the same storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        match (&self.buf, &other.buf) {
            (Buffer::Host(a, _), Buffer::Host(b, _)) => Arc::ptr_eq(a, b),
            (Buffer::Arena(a), Buffer::Arena(b)) => a.overlaps(b),
            (Buffer::Device { buf: a, .. }, Buffer::Device { buf: b, .. }) => {
                core::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            _ => false,
        }
    }

    /// Bytes this tensor's elements occupy (not the whole shared storage).
    pub fn byte_size(&self) -> usize {
        match self.host_data() {
            Some(Data::Str(v)) if self.is_full_contiguous() => v.iter().map(|s| s.len()).sum(),
            _ => self.dtype.storage_bytes(self.len()).unwrap_or(usize::MAX),
        }
    }

    pub fn is_contiguous(&self) -> bool {
        let mut acc = 1isize;
        for i in (0..self.shape.len()).rev() {
            if self.shape[i] != 1 && self.strides[i] != acc {
                return false;
            }
            acc *= self.shape[i] as isize;
        }
        true
    }

    fn is_full_contiguous(&self) -> bool {
        self.offset == 0
            && self.is_contiguous()
            && match &self.buf {
                Buffer::Host(d, _) => data_len(d) == self.len(),
                Buffer::Arena(r) => Some(r.bytes()) == self.dtype.storage_bytes(self.len()),
                Buffer::Device { .. } => false,
            }
    }

    /// Whether this tensor is the only user of its whole, contiguous host storage, so that
    /// [`Tensor::into_vec`] takes the storage without a copy.
    pub fn is_unique_host(&self) -> bool {
        self.is_full_contiguous()
            && matches!(&self.buf, Buffer::Host(d, _) if Arc::strong_count(d) == 1 && Arc::weak_count(d) == 0)
    }

    /// Whether this tensor is the only user of its device buffer (no view, no other tensor
    /// shares it), so a device kernel may write over it.
    pub fn is_unique_device(&self) -> bool {
        self.offset == 0
            && self.is_contiguous()
            && matches!(&self.buf, Buffer::Device { buf, .. } if Arc::strong_count(buf) == 1 && Arc::weak_count(buf) == 0)
    }

    /// A tensor in a planned run's arena (built by the executor and [`crate::arena::OutBuf`]).
    pub(crate) fn from_arena(
        dtype: DataType,
        shape: Vec<usize>,
        region: crate::arena::ArenaRegion,
    ) -> Tensor {
        let strides = contiguous_strides(&shape);
        Tensor {
            dtype,
            shape,
            strides,
            offset: 0,
            buf: Buffer::Arena(region),
        }
    }

    /// The arena region this tensor views, if it lives in a planned run's arena.
    pub fn arena_region(&self) -> Option<&crate::arena::ArenaRegion> {
        match &self.buf {
            Buffer::Arena(r) => Some(r),
            _ => None,
        }
    }

    /// True when this tensor is exactly the whole of its storage, contiguous and unsliced.
    pub fn is_whole_storage(&self) -> bool {
        self.is_full_contiguous()
    }

    /// The same tensor with its elements copied out of the arena into heap storage (a plain
    /// clone when it is not in an arena). Outputs leave a planned run this way.
    pub fn detach_arena(&self) -> Result<Tensor> {
        let Buffer::Arena(r) = &self.buf else {
            return Ok(self.clone());
        };
        let data = crate::arena::region_to_data(r, self.dtype)?;
        let t = Tensor {
            dtype: self.dtype,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            offset: self.offset,
            buf: Buffer::Host(Arc::new(data), None),
        };
        if t.is_full_contiguous() {
            Ok(t)
        } else {
            t.contiguous()
        }
    }

    fn require_host(&self) -> Result<&Data> {
        self.host_data().ok_or_else(|| {
            Error::Provider(alloc::format!(
                "tensor is in device memory ({:?}); copy it to the host first",
                self.location()
            ))
        })
    }

    /// The elements in row-major order: borrowed when contiguous, gathered otherwise.
    pub fn as_slice<T: Elem>(&self) -> Result<Cow<'_, [T]>> {
        if let Buffer::Arena(r) = &self.buf {
            let s = r.elems::<T>(self.dtype)?;
            return Ok(if self.is_contiguous() {
                Cow::Borrowed(&s[self.offset..self.offset + self.len()])
            } else {
                Cow::Owned(gather_strided(s, &self.shape, &self.strides, self.offset))
            });
        }
        let d = self.require_host()?;
        let s = T::slice(d).ok_or_else(|| {
            Error::Other(alloc::format!(
                "expected a {} tensor, got {}",
                T::DT,
                self.dtype
            ))
        })?;
        if self.is_contiguous() {
            Ok(Cow::Borrowed(&s[self.offset..self.offset + self.len()]))
        } else {
            Ok(Cow::Owned(gather_strided(
                s,
                &self.shape,
                &self.strides,
                self.offset,
            )))
        }
    }

    /// The elements as an owned vector; takes the storage without a copy when this tensor is
    /// its only, full, contiguous user.
    pub fn into_vec<T: Elem>(self) -> Result<Vec<T>> {
        if self.is_full_contiguous() {
            if let Buffer::Host(arc, lease) = self.buf {
                return match Arc::try_unwrap(arc) {
                    Ok(d) => T::take(d).ok_or_else(|| {
                        Error::Other(alloc::format!(
                            "expected a {} tensor, got {}",
                            T::DT,
                            self.dtype
                        ))
                    }),
                    Err(arc) => {
                        let t = Tensor {
                            buf: Buffer::Host(arc, lease),
                            ..Tensor::zeros_like_meta(self.dtype, &self.shape)
                        };
                        Ok(t.as_slice::<T>()?.into_owned())
                    }
                };
            }
        }
        Ok(self.as_slice::<T>()?.into_owned())
    }

    /// This tensor's heap vector and lease, taken without a copy: only when it is the only
    /// user of full, contiguous host storage of type `T` (`None` otherwise; the tensor drops).
    pub(crate) fn take_storage<T: Elem>(
        self,
    ) -> Option<(Vec<T>, Option<Arc<crate::governor::Lease>>)> {
        if T::DT != self.dtype || !self.is_full_contiguous() {
            return None;
        }
        match self.buf {
            Buffer::Host(arc, lease) => {
                let d = Arc::try_unwrap(arc).ok()?;
                Some((T::take(d)?, lease))
            }
            _ => None,
        }
    }

    fn zeros_like_meta(dtype: DataType, shape: &[usize]) -> Tensor {
        Tensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            buf: Buffer::Host(Arc::new(Data::U8(Vec::new())), None),
        }
    }

    /// Raw storage bytes of a packed/raw tensor (float8, int4, complex, ...).
    pub fn raw_bytes(&self) -> Result<&[u8]> {
        match self.require_host()? {
            Data::Raw(v) if self.offset == 0 => Ok(v),
            _ => Err(Error::Other(alloc::format!(
                "{} tensor has no raw storage",
                self.dtype
            ))),
        }
    }

    /// A contiguous copy (or the same tensor when already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        if let Buffer::Arena(_) = &self.buf {
            return self.detach_arena();
        }
        let d = self.require_host()?;
        macro_rules! g {
            ($v:expr, $var:ident) => {
                Data::$var(gather_strided($v, &self.shape, &self.strides, self.offset))
            };
        }
        let data = match d {
            Data::F32(v) => g!(v, F32),
            Data::F64(v) => g!(v, F64),
            Data::F16(v) => g!(v, F16),
            Data::BF16(v) => g!(v, BF16),
            Data::I8(v) => g!(v, I8),
            Data::I16(v) => g!(v, I16),
            Data::I32(v) => g!(v, I32),
            Data::I64(v) => g!(v, I64),
            Data::U8(v) => g!(v, U8),
            Data::U16(v) => g!(v, U16),
            Data::U32(v) => g!(v, U32),
            Data::U64(v) => g!(v, U64),
            Data::Bool(v) => g!(v, Bool),
            Data::Str(v) => g!(v, Str),
            Data::Raw(_) => {
                return Err(Error::Other(alloc::format!(
                    "strided views of packed {} tensors are not supported",
                    self.dtype
                )))
            }
        };
        Ok(Self::from_data_unchecked(
            self.dtype,
            self.shape.clone(),
            data,
        ))
    }

    /// A view with a new shape (same element count). Copies only if not contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if numel(shape)? != self.len() {
            return Err(Error::Shape(alloc::format!(
                "cannot reshape {:?} ({} elements) to {:?}",
                self.shape,
                self.len(),
                shape
            )));
        }
        let base = self.contiguous()?;
        Ok(Tensor {
            dtype: base.dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: base.offset,
            buf: base.buf,
        })
    }

    /// A view with permuted axes (no copy).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        if perm.len() != self.rank() {
            return Err(Error::Shape(alloc::format!(
                "permutation {perm:?} does not match rank {}",
                self.rank()
            )));
        }
        let mut seen = vec![false; perm.len()];
        for &p in perm {
            if p >= perm.len() || seen[p] {
                return Err(Error::Shape(alloc::format!("invalid permutation {perm:?}")));
            }
            seen[p] = true;
        }
        if self.dtype.is_sub_byte() {
            return Err(Error::Other(alloc::format!(
                "cannot permute packed {} tensor",
                self.dtype
            )));
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
            buf: self.buf.clone(),
        })
    }

    /// A view of `[start, start+len)` along `axis` with `step` (no copy).
    pub fn slice_axis(&self, axis: usize, start: usize, len: usize, step: isize) -> Result<Tensor> {
        if axis >= self.rank() || self.dtype.is_sub_byte() {
            return Err(Error::Shape(alloc::format!(
                "cannot slice axis {axis} of {:?}",
                self.shape
            )));
        }
        let mut t = self.clone();
        let off = self.offset as isize + start as isize * self.strides[axis];
        if len > 0 && off < 0 {
            return Err(Error::Shape("slice out of range".into()));
        }
        t.offset = off.max(0) as usize;
        t.shape[axis] = len;
        t.strides[axis] = self.strides[axis] * step;
        Ok(t)
    }

    /// A view that broadcasts this tensor to `shape` with zero strides (no copy).
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        if shape.len() < self.rank() {
            return Err(Error::Shape(alloc::format!(
                "cannot broadcast {:?} to {:?}",
                self.shape,
                shape
            )));
        }
        let pad = shape.len() - self.rank();
        let mut strides = vec![0isize; shape.len()];
        for i in 0..self.rank() {
            let (d, s) = (self.shape[i], shape[pad + i]);
            if d == s {
                strides[pad + i] = self.strides[i];
            } else if d == 1 {
                strides[pad + i] = 0;
            } else {
                return Err(Error::Shape(alloc::format!(
                    "cannot broadcast {:?} to {:?}",
                    self.shape,
                    shape
                )));
            }
        }
        Ok(Tensor {
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
            buf: self.buf.clone(),
        })
    }

    /// Element values converted to f32 (for float and integer types).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let t = self.detach_arena()?.contiguous()?;
        let d = t.require_host()?;
        let r = t.offset..t.offset + t.len();
        Ok(match d {
            Data::F32(v) => v[r].to_vec(),
            Data::F64(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::F16(v) => v[r].iter().map(|x| x.to_f32()).collect(),
            Data::BF16(v) => v[r].iter().map(|x| x.to_f32()).collect(),
            Data::I8(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::I16(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::I32(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::I64(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::U8(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::U16(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::U32(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::U64(v) => v[r].iter().map(|&x| x as f32).collect(),
            Data::Bool(v) => v[r].iter().map(|&x| x as u8 as f32).collect(),
            _ => {
                return Err(Error::Other(alloc::format!(
                    "cannot read {} as float",
                    self.dtype
                )))
            }
        })
    }

    /// Element values converted to i64 (integer and bool types; floats truncate).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        let t = self.detach_arena()?.contiguous()?;
        let d = t.require_host()?;
        let r = t.offset..t.offset + t.len();
        Ok(match d {
            Data::I64(v) => v[r].to_vec(),
            Data::I32(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::I16(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::I8(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::U8(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::U16(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::U32(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::U64(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::Bool(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::F32(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::F64(v) => v[r].iter().map(|&x| x as i64).collect(),
            Data::F16(v) => v[r].iter().map(|x| x.to_f32() as i64).collect(),
            _ => {
                return Err(Error::Other(alloc::format!(
                    "cannot read {} as integer",
                    self.dtype
                )))
            }
        })
    }
}

fn data_dtype(d: &Data) -> Option<DataType> {
    Some(match d {
        Data::F32(_) => DataType::Float,
        Data::F64(_) => DataType::Double,
        Data::F16(_) => DataType::Float16,
        Data::BF16(_) => DataType::Bfloat16,
        Data::I8(_) => DataType::Int8,
        Data::I16(_) => DataType::Int16,
        Data::I32(_) => DataType::Int32,
        Data::I64(_) => DataType::Int64,
        Data::U8(_) => DataType::Uint8,
        Data::U16(_) => DataType::Uint16,
        Data::U32(_) => DataType::Uint32,
        Data::U64(_) => DataType::Uint64,
        Data::Bool(_) => DataType::Bool,
        Data::Str(_) => DataType::String,
        Data::Raw(_) => return None,
    })
}

fn data_len(d: &Data) -> usize {
    match d {
        Data::F32(v) => v.len(),
        Data::F64(v) => v.len(),
        Data::F16(v) => v.len(),
        Data::BF16(v) => v.len(),
        Data::I8(v) => v.len(),
        Data::I16(v) => v.len(),
        Data::I32(v) => v.len(),
        Data::I64(v) => v.len(),
        Data::U8(v) => v.len(),
        Data::U16(v) => v.len(),
        Data::U32(v) => v.len(),
        Data::U64(v) => v.len(),
        Data::Bool(v) => v.len(),
        Data::Str(v) => v.len(),
        Data::Raw(v) => v.len(),
    }
}

/// Copies a strided view into a new row-major vector.
pub fn gather_strided<T: Clone>(
    src: &[T],
    shape: &[usize],
    strides: &[isize],
    offset: usize,
) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = shape.len();
    if rank == 0 {
        out.push(src[offset].clone());
        return out;
    }
    let last = rank - 1;
    let (ld, ls) = (shape[last], strides[last]);
    let mut idx = vec![0usize; rank];
    let mut base = offset as isize;
    loop {
        let mut p = base;
        for _ in 0..ld {
            out.push(src[p as usize].clone());
            p += ls;
        }
        // advance the outer index
        let mut ax = last;
        loop {
            if ax == 0 {
                return out;
            }
            ax -= 1;
            idx[ax] += 1;
            base += strides[ax];
            if idx[ax] < shape[ax] {
                break;
            }
            base -= strides[ax] * shape[ax] as isize;
            idx[ax] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reshape_is_a_view() {
        let t = Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let r = t.reshape(&[3, 2]).unwrap();
        assert!(r.shares_storage(&t));
        assert_eq!(r.shape(), &[3, 2]);
    }

    #[test]
    fn permute_then_gather() {
        let t = Tensor::from_vec(&[2, 3], vec![1i32, 2, 3, 4, 5, 6]).unwrap();
        let p = t.permute(&[1, 0]).unwrap();
        assert!(!p.is_contiguous());
        assert_eq!(&*p.as_slice::<i32>().unwrap(), &[1, 4, 2, 5, 3, 6]);
        let c = p.contiguous().unwrap();
        assert!(!c.shares_storage(&t));
    }

    #[test]
    fn broadcast_view() {
        let t = Tensor::from_vec(&[3], vec![1u8, 2, 3]).unwrap();
        let b = t.broadcast_to(&[2, 3]).unwrap();
        assert_eq!(&*b.as_slice::<u8>().unwrap(), &[1, 2, 3, 1, 2, 3]);
    }

    #[test]
    fn absurd_shape_is_an_error() {
        assert!(Tensor::zeros(DataType::Float, &[usize::MAX, 4]).is_err());
        assert!(Tensor::from_vec(&[2, 2], vec![1f32]).is_err());
    }

    #[test]
    fn negative_step_slice() {
        let t = Tensor::from_vec(&[5], vec![0i64, 1, 2, 3, 4]).unwrap();
        let s = t.slice_axis(0, 4, 3, -2).unwrap();
        assert_eq!(&*s.as_slice::<i64>().unwrap(), &[4, 2, 0]);
    }
}
