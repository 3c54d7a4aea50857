//! Generation exports (`nxrt/genai` in the npm package): the core decode loop over a wasm
//! session, driven one token per call so that the JS side yields to the event loop between
//! tokens and streams text as it is decoded. Text (tokenizer, stop strings) lives in the
//! separate tokenizer module (`target-wasm/tokenizer`), which users who never generate never
//! download.

use std::cell::RefCell;
use std::rc::Rc;

use js_sys::{Float32Array, Object, Uint8Array};
use wasm_bindgen::prelude::*;

use nxrt_core::genai::{
    DecoderConfig, Decoding, GenOptions, Generation, Generator, SamplingOptions,
};
use nxrt_core::Session;

use crate::bindings::{get, js_err, set, JsFiles};
use crate::opt_level;

type Gen = Generator<Rc<Session>>;

/// The external-data files a model names (each once), which a host must fetch beside it.
#[wasm_bindgen(js_name = externalLocations)]
pub fn external_locations(model: &[u8]) -> Result<Vec<String>, JsError> {
    nxrt_core::loader::external_locations(model).map_err(js_err)
}

/// A decoder with its KV cache and the sequence so far. Calls that run the decoder are async;
/// one runs at a time (a second call while one is in flight rejects).
#[wasm_bindgen]
pub struct WasmGenerator {
    /// `None` while an async call holds it.
    inner: Rc<RefCell<Option<Gen>>>,
    /// The generation in progress.
    decoding: Rc<RefCell<Option<Decoding>>>,
    cfg: DecoderConfig,
}

/// A JS function as a logits processor: it gets a copy of the logits as a `Float32Array`
/// (copied back after the call) and the ids so far.
struct JsProcessor(js_sys::Function);

// SAFETY: the wasm32 builds of this crate are single-threaded (no `atomics` target feature,
// no workers), so a processor never leaves the thread that made its JS function; the trait
// asks for `Send` for the native builds' sake.
unsafe impl Send for JsProcessor {}

impl nxrt_core::genai::LogitsProcessor for JsProcessor {
    fn process(&mut self, logits: &mut [f32], history: &[i64]) -> nxrt_core::Result<()> {
        let view = Float32Array::from(&logits[..]);
        let ids: js_sys::Array = history
            .iter()
            .map(|&i| JsValue::from_f64(i as f64))
            .collect();
        self.0.call2(&JsValue::NULL, &view, &ids).map_err(|e| {
            let msg = e
                .dyn_ref::<js_sys::Error>()
                .map(|e| String::from(e.message()))
                .or_else(|| e.as_string())
                .unwrap_or_else(|| format!("{e:?}"));
            nxrt_core::Error::Other(format!("logits processor: {msg}"))
        })?;
        view.copy_to(logits);
        Ok(())
    }
}

fn busy() -> JsValue {
    JsError::new("the generator is busy: await the call in flight first").into()
}

fn ids_from(ids: &[f64]) -> Result<Vec<i64>, JsError> {
    ids.iter()
        .map(|&x| {
            if x.fract() == 0.0 && (0.0..=i32::MAX as f64).contains(&x) {
                Ok(x as i64)
            } else {
                Err(JsError::new(&format!(
                    "token id {x} is not a non-negative integer"
                )))
            }
        })
        .collect()
}

fn num(o: &JsValue, k: &'static str) -> Result<Option<f64>, JsError> {
    let v = get(o, k);
    if v.is_undefined() || v.is_null() {
        return Ok(None);
    }
    v.as_f64()
        .filter(|x| x.is_finite())
        .map(Some)
        .ok_or_else(|| JsError::new(&format!("option {k} must be a finite number")))
}

fn count(o: &JsValue, k: &'static str) -> Result<Option<usize>, JsError> {
    match num(o, k)? {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= (1u64 << 40) as f64 => Ok(Some(x as usize)),
        Some(x) => Err(JsError::new(&format!(
            "option {k} must be a non-negative integer, got {x}"
        ))),
        None => Ok(None),
    }
}

