//! The element-type groups kernel registrations declare, and the few ops that declare none.
//!
//! Every registration names the element types its type-deciding input may have
//! (`def(..).types(FLOATS)`, or `.types_at(i, ..)` for an input other than 0). The registry
//! checks that list at load against the inferred input type, so an unsupported element type is
//! an `Unsupported` error naming node, op, domain, opset and type, not a failure mid-run.
//!
//! A list says what the kernel's code handles (its `match` on the element type), not what the
//! ONNX spec allows. Where the code accepts more than makes sense only by accident (a float
//! shape read through `to_i64_vec`, say) the list keeps to the meaningful types: an error at load
//! is better than a quiet conversion. Inputs other than the declared one, and attributes that
//! select a narrower path, stay checked by the kernel at run time.

use crate::dtype::DataType::{self, *};

/// float, double, float16, bfloat16.
pub const FLOATS: &[DataType] = &[Float, Double, Float16, Bfloat16];

/// The eight fixed-width integer types.
pub const INTS: &[DataType] = &[Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64];

/// [`FLOATS`] and [`INTS`]: what the arithmetic dispatch (`num_dispatch!`) handles.
pub const NUMERIC: &[DataType] = &[
    Float, Double, Float16, Bfloat16, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64,
];

/// [`NUMERIC`] and bool.
pub const NUMERIC_BOOL: &[DataType] = &[
    Float, Double, Float16, Bfloat16, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64,
    Bool,
];

/// Every type stored as native Rust elements: [`NUMERIC`], bool and string (`dispatch_any!`).
pub const PLAIN: &[DataType] = &[
    Float, Double, Float16, Bfloat16, Int8, Int16, Int32, Int64, Uint8, Uint16, Uint32, Uint64,
    Bool, String,
];

/// Every type of at least one byte per element: [`PLAIN`], the float8 types and complex (what
/// data-movement kernels copy as elements or fixed-width byte blocks). Not the packed 4- and
/// 2-bit types, which those kernels cannot address one element at a time.
pub const UNPACKED: &[DataType] = &[
    Float,
    Double,
    Float16,
    Bfloat16,
    Int8,
    Int16,
    Int32,
    Int64,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Bool,
    String,
    Float8E4M3FN,
    Float8E4M3FNUZ,
    Float8E5M2,
    Float8E5M2FNUZ,
    Float8E8M0,
    Complex64,
    Complex128,
];

/// Every element type (kernels that only pass a value on or read its shape).
pub const ALL: &[DataType] = &DataType::ALL;

/// Every type but complex: what Cast converts from and to.
pub const CASTABLE: &[DataType] = &[
    Float,
    Uint8,
    Int8,
    Uint16,
    Int16,
    Int32,
    Int64,
    String,
    Bool,
    Float16,
    Double,
    Uint32,
    Uint64,
    Bfloat16,
    Float8E4M3FN,
    Float8E4M3FNUZ,
    Float8E5M2,
    Float8E5M2FNUZ,
    Uint4,
    Int4,
    Float4E2M1,
    Float8E8M0,
    Uint2,
    Int2,
];

/// Every type but string: what BitCast reinterprets.
pub const NOT_STRING: &[DataType] = &[
    Float,
    Uint8,
    Int8,
    Uint16,
    Int16,
    Int32,
    Int64,
    Bool,
    Float16,
    Double,
    Uint32,
    Uint64,
    Complex64,
    Complex128,
    Bfloat16,
    Float8E4M3FN,
    Float8E4M3FNUZ,
    Float8E5M2,
    Float8E5M2FNUZ,
    Uint4,
    Int4,
    Float4E2M1,
    Float8E8M0,
    Uint2,
    Int2,
];

/// int32 and int64: indices, positions, counts.
pub const INDEX: &[DataType] = &[Int32, Int64];

/// int8 and uint8: the quantized integer kernels.
pub const INT8: &[DataType] = &[Int8, Uint8];

pub const BOOL: &[DataType] = &[Bool];

pub const STRING: &[DataType] = &[String];

/// The named groups, for documentation (`docs/operators.md` prints a declared list that equals
/// one of these by its name).
pub const GROUPS: &[(&str, &[DataType])] = &[
    ("FLOATS", FLOATS),
    ("INTS", INTS),
    ("NUMERIC", NUMERIC),
    ("NUMERIC_BOOL", NUMERIC_BOOL),
    ("PLAIN", PLAIN),
    ("UNPACKED", UNPACKED),
    ("ALL", ALL),
    ("CASTABLE", CASTABLE),
    ("NOT_STRING", NOT_STRING),
    ("INDEX", INDEX),
    ("INT8", INT8),
];

