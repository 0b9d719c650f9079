//! The Kubernetes path: what the kubelet asks of containerd's CRI plugin
//! for a Pod with `runtimeClassName: pier`, asked here directly over the
//! CRI's gRPC API (no kubelet on a test machine).
//!
//! One Pod, on the host's network (a Pod network needs a CNI plugin, which
//! has nothing to do with pier), its `pier.dev/` annotations passed on by
//! the runtime's `pod_annotations`: the sandbox starts through the shim,
//! then the echo container; a host program echoes through the socket the
//! annotations name; stopping the container (SIGTERM, then SIGKILL after
//! the timeout, as the kubelet does) gives 143, and removing the Pod
//! removes the socket. containerd is our own (`pier_testkit::containerd`), with
//! the runtime registered as `docs/kubernetes.md` shows.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, LinuxPodSandboxConfig, LinuxSandboxSecurityContext,
    NamespaceMode, NamespaceOption, PodSandboxConfig, PodSandboxMetadata, RemoveContainerRequest,
    RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest,
};
use pier_testkit::containerd::{Containerd, SANDBOX_IMAGE};
use tonic::transport::{Channel, Endpoint, Uri};

const IMAGE: &str = "docker.io/pier/echo:latest";

async fn cri_client(socket: &Path) -> RuntimeServiceClient<Channel> {
    let socket = socket.to_path_buf();
    let channel = Endpoint::try_from("http://[::]")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .expect("connecting to containerd's CRI");
    RuntimeServiceClient::new(channel)
}

#[tokio::test(flavor = "current_thread")]
async fn a_pod_with_the_pier_runtime_class_serves_and_stops() {
    let guest = pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::OnFailure,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("echo.tar");
    pier_testkit::oci_image::write_image(&guest.join("echo.wasm"), "echo", IMAGE, &[], &archive)
        .unwrap_or_else(|e| panic!("{e}"));
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-pier-v1"));
    let containerd =
        Containerd::start(&dir.path().join("containerd"), shim).unwrap_or_else(|e| panic!("{e}"));
    // The kubelet's images live in containerd's `k8s.io` namespace.
    containerd.import("k8s.io", &archive).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(SANDBOX_IMAGE, IMAGE, "the sandbox image is the one imported");

    let socket = dir.path().join("sockets/shop/web-0.sock");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let annotations = HashMap::from([
        ("pier.dev/listen".to_owned(), "1234".to_owned()),
        (
            "pier.dev/socket".to_owned(),
            format!("{}/sockets/{{pod-namespace}}/{{pod}}.sock", dir.path().display()),
        ),
    ]);
    let pod = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "web-0".into(),
            uid: "3f1c-web-0".into(),
            namespace: "shop".into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let log = || containerd.log();

    let mut cri = cri_client(&dir.path().join("containerd/containerd.sock")).await;
    let pod_id = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod.clone()),
            runtime_handler: "pier".into(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", log()))
        .into_inner()
        .pod_sandbox_id;
    let container = ContainerConfig {
        metadata: Some(ContainerMetadata { name: "echo".into(), attempt: 0 }),
        image: Some(ImageSpec { image: IMAGE.into(), ..Default::default() }),
        args: vec!["--port".into(), "1234".into()],
        log_path: "echo.log".into(),
        ..Default::default()
    };
    let container_id = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.clone(),
            config: Some(container),
            sandbox_config: Some(pod),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", log()))
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest { container_id: container_id.clone() })
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}\n{}", log()));

    // The annotations reached the shim: the socket is where the Pod's
    // template put it, and the grant lets echo listen.
    let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 251) as u8).collect();
    let echoed = tokio::task::spawn_blocking({
        let socket = socket.clone();
        let payload = payload.clone();
        move || {
            let attempt = || {
                pier_client::HybridStream::connect_timeout(&socket, 1234, Duration::from_secs(5))
            };
            let mut conn = pier_client::retry(Duration::from_secs(20), attempt)
                .unwrap_or_else(|e| panic!("{} never answered: {e}", socket.display()));
            let mut writer = conn.try_clone().unwrap();
            let sender = std::thread::spawn(move || {
                writer.write_all(&payload).unwrap();
                writer.shutdown(std::net::Shutdown::Write).unwrap();
            });
            let mut back = Vec::new();
            conn.read_to_end(&mut back).unwrap();
            sender.join().unwrap();
            back
        }
    })
    .await
    .unwrap();
    assert!(echoed == payload, "{} bytes echoed of {}", echoed.len(), payload.len());

    // The kubelet's stop: SIGTERM, SIGKILL after the timeout.
    cri.stop_container(StopContainerRequest { container_id: container_id.clone(), timeout: 10 })
        .await
        .unwrap_or_else(|e| panic!("StopContainer: {e}\n{}", log()));
    let status = cri
        .container_status(ContainerStatusRequest {
            container_id: container_id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .expect("the container's status");
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 143, "SIGTERM ended it; {}", log());
    cri.remove_container(RemoveContainerRequest { container_id })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    cri.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod_id.clone() })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", log()));
    cri.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod_id })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    assert!(!socket.exists(), "removing the Pod removed its socket");
}
