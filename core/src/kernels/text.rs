//! Text kernels: StringConcat, StringNormalizer, StringSplit, RegexFullMatch and
//! TfIdfVectorizer.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use hashbrown::HashMap;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::STRING;
use crate::kernels::{broadcast_shapes, def, out1, tensor_in, LATEST};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("StringConcat", 20, LATEST, build_string_concat).types(STRING),
    def("StringNormalizer", 10, LATEST, build_string_normalizer).types(STRING),
    def("StringSplit", 20, LATEST, build_string_split).types(STRING),
    def("RegexFullMatch", 20, LATEST, build_regex_full_match).types(STRING),
    // strings need pool_strings, integers pool_int64s; the kernel checks which it has
    def("TfIdfVectorizer", 9, LATEST, build_tfidf).types(&[
        DataType::String,
        DataType::Int32,
        DataType::Int64,
    ]),
];

fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

/// Input `i` as a string tensor's elements (row-major) and its shape.
fn strings_in(inputs: &[Option<&Value>], i: usize, op: &str) -> Result<(Vec<String>, Vec<usize>)> {
    let t = tensor_in(inputs, i)?;
    if t.dtype() != DataType::String {
        bail!("{op} input {i} must be a string tensor, is {}", t.dtype());
    }
    Ok((t.as_slice::<String>()?.into_owned(), t.shape().to_vec()))
}

// ----------------------------------------------------------------------------- StringConcat

fn build_string_concat(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        if a.dtype() != DataType::String || b.dtype() != DataType::String {
            bail!(
                "StringConcat takes string tensors, got {} and {}",
                a.dtype(),
                b.dtype()
            );
        }
        let shape = broadcast_shapes(a.shape(), b.shape())?;
        let av = a.broadcast_to(&shape)?.contiguous()?;
        let bv = b.broadcast_to(&shape)?.contiguous()?;
        let av = av.as_slice::<String>()?;
        let bv = bv.as_slice::<String>()?;
        let out: Vec<String> = av
            .iter()
            .zip(bv.iter())
            .map(|(x, y)| {
                let mut s = String::with_capacity(x.len() + y.len());
                s.push_str(x);
                s.push_str(y);
                s
            })
            .collect();
        out1(Tensor::from_vec(&shape, out)?)
    })
}

// ----------------------------------------------------------------------------- StringNormalizer

#[derive(Clone, Copy, PartialEq)]
enum CaseChange {
    None,
    Lower,
    Upper,
}

fn build_string_normalizer(node: &Node) -> Result<Box<dyn Kernel>> {
    let action = match node.get_s("case_change_action", "NONE")?.as_str() {
        "NONE" => CaseChange::None,
        "LOWER" => CaseChange::Lower,
        "UPPER" => CaseChange::Upper,
        other => bail!("StringNormalizer: unknown case_change_action '{other}'"),
    };
    let case_sensitive = match node.get_i("is_case_sensitive", 0)? {
        0 => false,
        1 => true,
        v => bail!("StringNormalizer: is_case_sensitive must be 0 or 1, is {v}"),
    };
    // `locale` only matters for case mapping; Unicode's default mapping is used for every locale
    let stopwords: Vec<String> = node
        .attr_strings("stopwords")?
        .unwrap_or_default()
        .into_iter()
        .map(|w| if case_sensitive { w } else { w.to_lowercase() })
        .collect();
    kernel(move |_cx, inputs| {
        let (xs, shape) = strings_in(inputs, 0, "StringNormalizer")?;
        let two_d = match shape.as_slice() {
            [_] => false,
            [1, _] => true,
            s => bail!("StringNormalizer input must be [C] or [1, C], is {s:?}"),
        };
        let mut out: Vec<String> = xs
            .into_iter()
            .filter(|w| {
                if stopwords.is_empty() {
                    return true;
                }
                if case_sensitive {
                    !stopwords.contains(w)
                } else {
                    !stopwords.contains(&w.to_lowercase())
                }
            })
            .map(|w| match action {
                CaseChange::None => w,
                CaseChange::Lower => w.to_lowercase(),
                CaseChange::Upper => w.to_uppercase(),
            })
            .collect();
        // an all-filtered input gives one empty string
        if out.is_empty() {
            out.push(String::new());
        }
        let n = out.len();
        let shape: Vec<usize> = if two_d { vec![1, n] } else { vec![n] };
        out1(Tensor::from_vec(&shape, out)?)
    })
}

