//! A paged KV pool for several sequences over one decoder ([`PagedGenerator`]).
//!
//! Every sequence's keys and values live in fixed-size pages ([`KvPool`]): `page_rows` token
//! rows of every layer's keys and values (`[2 * layers][kv_heads][page_rows][head_size]`). A
//! sequence is a list of pages. Pages are reference-counted:
//! - **fork** gives a new sequence the same pages (no copy); the first write into a shared page
//!   copies it (copy-on-write), so a fork costs one partial page at most;
//! - **prefix sharing**: a full page is indexed by its parent page and the ids it holds, so a
//!   new sequence whose prompt starts with the same ids as a live sequence's takes its pages
//!   and runs only the rest of the prompt (a prefix is identified by exact ids, never by a
//!   hash alone);
//! - **rewind** drops the pages past the kept rows;
//! - a page whose last holder goes is returned to a free list and reused; the pool never holds
//!   more than `max_pages`, and asking for more is a typed error.
//!
//! The decoder itself runs on one contiguous KV cache ([`Generator`]): the sequence being
//! advanced is *resident* there. Switching to another sequence gathers its pages into the
//! generator's buffers (one copy of its rows); after each call the new rows are written back
//! into its pages. Advancing one sequence several times in a row costs no gather.

use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use core::borrow::Borrow;

use super::engine::{GenOptions, Generation, Generator};
use super::sampling::LogitsProcessor;
use crate::governor::{Account, Holder, Lease, Tier};
use crate::session::Session;
use crate::tensor::Tensor;
use crate::value::Value;
use crate::DataType;
use crate::{Error, Result};

/// A sequence of a [`KvPool`] / [`PagedGenerator`].
pub type SeqId = usize;

const NO_PAGE: u32 = u32::MAX;

/// What a pool holds and has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Pages held by at least one sequence.
    pub pages_in_use: usize,
    /// Pages allocated (in use or free for reuse).
    pub pages_allocated: usize,
    /// Bytes of one page.
    pub page_bytes: usize,
    /// Pages taken from the free list or allocated, and pages given back.
    pub page_allocs: usize,
    pub page_frees: usize,
    /// Shared pages copied before a write.
    pub cow_copies: usize,
    /// Prompt tokens whose rows came from another sequence's pages.
    pub prefix_tokens_shared: usize,
}

struct Seq {
    ids: Vec<i64>,
    pages: Vec<u32>,
    logits: Vec<f32>,
}

/// Fixed-size KV pages shared by sequences (see the module's description). f32 rows.
pub struct KvPool {
    tensors: usize,
    heads: usize,
    head_size: usize,
    page_rows: usize,
    max_pages: usize,
    /// Each page's rows (empty once [`KvPool::trim`] gave a free page back) and its lease.
    pages: Vec<Box<[f32]>>,
    leases: Vec<Option<Lease>>,
    /// The account pages are leased from ([`Holder::Cache`]), if any.
    account: Option<Arc<Account>>,
    refs: Vec<u32>,
    free: Vec<u32>,
    /// Full pages by (parent page, the ids they hold), and each page's key while indexed.
    index: BTreeMap<(u32, Vec<i64>), u32>,
    key_of: Vec<Option<(u32, Vec<i64>)>>,
    seqs: Vec<Option<Seq>>,
    stats: PoolStats,
}

