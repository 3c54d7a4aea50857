//! Choosing the next token from logits: the processor chain (the built-in penalties and
//! no-repeat-ngram, then a caller's own [`LogitsProcessor`]s), then greedy (the highest logit,
//! ties to the lowest id) or seeded sampling after temperature, top-k, top-p and min-p.
//!
//! Sampling runs in f64 with `libm`'s exp (plain Rust, the same bits on every target) and a
//! portable generator (SplitMix64), so one seed gives the same tokens everywhere.

use alloc::vec::Vec;

use hashbrown::HashMap;

use crate::error::{Error, Result};

/// The processors and their parameters (1.0 / 0 where a processor is off).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingOptions {
    /// Sample (true) or take the best logit after the penalties (false).
    pub do_sample: bool,
    pub temperature: f32,
    /// Keep the k most likely ids (0: all).
    pub top_k: usize,
    /// Keep the most likely ids whose probabilities sum to at least p (1: all).
    pub top_p: f32,
    /// Drop ids less likely than `min_p` times the most likely one (0: none).
    pub min_p: f32,
    /// HF's repetition penalty: a seen id's logit is divided by it when positive, multiplied
    /// when negative (1: off).
    pub repetition_penalty: f32,
    /// OpenAI's penalties: `logit -= count * frequency + (count > 0) * presence`.
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// HF's no-repeat-ngram: an id that would complete an n-gram of this size already in the
    /// sequence (prompt included) is never chosen (0: off).
    pub no_repeat_ngram_size: usize,
    pub seed: u64,
}

impl Default for SamplingOptions {
    fn default() -> Self {
        SamplingOptions {
            do_sample: false,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            no_repeat_ngram_size: 0,
            seed: 0,
        }
    }
}

impl SamplingOptions {
    /// Checks the parameters' ranges.
    pub fn validate(&self) -> Result<()> {
        let bad = |w: &str| Err(Error::Input(alloc::format!("sampling: {w}")));
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return bad("temperature must be positive");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p must be in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty must be positive");
        }
        if !self.frequency_penalty.is_finite() || !self.presence_penalty.is_finite() {
            return bad("frequency and presence penalties must be finite");
        }
        Ok(())
    }
}

/// SplitMix64: a small generator with the same stream on every target.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Applies the penalties to `logits` for the ids in `history`.
pub fn apply_penalties(logits: &mut [f32], history: &[i64], o: &SamplingOptions) {
    let rep = o.repetition_penalty != 1.0;
    let openai = o.frequency_penalty != 0.0 || o.presence_penalty != 0.0;
    if !rep && !openai {
        return;
    }
    let mut counts: HashMap<usize, u32> = HashMap::new();
    for &id in history {
        if id >= 0 && (id as usize) < logits.len() {
            *counts.entry(id as usize).or_insert(0) += 1;
        }
    }
    for (&id, &c) in &counts {
        let x = &mut logits[id];
        if rep {
            *x = if *x > 0.0 {
                *x / o.repetition_penalty
            } else {
                *x * o.repetition_penalty
            };
        }
        if openai {
            *x -= c as f32 * o.frequency_penalty + o.presence_penalty;
        }
    }
}

/// Sets to minus infinity the logit of every id that would complete an `n`-gram already in
/// `history` (its last `n - 1` ids followed by that id); nothing while `history` is shorter
/// than `n - 1` (HF's `no_repeat_ngram_size`).
pub fn ban_repeated_ngrams(logits: &mut [f32], history: &[i64], n: usize) {
    if n == 0 || history.len() < n - 1 {
        return;
    }
    let tail = &history[history.len() - (n - 1)..];
    for w in history.windows(n) {
        if &w[..n - 1] == tail {
            let id = w[n - 1];
            if id >= 0 && (id as usize) < logits.len() {
                logits[id as usize] = f32::NEG_INFINITY;
            }
        }
    }
}

/// The id of the highest logit (ties to the lowest id; NaN never wins). `None` when every
/// logit is NaN or minus infinity.
pub fn argmax(logits: &[f32]) -> Option<usize> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in logits.iter().enumerate() {
        if x.is_nan() || x == f32::NEG_INFINITY {
            continue;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i)
}

