//! com.microsoft GroupQueryAttention on WebGPU against core's CPU kernel: packed and separate
//! QKV, rotary (halves and interleaved), a first prompt, a continued prompt, one decode step
//! of a batch of unequal lengths in a longer past buffer, local windows, softcap, sinks,
//! attention bias, more keys than a workgroup has lanes; and a decode loop that keeps the KV
//! cache on the device, written in place, with one read-back per step.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use std::sync::Arc;

use nxrt_core::provider::ExecutionProvider;
use nxrt_core::session::ExecMode;
use nxrt_core::{loader, Location, RunOptions, Session, SessionOptions, Tensor, Value};

fn i32s(shape: &[usize], v: Vec<i32>) -> Tensor {
    Tensor::from_vec(shape, v).unwrap()
}

/// Rotary tables of `rows` positions and `h2` angles (the usual inverse-frequency ones).
fn rotary(rows: usize, h2: usize) -> (Tensor, Tensor) {
    let mut c = Vec::with_capacity(rows * h2);
    let mut s = Vec::with_capacity(rows * h2);
    for p in 0..rows {
        for i in 0..h2 {
            let a = p as f64 / 10000f64.powf(i as f64 / h2 as f64);
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    (
        Tensor::from_vec(&[rows, h2], c).unwrap(),
        Tensor::from_vec(&[rows, h2], s).unwrap(),
    )
}

struct G {
    b: usize,
    s: usize,
    nh: usize,
    nkv: usize,
    h: usize,
    /// rows of the past buffers
    past: usize,
    /// per batch: valid length after this call (seqlens_k + 1)
    lens: Vec<usize>,
    total: usize,
    packed: bool,
    rotary: Option<bool>,
    attrs: Vec<nxrt_core::proto::AttributeProto>,
    bias: bool,
    sink: bool,
    pos_ids: Option<Vec<i64>>,
}

impl G {
    fn new(b: usize, s: usize, nh: usize, nkv: usize, h: usize) -> G {
        G {
            b,
            s,
            nh,
            nkv,
            h,
            past: 0,
            lens: vec![s; b],
            total: s,
            packed: false,
            rotary: None,
            attrs: vec![],
            bias: false,
            sink: false,
            pos_ids: None,
        }
    }

    fn case(&self, seed: u32) -> Case {
        let G {
            b, s, nh, nkv, h, ..
        } = *self;
        let qdim = if self.packed {
            (nh + 2 * nkv) * h
        } else {
            nh * h
        };
        let mut feeds = vec![ft(&[b, s, qdim], seed)];
        let mut consts = Vec::new();
        if self.packed {
            consts.push(None);
            consts.push(None);
        } else {
            feeds.push(ft(&[b, s, nkv * h], seed + 1));
            feeds.push(ft(&[b, s, nkv * h], seed + 2));
        }
        let pshape = [b, nkv, self.past, h];
        consts.push(Some(ft(&pshape, seed + 3)));
        consts.push(Some(ft(&pshape, seed + 4)));
        consts.push(Some(i32s(
            &[b],
            self.lens.iter().map(|&l| l as i32 - 1).collect(),
        )));
        consts.push(Some(i32s(&[], vec![self.total as i32])));
        let mut c = Case::new("GroupQueryAttention", feeds)
            .domain("com.microsoft")
            .attr(ai("num_heads", nh as i64))
            .attr(ai("kv_num_heads", nkv as i64))
            .outputs(3)
            .atol(2e-5);
        let rows = self.past.max(self.total) + 4;
        match self.rotary {
            Some(inter) => {
                let (cs, sn) = rotary(rows, h / 2);
                consts.push(Some(cs));
                consts.push(Some(sn));
                c = c
                    .attr(ai("do_rotary", 1))
                    .attr(ai("rotary_interleaved", i64::from(inter)));
            }
            None => {
                consts.push(None);
                consts.push(None);
            }
        }
        consts.push(self.pos_ids.as_ref().map(|p| it(&[b, s], p.clone())));
        consts.push(self.bias.then(|| ft(&[b, 1, s, self.total], seed + 5)));
        consts.push(self.sink.then(|| ft(&[nh], seed + 6)));
        while matches!(consts.last(), Some(None)) {
            consts.pop();
        }
        for a in &self.attrs {
            c = c.attr(a.clone());
        }
        c.consts(consts)
    }
}

#[test]
fn gqa_first_prompt_packed_and_separate() {
    // a first prompt (no past rows), packed QKV with rotary halves, 4 query heads on 2
    let mut g = G::new(1, 7, 4, 2, 16);
    g.packed = true;
    g.rotary = Some(false);
    g.past = 0;
    g.case(1).check();
    // the same in a past buffer with spare rows (onnxruntime-genai's shared buffer)
    g.past = 12;
    g.case(2).check();
    // separate Q, K, V, interleaved rotary, batch 2
    let mut g = G::new(2, 5, 6, 3, 8);
    g.rotary = Some(true);
    g.past = 5;
    g.case(3).check();
    // no rotary, one kv head for all, head size 1
    let mut g = G::new(2, 3, 3, 1, 1);
    g.past = 3;
    g.case(4).check();
}

#[test]
fn gqa_decodes_a_batch_of_unequal_lengths() {
    // one new token per sequence; sequence 0 has 9 rows valid, sequence 1 has 4, in a
    // 16-row buffer (rows past the valid ones hold garbage that must not be read)
    let mut g = G::new(2, 1, 4, 2, 32);
    g.packed = true;
    g.rotary = Some(false);
    g.past = 16;
    g.lens = vec![10, 5];
    g.total = 10;
    g.case(5).check();
    // the past exactly full: the present grows to total_sequence_length rows
    let mut g = G::new(1, 1, 8, 2, 64);
    g.rotary = Some(false);
    g.past = 6;
    g.lens = vec![7];
    g.total = 7;
    g.case(6).check();
    // more keys than a workgroup has lanes (300), packed, interleaved
    let mut g = G::new(1, 1, 2, 1, 16);
    g.packed = true;
    g.rotary = Some(true);
    g.past = 320;
    g.lens = vec![301];
    g.total = 301;
    g.case(7).check();
}

#[test]
fn gqa_continues_a_prompt_with_positions() {
    // 4 new tokens after 6 past ones
    let mut g = G::new(1, 4, 4, 2, 16);
    g.packed = true;
    g.rotary = Some(false);
    g.past = 16;
    g.lens = vec![10];
    g.total = 10;
    g.case(8).check();
    // explicit position ids
    g.pos_ids = Some(vec![6, 7, 8, 9]);
    g.case(9).check();
}

#[test]
fn gqa_window_softcap_scale_sink_and_bias() {
    let mut g = G::new(1, 6, 4, 2, 16);
    g.packed = true;
    g.rotary = Some(false);
    g.past = 8;
    g.attrs = vec![ai("local_window_size", 3)];
    g.case(10).check();
    g.attrs = vec![af("softcap", 1.5), af("scale", 0.3)];
    g.case(11).check();
    g.attrs = vec![ai("smooth_softmax", 1)];
    g.case(12).check();
    g.attrs = vec![];
    g.sink = true;
    g.case(13).check();
    g.sink = false;
    g.bias = true;
    g.case(14).check();
    // a decode step with a window and a bias
    let mut g = G::new(2, 1, 4, 2, 16);
    g.past = 12;
    g.lens = vec![9, 4];
    g.total = 9;
    g.bias = true;
    g.attrs = vec![ai("local_window_size", 5)];
    g.case(15).check();
}

#[test]
fn gqa_with_qk_output_is_declined_by_name() {
    let Some(gp) = gpu() else { return };
    let mut g = G::new(1, 3, 2, 1, 8);
    g.past = 3;
    g.attrs = vec![ai("qk_output", 1)];
    let c = g.case(16);
    let m = loader::load_model(&c.model(), &loader::NoExternalData).unwrap();
    // the WebGPU kernel declines it, naming why
    let node = &m.graph.nodes[0];
    let types = nxrt_core::session::input_types(&m.graph, node);
    match gp.supports(node, &types) {
        nxrt_core::provider::Support::No(why) => assert!(why.contains("qk_output"), "{why}"),
        nxrt_core::provider::Support::Yes => {
            panic!("WebGPU took a GroupQueryAttention with qk_output")
        }
    }
    // and the CPU refuses it too: a clear error at load, never a silent run
    let e = Session::new(m, vec![gp, cpu()], &SessionOptions::default())
        .err()
        .expect("qk_output is refused at load");
    assert!(e.to_string().contains("qk_output"), "{e}");
}

/// A decoder's attention step by step: the KV cache kept on the device between runs
/// (RunOptions::keep_on_device) and fed back as it is, written in place; every step's output
/// and cache equal the CPU's.
#[test]
fn gqa_decode_loop_keeps_the_cache_on_the_device_in_place() {
    // a provider of its own: its counters see this test's copies alone
    let Some(gp) = fresh_gpu() else { return };
    let (nh, nkv, h, cap) = (4usize, 2usize, 16usize, 24usize);
    let qdim = (nh + 2 * nkv) * h;
    let (cs, sn) = rotary(64, h / 2);
    // query feed x0; past key/value feeds x1, x2; seqlens x3, total x4; cos/sin constants
    let model = {
        let mut c = Case::new(
            "GroupQueryAttention",
            vec![
                ft(&[1, 1, qdim], 0),
                ft(&[1, nkv, cap, h], 0),
                ft(&[1, nkv, cap, h], 0),
                i32s(&[1], vec![0]),
                i32s(&[], vec![1]),
            ],
        )
        .domain("com.microsoft")
        .attr(ai("num_heads", nh as i64))
        .attr(ai("kv_num_heads", nkv as i64))
        .attr(ai("do_rotary", 1))
        .outputs(3);
        c.consts = vec![Some(cs), Some(sn)];
        // inputs: query, key, value, past_key, past_value, seqlens, total, cos, sin: reorder
        // the names so the feeds land where GroupQueryAttention reads them
        let mut m: nxrt_core::proto::ModelProto = prost::Message::decode(&c.model()[..]).unwrap();
        let g = m.graph.as_mut().unwrap();
        g.node[0].input = ["x0", "", "", "x1", "x2", "x3", "x4", "c0", "c1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        prost::Message::encode_to_vec(&m)
    };
    let opts = SessionOptions {
        mode: ExecMode::Eager,
        ..Default::default()
    };
    let load = |p: Vec<Arc<dyn ExecutionProvider>>| {
        let m = loader::load_model(&model, &loader::NoExternalData).unwrap();
        Session::new(m, p, &opts).unwrap()
    };
    let sg = load(vec![gp.clone(), cpu()]);
    assert_eq!(sg.partition().assignments[0].2, "webgpu");
    let sc = load(vec![cpu()]);
    let keep = RunOptions {
        keep_on_device: vec!["y1".into(), "y2".into()],
        ..Default::default()
    };
    let zeros =
        || Value::Tensor(Tensor::from_vec(&[1, nkv, cap, h], vec![0f32; nkv * cap * h]).unwrap());
    let (mut pg, mut pc) = ((zeros(), zeros()), (zeros(), zeros()));
    let stats0 = gp.gpu().stats();
    let mut addr = None;
    for step in 0..10usize {
        let feeds = |past: (Value, Value)| {
            vec![
                (
                    "x0".to_string(),
                    Value::Tensor(ft(&[1, 1, qdim], 100 + step as u32)),
                ),
                ("x1".to_string(), past.0),
                ("x2".to_string(), past.1),
                (
                    "x3".to_string(),
                    Value::Tensor(i32s(&[1], vec![step as i32])),
                ),
                (
                    "x4".to_string(),
                    Value::Tensor(i32s(&[], vec![step as i32 + 1])),
                ),
            ]
        };
        let og = pollster::block_on(sg.run_async_with(feeds(pg), keep.clone())).unwrap();
        let oc = pollster::block_on(sc.run_async(feeds(pc))).unwrap();
        let t = |v: &Value| v.as_tensor().unwrap().clone();
        let (kg, vg) = (t(&og[1].1), t(&og[2].1));
        assert_eq!(
            kg.location(),
            Location::Device(0),
            "present key kept on the device"
        );
        // after the first step the present is the past's own buffer (written in place)
        let a = Arc::as_ptr(kg.device_buffer().unwrap()) as *const u8 as usize;
        if step > 0 {
            assert_eq!(
                Some(a),
                addr,
                "step {step}: the present is not the past's buffer"
            );
        }
        addr = Some(a);
        let y = t(&og[0].1);
        assert_eq!(y.location(), Location::Host);
        close(
            &format!("step {step} output"),
            &y.to_f32_vec().unwrap(),
            &t(&oc[0].1).to_f32_vec().unwrap(),
            1e-4,
            2e-5,
        );
        let kh = pollster::block_on(gp.download(&kg)).unwrap();
        close(
            &format!("step {step} present key"),
            &kh.to_f32_vec().unwrap(),
            &t(&oc[1].1).to_f32_vec().unwrap(),
            1e-5,
            1e-6,
        );
        pg = (Value::Tensor(kg), Value::Tensor(vg));
        pc = (og_host(&oc, 1), og_host(&oc, 2));
    }
    let st = gp.gpu().stats();
    // per step: the query uploaded, the output read back (and the test's own key read-back);
    // the cache is uploaded once, on the first step
    assert_eq!(st.downloads - stats0.downloads, 20);
    assert!(
        st.uploads - stats0.uploads <= 10 + 2 + 2,
        "uploads: {}",
        st.uploads - stats0.uploads
    );
}

fn og_host(o: &[(String, Value)], k: usize) -> Value {
    o[k].1.clone()
}

/// A KV buffer grows on the device (`ExecutionProvider::resize_axis`): the kept rows of every
/// head copied, the new ones zero; shapes whose rows are not whole words go through the host.
#[test]
fn kv_buffers_grow_on_the_device() {
    let Some(gp) = gpu() else { return };
    let (heads, rows, h) = (3usize, 5usize, 4usize);
    let x = ft(&[1, heads, rows, h], 7);
    let d = gp.upload(&x).unwrap();
    let y = gp.resize_axis(&d, 2, 3, 9).expect("offered").unwrap();
    assert_eq!(y.shape(), &[1, heads, 9, h]);
    assert_eq!(y.location(), Location::Device(0));
    let got = pollster::block_on(gp.download(&y))
        .unwrap()
        .to_f32_vec()
        .unwrap();
    let xv = x.to_f32_vec().unwrap();
    let mut want = vec![0f32; heads * 9 * h];
    for j in 0..heads {
        want[j * 9 * h..][..3 * h].copy_from_slice(&xv[j * rows * h..][..3 * h]);
    }
    assert_eq!(got, want);
    // float16 rows of 3 elements (6 bytes) on f16 storage: not whole words
    if let Some(hp) = half_gpu(true) {
        let d = hp.upload(&to_half(&ft(&[1, 2, 3, 3], 8))).unwrap();
        assert!(hp.resize_axis(&d, 2, 1, 4).is_none());
    }
}