impl KvPool {
    /// A pool for `layers` layers of `kv_heads` heads of `head_size`, pages of `page_rows`
    /// tokens, at most `max_pages` pages.
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_size: usize,
        page_rows: usize,
        max_pages: usize,
    ) -> Result<KvPool> {
        let page_elems = (2 * layers)
            .checked_mul(kv_heads)
            .and_then(|x| x.checked_mul(page_rows))
            .and_then(|x| x.checked_mul(head_size))
            .filter(|&n| n > 0 && n <= (1 << 30))
            .ok_or_else(|| {
                Error::Shape(alloc::format!(
                    "a KV page of {layers} layers x {kv_heads} heads x {page_rows} rows x {head_size}"
                ))
            })?;
        if max_pages == 0 || max_pages >= NO_PAGE as usize {
            return Err(Error::Shape(alloc::format!("a pool of {max_pages} pages")));
        }
        Ok(KvPool {
            tensors: 2 * layers,
            heads: kv_heads,
            head_size,
            page_rows,
            max_pages,
            pages: Vec::new(),
            leases: Vec::new(),
            account: None,
            refs: Vec::new(),
            free: Vec::new(),
            index: BTreeMap::new(),
            key_of: Vec::new(),
            seqs: Vec::new(),
            stats: PoolStats {
                page_bytes: page_elems * 4,
                ..PoolStats::default()
            },
        })
    }

    /// Leases every page from now on from `account` (a session's: its [`Holder::Cache`]), so
    /// its budget bounds the pool: a page over it is [`Error::OutOfMemory`].
    pub fn set_account(&mut self, account: Arc<Account>) {
        self.account = Some(account);
    }

    /// Gives back the memory of the free pages (those no sequence holds; they are allocated
    /// again when needed). Returns the bytes given back.
    pub fn trim(&mut self) -> usize {
        let mut n = 0;
        for &p in &self.free {
            let p = p as usize;
            if !self.pages[p].is_empty() {
                n += self.stats.page_bytes;
                self.pages[p] = Box::default();
                self.leases[p] = None;
            }
        }
        n
    }

    /// Gives back every page (the sequences end first, children before the pages they
    /// share), so the pages' leases return before whatever holds the pool goes.
    pub fn clear(&mut self) {
        for s in (0..self.seqs.len()).rev() {
            let _ = self.release(s);
        }
        self.index.clear();
        self.pages.clear();
        self.leases.clear();
        self.refs.clear();
        self.key_of.clear();
        self.free.clear();
    }

    /// Storage and lease for one page: charged first, then allocated (both fallible).
    fn new_page(&self) -> Result<(Box<[f32]>, Option<Lease>)> {
        let bytes = self.stats.page_bytes;
        let lease = match &self.account {
            Some(a) => Some(Lease::take(
                Some(a),
                Tier::Host,
                Holder::Cache,
                bytes,
                &|| "a KV page".into(),
            )?),
            None => None,
        };
        let page = crate::governor::try_zeroed::<f32>(self.page_elems())?.into_boxed_slice();
        Ok((page, lease))
    }

    fn page_elems(&self) -> usize {
        self.tensors * self.heads * self.page_rows * self.head_size
    }

    /// Rows per page.
    pub fn page_rows(&self) -> usize {
        self.page_rows
    }

    /// The pool's figures now.
    pub fn stats(&self) -> PoolStats {
        PoolStats {
            pages_in_use: self.refs.iter().filter(|&&r| r > 0).count(),
            pages_allocated: self.pages.len(),
            ..self.stats
        }
    }

    fn seq(&self, s: SeqId) -> Result<&Seq> {
        self.seqs
            .get(s)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Input(alloc::format!("no sequence {s} in the KV pool")))
    }

    fn seq_mut(&mut self, s: SeqId) -> Result<&mut Seq> {
        self.seqs
            .get_mut(s)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Input(alloc::format!("no sequence {s} in the KV pool")))
    }

    /// A new, empty sequence.
    pub fn create(&mut self) -> SeqId {
        let seq = Seq {
            ids: Vec::new(),
            pages: Vec::new(),
            logits: Vec::new(),
        };
        match self.seqs.iter().position(Option::is_none) {
            Some(i) => {
                self.seqs[i] = Some(seq);
                i
            }
            None => {
                self.seqs.push(Some(seq));
                self.seqs.len() - 1
            }
        }
    }

    /// A new sequence holding what `s` holds (its pages shared, not copied).
    pub fn fork(&mut self, s: SeqId) -> Result<SeqId> {
        let (ids, pages, logits) = {
            let q = self.seq(s)?;
            (q.ids.clone(), q.pages.clone(), q.logits.clone())
        };
        for &p in &pages {
            self.refs[p as usize] += 1;
        }
        let n = self.create();
        let q = self.seq_mut(n)?;
        (q.ids, q.pages, q.logits) = (ids, pages, logits);
        Ok(n)
    }

    /// Ends sequence `s`, giving back the pages only it held.
    pub fn release(&mut self, s: SeqId) -> Result<()> {
        let q = self.seq(s)?;
        let pages = q.pages.clone();
        self.seqs[s] = None;
        for p in pages.into_iter().rev() {
            self.unref(p);
        }
        Ok(())
    }

    fn unref(&mut self, p: u32) {
        let r = &mut self.refs[p as usize];
        *r -= 1;
        if *r == 0 {
            self.unindex(p);
            self.free.push(p);
            self.stats.page_frees += 1;
        }
    }

    fn unindex(&mut self, p: u32) {
        if let Some(key) = self.key_of[p as usize].take() {
            self.index.remove(&key);
        }
    }

    fn alloc(&mut self) -> Result<u32> {
        if let Some(&p) = self.free.last() {
            if self.pages[p as usize].is_empty() {
                // trimmed: allocated again
                let (page, lease) = self.new_page()?;
                self.pages[p as usize] = page;
                self.leases[p as usize] = lease;
            }
            self.free.pop();
            self.refs[p as usize] = 1;
            self.stats.page_allocs += 1;
            return Ok(p);
        }
        if self.pages.len() >= self.max_pages {
            return Err(Error::Shape(alloc::format!(
                "the KV pool's {} pages ({} bytes each) are all in use",
                self.max_pages,
                self.stats.page_bytes
            )));
        }
        let (page, lease) = self.new_page()?;
        self.pages.push(page);
        self.leases.push(lease);
        self.refs.push(1);
        self.key_of.push(None);
        self.stats.page_allocs += 1;
        Ok((self.pages.len() - 1) as u32)
    }

    /// Page `k` of `s`, made the sequence's own (copied first when shared; taken out of the
    /// prefix index, as its rows are about to change).
    fn writable_page(&mut self, s: SeqId, k: usize) -> Result<u32> {
        let have = self.seq(s)?.pages.len();
        if k == have {
            let p = self.alloc()?;
            self.seq_mut(s)?.pages.push(p);
            return Ok(p);
        }
        let p = self.seq(s)?.pages[k];
        if self.refs[p as usize] == 1 {
            self.unindex(p);
            return Ok(p);
        }
        let n = self.alloc()?;
        let src = self.pages[p as usize].clone();
        self.pages[n as usize].copy_from_slice(&src);
        self.refs[p as usize] -= 1;
        self.seq_mut(s)?.pages[k] = n;
        self.stats.cow_copies += 1;
        Ok(n)
    }

    /// The ids `s` holds KV rows for.
    pub fn ids(&self, s: SeqId) -> Result<&[i64]> {
        Ok(&self.seq(s)?.ids)
    }

    /// The logits after the last id `s` holds (empty before the first).
    pub fn logits(&self, s: SeqId) -> Result<&[f32]> {
        Ok(&self.seq(s)?.logits)
    }

    /// Keeps the first `n` rows of `s` (and ids), dropping the pages past them.
    pub fn truncate(&mut self, s: SeqId, n: usize) -> Result<()> {
        let keep = n.div_ceil(self.page_rows);
        let q = self.seq_mut(s)?;
        if n >= q.ids.len() {
            return Ok(());
        }
        q.ids.truncate(n);
        q.logits.clear();
        let dropped: Vec<u32> = q.pages.drain(keep.min(q.pages.len())..).collect();
        for p in dropped.into_iter().rev() {
            self.unref(p);
        }
        Ok(())
    }

    /// Writes rows `from..` of `ids` (the whole sequence's ids) into `s`'s pages from `src`:
    /// one slice per key/value tensor (`[kv_heads][cap][head_size]`), then indexes the pages
    /// that became full. `s` must hold exactly `from` rows.
    pub fn write_rows(
        &mut self,
        s: SeqId,
        ids: &[i64],
        from: usize,
        src: &[&[f32]],
        cap: usize,
        logits: &[f32],
    ) -> Result<()> {
        let (t_n, heads, h, pr) = (self.tensors, self.heads, self.head_size, self.page_rows);
        if self.seq(s)?.ids.len() != from || ids.len() < from || src.len() != t_n {
            return Err(Error::Other(alloc::format!(
                "KV pool: writing rows {from}.. of {} into a sequence of {} rows",
                ids.len(),
                self.seq(s)?.ids.len()
            )));
        }
        if src.iter().any(|x| x.len() < heads * cap * h) || cap < ids.len() {
            return Err(Error::Other("KV pool: a source tensor is too small".into()));
        }
        let mut r = from;
        while r < ids.len() {
            let k = r / pr;
            let end = ((k + 1) * pr).min(ids.len());
            let p = match self.writable_page(s, k) {
                Ok(p) => p as usize,
                Err(e) => {
                    // the sequence keeps its `from` rows; pages taken for the new ones go back
                    let keep = from.div_ceil(pr);
                    let q = self.seq_mut(s)?;
                    let extra: Vec<u32> = q.pages.drain(keep.min(q.pages.len())..).collect();
                    for p in extra.into_iter().rev() {
                        self.unref(p);
                    }
                    return Err(e);
                }
            };
            let page = &mut self.pages[p];
            for (t, x) in src.iter().enumerate() {
                for j in 0..heads {
                    let d0 = ((t * heads + j) * pr + r % pr) * h;
                    let s0 = (j * cap + r) * h;
                    let n = (end - r) * h;
                    page[d0..d0 + n].copy_from_slice(&x[s0..s0 + n]);
                }
            }
            r = end;
        }
        let q = self.seq_mut(s)?;
        q.ids.extend_from_slice(&ids[from..]);
        q.logits.clear();
        q.logits.extend_from_slice(logits);
        // index the pages that are now full
        let (full, pages) = (ids.len() / pr, q.pages.clone());
        for k in from / pr..full {
            let p = pages[k];
            if self.key_of[p as usize].is_some() {
                continue;
            }
            let parent = if k == 0 { NO_PAGE } else { pages[k - 1] };
            let key = (parent, ids[k * pr..(k + 1) * pr].to_vec());
            if !self.index.contains_key(&key) {
                self.index.insert(key.clone(), p);
                self.key_of[p as usize] = Some(key);
            }
        }
        Ok(())
    }

    /// Copies `s`'s rows into `dst` (one buffer per key/value tensor, `[kv_heads][cap][h]`).
    pub fn read_rows(&self, s: SeqId, dst: &mut [Vec<f32>], cap: usize) -> Result<()> {
        let q = self.seq(s)?;
        let (heads, h, pr) = (self.heads, self.head_size, self.page_rows);
        if dst.len() != self.tensors || cap < q.ids.len() {
            return Err(Error::Other("KV pool: bad destination".into()));
        }
        for d in dst.iter_mut() {
            d.resize(heads * cap * h, 0.0);
        }
        for (k, &p) in q.pages.iter().enumerate() {
            let (r0, r1) = (k * pr, ((k + 1) * pr).min(q.ids.len()));
            let page = &self.pages[p as usize];
            for (t, d) in dst.iter_mut().enumerate() {
                for j in 0..heads {
                    let s0 = (t * heads + j) * pr * h;
                    let d0 = (j * cap + r0) * h;
                    let n = (r1 - r0) * h;
                    d[d0..d0 + n].copy_from_slice(&page[s0..s0 + n]);
                }
            }
        }
        Ok(())
    }

    /// Gives the empty sequence `s` the pages of a live sequence whose ids start as `prompt`
    /// does, whole pages at a time, leaving at least one id of `prompt` to run (its logits are
    /// needed). Returns the ids covered.
    pub fn share_prefix(&mut self, s: SeqId, prompt: &[i64]) -> Result<usize> {
        if !self.seq(s)?.ids.is_empty() {
            return Ok(0);
        }
        let pr = self.page_rows;
        let mut parent = NO_PAGE;
        let mut taken = Vec::new();
        for block in prompt[..prompt.len().saturating_sub(1)].chunks_exact(pr) {
            let Some(&p) = self.index.get(&(parent, block.to_vec())) else {
                break;
            };
            taken.push(p);
            parent = p;
        }
        for &p in &taken {
            self.refs[p as usize] += 1;
        }
        let n = taken.len() * pr;
        let q = self.seq_mut(s)?;
        q.pages = taken;
        q.ids = prompt[..n].to_vec();
        self.stats.prefix_tokens_shared += n;
        Ok(n)
    }
}