/// The candidates sampling keeps, most likely first, as (id, probability renormalised over
/// the kept ids), after temperature, top-k, top-p and min-p.
pub fn candidates(logits: &[f32], o: &SamplingOptions) -> Vec<(usize, f64)> {
    let t = o.temperature as f64;
    // Each id as one integer whose ascending order is the ranking: descending by logit (f32
    // total order), ties to the lower id. Integer compares and one contiguous array keep the
    // selections and sorts below cheap on a 150 000-entry vocabulary.
    let rank_key = |i: usize| {
        let b = logits[i].to_bits() as i32;
        let ascending = ((b ^ ((((b >> 31) as u32) >> 1) as i32)) as u32) ^ 0x8000_0000;
        ((!ascending as u64) << 32) | i as u64
    };
    let id = |k: u64| (k & 0xffff_ffff) as usize;
    let mut keys: Vec<u64> = (0..logits.len())
        .filter(|&i| !logits[i].is_nan() && logits[i] != f32::NEG_INFINITY)
        .map(rank_key)
        .collect();
    let Some(&best) = keys.iter().min() else {
        return Vec::new();
    };
    let max = logits[id(best)] as f64;
    // every id's weight once (ascending id order, as the sum below has always run); the
    // softmax's denominator over every id (top-p and min-p read full probabilities)
    let mut w = alloc::vec![0f64; logits.len()];
    let mut z = 0.0;
    for &k in &keys {
        let e = libm::exp((logits[id(k)] as f64 - max) / t);
        w[id(k)] = e;
        z += e;
    }
    let prob = |k: u64| w[id(k)] / z;
    // min-p first: a floor on probability keeps a prefix of the ranking, so applying it
    // before top-k and top-p keeps exactly what applying it after does, and they then rank
    // only what survives
    if o.min_p > 0.0 {
        let floor = o.min_p as f64 * prob(best);
        keys.retain(|&k| prob(k) >= floor);
    }
    let k_cap = if o.top_k > 0 {
        o.top_k.min(keys.len())
    } else {
        keys.len()
    };
    if o.top_p >= 1.0 {
        if k_cap < keys.len() {
            keys.select_nth_unstable(k_cap - 1);
            keys.truncate(k_cap);
        }
        keys.sort_unstable();
    } else {
        // top-p over a ranked prefix grown until it holds the mass: each round ranks only the
        // next slice of the rest (partial selection, never a sort of the whole vocabulary)
        let (mut done, mut k, mut mass) = (0, 64.min(k_cap), 0.0);
        loop {
            let rest = &mut keys[done..];
            let take = k - done;
            if take < rest.len() {
                rest.select_nth_unstable(take - 1);
            }
            rest[..take].sort_unstable();
            let cut = (done..k).find(|&j| {
                mass += prob(keys[j]);
                mass >= o.top_p as f64
            });
            if let Some(j) = cut {
                keys.truncate(j + 1);
                break;
            }
            if k >= k_cap {
                keys.truncate(k_cap);
                break;
            }
            done = k;
            k = (k * 2).min(k_cap);
        }
    }
    let total: f64 = keys.iter().map(|&k| prob(k)).sum();
    keys.into_iter().map(|k| (id(k), prob(k) / total)).collect()
}

