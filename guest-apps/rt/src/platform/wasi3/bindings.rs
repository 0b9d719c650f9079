//! The generated bindings of the `pier:apps-p3/rt` world: vsock:sockets
//! 0.2.0, the 0.3 monotonic clock, and the `wasi:cli/run@0.3.0` export
//! that `pier_rt::main!` fills in for the app (through `export_run!`,
//! which the app's crate must invoke: an export defined only in a library
//! would not be linked into the component).

#![allow(missing_docs, missing_debug_implementations, clippy::all)]

wit_bindgen::generate!({
    path: ["../../wit/v0.2.0", "../wit-p3"],
    world: "pier:apps-p3/rt",
    generate_all,
    pub_export_macro: true,
    export_macro_name: "export_run",
    default_bindings_module: "pier_rt::__private::wasi3",
});