/// Several sequences over one decoder, their KV rows in a [`KvPool`] (see the module's
/// description).
pub struct PagedGenerator<S: Borrow<Session>> {
    gen: Generator<S>,
    pool: KvPool,
    /// The sequence whose rows the generator holds, and how many of them equal its pages'.
    resident: Option<(SeqId, usize)>,
}

impl<S: Borrow<Session>> PagedGenerator<S> {
    /// Wraps `gen` (its current sequence is forgotten) with a pool of `max_pages` pages of
    /// `page_rows` rows. f32 KV caches only.
    pub fn new(mut gen: Generator<S>, page_rows: usize, max_pages: usize) -> Result<Self> {
        if gen.kv_dtype() != DataType::Float {
            return Err(Error::Unsupported {
                ctx: Default::default(),
                detail: alloc::format!(
                    "a paged KV pool for a {} KV cache (float only)",
                    gen.kv_dtype()
                ),
            });
        }
        if page_rows == 0 {
            return Err(Error::Input("KV pages of 0 rows".into()));
        }
        gen.reset()?;
        // the pool copies rows between pages and the decoder's buffers on the host
        gen.set_device_kv(false);
        let c = gen.config();
        let mut pool = KvPool::new(c.layers, c.kv_heads, c.head_size, page_rows, max_pages)?;
        pool.set_account(gen.session().memory_account().clone());
        Ok(PagedGenerator {
            gen,
            pool,
            resident: None,
        })
    }