/// Options of one generation from a JS object (camelCase names as the JS API documents).
fn gen_options(o: &JsValue) -> Result<GenOptions, JsError> {
    let d = SamplingOptions::default();
    let f = |k: &'static str, def: f32| -> Result<f32, JsError> {
        Ok(num(o, k)?.map_or(def, |x| x as f32))
    };
    let do_sample = match get(o, "doSample") {
        v if v.is_undefined() || v.is_null() => false,
        v => v
            .as_bool()
            .ok_or_else(|| JsError::new("option doSample must be a boolean"))?,
    };
    let seed = match num(o, "seed")? {
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x <= 9007199254740991.0 => x as u64,
        Some(x) => {
            return Err(JsError::new(&format!(
                "option seed must be a non-negative safe integer, got {x}"
            )))
        }
        None => d.seed,
    };
    let sampling = SamplingOptions {
        do_sample,
        temperature: f("temperature", d.temperature)?,
        top_k: count(o, "topK")?.unwrap_or(d.top_k),
        top_p: f("topP", d.top_p)?,
        min_p: f("minP", d.min_p)?,
        repetition_penalty: f("repetitionPenalty", d.repetition_penalty)?,
        frequency_penalty: f("frequencyPenalty", d.frequency_penalty)?,
        presence_penalty: f("presencePenalty", d.presence_penalty)?,
        no_repeat_ngram_size: count(o, "noRepeatNgramSize")?.unwrap_or(d.no_repeat_ngram_size),
        seed,
    };
    sampling.validate().map_err(js_err)?;
    let g = GenOptions::default();
    Ok(GenOptions {
        max_new_tokens: count(o, "maxNewTokens")?.unwrap_or(g.max_new_tokens),
        min_new_tokens: count(o, "minNewTokens")?.unwrap_or(g.min_new_tokens),
        prefill_chunk: count(o, "prefillChunk")?.unwrap_or(g.prefill_chunk),
        sampling: Some(sampling),
    })
}

fn generation_js(g: &Generation, kv_bytes: usize) -> JsValue {
    let o = Object::new();
    let arr = |v: &[i64]| {
        let a = js_sys::Array::new();
        for &x in v {
            a.push(&JsValue::from_f64(x as f64));
        }
        a
    };
    set(&o, "promptIds", &arr(&g.prompt_ids));
    set(&o, "tokens", &arr(&g.tokens));
    set(
        &o,
        "finishReason",
        &JsValue::from_str(g.finish_reason.as_str()),
    );
    set(
        &o,
        "prefillMs",
        &JsValue::from_f64(g.prefill_ns as f64 / 1e6),
    );
    set(&o, "decodeMs", &JsValue::from_f64(g.decode_ns as f64 / 1e6));
    let tps = if g.decode_ns > 0 {
        g.decode_runs as f64 / (g.decode_ns as f64 / 1e9)
    } else {
        0.0
    };
    set(&o, "decodeTokensPerS", &JsValue::from_f64(tps));
    let ptps = if g.prefill_ns > 0 {
        g.prompt_ids.len() as f64 / (g.prefill_ns as f64 / 1e9)
    } else {
        0.0
    };
    set(&o, "prefillTokensPerS", &JsValue::from_f64(ptps));
    set(&o, "kvBytes", &JsValue::from_f64(kv_bytes as f64));
    o.into()
}

impl WasmGenerator {
    /// Takes the generator for an async call (an error while another call holds it).
    fn take(&self) -> Result<Gen, JsValue> {
        self.inner.borrow_mut().take().ok_or_else(busy)
    }
}

#[wasm_bindgen]
impl WasmGenerator {
    /// Loads a decoder: `config` is the folder's genai_config.json text, `model` the decoder
    /// file's bytes, `ext_names`/`ext_data` its external-data files. Resolves to a
    /// `WasmGenerator`.
    pub fn create(
        config: String,
        model: Vec<u8>,
        ext_names: Vec<String>,
        ext_data: Vec<Uint8Array>,
        providers: Vec<String>,
        opt: String,
    ) -> js_sys::Promise {
        let cfg = DecoderConfig::from_genai_json(&config);
        Self::load(cfg, model, ext_names, ext_data, providers, opt)
    }

    /// Loads a transformers.js / Optimum decoder: `config` is config.json's text,
    /// `generation` generation_config.json's (if the folder has one), `filename` the decoder's
    /// path in the folder; the rest as [`WasmGenerator::create`].
    #[wasm_bindgen(js_name = createHf)]
    #[allow(clippy::too_many_arguments)]
    pub fn create_hf(
        config: String,
        generation: Option<String>,
        filename: String,
        model: Vec<u8>,
        ext_names: Vec<String>,
        ext_data: Vec<Uint8Array>,
        providers: Vec<String>,
        opt: String,
    ) -> js_sys::Promise {
        let cfg = DecoderConfig::from_hf_config(&config, generation.as_deref(), &filename);
        Self::load(cfg, model, ext_names, ext_data, providers, opt)
    }
}

