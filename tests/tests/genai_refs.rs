//! Greedy generation against onnxruntime-genai's tokens (`$NXRT_CACHE/genai/refs.json`, from
//! `../shared/genai/fetch_genai.sh`): per reference model, six prompts of random ids and the
//! 32 ids onnxruntime-genai 0.18 generates with EOS held back.
//!
//! fp32 models: `nxrt generate --prompt-ids .. --max-new-tokens 32 --min-new-tokens 32 --json`
//! must print exactly the reference ids (every step's margin there is at least 1e-4, far above
//! fp32 rounding).
//!
//! int4 models (MatMulNBits with int8-quantized activations): rounding differences upstream of
//! that quantization can land an activation on the other int8 neighbour, which moves logits by
//! up to ~2e-2, above some reference steps' margins (1e-3 at least). So each prompt is also
//! teacher-forced: fed the reference ids one by one, the reference id's logit must be within
//! `INT4_SLACK` of the best logit at every step (a wrong kernel misses by far more). Where
//! this machine has AVX-512 VNNI (ONNX Runtime's MatMulNBits then runs the kernel whose
//! rounding ours reproduces, as do its RMS norm, logistic, rotary and attention), the int4
//! ids must also be exact; elsewhere the test prints how many prompts match exactly.

use std::path::{Path, PathBuf};

use nxrt::genai::Generator;
use nxrt_tests::{cache_dir, nxrt_bin, nxrt_json, webgpu_available};
use serde_json::Value as Json;

/// How far below our best logit the reference's id may sit at a teacher-forced int4 step.
const INT4_SLACK: f32 = 5e-2;

fn refs() -> (PathBuf, Json) {
    let cache = cache_dir();
    let path = cache.join("genai/refs.json");
    assert!(
        path.exists(),
        "no {}: run ../shared/genai/fetch_genai.sh (the README's test command does)",
        path.display()
    );
    let j = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    (cache, j)
}

fn ids(j: &Json) -> Vec<i64> {
    j.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect()
}

/// `nxrt generate --json` on one prompt: the generated ids and the JSON line.
fn cli_generate(dir: &Path, prompt: &[i64], n: usize) -> (Vec<i64>, Json) {
    cli_generate_on(dir, prompt, n, "cpu")
}

/// [`cli_generate`] with `--provider`.
fn cli_generate_on(dir: &Path, prompt: &[i64], n: usize, provider: &str) -> (Vec<i64>, Json) {
    let list: Vec<String> = prompt.iter().map(|i| i.to_string()).collect();
    let (n, ids_arg) = (n.to_string(), list.join(","));
    let j = nxrt_json(&[
        "generate",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids_arg,
        "--max-new-tokens",
        &n,
        "--min-new-tokens",
        &n,
        "--provider",
        provider,
        "--json",
    ]);
    for key in [
        "prompt_ids",
        "tokens",
        "text",
        "finish_reason",
        "load_ms",
        "prefill_ms",
        "decode_ms",
        "decode_tokens_per_s",
    ] {
        assert!(j.get(key).is_some(), "--json output lacks `{key}`: {j}");
    }
    assert_eq!(ids(&j["prompt_ids"]), prompt);
    assert_eq!(j["finish_reason"], "length");
    (ids(&j["tokens"]), j)
}