    /// The pool (ids, logits and figures per sequence).
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Gives back the memory of the pool's free pages and what the session caches between
    /// runs (see [`Session::release_cached`]). Returns the pages' bytes given back.
    pub fn release_cached(&mut self) -> usize {
        self.gen.session().release_cached();
        self.pool.trim()
    }

    /// The decoder's generator (its state is the resident sequence's).
    pub fn generator(&self) -> &Generator<S> {
        &self.gen
    }

    /// A new, empty sequence.
    pub fn create(&mut self) -> SeqId {
        self.pool.create()
    }

    /// A new sequence holding what `s` holds, sharing its pages.
    pub fn fork(&mut self, s: SeqId) -> Result<SeqId> {
        self.pool.fork(s)
    }

    /// Ends `s`, giving back the pages only it held.
    pub fn release(&mut self, s: SeqId) -> Result<()> {
        if self.resident.is_some_and(|(r, _)| r == s) {
            self.resident = None;
            self.gen.reset()?;
        }
        self.pool.release(s)
    }

    /// Makes `s` the generator's sequence.
    fn load(&mut self, s: SeqId) -> Result<()> {
        if self.resident.is_some_and(|(r, _)| r == s) {
            return Ok(());
        }
        let len = self.pool.ids(s)?.len();
        let (t, c) = (self.pool.tensors, self.gen.config());
        let (heads, h) = (c.kv_heads, c.head_size);
        // spare rows where the generator writes in place (rounded up to a page)
        let cap = if self.gen.shared_kv_buffer() {
            (len + 1).next_multiple_of(self.pool.page_rows)
        } else {
            len
        };
        let mut bufs = vec![Vec::new(); t];
        if len > 0 {
            self.pool.read_rows(s, &mut bufs, cap)?;
        }
        let past = bufs
            .into_iter()
            .map(|mut v| {
                v.resize(heads * cap * h, 0.0);
                Tensor::from_vec(&[1, heads, cap, h], v).map(Value::Tensor)
            })
            .collect::<Result<Vec<_>>>()?;
        let ids = self.pool.ids(s)?.to_vec();
        let logits = self.pool.logits(s)?.to_vec();
        self.gen.set_state(ids, past, logits);
        self.resident = Some((s, len));
        Ok(())
    }