/// The group a declared list is, if it is one (order does not matter).
pub fn group_name(types: &[DataType]) -> Option<&'static str> {
    GROUPS
        .iter()
        .find(|(_, g)| g.len() == types.len() && g.iter().all(|t| types.contains(t)))
        .map(|(n, _)| *n)
}

/// Ops whose registrations declare no element types, and why: the only ones allowed to. Each
/// has no tensor input whose inferred type could be checked at load.
pub const UNDECLARED: &[(&str, &str, &str)] = &[
    (
        "",
        "Constant",
        "no inputs; the value attribute is the output",
    ),
    (
        "",
        "RandomUniform",
        "no inputs; the dtype attribute is checked when the kernel is built",
    ),
    (
        "",
        "RandomNormal",
        "no inputs; the dtype attribute is checked when the kernel is built",
    ),
    (
        "",
        "SequenceEmpty",
        "no inputs; the dtype attribute only labels the empty sequence",
    ),
    (
        "",
        "SequenceLength",
        "its only input is a sequence, which has no tensor element type at load",
    ),
    (
        "",
        "ConcatFromSequence",
        "its only input is a sequence; the items' type is checked when they are concatenated",
    ),
];

#[cfg(test)]
mod audit;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu_registry;
    use alloc::vec::Vec;

    fn undeclared(domain: &str, op: &str) -> bool {
        UNDECLARED.iter().any(|(d, o, _)| *d == domain && *o == op)
    }

    #[test]
    fn every_registration_declares_its_element_types() {
        let reg = cpu_registry();
        let mut missing = Vec::new();
        for d in reg.entries() {
            if d.types.is_empty() && !undeclared(d.domain, d.op) {
                missing.push(alloc::format!(
                    "{}::{} {}..{}",
                    d.domain,
                    d.op,
                    d.since,
                    d.until
                ));
            }
        }
        missing.sort();
        assert!(
            missing.is_empty(),
            "registrations without element types (declare them, see kernels/types.rs): {missing:?}"
        );
    }

    #[test]
    fn the_allow_list_names_only_undeclared_registered_ops() {
        let reg = cpu_registry();
        for (domain, op, why) in UNDECLARED {
            assert!(
                reg.has_op(domain, op),
                "{op} is allow-listed but not registered"
            );
            assert!(!why.is_empty());
            for d in reg.entries().filter(|d| d.domain == *domain && d.op == *op) {
                assert!(
                    d.types.is_empty(),
                    "{op} declares types, so it should leave the allow-list"
                );
            }
        }
    }

    #[test]
    fn declared_lists_have_no_repeats() {
        for d in cpu_registry().entries() {
            for (i, t) in d.types.iter().enumerate() {
                assert!(!d.types[..i].contains(t), "{} lists {t} twice", d.op);
            }
        }
    }

    #[test]
    fn groups_are_what_their_names_say() {
        let union = |a: &[DataType], b: &[DataType]| {
            let mut v: Vec<DataType> = a.iter().chain(b).copied().collect();
            v.sort();
            v
        };
        let sorted = |a: &[DataType]| {
            let mut v = a.to_vec();
            v.sort();
            v
        };
        assert!(FLOATS.iter().all(|t| t.is_float()) && FLOATS.len() == 4);
        assert!(INTS.iter().all(|t| t.is_int()) && INTS.len() == 8);
        assert_eq!(sorted(NUMERIC), union(FLOATS, INTS));
        assert_eq!(sorted(NUMERIC_BOOL), union(NUMERIC, BOOL));
        assert_eq!(sorted(PLAIN), union(NUMERIC_BOOL, STRING));
        let wide: Vec<DataType> = DataType::ALL
            .iter()
            .copied()
            .filter(|t| !t.is_sub_byte())
            .collect();
        assert_eq!(sorted(UNPACKED), sorted(&wide));
        let castable: Vec<DataType> = DataType::ALL
            .iter()
            .copied()
            .filter(|t| !matches!(t, Complex64 | Complex128))
            .collect();
        assert_eq!(sorted(CASTABLE), sorted(&castable));
        let not_string: Vec<DataType> = DataType::ALL
            .iter()
            .copied()
            .filter(|t| *t != String)
            .collect();
        assert_eq!(sorted(NOT_STRING), sorted(&not_string));
        for (name, g) in GROUPS {
            assert_eq!(group_name(g), Some(*name));
        }
    }
}
