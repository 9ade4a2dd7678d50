//! Generates the ONNX message types from the vendored `proto/onnx.proto` (the file the `onnx`
//! package ships, Apache-2.0). `protox` compiles the schema in Rust, so building needs no
//! `protoc` binary; `prost-build` writes the structs.

fn main() {
    println!("cargo:rerun-if-changed=proto/onnx.proto");
    let descriptors =
        protox::compile(["proto/onnx.proto"], ["proto"]).expect("proto/onnx.proto compiles");
    prost_build::Config::new().compile_fds(descriptors).expect("prost-build writes the ONNX types");
}
