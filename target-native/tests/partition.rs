//! Partitioning across providers, with a stand-in device provider ("fakedev") whose tensors live
//! behind `Buffer::Device` and come back only through its async `download`: the partition report
//! (which node runs where, every copy), input placement (host-side shape operands, metadata-only
//! Shape), and that the answers equal a CPU-only run.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nxrt_core::ir::Node;
use nxrt_core::kernels::CpuProvider;
use nxrt_core::proto::{GraphProto, ModelProto, OperatorSetIdProto};
use nxrt_core::provider::{
    BoxFuture, CpuBackend, ExecutionProvider, InputPlacement, Kernel, KernelCx, ReferenceCpu,
    Support,
};
use nxrt_core::tensor::DeviceBuffer;
use nxrt_core::{loader, DataType, Location, Result, Session, SessionOptions, Tensor, Value};
use prost::Message;

mod common;
use common::{f32s, i64s, node, vi};

/// Device memory of the stand-in provider: a host tensor it keeps out of the executor's reach.
#[derive(Debug)]
struct FakeBuf(Tensor);

impl DeviceBuffer for FakeBuf {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn byte_len(&self) -> usize {
        self.0.len() * 4
    }
}

/// Runs Relu, Add and Reshape "on the device" by unwrapping its buffers and using the CPU
/// kernels; counts uploads and downloads.
struct FakeDevice {
    id: u16,
    cpu: CpuProvider,
    uploads: AtomicUsize,
    downloads: AtomicUsize,
}

fn unwrap_dev(t: &Tensor) -> Tensor {
    let Location::Device(_) = t.location() else {
        panic!("a device kernel was handed a host tensor")
    };
    t.device_buffer()
        .and_then(|b| b.as_any().downcast_ref::<FakeBuf>())
        .expect("a FakeBuf")
        .0
        .clone()
}

struct DevKernel {
    id: u16,
    inner: Box<dyn Kernel>,
    /// inputs the kernel reads on the host
    host_inputs: Vec<usize>,
}

impl Kernel for DevKernel {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let owned: Vec<Option<Value>> = inputs
            .iter()
            .enumerate()
            .map(|(k, v)| {
                v.map(|v| match v {
                    Value::Tensor(t) if self.host_inputs.contains(&k) => {
                        assert_eq!(
                            t.location(),
                            Location::Host,
                            "input {k} should be on the host"
                        );
                        Value::Tensor(t.clone())
                    }
                    Value::Tensor(t) => Value::Tensor(unwrap_dev(t)),
                    other => other.clone(),
                })
            })
            .collect();
        let refs: Vec<Option<&Value>> = owned.iter().map(|v| v.as_ref()).collect();
        let outs = self.inner.compute(&KernelCx::new(cx.cpu), &refs)?;
        Ok(outs
            .into_iter()
            .map(|v| match v {
                Value::Tensor(t) => Value::Tensor(Tensor::from_device(
                    t.dtype(),
                    t.shape().to_vec(),
                    self.id,
                    Arc::new(FakeBuf(t)),
                )),
                other => other,
            })
            .collect())
    }
}

impl ExecutionProvider for FakeDevice {
    fn name(&self) -> &str {
        "fakedev"
    }
    fn location(&self) -> Location {
        Location::Device(self.id)
    }
    fn supports(&self, node: &Node, types: &[Option<DataType>]) -> Support {
        let ok_op = matches!(node.op_type.as_str(), "Relu" | "Add" | "Reshape");
        if ok_op && types.first() == Some(&Some(DataType::Float)) {
            Support::Yes
        } else {
            Support::No("fakedev runs f32 Relu, Add and Reshape only".into())
        }
    }
    fn input_placement(&self, node: &Node, k: usize) -> InputPlacement {
        if node.op_type == "Reshape" && k == 1 {
            InputPlacement::Host
        } else {
            InputPlacement::Provider
        }
    }
    fn create_kernel(&self, node: &Node, types: &[Option<DataType>]) -> Result<Box<dyn Kernel>> {
        Ok(Box::new(DevKernel {
            id: self.id,
            inner: self.cpu.create_kernel(node, types)?,
            host_inputs: if node.op_type == "Reshape" {
                vec![1]
            } else {
                vec![]
            },
        }))
    }
    fn cpu_backend(&self) -> &dyn CpuBackend {
        self.cpu.cpu_backend()
    }
    fn upload(&self, t: &Tensor) -> Result<Tensor> {
        assert_eq!(t.location(), Location::Host);
        self.uploads.fetch_add(1, Ordering::Relaxed);
        Ok(Tensor::from_device(
            t.dtype(),
            t.shape().to_vec(),
            self.id,
            Arc::new(FakeBuf(t.clone())),
        ))
    }
    fn download<'a>(&'a self, t: &'a Tensor) -> BoxFuture<'a, Result<Tensor>> {
        Box::pin(async move {
            self.downloads.fetch_add(1, Ordering::Relaxed);
            Ok(unwrap_dev(t))
        })
    }
}

