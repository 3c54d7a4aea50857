//! Element types: every ONNX `TensorProto.DataType`, with its wire code, name and storage width.

use core::fmt;

/// An ONNX tensor element type. Discriminants are the ONNX wire codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(i32)]
pub enum DataType {
    Float = 1,
    Uint8 = 2,
    Int8 = 3,
    Uint16 = 4,
    Int16 = 5,
    Int32 = 6,
    Int64 = 7,
    String = 8,
    Bool = 9,
    Float16 = 10,
    Double = 11,
    Uint32 = 12,
    Uint64 = 13,
    Complex64 = 14,
    Complex128 = 15,
    Bfloat16 = 16,
    Float8E4M3FN = 17,
    Float8E4M3FNUZ = 18,
    Float8E5M2 = 19,
    Float8E5M2FNUZ = 20,
    Uint4 = 21,
    Int4 = 22,
    Float4E2M1 = 23,
    Float8E8M0 = 24,
    Uint2 = 25,
    Int2 = 26,
}

impl DataType {
    /// All element types, in wire-code order.
    pub const ALL: [DataType; 26] = [
        DataType::Float,
        DataType::Uint8,
        DataType::Int8,
        DataType::Uint16,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::String,
        DataType::Bool,
        DataType::Float16,
        DataType::Double,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Complex64,
        DataType::Complex128,
        DataType::Bfloat16,
        DataType::Float8E4M3FN,
        DataType::Float8E4M3FNUZ,
        DataType::Float8E5M2,
        DataType::Float8E5M2FNUZ,
        DataType::Uint4,
        DataType::Int4,
        DataType::Float4E2M1,
        DataType::Float8E8M0,
        DataType::Uint2,
        DataType::Int2,
    ];

    /// Decodes an ONNX wire code.
    pub fn from_code(code: i32) -> Option<DataType> {
        if (1..=26).contains(&code) {
            Some(Self::ALL[(code - 1) as usize])
        } else {
            None
        }
    }

    pub fn code(self) -> i32 {
        self as i32
    }

    /// The name the ONNX spec uses (`tensor(float)` style without the wrapper).
    pub fn name(self) -> &'static str {
        use DataType::*;
        match self {
            Float => "float",
            Uint8 => "uint8",
            Int8 => "int8",
            Uint16 => "uint16",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            String => "string",
            Bool => "bool",
            Float16 => "float16",
            Double => "double",
            Uint32 => "uint32",
            Uint64 => "uint64",
            Complex64 => "complex64",
            Complex128 => "complex128",
            Bfloat16 => "bfloat16",
            Float8E4M3FN => "float8e4m3fn",
            Float8E4M3FNUZ => "float8e4m3fnuz",
            Float8E5M2 => "float8e5m2",
            Float8E5M2FNUZ => "float8e5m2fnuz",
            Uint4 => "uint4",
            Int4 => "int4",
            Float4E2M1 => "float4e2m1",
            Float8E8M0 => "float8e8m0",
            Uint2 => "uint2",
            Int2 => "int2",
        }
    }

    /// Storage width in bits of one element (strings: 0, they are stored out of line).
    pub fn bits(self) -> usize {
        use DataType::*;
        match self {
            Bool | Uint8 | Int8 | Float8E4M3FN | Float8E4M3FNUZ | Float8E5M2 | Float8E5M2FNUZ
            | Float8E8M0 => 8,
            Uint16 | Int16 | Float16 | Bfloat16 => 16,
            Float | Int32 | Uint32 => 32,
            Double | Int64 | Uint64 | Complex64 => 64,
            Complex128 => 128,
            Uint4 | Int4 | Float4E2M1 => 4,
            Uint2 | Int2 => 2,
            String => 0,
        }
    }

    /// Bytes needed to store `n` elements (packed sub-byte types round up).
    pub fn storage_bytes(self, n: usize) -> Option<usize> {
        let bits = n.checked_mul(self.bits())?;
        Some(bits.div_ceil(8))
    }

    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
        )
    }

    pub fn is_float8(self) -> bool {
        matches!(
            self,
            DataType::Float8E4M3FN
                | DataType::Float8E4M3FNUZ
                | DataType::Float8E5M2
                | DataType::Float8E5M2FNUZ
                | DataType::Float8E8M0
        )
    }

    pub fn is_sub_byte(self) -> bool {
        self.bits() > 0 && self.bits() < 8
    }

    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
        )
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(
            self,
            DataType::Uint8 | DataType::Uint16 | DataType::Uint32 | DataType::Uint64
        )
    }

    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    /// True for types that `.npy` files can hold.
    pub fn npy_representable(self) -> bool {
        !(self == DataType::String
            || self == DataType::Bfloat16
            || self.is_float8()
            || self.is_sub_byte())
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for (i, dt) in DataType::ALL.iter().enumerate() {
            assert_eq!(dt.code(), i as i32 + 1);
            assert_eq!(DataType::from_code(dt.code()), Some(*dt));
        }
        assert_eq!(DataType::from_code(0), None);
        assert_eq!(DataType::from_code(27), None);
    }

    #[test]
    fn packed_storage() {
        assert_eq!(DataType::Int4.storage_bytes(3), Some(2));
        assert_eq!(DataType::Uint2.storage_bytes(5), Some(2));
        assert_eq!(DataType::Float.storage_bytes(usize::MAX), None);
    }
}