/// The direct form of [`candidates`]: the full softmax, one sort of the whole vocabulary,
/// then top-k, top-p and min-p on the sorted list. It keeps the same candidates with the same
/// probabilities, bit for bit (the tests hold it to that); it is the baseline the benchmark
/// suite's `qwen3_sampling_processors/*_full_sort_baseline` scenarios time, and slower on a
/// large vocabulary (it sorts every id where [`candidates`] ranks only what it keeps).
pub fn candidates_full_sort(logits: &[f32], o: &SamplingOptions) -> Vec<(usize, f64)> {
    let t = o.temperature as f64;
    let mut ids: Vec<usize> = (0..logits.len())
        .filter(|&i| !logits[i].is_nan() && logits[i] != f32::NEG_INFINITY)
        .collect();
    // descending by logit, ties to the lower id
    ids.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let Some(&first) = ids.first() else {
        return Vec::new();
    };
    let max = logits[first] as f64;
    // the denominator sums in ascending id order, as [`candidates`] does
    let mut w = alloc::vec![0f64; logits.len()];
    let mut by_id: Vec<usize> = ids.clone();
    by_id.sort_unstable();
    let mut z = 0.0;
    for &i in &by_id {
        w[i] = libm::exp((logits[i] as f64 - max) / t);
        z += w[i];
    }
    let prob = |i: usize| w[i] / z;
    if o.top_k > 0 {
        ids.truncate(o.top_k);
    }
    if o.top_p < 1.0 {
        let mut mass = 0.0;
        if let Some(n) = ids.iter().position(|&i| {
            mass += prob(i);
            mass >= o.top_p as f64
        }) {
            ids.truncate(n + 1);
        }
    }
    if o.min_p > 0.0 {
        let floor = o.min_p as f64 * prob(first);
        ids.retain(|&i| prob(i) >= floor);
    }
    let total: f64 = ids.iter().map(|&i| prob(i)).sum();
    ids.into_iter().map(|i| (i, prob(i) / total)).collect()
}

/// One link of the processor chain a caller adds ([`Sampler::push`],
/// [`super::Decoding::add_processor`]): changes one step's logits in place before the choice.
/// `history` is every id of the sequence so far, prompt included. A step runs the built-in
/// penalties (HF repetition, OpenAI frequency and presence) and no-repeat-ngram first, then
/// the added processors in the order added, then holds back the end-of-sequence ids a minimum
/// length bans, then chooses (greedy, or temperature, top-k, top-p, min-p and the seeded draw).
/// Setting a logit to `-inf` bans that id; an error ends the generation with it.
pub trait LogitsProcessor: Send {
    fn process(&mut self, logits: &mut [f32], history: &[i64]) -> Result<()>;
}

/// Any `FnMut(&mut [f32], &[i64]) -> Result<()>` is a processor.
impl<F: FnMut(&mut [f32], &[i64]) -> Result<()> + Send> LogitsProcessor for F {
    fn process(&mut self, logits: &mut [f32], history: &[i64]) -> Result<()> {
        self(logits, history)
    }
}

/// Picks the next token: the processor chain, then greedy or a seeded draw.
pub struct Sampler {
    opts: SamplingOptions,
    rng: Rng,
    chain: Vec<alloc::boxed::Box<dyn LogitsProcessor>>,
}

impl Sampler {
    /// Greedy without options.
    pub fn new(opts: Option<SamplingOptions>) -> Sampler {
        let opts = opts.unwrap_or_default();
        let rng = Rng::new(opts.seed);
        Sampler {
            opts,
            rng,
            chain: Vec::new(),
        }
    }

    /// Adds a processor at the end of the chain (after the built-in ones and those added
    /// before).
    pub fn push(&mut self, p: alloc::boxed::Box<dyn LogitsProcessor>) {
        self.chain.push(p);
    }