/// x[2,6] -> Relu -> Add(bias) -> Shape ; Add -> Reshape([3,4]) -> Sigmoid (CPU) -> Relu (dev) -> y
/// plus the Shape output as a graph output.
fn model() -> Vec<u8> {
    ModelProto {
        ir_version: 9,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
        }],
        graph: Some(GraphProto {
            name: "mixed".into(),
            node: vec![
                node("Relu", &["x"], &["r"]),
                node("Add", &["r", "bias"], &["a"]),
                node("Shape", &["a"], &["s"]),
                node("Reshape", &["a", "shape"], &["m"]),
                node("Sigmoid", &["m"], &["g"]),
                node("Relu", &["g"], &["y"]),
            ],
            initializer: vec![
                f32s("bias", &[6], &[0.5, -1.0, 0.25, 2.0, -0.5, 1.0]),
                i64s("shape", &[3, 4]),
            ],
            input: vec![vi("x", 1, &["B", "6"])],
            output: vec![vi("y", 1, &["3", "4"]), vi("s", 7, &["2"])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

fn cpu() -> Arc<CpuProvider> {
    Arc::new(CpuProvider::new(Arc::new(ReferenceCpu)))
}

fn run(s: &Session) -> Vec<(String, Value)> {
    let x: Vec<f32> = (0..12).map(|i| i as f32 * 0.3 - 1.7).collect();
    let feeds = vec![(
        "x".to_string(),
        Value::Tensor(Tensor::from_vec(&[2, 6], x).unwrap()),
    )];
    pollster::block_on(s.run_async(feeds)).unwrap()
}

#[test]
fn a_device_provider_gets_its_nodes_with_explicit_copies_and_the_cpus_answers() {
    let dev = Arc::new(FakeDevice {
        id: 0,
        cpu: CpuProvider::new(Arc::new(ReferenceCpu)),
        uploads: AtomicUsize::new(0),
        downloads: AtomicUsize::new(0),
    });
    let m = loader::load_model(&model(), &loader::NoExternalData).unwrap();
    let opts = SessionOptions::default();
    let s = Session::new(m, vec![dev.clone(), cpu()], &opts).unwrap();
    let r = s.partition();
    let placed: Vec<(&str, &str)> = r
        .assignments
        .iter()
        .map(|(_, op, p)| (op.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        placed,
        [
            ("Relu", "fakedev"),
            ("Add", "fakedev"),
            ("Shape", "cpu"),
            ("Reshape", "fakedev"),
            ("Sigmoid", "cpu"),
            ("Relu", "fakedev"),
        ]
    );
    // x and bias go up; Shape reads metadata where it is (no copy); Reshape's shape stays on
    // the host; m comes down for Sigmoid, g goes up for Relu, y comes back as an output.
    let copies: Vec<(&str, &str, &str)> = r
        .copy_list
        .iter()
        .map(|c| (c.value.as_str(), c.from.as_str(), c.to.as_str()))
        .collect();
    assert_eq!(
        copies,
        [
            ("x", "cpu", "fakedev"),
            ("bias", "cpu", "fakedev"),
            ("m", "fakedev", "cpu"),
            ("g", "cpu", "fakedev"),
            ("y", "fakedev", "cpu"),
        ]
    );
    assert_eq!(r.copies, 5);
    assert_eq!(r.nodes_per_provider.len(), 2);

    let want = run(&Session::new(
        loader::load_model(&model(), &loader::NoExternalData).unwrap(),
        vec![cpu()],
        &opts,
    )
    .unwrap());
    for _ in 0..2 {
        let got = run(&s);
        for ((n1, a), (n2, b)) in got.iter().zip(&want) {
            assert_eq!(n1, n2);
            let (Value::Tensor(a), Value::Tensor(b)) = (a, b) else {
                panic!("tensors")
            };
            assert_eq!(a.location(), Location::Host, "{n1} was not read back");
            assert_eq!(a.shape(), b.shape());
            if a.dtype() == DataType::Float {
                assert_eq!(a.to_f32_vec().unwrap(), b.to_f32_vec().unwrap(), "{n1}");
            } else {
                assert_eq!(a.to_i64_vec().unwrap(), b.to_i64_vec().unwrap(), "{n1}");
            }
        }
    }
    // x and g go up every run, the initializer bias only on the first; m, y come down
    assert_eq!(dev.uploads.load(Ordering::Relaxed), 5);
    assert!(r.copy_list.iter().any(|c| c.value == "bias" && c.once));
    assert!(r
        .copy_list
        .iter()
        .filter(|c| c.value != "bias")
        .all(|c| !c.once));
    assert_eq!(dev.downloads.load(Ordering::Relaxed), 4);
}
