//! `quant_judge MODEL_DIR OUT_DIR`: judges outputs another target wrote (one `.npy` per output,
//! named as `nxrt run --output-dir` names them) against the quantized set's ONNX Runtime
//! reference, by the set's rule ([`nxrt_tests::quant`]). Prints `ok <report>` and exits 0, or
//! `FAIL <first violation>` and exits 1 (2 for a usage error). The wasm tests call it, so every
//! target is judged by the one rule.

use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, out] = args.as_slice() else {
        eprintln!("usage: quant_judge MODEL_DIR OUT_DIR");
        std::process::exit(2);
    };
    match nxrt_tests::quant::QuantCase::open(Path::new(model)).and_then(|c| c.judge(Path::new(out)))
    {
        Ok(r) => println!("ok {r}"),
        Err(e) => {
            println!("FAIL {e}");
            std::process::exit(1);
        }
    }
}