impl WasmGenerator {
    fn load(
        cfg: nxrt_core::Result<DecoderConfig>,
        model: Vec<u8>,
        ext_names: Vec<String>,
        ext_data: Vec<Uint8Array>,
        providers: Vec<String>,
        opt: String,
    ) -> js_sys::Promise {
        wasm_bindgen_futures::future_to_promise(async move {
            let cfg = cfg.map_err(js_err)?;
            let level = opt_level(&opt).map_err(js_err)?;
            let ext = JsFiles::new(ext_names, ext_data).map_err(js_err)?;
            let s = crate::build_session_async(&model, &providers, level, &ext)
                .await
                .map_err(js_err)?;
            let g = Generator::new(Rc::new(s), cfg.clone()).map_err(js_err)?;
            Ok(JsValue::from(WasmGenerator {
                inner: Rc::new(RefCell::new(Some(g))),
                decoding: Rc::new(RefCell::new(None)),
                cfg,
            }))
        })
    }
}

#[wasm_bindgen]
impl WasmGenerator {
    /// The decoder's description: `{modelType, vocabSize, contextLength, layers, heads,
    /// kvHeads, headSize, bosTokenId, eosTokenIds, padTokenId, search: {maxLength, minLength,
    /// doSample, temperature, topK, topP, repetitionPenalty}}`.
    pub fn config(&self) -> JsValue {
        let c = &self.cfg;
        let o = Object::new();
        let n = |x: usize| JsValue::from_f64(x as f64);
        let id = |x: Option<i64>| x.map_or(JsValue::NULL, |v| JsValue::from_f64(v as f64));
        set(&o, "modelType", &JsValue::from_str(&c.model_type));
        set(&o, "vocabSize", &n(c.vocab_size));
        set(&o, "contextLength", &n(c.context_length));
        set(&o, "layers", &n(c.layers));
        set(&o, "heads", &n(c.heads));
        set(&o, "kvHeads", &n(c.kv_heads));
        set(&o, "headSize", &n(c.head_size));
        set(&o, "bosTokenId", &id(c.bos_token_id));
        let eos = js_sys::Array::new();
        for &e in &c.eos_token_ids {
            eos.push(&JsValue::from_f64(e as f64));
        }
        set(&o, "eosTokenIds", &eos);
        set(&o, "padTokenId", &id(c.pad_token_id));
        let s = Object::new();
        let sd = &c.search;
        set(&s, "maxLength", &sd.max_length.map_or(JsValue::NULL, n));
        set(&s, "minLength", &n(sd.min_length));
        set(&s, "doSample", &JsValue::from_bool(sd.do_sample));
        set(&s, "temperature", &JsValue::from_f64(sd.temperature as f64));
        set(&s, "topK", &n(sd.top_k));
        set(&s, "topP", &JsValue::from_f64(sd.top_p as f64));
        set(
            &s,
            "repetitionPenalty",
            &JsValue::from_f64(sd.repetition_penalty as f64),
        );
        set(&o, "search", &s);
        o.into()
    }