// ----------------------------------------------------------------------------- StringSplit

/// Splits like Python's `str.split(sep, maxsplit)`: on `sep` when given (keeping empty
/// pieces), else on runs of whitespace (dropping leading/trailing whitespace).
fn split_str(s: &str, sep: Option<&str>, maxsplit: Option<usize>) -> Vec<String> {
    let max = maxsplit.unwrap_or(usize::MAX);
    match sep {
        Some(sep) => {
            let mut out = Vec::new();
            let mut rest = s;
            while out.len() < max {
                match rest.find(sep) {
                    Some(p) => {
                        out.push(String::from(&rest[..p]));
                        rest = &rest[p + sep.len()..];
                    }
                    None => break,
                }
            }
            out.push(String::from(rest));
            out
        }
        None => {
            let mut out = Vec::new();
            let mut rest = s.trim_start();
            while !rest.is_empty() {
                if out.len() == max {
                    out.push(String::from(rest));
                    break;
                }
                let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                out.push(String::from(&rest[..end]));
                rest = rest[end..].trim_start();
            }
            out
        }
    }
}

fn build_string_split(node: &Node) -> Result<Box<dyn Kernel>> {
    let delimiter = node.attr_s("delimiter")?.filter(|d| !d.is_empty());
    let maxsplit = match node.attr_i("maxsplit")? {
        None => None,
        Some(m) if m < 0 => None,
        Some(m) => Some(m as usize),
    };
    kernel(move |_cx, inputs| {
        let (xs, shape) = strings_in(inputs, 0, "StringSplit")?;
        let parts: Vec<Vec<String>> = xs
            .iter()
            .map(|s| split_str(s, delimiter.as_deref(), maxsplit))
            .collect();
        let width = parts.iter().map(Vec::len).max().unwrap_or(0);
        let counts: Vec<i64> = parts.iter().map(|p| p.len() as i64).collect();
        let mut flat = Vec::with_capacity(parts.len() * width);
        for p in parts {
            let n = p.len();
            flat.extend(p);
            flat.extend((n..width).map(|_| String::new()));
        }
        let mut yshape = shape.clone();
        yshape.push(width);
        Ok(vec![
            Value::Tensor(Tensor::from_vec(&yshape, flat)?),
            Value::Tensor(Tensor::from_vec(&shape, counts)?),
        ])
    })
}

// ----------------------------------------------------------------------------- RegexFullMatch

/// Rewrites RE2's ASCII Perl classes (`\w \d \s \b` and negations) into forms the Unicode-mode
/// regex syntax reads the same way, so that no Unicode class tables are needed and the
/// classes keep RE2's ASCII meaning.
fn re2_to_syntax(p: &str) -> String {
    let mut out = String::with_capacity(p.len() + 16);
    let mut in_class = false;
    let mut class_start = false;
    let mut chars = p.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let Some(n) = chars.next() else {
                out.push('\\');
                break;
            };
            let ascii = match n {
                'w' => Some("word"),
                'd' => Some("digit"),
                's' => Some("space"),
                _ => None,
            };
            let neg = match n {
                'W' => Some("word"),
                'D' => Some("digit"),
                'S' => Some("space"),
                _ => None,
            };
            match (ascii, neg, n) {
                (Some(name), _, _) if in_class => {
                    out.push_str("[:");
                    out.push_str(name);
                    out.push_str(":]");
                }
                (Some(name), _, _) => {
                    out.push_str("[[:");
                    out.push_str(name);
                    out.push_str(":]]");
                }
                (_, Some(name), _) if in_class => {
                    out.push_str("[:^");
                    out.push_str(name);
                    out.push_str(":]");
                }
                (_, Some(name), _) => {
                    out.push_str("[[:^");
                    out.push_str(name);
                    out.push_str(":]]");
                }
                (_, _, 'b') if !in_class => out.push_str("(?-u:\\b)"),
                (_, _, 'B') if !in_class => out.push_str("(?-u:\\B)"),
                _ => {
                    out.push('\\');
                    out.push(n);
                }
            }
            class_start = false;
            continue;
        }
        if in_class {
            if c == ']' && !class_start {
                in_class = false;
            } else if c == '[' && chars.peek() == Some(&':') {
                // a POSIX class inside a class: copy through its closing ":]"
                out.push(c);
                for d in chars.by_ref() {
                    out.push(d);
                    if d == ']' {
                        break;
                    }
                }
                class_start = false;
                continue;
            }
            class_start = class_start && c == '^';
            out.push(c);
        } else {
            if c == '[' {
                in_class = true;
                class_start = true;
            }
            out.push(c);
        }
    }
    out
}