#[test]
fn greedy_generation_matches_onnxruntime_genai() {
    let (cache, r) = refs();
    let bin = nxrt_bin();
    assert!(bin.exists(), "no nxrt binary at {}", bin.display());
    let models = r["models"].as_object().unwrap();
    assert!(models.len() >= 4, "expected four reference models");
    let mut failures = Vec::new();
    // the references were made here by ONNX Runtime: on an AVX-512 VNNI machine its int4
    // kernels round as ours do, so its ids are ours exactly
    let int4_exact = nxrt_core::simd::q4_isa().0 == nxrt_core::simd::Isa::Avx512;
    println!("int4 ids required exact: {int4_exact} (AVX-512 VNNI)");
    for (name, m) in models {
        let dir = cache.join(m["dir"].as_str().unwrap());
        let int4 = m["precision"] == "int4";
        let n = r["new_tokens"].as_u64().unwrap() as usize;
        let mut exact = 0;
        let cases = m["cases"].as_array().unwrap();
        let mut forced = int4.then(|| {
            Generator::from_folder(&dir, &nxrt::Session::builder()).expect("load the folder")
        });
        for c in cases {
            let prompt = ids(&c["prompt_ids"]);
            let want = ids(&c["tokens"]);
            let (got, j) = cli_generate(&dir, &prompt, n);
            assert_eq!(got.len(), n, "{name}: {} tokens", got.len());
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            println!(
                "{name:<22} prompt {:>3}: {}  ({:.0} tok/s)",
                prompt.len(),
                first.map_or("same 32 ids".to_string(), |i| format!(
                    "differs from step {i} (reference margin {})",
                    c["margins"][i]
                )),
                j["decode_tokens_per_s"].as_f64().unwrap()
            );
            if first.is_none() {
                exact += 1;
            } else if !int4 || int4_exact {
                failures.push(format!(
                    "{name}, prompt of {}: {got:?} != {want:?}",
                    prompt.len()
                ));
            }
            if let Some(g) = forced.as_mut() {
                g.reset().unwrap();
                g.append_tokens(&prompt, 0).unwrap();
                for (step, &id) in want.iter().enumerate() {
                    let l = g.logits();
                    let best = l.iter().copied().fold(f32::MIN, f32::max);
                    let gap = best - l[id as usize];
                    if gap > INT4_SLACK {
                        failures.push(format!(
                            "{name}, prompt of {}: step {step}: the reference id {id} is {gap} \
                             below the best logit",
                            prompt.len()
                        ));
                        break;
                    }
                    g.append_tokens(&[id], 0).unwrap();
                }
            }
        }
        println!(
            "{name}: {exact} of {} prompts give the same 32 ids",
            cases.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The fp32 reference models on WebGPU (lavapipe in CI: the ops WebGPU declines, such as
/// GroupQueryAttention, run on the CPU with reported copies): the same 32 ids as
/// onnxruntime-genai on every prompt of the small model and on the two shortest prompts of the
/// larger one (software Vulkan decodes it at about 4 tokens/s). Skips, saying so, where there is
/// no WebGPU adapter.
#[test]
fn greedy_generation_on_webgpu_matches_onnxruntime_genai_for_fp32() {
    if !webgpu_available() {
        return;
    }
    let (cache, r) = refs();
    let n = r["new_tokens"].as_u64().unwrap() as usize;
    let mut failures = Vec::new();
    for (name, take) in [("tiny_llama_genai_fp32", 6), ("llama_bench_fp32", 2)] {
        let m = &r["models"][name];
        assert!(m.is_object(), "no reference model {name}");
        let dir = cache.join(m["dir"].as_str().unwrap());
        for c in m["cases"].as_array().unwrap().iter().take(take) {
            let prompt = ids(&c["prompt_ids"]);
            let want = ids(&c["tokens"]);
            let (got, j) = cli_generate_on(&dir, &prompt, n, "webgpu");
            println!(
                "webgpu {name:<22} prompt {:>3}: {} ({:.1} tok/s)",
                prompt.len(),
                if got == want {
                    "same 32 ids"
                } else {
                    "differs"
                },
                j["decode_tokens_per_s"].as_f64().unwrap()
            );
            if got != want {
                failures.push(format!(
                    "{name}, prompt of {}: {got:?} != {want:?}",
                    prompt.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// On WebGPU the KV cache stays on the device: GroupQueryAttention writes each step's rows
/// into the cache's own buffer there, and a decode step reads back nothing but the logits
/// (one download per step, counted by the provider); `rewind_to` keeps the device buffer and
/// continues the reference. Skips, saying so, where there is no WebGPU adapter.
#[test]
fn webgpu_generation_keeps_the_kv_cache_on_the_device() {
    if !webgpu_available() {
        return;
    }
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let c = &m["cases"][2];
    let (prompt, want) = (ids(&c["prompt_ids"]), ids(&c["tokens"]));
    let mut g = Generator::from_folder(
        &dir,
        &nxrt::Session::builder().providers(&["webgpu", "cpu"]),
    )
    .unwrap();
    let counter = |g: &Generator, name: &str| {
        let webgpu = g
            .core_session()
            .providers()
            .iter()
            .find(|p| p.name() == "webgpu")
            .expect("a webgpu provider");
        let c = webgpu.counters();
        c.iter().find(|(n, _)| *n == name).unwrap().1
    };
    let downloads = |g: &Generator| counter(g, "downloads");
    let bytes_before = counter(&g, "downloaded_bytes");
    g.append_tokens(&prompt, 0).unwrap();
    assert!(g.kv_on_device(), "the KV cache was read back to the host");
    // the prompt's logits: only the last row comes back
    assert!(prompt.len() > 1);
    assert_eq!(
        counter(&g, "downloaded_bytes") - bytes_before,
        4 * g.logits().len() as u64,
        "bytes read back after a {}-id prompt",
        prompt.len()
    );
    let n = want.len();
    let before = downloads(&g);
    let opts = nxrt::genai::GenOptions {
        max_new_tokens: n,
        min_new_tokens: n,
        ..Default::default()
    };
    let got = g.generate(&[], &opts, |_| true).unwrap();
    assert_eq!(got.tokens, want);
    assert!(g.kv_on_device());
    // the last id is chosen from the logits already read: n - 1 more runs
    assert_eq!(
        downloads(&g) - before,
        n as u64 - 1,
        "read-backs over {} decode steps",
        n - 1
    );
    g.rewind_to(prompt.len() + 10).unwrap();
    assert!(g.kv_on_device(), "a rewind read the cache back");
    let rest = nxrt::genai::GenOptions {
        max_new_tokens: n - 10,
        min_new_tokens: n - 10,
        ..Default::default()
    };
    assert_eq!(g.generate(&[], &rest, |_| true).unwrap().tokens, want[10..]);
}

/// The shared KV buffer (GroupQueryAttention decoders) through `rewind_to`: after generating
/// the reference's 32 ids, rewinding into them and generating again gives the reference's ids
/// from there (rows past the rewind point are overwritten in place, never read); and the
/// buffer grows geometrically (at most twice the rows the sequence needs).
#[test]
fn rewind_then_generate_continues_the_reference() {
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let mut g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    assert!(
        g.shared_kv_buffer(),
        "a GroupQueryAttention decoder shares past and present"
    );
    let per_row = 2 * 4 * 2 * 64 * 4; // K and V, 4 layers, 2 kv heads of 64, f32
    for c in m["cases"].as_array().unwrap().iter().take(3) {
        let prompt = ids(&c["prompt_ids"]);
        let want = ids(&c["tokens"]);
        let n = want.len();
        let opts = nxrt::genai::GenOptions {
            max_new_tokens: n,
            min_new_tokens: n,
            ..Default::default()
        };
        g.reset().unwrap();
        let first = g.generate(&prompt, &opts, |_| true).unwrap();
        assert_eq!(first.tokens, want);
        let (rows, used) = (g.kv_bytes() / per_row, prompt.len() + n - 1);
        assert!(
            rows >= used && rows <= (2 * used).max(16),
            "{rows} rows for {used} ids"
        );
        for back in [10, 1] {
            g.rewind_to(prompt.len() + back).unwrap();
            assert_eq!(g.ids().len(), prompt.len() + back);
            let rest = nxrt::genai::GenOptions {
                max_new_tokens: n - back,
                min_new_tokens: n - back,
                ..Default::default()
            };
            let again = g.generate(&[], &rest, |_| true).unwrap();
            assert_eq!(
                again.tokens,
                want[back..],
                "prompt of {}, rewound to +{back}",
                prompt.len()
            );
        }
    }
}

/// The processor chain (`generate_with`): a caller's processor sees every step's logits and the
/// ids so far (the prompt, then each new id), its changes decide the choice (banning the
/// reference's first id gives the runner-up of that step's logits), and processors run in the
/// order added (a later one sees what an earlier one did).
#[test]
fn logits_processors_see_each_step_and_steer_the_choice() {
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let c = &m["cases"][2];
    let (prompt, want) = (ids(&c["prompt_ids"]), ids(&c["tokens"]));
    let mut g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    let opts = nxrt::genai::GenOptions {
        max_new_tokens: 4,
        min_new_tokens: 4,
        ..Default::default()
    };
    // the step-0 logits without processors, for the runner-up
    g.reset().unwrap();
    g.append_tokens(&prompt, 0).unwrap();
    let l0 = g.logits().to_vec();
    let mut order: Vec<usize> = (0..l0.len()).collect();
    order.sort_by(|&a, &b| l0[b].total_cmp(&l0[a]).then(a.cmp(&b)));
    assert_eq!(order[0] as i64, want[0]);

    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Vec<i64>>::new()));
    let saw_ban = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (log, first, plen) = (seen.clone(), want[0], prompt.len());
    let ban_first = move |l: &mut [f32], h: &[i64]| {
        log.lock().unwrap().push(h.to_vec());
        if h.len() == plen {
            l[first as usize] = f32::NEG_INFINITY;
        }
        Ok(())
    };
    // a second processor runs after the first: at step 0 it sees the ban
    let flag = saw_ban.clone();
    let after = move |l: &mut [f32], h: &[i64]| {
        if h.len() == plen {
            flag.store(
                l[first as usize] == f32::NEG_INFINITY,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        Ok(())
    };
    g.reset().unwrap();
    let got = g
        .generate_with(
            &prompt,
            &opts,
            vec![Box::new(ban_first), Box::new(after)],
            |_| true,
        )
        .unwrap();
    assert_eq!(
        got.tokens[0], order[1] as i64,
        "the runner-up once the best is banned"
    );
    assert!(
        saw_ban.load(std::sync::atomic::Ordering::Relaxed),
        "processors run in order"
    );
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 4, "one call per choice");
    for (step, h) in seen.iter().enumerate() {
        let mut expect = prompt.clone();
        expect.extend_from_slice(&got.tokens[..step]);
        assert_eq!(*h, expect, "history at step {step}");
    }

    // forcing an id: every other logit -inf
    let forced = 7i64;
    let force = move |l: &mut [f32], _: &[i64]| {
        for (i, x) in l.iter_mut().enumerate() {
            if i as i64 != forced {
                *x = f32::NEG_INFINITY;
            }
        }
        Ok(())
    };
    g.reset().unwrap();
    let got = g
        .generate_with(&prompt, &opts, vec![Box::new(force)], |_| true)
        .unwrap();
    assert_eq!(got.tokens, vec![forced; 4]);
    // an error from a processor ends the generation with it
    let fail = |_: &mut [f32], _: &[i64]| Err(nxrt::Error::Input("no".into()));
    g.reset().unwrap();
    assert!(g
        .generate_with(&prompt, &opts, vec![Box::new(fail)], |_| true)
        .is_err());
}

/// A transformers.js / Optimum folder: `config.json` and a decoder of plain ONNX ops whose
/// present is Concat(past, new) (the corpus's `tiny_llama`, exported by torch from the same
/// seeded weights the onnxruntime-genai builder turned into `tiny_llama_genai_fp32`), so
/// `nxrt generate` on it must give onnxruntime-genai's greedy ids for that model.
#[test]
fn optimum_folder_generates_onnxruntime_genai_ids_for_the_same_weights() {
    let (cache, r) = refs();
    let src = cache.join("corpus/tiny_llama");
    let meta: Json =
        serde_json::from_slice(&std::fs::read(src.join("tiny_llama_meta.json")).unwrap()).unwrap();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = std::env::temp_dir().join(format!("nxrt-optimum-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("onnx")).unwrap();
    let mut config = meta["config"].clone();
    config["model_type"] = "llama".into();
    config["bos_token_id"] = m["bos_token_id"].clone();
    config["eos_token_id"] = m["eos_token_id"].clone();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::os::unix::fs::symlink(src.join("model.onnx"), dir.join("onnx/model.onnx")).unwrap();
    let g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    assert!(
        !g.shared_kv_buffer(),
        "a Concat decoder gets a past of the sequence's own length"
    );
    drop(g);
    let n = r["new_tokens"].as_u64().unwrap() as usize;
    for c in m["cases"].as_array().unwrap() {
        let prompt = ids(&c["prompt_ids"]);
        let (got, _) = cli_generate(&dir, &prompt, n);
        assert_eq!(got, ids(&c["tokens"]), "prompt of {} ids", prompt.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The paged KV pool (`Generator::into_paged`): three sequences advanced in turn, one id at a
/// time, each give onnxruntime-genai's ids; a fork shares the pages (copying one on its first
/// write), rewinds and regenerates the reference from there while the original is untouched; a
/// new sequence whose prompt repeats a live one's takes its whole pages; every page comes
/// back when the sequences end; the pool's budget is a typed error.
#[test]
fn paged_sequences_give_the_reference_ids() {
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let cases: Vec<(Vec<i64>, Vec<i64>)> = m["cases"].as_array().unwrap()[2..5]
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["tokens"])))
        .collect();
    let g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    let mut pg = g.into_paged(16, 256).unwrap();
    let seqs: Vec<_> = cases.iter().map(|_| pg.create()).collect();
    for (&s, (p, _)) in seqs.iter().zip(&cases) {
        pg.append_tokens(s, p, 0).unwrap();
    }
    let n = cases[0].1.len();
    for step in 0..n {
        for (&s, (p, want)) in seqs.iter().zip(&cases) {
            let id = argmax(pg.logits(s).unwrap());
            assert_eq!(id, want[step], "prompt of {} ids, step {step}", p.len());
            if step + 1 < n {
                pg.append_tokens(s, &[id], 0).unwrap();
            }
        }
    }
    let rows: usize = seqs.iter().map(|&s| pg.ids(s).unwrap().len()).sum();
    let st = pg.stats();
    assert_eq!(
        st.pages_in_use,
        seqs.iter()
            .map(|&s| pg.ids(s).unwrap().len().div_ceil(16))
            .sum::<usize>()
    );
    println!("3 sequences, {rows} rows: {st:?}");

    // a fork: no copy; rewound into the shared rows, it regenerates the reference from there
    let (p0, want0) = &cases[0];
    let f = pg.fork(seqs[0]).unwrap();
    assert_eq!(
        pg.stats().pages_in_use,
        st.pages_in_use,
        "a fork copies nothing"
    );
    pg.rewind_to(f, p0.len() + 10).unwrap();
    let opts = nxrt::genai::GenOptions {
        max_new_tokens: n - 10,
        min_new_tokens: n - 10,
        ..Default::default()
    };
    let again = pg
        .generate_with(f, &[], &opts, Vec::new(), |_| true)
        .unwrap();
    assert_eq!(again.tokens, want0[10..]);
    assert!(
        pg.stats().cow_copies >= 1,
        "the rewound fork wrote into a shared page"
    );
    assert_eq!(
        argmax(pg.logits(seqs[0]).unwrap()),
        want0[n - 1],
        "the original is untouched"
    );
    assert_eq!(pg.ids(seqs[0]).unwrap().len(), p0.len() + n - 1);
    // (its rows too: recomputed from its pages past the fork's rewind point)
    pg.rewind_to(seqs[0], p0.len() + 20).unwrap();
    assert_eq!(argmax(pg.logits(seqs[0]).unwrap()), want0[20]);

    // a prompt repeating a live sequence's ids takes its whole pages and runs the rest
    let (p1, want1) = &cases[1];
    let full: Vec<i64> = p1.iter().chain(&want1[..n - 1]).copied().collect();
    let d = pg.create();
    let before = pg.stats();
    pg.append_tokens(d, &full, 0).unwrap();
    let shared = pg.stats().prefix_tokens_shared - before.prefix_tokens_shared;
    assert_eq!(shared, (full.len() - 1) / 16 * 16);
    assert_eq!(
        pg.stats().pages_in_use - before.pages_in_use,
        1,
        "one page of its own"
    );
    assert_eq!(argmax(pg.logits(d).unwrap()), want1[n - 1]);
    let (a, b) = (pg.logits(d).unwrap().to_vec(), pg.logits(seqs[1]).unwrap());
    let diff = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max);
    assert!(
        diff < 1e-4,
        "logits after the shared prefix differ by {diff}"
    );

    for s in seqs.into_iter().chain([f, d]) {
        pg.release(s).unwrap();
    }
    let end = pg.stats();
    assert_eq!(end.pages_in_use, 0);
    assert_eq!(end.page_allocs, end.page_frees);
    println!("released: {end:?}");

    // the pages are the session's cache (leased from its account), given back on request,
    // and returned before the session goes
    let cache_of = |pg: &nxrt::genai::PagedGenerator| {
        let snap = pg.memory_snapshot();
        let host = &snap.tiers[0];
        assert_eq!(host.tier, nxrt::governor::Tier::Host);
        host.holders
            .iter()
            .find(|h| h.holder == nxrt::governor::Holder::Cache)
            .map_or(0, |h| h.in_use)
    };
    assert_eq!(cache_of(&pg), end.pages_allocated * end.page_bytes);
    assert_eq!(pg.release_cached(), end.pages_allocated * end.page_bytes);
    assert_eq!(cache_of(&pg), 0);
    let (x, y) = (pg.create(), pg.create());
    pg.append_tokens(x, &cases[0].0, 0).unwrap();
    pg.append_tokens(y, &cases[0].0, 0).unwrap();
    assert!(pg.stats().prefix_tokens_shared > 0 && cache_of(&pg) > 0);
    let faults = nxrt::governor::teardown_faults();
    drop(pg); // it holds the only pin on its session, and live shared pages
    assert_eq!(
        nxrt::governor::teardown_faults(),
        faults,
        "KV pages outlived the session they depend on"
    );

    // the budget: two pages of 16 rows cannot hold a 64-id prompt
    let g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    let mut small = g.into_paged(16, 2).unwrap();
    let s = small.create();
    let e = small.append_tokens(s, &cases[2].0, 0).unwrap_err();
    assert!(e.to_string().contains("2 pages"), "{e}");
}

/// The greedy choice (ties to the lowest id), as the sampler makes it.
fn argmax(l: &[f32]) -> i64 {
    nxrt_core::genai::sampling::argmax(l).expect("a finite logit") as i64
}

/// `nxrt generate --phase-profile`: the run table on stderr counts one run per step (the
/// prompt, then each decode step) and names the decoder's attention and its slowest nodes;
/// stdout still ends with the JSON line.
#[test]
fn generate_phase_profile_covers_every_step() {
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let out = std::process::Command::new(nxrt_bin())
        .args([
            "generate",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3,4",
            "--max-new-tokens",
            "5",
            "--min-new-tokens",
            "5",
            "--json",
            "--phase-profile",
            "--profile-nodes",
            "3",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // the prompt and 4 decode steps (the fifth id comes from the last step's logits)
    assert!(
        err.contains("phase profile: 5 profiled run(s)"),
        "stderr: {err}"
    );
    assert!(err.contains("GroupQueryAttention"), "stderr: {err}");
    assert!(err.contains("node (slowest first)"), "stderr: {err}");
    let last = String::from_utf8_lossy(&out.stdout);
    let j: Json = serde_json::from_str(last.lines().last().unwrap()).unwrap();
    assert_eq!(ids(&j["tokens"]).len(), 5);
}

/// The contiguous KV cache a generator keeps between steps is its session's `cache` (the
/// present outputs it keeps move there from `outputs`; buffers it grows itself are leased
/// there), it goes on `reset`, and it is released before the session it depends on.
#[test]
fn the_contiguous_kv_cache_is_leased_as_cache() {
    use nxrt::governor::{Holder, Tier};
    let (cache, r) = refs();
    let m = &r["models"]["tiny_llama_genai_fp32"];
    let dir = cache.join(m["dir"].as_str().unwrap());
    let c = &m["cases"].as_array().unwrap()[2];
    let (prompt, want) = (ids(&c["prompt_ids"]), ids(&c["tokens"]));
    let mut g = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    let held = |g: &Generator, h: Holder| {
        let snap = g.memory_snapshot();
        let host = snap.tiers.iter().find(|t| t.tier == Tier::Host).unwrap();
        host.holders
            .iter()
            .find(|x| x.holder == h)
            .map_or(0, |x| x.in_use)
    };
    assert_eq!(held(&g, Holder::Cache), 0);
    g.append_tokens(&prompt, 0).unwrap();
    let after_prompt = held(&g, Holder::Cache);
    assert!(after_prompt > 0, "the KV cache is not charged as cache");
    assert_eq!(
        held(&g, Holder::Outputs),
        0,
        "the kept KV is still charged as outputs"
    );
    for &id in &want[..4] {
        g.append_tokens(&[id], 0).unwrap();
    }
    assert!(held(&g, Holder::Cache) >= after_prompt);
    assert_eq!(held(&g, Holder::Outputs), 0);
    g.reset().unwrap();
    assert_eq!(held(&g, Holder::Cache), 0, "reset keeps cache bytes");
    g.append_tokens(&prompt, 0).unwrap();
    let faults = nxrt::governor::teardown_faults();
    drop(g); // the only pin on its session, with a live cache
    assert_eq!(
        nxrt::governor::teardown_faults(),
        faults,
        "the KV cache outlived the session it depends on"
    );
}