    /// Starts a generation after `prompt_ids` (appended to the sequence so far): runs the
    /// prompt. `options`: `{maxNewTokens, minNewTokens, doSample, temperature, topK, topP,
    /// minP, repetitionPenalty, frequencyPenalty, presencePenalty, noRepeatNgramSize, seed,
    /// prefillChunk}` (greedy unless `doSample`). `processors`: functions
    /// `(logits: Float32Array, ids: number[]) => void` run in order at every step after the
    /// built-in penalties (they change `logits` in place; `-Infinity` bans an id; a throw ends
    /// the generation with that error). Resolves when the prompt has run.
    pub fn begin(
        &self,
        prompt_ids: Vec<f64>,
        options: JsValue,
        processors: Option<Vec<JsValue>>,
    ) -> js_sys::Promise {
        let (inner, decoding) = (self.inner.clone(), self.decoding.clone());
        let prep = (|| -> Result<_, JsError> {
            let procs = processors
                .unwrap_or_default()
                .into_iter()
                .map(|f| {
                    f.dyn_into::<js_sys::Function>()
                        .map(JsProcessor)
                        .map_err(|_| JsError::new("a logits processor is not a function"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((ids_from(&prompt_ids)?, gen_options(&options)?, procs))
        })();
        // checked before the generator is taken, which an error must not lose
        let taken = prep
            .map_err(JsValue::from)
            .and_then(|p| Ok((p, self.take()?)));
        wasm_bindgen_futures::future_to_promise(async move {
            let ((ids, opts, procs), mut g) = taken?;
            let r = g.begin(&ids, &opts).await;
            *inner.borrow_mut() = Some(g);
            let mut d = r.map_err(js_err)?;
            for p in procs {
                d.add_processor(Box::new(p));
            }
            *decoding.borrow_mut() = Some(d);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The next id of the generation (feeding the one before through the decoder); resolves
    /// to `undefined` once it has finished.
    pub fn next(&self) -> js_sys::Promise {
        let (inner, decoding) = (self.inner.clone(), self.decoding.clone());
        let taken = self.take();
        wasm_bindgen_futures::future_to_promise(async move {
            let mut g = taken?;
            let d = decoding.borrow_mut().take();
            let Some(mut d) = d else {
                *inner.borrow_mut() = Some(g);
                return Err(JsError::new("no generation in progress: call begin first").into());
            };
            let r = g.next_token(&mut d).await;
            *inner.borrow_mut() = Some(g);
            *decoding.borrow_mut() = Some(d);
            Ok(match r.map_err(js_err)? {
                Some(id) => JsValue::from_f64(id as f64),
                None => JsValue::UNDEFINED,
            })
        })
    }

    /// Ends the generation after the ids given so far (`finishReason` `stop`: a stop string).
    pub fn stop(&self) {
        if let Some(d) = self.decoding.borrow_mut().as_mut() {
            d.stop();
        }
    }

    /// Ends the generation and returns it: `{promptIds, tokens, finishReason, prefillMs,
    /// decodeMs, decodeTokensPerS, prefillTokensPerS, kvBytes}`.
    pub fn finish(&self) -> Result<JsValue, JsError> {
        let d = self
            .decoding
            .borrow_mut()
            .take()
            .ok_or_else(|| JsError::new("no generation in progress"))?;
        let kv = self.inner.borrow().as_ref().map_or(0, |g| g.kv_bytes());
        Ok(generation_js(&d.into_generation(), kv))
    }

    /// Every id the KV cache holds (prompt and generated).
    pub fn ids(&self) -> Result<Vec<f64>, JsError> {
        let g = self.inner.borrow();
        let g = g
            .as_ref()
            .ok_or_else(|| JsError::new("the generator is busy"))?;
        Ok(g.ids().iter().map(|&x| x as f64).collect())
    }

    /// The logits after the last id fed (the penalties of the last choice applied).
    pub fn logits(&self) -> Result<Float32Array, JsError> {
        let g = self.inner.borrow();
        let g = g
            .as_ref()
            .ok_or_else(|| JsError::new("the generator is busy"))?;
        Ok(Float32Array::from(g.logits()))
    }

    /// Bytes the KV cache holds now.
    #[wasm_bindgen(js_name = kvBytes)]
    pub fn kv_bytes(&self) -> f64 {
        self.inner
            .borrow()
            .as_ref()
            .map_or(0.0, |g| g.kv_bytes() as f64)
    }

    /// Feeds ids after the sequence so far (no generation), leaving their logits.
    #[wasm_bindgen(js_name = appendTokens)]
    pub fn append_tokens(&self, ids: Vec<f64>) -> js_sys::Promise {
        let inner = self.inner.clone();
        let taken = ids_from(&ids)
            .map_err(JsValue::from)
            .and_then(|ids| Ok((ids, self.take()?)));
        wasm_bindgen_futures::future_to_promise(async move {
            let (ids, mut g) = taken?;
            let r = g.append_tokens(&ids, 512).await;
            *inner.borrow_mut() = Some(g);
            r.map_err(js_err)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Keeps the first `n` ids and their KV entries (recomputing the logits after id n - 1).
    #[wasm_bindgen(js_name = rewindTo)]
    pub fn rewind_to(&self, n: f64) -> js_sys::Promise {
        let inner = self.inner.clone();
        let taken = if n >= 0.0 && n.fract() == 0.0 {
            self.take()
        } else {
            Err(JsError::new("rewindTo takes a non-negative integer").into())
        };
        wasm_bindgen_futures::future_to_promise(async move {
            let mut g = taken?;
            let r = g.rewind_to(n as usize).await;
            *inner.borrow_mut() = Some(g);
            r.map_err(js_err)?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Forgets the sequence (an empty KV cache) and any generation in progress.
    pub fn reset(&self) -> Result<(), JsError> {
        let mut g = self.inner.borrow_mut();
        let g = g
            .as_mut()
            .ok_or_else(|| JsError::new("the generator is busy"))?;
        *self.decoding.borrow_mut() = None;
        g.reset().map_err(js_err)
    }

    /// Frees the decoder's cached memory (memory plans, WebGPU buffers).
    #[wasm_bindgen(js_name = releaseCached)]
    pub fn release_cached(&self) {
        if let Some(g) = self.inner.borrow().as_ref() {
            g.session().release_cached();
        }
    }
}