    /// Writes the resident sequence's new rows into its pages.
    fn store(&mut self) -> Result<()> {
        let Some((s, clean)) = self.resident else {
            return Ok(());
        };
        self.pool.truncate(s, clean)?;
        let clean = clean.min(self.pool.ids(s)?.len());
        let (ids, past, logits) = self.gen.state();
        let cap = match past.first() {
            Some(Value::Tensor(t)) => t.shape()[2],
            _ => 0,
        };
        let slices = past
            .iter()
            .map(|v| match v {
                Value::Tensor(t) => t.as_slice::<f32>(),
                _ => Err(Error::Other("a KV cache entry is not a tensor".into())),
            })
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<&[f32]> = slices.iter().map(|c| &c[..]).collect();
        self.pool.write_rows(s, ids, clean, &refs, cap, logits)?;
        self.resident = Some((s, ids.len()));
        Ok(())
    }

    /// Feeds `ids` after what `s` holds, `chunk` at a time (0: at once). An empty sequence
    /// first takes the pages of a live sequence with the same leading ids (whole pages), and
    /// runs only the rest.
    pub async fn append_tokens(&mut self, s: SeqId, ids: &[i64], chunk: usize) -> Result<()> {
        let n = self.share_prefix(s, ids)?;
        self.load(s)?;
        let r = self.gen.append_tokens(&ids[n..], chunk).await;
        self.store()?;
        r
    }