fn build_regex_full_match(node: &Node) -> Result<Box<dyn Kernel>> {
    use regex_automata::meta::Regex;
    use regex_automata::{Anchored, Input};
    let Some(pattern) = node.attr_s("pattern")? else {
        bail!("RegexFullMatch needs a 'pattern' attribute");
    };
    let translated = re2_to_syntax(&pattern);
    let re = match Regex::new(&alloc::format!("(?:{translated})$")) {
        Ok(r) => r,
        Err(e) => unsupported!("RegexFullMatch pattern '{pattern}' is not supported: {e}"),
    };
    kernel(move |_cx, inputs| {
        let (xs, shape) = strings_in(inputs, 0, "RegexFullMatch")?;
        let out: Vec<bool> = xs
            .iter()
            .map(|s| {
                // full match: anchored at the start, and the pattern ends with `$`
                let input = Input::new(s.as_str()).anchored(Anchored::Yes);
                re.search_half(&input).is_some()
            })
            .collect();
        out1(Tensor::from_vec(&shape, out)?)
    })
}

// ----------------------------------------------------------------------------- TfIdfVectorizer

#[derive(Clone, Copy, PartialEq)]
enum Weighting {
    Tf,
    Idf,
    TfIdf,
}

/// A token: an integer, or a pool string's index (`-1` for strings outside the pool).
type Tok = i64;

struct TfIdf {
    min_n: usize,
    max_n: usize,
    max_skip: usize,
    mode: Weighting,
    /// n-gram (tokens) -> output column, for each n in `min_n..=max_n`.
    grams: HashMap<Vec<Tok>, usize>,
    /// Pool strings -> token, when the pool is of strings.
    string_ids: Option<HashMap<String, Tok>>,
    out_size: usize,
    weights: Option<Vec<f32>>,
}

fn build_tfidf(node: &Node) -> Result<Box<dyn Kernel>> {
    let get = |name: &str| -> Result<i64> {
        match node.attr_i(name)? {
            Some(v) => Ok(v),
            None => bail!("TfIdfVectorizer needs the '{name}' attribute"),
        }
    };
    let min_n = get("min_gram_length")?;
    let max_n = get("max_gram_length")?;
    let max_skip = get("max_skip_count")?;
    if min_n < 1 || max_n < min_n || max_skip < 0 {
        bail!("TfIdfVectorizer: bad gram lengths {min_n}..{max_n} or skip count {max_skip}");
    }
    let mode = match node.get_s("mode", "")?.as_str() {
        "TF" => Weighting::Tf,
        "IDF" => Weighting::Idf,
        "TFIDF" => Weighting::TfIdf,
        other => bail!("TfIdfVectorizer: unknown mode '{other}'"),
    };
    let counts = node.attr_ints("ngram_counts")?.unwrap_or_default();
    let indexes = node.attr_ints("ngram_indexes")?.unwrap_or_default();
    let pool_ints = node.attr_ints("pool_int64s")?;
    let pool_strs = node.attr_strings("pool_strings")?;
    let (pool, string_ids): (Vec<Tok>, Option<HashMap<String, Tok>>) = match (pool_ints, pool_strs)
    {
        (Some(p), None) => (p, None),
        (None, Some(s)) => {
            let mut ids: HashMap<String, Tok> = HashMap::new();
            let mut pool = Vec::with_capacity(s.len());
            for w in s {
                let next = ids.len() as Tok;
                pool.push(*ids.entry(w).or_insert(next));
            }
            (pool, Some(ids))
        }
        _ => bail!("TfIdfVectorizer needs exactly one of pool_int64s and pool_strings"),
    };
    if indexes.is_empty() || indexes.iter().any(|&i| i < 0) {
        bail!("TfIdfVectorizer: ngram_indexes must be non-empty and non-negative");
    }
    let out_size = *indexes.iter().max().unwrap() as usize + 1;
    let weights = match node.attr_floats("weights")? {
        Some(w) if !w.is_empty() => {
            if w.len() < out_size {
                bail!(
                    "TfIdfVectorizer: {} weights for {out_size} output columns",
                    w.len()
                );
            }
            Some(w)
        }
        _ => None,
    };
    // walk the pool: ngram_counts[k] is where the (k+1)-grams start
    let mut grams = HashMap::new();
    let mut gram_id = 0usize;
    for (k, &start) in counts.iter().enumerate() {
        let n = k + 1;
        let end = counts.get(k + 1).copied().unwrap_or(pool.len() as i64);
        if start < 0 || end < start || end as usize > pool.len() {
            bail!("TfIdfVectorizer: ngram_counts {counts:?} do not fit the pool");
        }
        let items = (end - start) as usize;
        if !items.is_multiple_of(n) {
            bail!("TfIdfVectorizer: {items} pool items do not make whole {n}-grams");
        }
        for g in pool[start as usize..end as usize].chunks_exact(n) {
            let Some(&col) = indexes.get(gram_id) else {
                bail!("TfIdfVectorizer: fewer ngram_indexes than n-grams in the pool");
            };
            if n as i64 >= min_n && n as i64 <= max_n {
                grams.insert(g.to_vec(), col as usize);
            }
            gram_id += 1;
        }
    }
    let st = TfIdf {
        min_n: min_n as usize,
        max_n: max_n as usize,
        max_skip: max_skip as usize,
        mode,
        grams,
        string_ids,
        out_size,
        weights,
    };
    kernel(move |_cx, inputs| st.run(tensor_in(inputs, 0)?))
}

