//! The NumPy `.npy` format (versions 1-3): reading into tensors and writing tensors out.

use alloc::string::String;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::loader::{tensor_from_le_bytes, tensor_to_le_bytes};
use crate::tensor::{numel, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr_of(dt: DataType) -> Option<&'static str> {
    Some(match dt {
        DataType::Float => "<f4",
        DataType::Double => "<f8",
        DataType::Float16 => "<f2",
        DataType::Int8 => "|i1",
        DataType::Int16 => "<i2",
        DataType::Int32 => "<i4",
        DataType::Int64 => "<i8",
        DataType::Uint8 => "|u1",
        DataType::Uint16 => "<u2",
        DataType::Uint32 => "<u4",
        DataType::Uint64 => "<u8",
        DataType::Bool => "|b1",
        DataType::Complex64 => "<c8",
        DataType::Complex128 => "<c16",
        _ => return None,
    })
}

fn dtype_of(descr: &str) -> Option<DataType> {
    let d = descr.trim_start_matches(['<', '|', '=']);
    Some(match d {
        "f4" => DataType::Float,
        "f8" => DataType::Double,
        "f2" => DataType::Float16,
        "i1" => DataType::Int8,
        "i2" => DataType::Int16,
        "i4" => DataType::Int32,
        "i8" => DataType::Int64,
        "u1" => DataType::Uint8,
        "u2" => DataType::Uint16,
        "u4" => DataType::Uint32,
        "u8" => DataType::Uint64,
        "b1" => DataType::Bool,
        "c8" => DataType::Complex64,
        "c16" => DataType::Complex128,
        _ => return None,
    })
}

/// Whether `.npy` can hold this element type.
pub fn can_hold(dt: DataType) -> bool {
    descr_of(dt).is_some()
}

fn header_value<'a>(h: &'a str, key: &str) -> Option<&'a str> {
    let k = alloc::format!("'{key}'");
    let at = h.find(&k)? + k.len();
    let rest = h[at..].trim_start().strip_prefix(':')?.trim_start();
    Some(rest)
}

/// Parses `.npy` bytes into a tensor.
pub fn read_npy(bytes: &[u8]) -> Result<Tensor> {
    let bad = |m: &str| Error::Input(alloc::format!("not a valid .npy file: {m}"));
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("missing magic"));
    }
    let major = bytes[6];
    let (hlen, start): (usize, usize) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(bad("truncated header"));
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12,
            )
        }
        _ => return Err(bad("unknown version")),
    };
    let end = start
        .checked_add(hlen)
        .ok_or_else(|| bad("header length"))?;
    let header = core::str::from_utf8(
        bytes
            .get(start..end)
            .ok_or_else(|| bad("truncated header"))?,
    )
    .map_err(|_| bad("header is not text"))?;
    let descr = header_value(header, "descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or_else(|| bad("no descr"))?;
    let fortran = header_value(header, "fortran_order")
        .map(|r| r.starts_with("True"))
        .unwrap_or(false);
    let shape_s = header_value(header, "shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or_else(|| bad("no shape"))?;
    let mut shape = Vec::new();
    for p in shape_s.split(',') {
        let p = p.trim();
        if p.is_empty() {
            continue;
        }
        shape.push(p.parse::<usize>().map_err(|_| bad("bad shape"))?);
    }
    if descr.starts_with('>') {
        return Err(Error::Input(
            "big-endian .npy files are not supported".into(),
        ));
    }
    let dt = dtype_of(descr).ok_or_else(|| {
        Error::Input(alloc::format!(
            ".npy element type '{descr}' is not supported"
        ))
    })?;
    let n = numel(&shape)?;
    let nbytes = dt.storage_bytes(n).ok_or_else(|| bad("too large"))?;
    let data = bytes
        .get(end..end.checked_add(nbytes).ok_or_else(|| bad("too large"))?)
        .ok_or_else(|| bad("data shorter than the shape says"))?;
    if fortran && shape.len() > 1 {
        let mut rev = shape.clone();
        rev.reverse();
        let t = tensor_from_le_bytes(dt, rev, data)?;
        let perm: Vec<usize> = (0..shape.len()).rev().collect();
        return t.permute(&perm)?.contiguous();
    }
    tensor_from_le_bytes(dt, shape, data)
}

/// Serialises a host tensor as `.npy` (version 1.0).
pub fn write_npy(t: &Tensor) -> Result<Vec<u8>> {
    let descr = descr_of(t.dtype())
        .ok_or_else(|| Error::Other(alloc::format!(".npy cannot hold {} tensors", t.dtype())))?;
    let mut shape = String::from("(");
    for (i, d) in t.shape().iter().enumerate() {
        shape.push_str(&alloc::format!("{d}"));
        if i + 1 < t.rank() || t.rank() == 1 {
            shape.push(',');
        }
        if i + 1 < t.rank() {
            shape.push(' ');
        }
    }
    shape.push(')');
    let mut header =
        alloc::format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // pad so that data starts at a multiple of 64 bytes, header ends with '\n'
    let total = 10 + header.len() + 1;
    let pad = (64 - total % 64) % 64;
    for _ in 0..pad {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.byte_size());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&tensor_to_le_bytes(t)?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = Tensor::from_vec(&[2, 3], alloc::vec![1f32, 2., 3., 4., 5., 6.]).unwrap();
        let b = write_npy(&t).unwrap();
        assert_eq!((10 + u16::from_le_bytes([b[8], b[9]]) as usize) % 64, 0);
        let r = read_npy(&b).unwrap();
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(&*r.as_slice::<f32>().unwrap(), &[1., 2., 3., 4., 5., 6.]);
    }

    #[test]
    fn truncated_is_an_error() {
        let t = Tensor::from_vec(&[4], alloc::vec![1i64, 2, 3, 4]).unwrap();
        let b = write_npy(&t).unwrap();
        assert!(read_npy(&b[..b.len() - 3]).is_err());
        assert!(read_npy(&b[..5]).is_err());
    }

    #[test]
    fn numpy_written_header() {
        // header exactly as numpy 2 writes a (3,) float32 array
        let mut b = alloc::vec::Vec::new();
        b.extend_from_slice(b"\x93NUMPY\x01\x00v\x00");
        let mut h = String::from("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        b[8] = h.len() as u8;
        b.extend_from_slice(h.as_bytes());
        for v in [1.5f32, -2.0, 3.25] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let t = read_npy(&b).unwrap();
        assert_eq!(&*t.as_slice::<f32>().unwrap(), &[1.5, -2.0, 3.25]);
    }
}