    /// For an empty `s`: the whole pages of a live sequence starting with `ids`' ids (see
    /// [`KvPool::share_prefix`]); returns how many ids they cover (0 for a sequence that holds
    /// ids already).
    fn share_prefix(&mut self, s: SeqId, ids: &[i64]) -> Result<usize> {
        let n = self.pool.share_prefix(s, ids)?;
        if n > 0 && self.resident.is_some_and(|(r, _)| r == s) {
            // the generator holds the sequence as it was: empty
            self.resident = None;
        }
        Ok(n)
    }

    /// Keeps the first `n` ids of `s` (the logits become those after id `n - 1`).
    pub async fn rewind_to(&mut self, s: SeqId, n: usize) -> Result<()> {
        self.load(s)?;
        let r = self.gen.rewind_to(n).await;
        if let Some((_, clean)) = &mut self.resident {
            *clean = (*clean).min(n.saturating_sub(1));
        }
        self.store()?;
        r
    }

    /// The ids `s` holds.
    pub fn ids(&self, s: SeqId) -> Result<&[i64]> {
        self.pool.ids(s)
    }

    /// The logits after the last id `s` holds.
    pub fn logits(&self, s: SeqId) -> Result<&[f32]> {
        self.pool.logits(s)
    }

    /// Generates on `s` after `prompt` (appended to what it holds), as
    /// [`Generator::generate_with`]: the last id chosen is not fed (a later call feeds it).
    pub async fn generate_with(
        &mut self,
        s: SeqId,
        prompt: &[i64],
        opts: &GenOptions,
        processors: Vec<Box<dyn LogitsProcessor>>,
        on_token: &mut dyn FnMut(i64) -> bool,
    ) -> Result<Generation> {
        let n = self.share_prefix(s, prompt)?;
        self.load(s)?;
        let r = self
            .gen
            .generate_with(&prompt[n..], opts, processors, on_token)
            .await;
        self.store()?;
        r.map(|mut g| {
            g.prompt_ids = prompt.to_vec();
            g
        })
    }
}