impl TfIdf {
    fn run(&self, x: &Tensor) -> Result<Vec<Value>> {
        let toks: Vec<Tok> = match (x.dtype(), &self.string_ids) {
            (DataType::String, Some(ids)) => x
                .as_slice::<String>()?
                .iter()
                .map(|s| ids.get(s).copied().unwrap_or(-1))
                .collect(),
            (DataType::Int32 | DataType::Int64, None) => x.to_i64_vec()?,
            (dt, _) => unsupported!("TfIdfVectorizer: {dt} input does not match the pool's type"),
        };
        let (rows, c, out_shape) = match x.shape() {
            [] => (1, 1, vec![self.out_size]),
            [c] => (1, *c, vec![self.out_size]),
            [b, c] => (*b, *c, vec![*b, self.out_size]),
            s => bail!("TfIdfVectorizer input must be [C] or [B, C], is {s:?}"),
        };
        let mut freq = vec![0u32; rows * self.out_size];
        let mut gram = Vec::with_capacity(self.max_n);
        for r in 0..rows {
            let row = &toks[r * c..(r + 1) * c];
            let f = &mut freq[r * self.out_size..(r + 1) * self.out_size];
            for n in self.min_n..=self.max_n {
                // unigrams do not depend on the skip, count them once
                let skips = if n == 1 { 0 } else { self.max_skip };
                for skip in 0..=skips {
                    let step = skip + 1;
                    let span = (n - 1) * step;
                    if span >= c {
                        break;
                    }
                    for start in 0..c - span {
                        gram.clear();
                        gram.extend((0..n).map(|j| row[start + j * step]));
                        if let Some(&col) = self.grams.get(&gram) {
                            f[col] += 1;
                        }
                    }
                }
            }
        }
        let out: Vec<f32> = freq
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let w = self.weights.as_ref().map_or(1.0, |w| w[i % self.out_size]);
                match self.mode {
                    Weighting::Tf => n as f32,
                    Weighting::Idf => {
                        if n > 0 {
                            w
                        } else {
                            0.0
                        }
                    }
                    Weighting::TfIdf => n as f32 * w,
                }
            })
            .collect();
        out1(Tensor::from_vec(&out_shape, out)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;

    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Node {
        Node {
            name: String::new(),
            op_type: op.into(),
            domain: String::new(),
            opset,
            inputs: vec![],
            outputs: vec![],
            attrs: attrs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            implicit_inputs: vec![],
        }
    }

    fn run(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: &[&Value],
    ) -> Result<Vec<Value>> {
        let n = node(op, opset, attrs);
        let def = KERNELS.iter().find(|d| d.op == op).unwrap();
        let k = (def.build)(&n)?;
        let ins: Vec<Option<&Value>> = inputs.iter().map(|v| Some(*v)).collect();
        k.compute(&KernelCx::new(&ReferenceCpu), &ins)
    }

    fn strs(shape: &[usize], v: &[&str]) -> Value {
        Value::Tensor(
            Tensor::from_vec(shape, v.iter().map(|s| String::from(*s)).collect()).unwrap(),
        )
    }

    fn get_strs(v: &Value) -> (Vec<usize>, Vec<String>) {
        let t = v.as_tensor().unwrap();
        (
            t.shape().to_vec(),
            t.as_slice::<String>().unwrap().into_owned(),
        )
    }

    #[test]
    fn concat_broadcasts() {
        let a = strs(&[2], &["a", "bc"]);
        let b = strs(&[], &["!"]);
        let y = run("StringConcat", 20, vec![], &[&a, &b]).unwrap();
        assert_eq!(get_strs(&y[0]), (vec![2], vec!["a!".into(), "bc!".into()]));
    }

    #[test]
    fn split_like_python() {
        assert_eq!(split_str("a,,b", Some(","), None), vec!["a", "", "b"]);
        assert_eq!(split_str("", Some(","), None), vec![""]);
        assert_eq!(split_str("  x  y z ", None, None), vec!["x", "y", "z"]);
        assert_eq!(split_str("  x  y z ", None, Some(1)), vec!["x", "y z "]);
        assert_eq!(split_str("a-b-c", Some("-"), Some(1)), vec!["a", "b-c"]);
        assert!(split_str("   ", None, None).is_empty());
        let x = strs(&[2], &["a b", "c"]);
        let y = run("StringSplit", 20, vec![], &[&x]).unwrap();
        assert_eq!(
            get_strs(&y[0]),
            (
                vec![2, 2],
                vec!["a".into(), "b".into(), "c".into(), "".into()]
            )
        );
        assert_eq!(y[1].as_tensor().unwrap().to_i64_vec().unwrap(), vec![2, 1]);
    }

    #[test]
    fn normalizer_stopwords_and_case() {
        let x = strs(&[3], &["Monday", "tuesday", "MONDAY"]);
        let y = run(
            "StringNormalizer",
            10,
            vec![
                ("case_change_action", AttrValue::String(b"UPPER".to_vec())),
                ("stopwords", AttrValue::Strings(vec![b"monday".to_vec()])),
            ],
            &[&x],
        )
        .unwrap();
        // case-insensitive by default: both mondays go
        assert_eq!(get_strs(&y[0]), (vec![1], vec!["TUESDAY".into()]));
    }

    #[test]
    fn regex_full_match_is_anchored() {
        let x = strs(&[3], &["www.google.com", "xwww.google.com", "www.a.comx"]);
        let y = run(
            "RegexFullMatch",
            20,
            vec![(
                "pattern",
                AttrValue::String(br"www\.[\w.-]+\.\bcom\b".to_vec()),
            )],
            &[&x],
        )
        .unwrap();
        assert_eq!(
            y[0].as_tensor().unwrap().to_i64_vec().unwrap(),
            vec![1, 0, 0]
        );
        // RE2's \w is ASCII only
        let x = strs(&[1], &["é"]);
        let y = run(
            "RegexFullMatch",
            20,
            vec![("pattern", AttrValue::String(br"\w".to_vec()))],
            &[&x],
        )
        .unwrap();
        assert_eq!(y[0].as_tensor().unwrap().to_i64_vec().unwrap(), vec![0]);
    }

    #[test]
    fn tfidf_counts_skip_grams() {
        // pool: unigrams {1, 2}, bigram (1, 3); columns 0, 1, 2
        let attrs = || {
            vec![
                ("min_gram_length", AttrValue::Int(1)),
                ("max_gram_length", AttrValue::Int(2)),
                ("max_skip_count", AttrValue::Int(1)),
                ("mode", AttrValue::String(b"TF".to_vec())),
                ("ngram_counts", AttrValue::Ints(vec![0, 2])),
                ("ngram_indexes", AttrValue::Ints(vec![0, 1, 2])),
                ("pool_int64s", AttrValue::Ints(vec![1, 2, 1, 3])),
            ]
        };
        // 1 2 3 1 3: unigram 1 twice, 2 once; bigram (1,3): skip 0 at 3-4, skip 1 at 0-2
        let x = Value::Tensor(Tensor::from_vec(&[5], vec![1i32, 2, 3, 1, 3]).unwrap());
        let y = run("TfIdfVectorizer", 9, attrs(), &[&x]).unwrap();
        assert_eq!(
            y[0].as_tensor().unwrap().to_f32_vec().unwrap(),
            vec![2.0, 1.0, 2.0]
        );
    }
}
