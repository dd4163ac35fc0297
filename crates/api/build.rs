//! Generates the docker.swarmkit.v1 types and gRPC stubs, and Shoal's own `shoal.v1` services. Uses `$PROTOC` when set,
//! else the vendored protoc, so a fresh machine needs no system package.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::var_os("PROTOC").is_none() {
        let protoc = protoc_bin_vendored::protoc_bin_path()?;
        // SAFETY-free: build scripts are single-threaded; set_var is only unsafe in edition 2024.
        std::env::set_var("PROTOC", protoc);
    }
    let protos = [
        "proto/types.proto",
        "proto/specs.proto",
        "proto/objects.proto",
        "proto/dispatcher.proto",
        "proto/health.proto",
        "proto/raft.proto",
        "proto/ca.proto",
        "proto/logbroker.proto",
        "proto/control.proto",
        "proto/watch.proto",
        "proto/resource.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        // A secret's data and a key's bytes must never reach a log line or an error through `{:?}`: their
        // `Debug` is written by hand in `helpers.rs` and prints the length only.
        .skip_debug(["docker.swarmkit.v1.SecretSpec", "docker.swarmkit.v1.EncryptionKey"])
        // `Task` is written by hand (`src/task.rs`) so that tasks can share their spec; same wire form.
        .extern_path(".docker.swarmkit.v1.Task", "crate::Task")
        // Every task holds a `TaskStatus` inline: its fields that are nearly always empty are boxed, so
        // an absent one costs a pointer (the wire form is unchanged).
        .boxed(".docker.swarmkit.v1.TaskStatus.port_status")
        .boxed(".docker.swarmkit.v1.TaskStatus.applied_at")
        .build_client(true)
        .build_server(true)
        // The descriptors let the SwarmKit API refuse requests carrying fields Shoal does not know
        // (`shoal_api::unknown_fields`) instead of dropping them as prost would.
        .file_descriptor_set_path(std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("swarmkit_descriptor.bin"))
        .compile_protos(&protos, &["proto"])?;
    // Shoal's own services (package shoal.v1), apart so that no docker.swarmkit.v1 message changes.
    println!("cargo:rerun-if-changed=proto/shoal_netview.proto");
    tonic_prost_build::configure()
        .extern_path(".docker.swarmkit.v1", "crate::generated")
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/shoal_netview.proto"], &["proto"])?;
    // The Container Storage Interface (package csi.v1): what cluster-volume plugins serve.
    println!("cargo:rerun-if-changed=proto/csi.proto");
    tonic_prost_build::configure()
        // The secrets a plugin is given must never reach a log line through `{:?}`.
        .skip_debug([
            "csi.v1.CreateVolumeRequest",
            "csi.v1.DeleteVolumeRequest",
            "csi.v1.ControllerPublishVolumeRequest",
            "csi.v1.ControllerUnpublishVolumeRequest",
            "csi.v1.NodeStageVolumeRequest",
            "csi.v1.NodePublishVolumeRequest",
        ])
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/csi.proto"], &["proto"])?;
    Ok(())
}