impl<S: Borrow<Session>> Drop for PagedGenerator<S> {
    /// Teardown order: the pages (shared prefixes included) go back to the session's account
    /// before the generator, which may hold the last pin on the session, drops.
    fn drop(&mut self) {
        self.pool.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of 1 layer, 2 heads, head size 3, pages of 4 rows; rows whose values encode
    /// (tensor, head, row, k) and a tag.
    fn pool(max: usize) -> KvPool {
        KvPool::new(1, 2, 3, 4, max).unwrap()
    }

    fn rows(n: usize, tag: f32) -> Vec<Vec<f32>> {
        (0..2)
            .map(|t| {
                let mut v = vec![0.0; 2 * n * 3];
                for j in 0..2 {
                    for r in 0..n {
                        for k in 0..3 {
                            v[(j * n + r) * 3 + k] = tag + (t * 1000 + j * 100 + r * 10 + k) as f32;
                        }
                    }
                }
                v
            })
            .collect()
    }

    fn write(p: &mut KvPool, s: SeqId, ids: &[i64], from: usize, data: &[Vec<f32>]) {
        let refs: Vec<&[f32]> = data.iter().map(|v| &v[..]).collect();
        p.write_rows(s, ids, from, &refs, ids.len(), &[0.5])
            .unwrap();
    }

    fn read(p: &KvPool, s: SeqId) -> Vec<Vec<f32>> {
        let n = p.ids(s).unwrap().len();
        let mut d = vec![Vec::new(); 2];
        p.read_rows(s, &mut d, n).unwrap();
        d
    }

    #[test]
    fn rows_round_trip_across_pages() {
        let mut p = pool(8);
        let s = p.create();
        let ids: Vec<i64> = (0..10).collect();
        let data = rows(10, 0.0);
        write(&mut p, s, &ids[..3], 0, &rows(3, 0.0));
        // rows 3.. from a larger source: the first 3 rows of `data` equal rows(3)'s
        write(&mut p, s, &ids, 3, &data);
        assert_eq!(read(&p, s), data);
        assert_eq!(p.stats().pages_in_use, 3, "10 rows in pages of 4");
        assert_eq!(p.logits(s).unwrap(), &[0.5]);
    }

    #[test]
    fn a_fork_shares_pages_and_copies_one_on_write() {
        let mut p = pool(8);
        let a = p.create();
        let ids: Vec<i64> = (0..6).collect();
        write(&mut p, a, &ids, 0, &rows(6, 0.0));
        let b = p.fork(a).unwrap();
        assert_eq!(p.stats().pages_in_use, 2, "nothing copied by the fork");
        // b writes row 6 (into the shared second page): copied first; a is unchanged
        let mut ids_b = ids.clone();
        ids_b.push(99);
        let mut data_b = rows(7, 0.0);
        for t in &mut data_b {
            for j in 0..2 {
                t[(j * 7 + 6) * 3] = -1.0;
            }
        }
        write(&mut p, b, &ids_b, 6, &data_b);
        assert_eq!(p.stats().cow_copies, 1);
        assert_eq!(
            p.stats().pages_in_use,
            3,
            "page 0 still shared, page 1 copied"
        );
        assert_eq!(read(&p, a), rows(6, 0.0));
        assert_eq!(read(&p, b), data_b);
        p.release(a).unwrap();
        assert_eq!(p.stats().pages_in_use, 2);
        assert_eq!(read(&p, b), data_b);
        p.release(b).unwrap();
        assert_eq!(p.stats().pages_in_use, 0);
        let st = p.stats();
        assert_eq!(st.page_allocs, st.page_frees);
        assert!(p.release(b).is_err(), "a released sequence is gone");
    }

    #[test]
    fn full_pages_are_shared_by_prefix_and_truncation_drops_pages() {
        let mut p = pool(8);
        let a = p.create();
        let ids: Vec<i64> = (10..21).collect(); // 11 rows: 2 full pages + 3
        write(&mut p, a, &ids, 0, &rows(11, 0.0));
        let c = p.create();
        let mut prompt = ids[..9].to_vec();
        prompt.push(7);
        // 10 prompt ids: two whole pages match (8 ids), at least one id is left to run
        assert_eq!(p.share_prefix(c, &prompt).unwrap(), 8);
        assert_eq!(p.ids(c).unwrap(), &ids[..8]);
        assert_eq!(read(&p, c), rows(8, 0.0));
        assert_eq!(p.stats().pages_in_use, 3);
        // another prompt differing in the second page shares the first page only
        let d = p.create();
        let mut other = ids[..8].to_vec();
        other[6] = 0;
        other.push(1);
        assert_eq!(p.share_prefix(d, &other).unwrap(), 4);
        // exactly 8 ids: one page, as the last id must run
        let e = p.create();
        assert_eq!(p.share_prefix(e, &ids[..8]).unwrap(), 4);
        // truncation keeps the page's old rows, still valid for their ids
        p.truncate(a, 6).unwrap();
        assert_eq!(p.ids(a).unwrap(), &ids[..6]);
        for s in [c, d, e] {
            p.release(s).unwrap();
        }
        assert_eq!(p.stats().pages_in_use, 2, "a keeps 6 rows in 2 pages");
        let f = p.create();
        assert_eq!(p.share_prefix(f, &ids).unwrap(), 8);
        p.release(f).unwrap();
        // rows for other ids: the page leaves the index under its old ids, joins under the new
        let mut ids2 = ids[..6].to_vec();
        ids2.extend([77, 78]);
        write(&mut p, a, &ids2, 6, &rows(8, 5.0));
        let g = p.create();
        assert_eq!(
            p.share_prefix(g, &ids).unwrap(),
            4,
            "the rewritten page is not the old one"
        );
        let h = p.create();
        ids2.push(1);
        assert_eq!(p.share_prefix(h, &ids2).unwrap(), 8);
    }

    #[test]
    fn the_budget_is_a_typed_error() {
        let mut p = pool(2);
        let s = p.create();
        let ids: Vec<i64> = (0..9).collect();
        let data = rows(9, 0.0);
        let refs: Vec<&[f32]> = data.iter().map(|v| &v[..]).collect();
        let e = p.write_rows(s, &ids, 0, &refs, 9, &[]).unwrap_err();
        assert!(
            matches!(e, Error::Shape(ref m) if m.contains("2 pages")),
            "{e:?}"
        );
        assert!(KvPool::new(1 << 20, 1 << 20, 1 << 20, 1 << 20, 4).is_err());
        assert!(KvPool::new(1, 1, 1, 1, 0).is_err());
    }

    #[test]
    fn pages_are_leased_as_cache_trimmed_and_bounded_by_the_session_budget() {
        let a = Account::new("kv", None);
        let mut p = pool(8);
        p.set_account(a.clone());
        let page = p.stats().page_bytes;
        let cache = || a.holder(Tier::Host, Holder::Cache).in_use();
        let s = p.create();
        let ids: Vec<i64> = (0..10).collect();
        write(&mut p, s, &ids, 0, &rows(10, 0.0));
        assert_eq!(p.stats().pages_allocated, 3);
        assert_eq!(cache(), 3 * page);
        // ended, the pages stay allocated for reuse until trimmed
        p.release(s).unwrap();
        assert_eq!(cache(), 3 * page);
        assert_eq!(p.trim(), 3 * page);
        assert_eq!((cache(), a.budget(Tier::Host).leases()), (0, 0));
        // trimmed pages come back on demand, with the right rows
        let s = p.create();
        write(&mut p, s, &ids[..6], 0, &rows(6, 5.0));
        assert_eq!(cache(), 2 * page);
        assert_eq!(read(&p, s), rows(6, 5.0));
        // a budget of three pages: the fourth is a typed error and the sequence keeps its rows
        a.budget(Tier::Host).set_limit(Some(3 * page));
        let t = p.create();
        write(&mut p, t, &ids[..4], 0, &rows(4, 7.0));
        let refs: Vec<Vec<f32>> = rows(8, 7.0);
        let r: Vec<&[f32]> = refs.iter().map(|v| &v[..]).collect();
        let e = p.write_rows(t, &ids[..8], 4, &r, 8, &[0.5]).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory { holder, .. } if holder == "a KV page"),
            "{e}"
        );
        assert_eq!(read(&p, t), rows(4, 7.0));
        assert_eq!(cache(), 3 * page);
        // the owner's end while pages are live is a counted teardown fault; after clear() not
        let f0 = crate::governor::teardown_faults();
        assert_eq!(a.close(), 3 * page);
        assert_eq!(crate::governor::teardown_faults(), f0 + 1);
        p.clear();
        assert_eq!((cache(), a.budget(Tier::Host).leases()), (0, 0));
        assert_eq!(a.close(), 0);
        assert_eq!(crate::governor::teardown_faults(), f0 + 1);
    }
}