    /// Chooses from `logits` (changed in place by the penalties), never one of `banned`
    /// (end-of-sequence ids held back by a minimum length); `history` feeds the penalties.
    pub fn choose(&mut self, logits: &mut [f32], banned: &[i64], history: &[i64]) -> Result<i64> {
        apply_penalties(logits, history, &self.opts);
        ban_repeated_ngrams(logits, history, self.opts.no_repeat_ngram_size);
        for p in &mut self.chain {
            p.process(logits, history)?;
        }
        for &b in banned {
            if b >= 0 && (b as usize) < logits.len() {
                logits[b as usize] = f32::NEG_INFINITY;
            }
        }
        let none = || Error::Other("no token can be chosen: every logit is NaN or -inf".into());
        if !self.opts.do_sample {
            return argmax(logits).map(|i| i as i64).ok_or_else(none);
        }
        let c = candidates(logits, &self.opts);
        if c.is_empty() {
            return Err(none());
        }
        let u = self.rng.next_f64();
        let mut acc = 0.0;
        for &(i, p) in &c {
            acc += p;
            if u < acc {
                return Ok(i as i64);
            }
        }
        Ok(c[c.len() - 1].0 as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn logits(n: usize, seed: u64) -> Vec<f32> {
        let mut r = Rng::new(seed);
        (0..n).map(|_| (r.next_f64() * 8.0 - 4.0) as f32).collect()
    }

    /// Full-softmax probabilities at temperature `t`, in f64 (the direct computation).
    fn softmax(l: &[f32], t: f64) -> Vec<f64> {
        let m = l.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let e: Vec<f64> = l.iter().map(|&x| ((x as f64 - m) / t).exp()).collect();
        let z: f64 = e.iter().sum();
        e.into_iter().map(|x| x / z).collect()
    }

    /// Ids by descending probability (ties to the lower id), by a full sort.
    fn ranked(p: &[f64]) -> Vec<usize> {
        let mut ids: Vec<usize> = (0..p.len()).collect();
        ids.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        ids
    }

    #[test]
    fn greedy_takes_the_lowest_id_of_a_tie_and_skips_nan() {
        assert_eq!(argmax(&[1.0, 3.0, f32::NAN, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), None);
        let mut s = Sampler::new(None);
        let mut l = vec![0.5, 2.0, 2.0, 1.0];
        // a held-back EOS id is never chosen
        assert_eq!(s.choose(&mut l, &[1], &[]).unwrap(), 2);
    }

    #[test]
    fn no_repeat_ngram_bans_exactly_the_ids_completing_a_seen_ngram() {
        let mut r = Rng::new(3);
        for n in 1..5usize {
            for len in 0..40usize {
                // a small vocabulary, so n-grams repeat
                let history: Vec<i64> = (0..len).map(|_| (r.next_u64() % 5) as i64).collect();
                let mut l = vec![0.5f32; 6];
                ban_repeated_ngrams(&mut l, &history, n);
                // the direct rule: every n-gram of the history, against tail + id
                for id in 0..6i64 {
                    let banned = len + 1 >= n && {
                        let mut cand = history[len + 1 - n..].to_vec();
                        cand.push(id);
                        history.windows(n).any(|w| w == cand.as_slice())
                    };
                    assert_eq!(
                        l[id as usize] == f32::NEG_INFINITY,
                        banned,
                        "n {n} {history:?} id {id}"
                    );
                }
            }
        }
        // through the sampler: greedy takes the best id that is not banned
        let mut s = Sampler::new(Some(SamplingOptions {
            no_repeat_ngram_size: 2,
            ..Default::default()
        }));
        let mut l = vec![0.0f32, 3.0, 2.0];
        assert_eq!(s.choose(&mut l, &[], &[1, 1]).unwrap(), 2);
    }

    #[test]
    fn penalties_follow_their_formulas() {
        let base = vec![2.0f32, -2.0, 1.0, 0.5];
        let history = [0i64, 1, 0, 3];
        let o = SamplingOptions {
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut l = base.clone();
        apply_penalties(&mut l, &history, &o);
        // positive logits of seen ids are divided, negative ones multiplied, once per id
        assert_eq!(l, vec![1.0, -4.0, 1.0, 0.25]);
        let o = SamplingOptions {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        let mut l = base.clone();
        apply_penalties(&mut l, &history, &o);
        for (i, (&got, &x)) in l.iter().zip(&base).enumerate() {
            let c = history.iter().filter(|&&h| h == i as i64).count() as f32;
            let want = x - c * 0.5 - if c > 0.0 { 0.25 } else { 0.0 };
            assert_eq!(got, want, "id {i}");
        }
    }

    #[test]
    fn top_k_top_p_and_min_p_keep_what_the_definitions_keep() {
        let l = logits(1000, 5);
        for t in [0.7f32, 1.0, 1.6] {
            let p = softmax(&l, t as f64);
            let rank = ranked(&p);
            // top-k: the k most likely, renormalised
            let o = SamplingOptions {
                do_sample: true,
                temperature: t,
                top_k: 17,
                ..Default::default()
            };
            let c = candidates(&l, &o);
            assert_eq!(
                c.iter().map(|x| x.0).collect::<Vec<_>>(),
                rank[..17].to_vec()
            );
            let z: f64 = rank[..17].iter().map(|&i| p[i]).sum();
            for &(i, q) in &c {
                assert!((q - p[i] / z).abs() < 1e-12);
            }
            // top-p: the shortest prefix of the ranking whose mass reaches p
            for top_p in [0.05f32, 0.5, 0.9, 0.999] {
                let o = SamplingOptions {
                    do_sample: true,
                    temperature: t,
                    top_p,
                    ..Default::default()
                };
                let c = candidates(&l, &o);
                let mut mass = 0.0;
                let n = rank
                    .iter()
                    .position(|&i| {
                        mass += p[i];
                        mass >= top_p as f64
                    })
                    .unwrap()
                    + 1;
                assert_eq!(c.len(), n, "t {t} top_p {top_p}");
                assert_eq!(
                    c.iter().map(|x| x.0).collect::<Vec<_>>(),
                    rank[..n].to_vec()
                );
            }
            // min-p: every id at least min_p times as likely as the best
            let o = SamplingOptions {
                do_sample: true,
                temperature: t,
                min_p: 0.2,
                ..Default::default()
            };
            let c = candidates(&l, &o);
            let floor = 0.2 * p[rank[0]];
            let want: Vec<usize> = rank.iter().copied().filter(|&i| p[i] >= floor).collect();
            assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn candidates_equal_the_reference_bit_for_bit() {
        let mut seed = 7u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for round in 0..60 {
            let n = [1usize, 2, 5, 100, 3000][round % 5];
            let mut l: Vec<f32> = (0..n)
                .map(|_| {
                    ((next() % 4000) as f32 / 250.0 - 8.0) * if round % 3 == 0 { 0.1 } else { 1.0 }
                })
                .collect();
            // ties, and ids no draw may take
            if n > 4 {
                l[1] = l[0];
                l[3] = f32::NAN;
                l[4] = f32::NEG_INFINITY;
            }
            for (top_k, top_p, min_p) in [
                (0, 1.0, 0.0),
                (17, 1.0, 0.0),
                (0, 0.9, 0.0),
                (0, 0.3, 0.0),
                (0, 1.0, 0.05),
                (40, 0.95, 0.02),
                (3, 0.5, 0.3),
                (0, 0.999, 0.2),
            ] {
                let o = SamplingOptions {
                    do_sample: true,
                    temperature: [0.7f32, 1.0, 1.6][round % 3],
                    top_k,
                    top_p,
                    min_p,
                    ..Default::default()
                };
                let got = candidates(&l, &o);
                let want = candidates_full_sort(&l, &o);
                assert_eq!(got.len(), want.len(), "round {round} {o:?}");
                for (a, b) in got.iter().zip(&want) {
                    assert!(
                        a.0 == b.0 && a.1.to_bits() == b.1.to_bits(),
                        "round {round} {o:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn seeded_sampling_repeats_and_follows_the_probabilities() {
        let l = vec![0.0f32, 1.0, 2.0, -1.0];
        let o = SamplingOptions {
            do_sample: true,
            seed: 42,
            ..Default::default()
        };
        let draw = |o: &SamplingOptions| {
            let mut s = Sampler::new(Some(o.clone()));
            (0..4000)
                .map(|_| s.choose(&mut l.clone(), &[], &[]).unwrap())
                .collect::<Vec<_>>()
        };
        let a = draw(&o);
        assert_eq!(a, draw(&o), "same seed, same tokens");
        let other = SamplingOptions {
            seed: 43,
            ..o.clone()
        };
        assert_ne!(a, draw(&other));
        let p = softmax(&l, 1.0);
        for (id, &pi) in p.iter().enumerate() {
            let f = a.iter().filter(|&&x| x == id as i64).count() as f64 / a.len() as f64;
            // four standard deviations of a binomial frequency
            let sd = (pi * (1.0 - pi) / a.len() as f64).sqrt();
            assert!((f - pi).abs() < 4.0 * sd + 1e-9, "id {id}: {f} vs {pi}");
        }
    }
}
