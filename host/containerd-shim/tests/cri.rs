//! The Kubernetes path: what the kubelet asks of containerd's CRI plugin
//! for a Pod with `runtimeClassName: pier`, asked here directly over the
//! CRI's gRPC API (no kubelet on a test machine).
//!
//! One Pod, on the host's network (a Pod network needs a CNI plugin, which
//! has nothing to do with pier), its `pier.dev/` annotations passed on by
//! the runtime's `pod_annotations`: the sandbox starts through the shim,
//! then the echo container; a host program echoes through the socket in
//! the Pod's folder; stopping the container (SIGTERM, then SIGKILL after
//! the timeout, as the kubelet does) gives 143; containers of hello exit
//! with 0, 3, 42 and a trap's 134, as the CRI reports them; a component
//! reads a configMap's folder and writes an emptyDir's; and removing
//! the Pod removes its socket folder. containerd is our own (`pier_testkit::containerd`), with
//! the runtime registered as `docs/kubernetes.md` shows.
//!
//! The kubelet's image pull too: PullImage with the reference alone, from
//! a registry on loopback (`pier_testkit::registry`), and a container of
//! the pulled image.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, ImageStatusRequest, LinuxPodSandboxConfig,
    LinuxSandboxSecurityContext, Mount, NamespaceMode, NamespaceOption, PodSandboxConfig,
    PodSandboxMetadata, PullImageRequest, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopContainerRequest, StopPodSandboxRequest,
};
use pier_testkit::containerd::{Containerd, SANDBOX_IMAGE};
use pier_testkit::registry::Registry;
use tonic::transport::{Channel, Endpoint, Uri};

const IMAGE: &str = "docker.io/pier/echo:latest";
const HELLO: &str = "docker.io/pier/hello:latest";
const PROBE: &str = "docker.io/pier/probe:latest";

async fn cri_client(socket: &Path) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(cri_channel(socket).await)
}

/// A channel to containerd's gRPC socket, for the CRI's runtime and image
/// services alike.
async fn cri_channel(socket: &Path) -> Channel {
    let socket = socket.to_path_buf();
    Endpoint::try_from("http://[::]")
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
        .expect("connecting to containerd's CRI")
}

/// What the kubelet asks for container `name` of `image` with `args`.
fn container_config(name: &str, image: &str, args: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(ImageSpec { image: image.into(), ..Default::default() }),
        args: args.iter().map(|a| a.to_string()).collect(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

/// Creates and starts the container `config` describes in the Pod, as the
/// kubelet does; returns its id.
async fn start_container(
    cri: &mut RuntimeServiceClient<Channel>,
    pod_id: &str,
    pod: &PodSandboxConfig,
    config: ContainerConfig,
    log: &dyn Fn() -> String,
) -> String {
    let name = config.metadata.as_ref().map_or_else(String::new, |m| m.name.clone());
    let id = cri
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(pod.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", log()))
        .into_inner()
        .container_id;
    cri.start_container(StartContainerRequest { container_id: id.clone() })
        .await
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", log()));
    id
}

/// Waits until container `id` has exited, removes it, and returns its
/// exit code as the CRI reports it.
async fn exit_code_of(
    cri: &mut RuntimeServiceClient<Channel>,
    id: &str,
    log: &dyn Fn() -> String,
) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        let status = container_status(cri, id).await;
        if status.state == ContainerState::ContainerExited as i32 {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "container {id} still runs; {}", log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    cri.remove_container(RemoveContainerRequest { container_id: id.to_owned() })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    status.exit_code
}

/// The guest components (built when missing), and echo's image archive
/// written into `dir`: the Pods' sandbox image.
fn guest_and_echo_image(dir: &Path) -> (PathBuf, PathBuf) {
    let guest = pier_testkit::build_guest_components(
        &pier_testkit::cache_dir("guest-target"),
        pier_testkit::Output::OnFailure,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let archive = dir.join("echo.tar");
    pier_testkit::oci_image::write_image(&guest.join("echo.wasm"), "echo", IMAGE, &[], &archive)
        .unwrap_or_else(|e| panic!("{e}"));
    (guest, archive)
}

/// Starts the Pod `pod` with the `pier` runtime handler (its
/// RuntimeClass's), as the kubelet does; returns its sandbox's id.
async fn run_pier_pod(
    cri: &mut RuntimeServiceClient<Channel>,
    pod: &PodSandboxConfig,
    log: &dyn Fn() -> String,
) -> String {
    cri.run_pod_sandbox(RunPodSandboxRequest {
        config: Some(pod.clone()),
        runtime_handler: "pier".into(),
    })
    .await
    .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", log()))
    .into_inner()
    .pod_sandbox_id
}

/// Stops and removes the Pod's sandbox, as the kubelet does when the Pod
/// is deleted.
async fn remove_pod(
    cri: &mut RuntimeServiceClient<Channel>,
    pod: &PodSandboxConfig,
    pod_id: String,
    log: &dyn Fn() -> String,
) {
    cri.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod_id.clone() })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e}\n{}", log()));
    cri.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod_id })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}"));
    // The Pod's own cgroup is the kubelet's to remove (cgroup v1's cpu
    // hierarchy, or v2's unified one).
    let parent = pod.linux.as_ref().map_or("", |l| l.cgroup_parent.as_str());
    if !parent.is_empty() {
        for root in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup"] {
            let _ = std::fs::remove_dir(Path::new(root).join(parent.trim_start_matches('/')));
        }
    }
}

/// The pid of the shim process that serves Pod sandbox `pod_id`: its
/// command line names the sandbox, by which containerd groups a Pod's
/// containers into one shim.
fn shim_of(pod_id: &str) -> u32 {
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_shim = args.first().is_some_and(|a| a.ends_with(b"containerd-shim-pier-v1"));
        if is_shim && args.windows(2).any(|w| w[0] == b"-id" && w[1] == pod_id.as_bytes()) {
            return pid;
        }
    }
    panic!("no shim serves Pod {pod_id}");
}

/// The kubelet's config of Pod `namespace/name` on the host's network,
/// its containers' logs under `logs`.
fn host_network_pod(
    namespace: &str,
    name: &str,
    logs: &Path,
    annotations: HashMap<String, String>,
) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("3f1c-{name}"),
            namespace: namespace.into(),
            attempt: 0,
        }),
        log_directory: logs.display().to_string(),
        annotations,
        linux: Some(LinuxPodSandboxConfig {
            // Where the kubelet (cgroupfs driver) puts a Pod's cgroup.
            cgroup_parent: format!("/kubepods/pod3f1c-{name}"),
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
    }
}

/// The CRI's status of a container.
async fn container_status(
    cri: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> k8s_cri::v1::ContainerStatus {
    cri.container_status(ContainerStatusRequest { container_id: id.to_owned(), verbose: false })
        .await
        .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
        .into_inner()
        .status
        .expect("the container's status")
}

#[tokio::test(flavor = "current_thread")]
async fn a_pod_with_the_pier_runtime_class_serves_stops_reports_exit_codes_and_mounts_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let (guest, archive) = guest_and_echo_image(dir.path());
    let more_images = [("hello", HELLO), ("probe", PROBE)].map(|(app, reference)| {
        let archive = dir.path().join(format!("{app}.tar"));
        let wasm = guest.join(format!("{app}.wasm"));
        pier_testkit::oci_image::write_image(&wasm, app, reference, &[], &archive)
            .unwrap_or_else(|e| panic!("{e}"));
        archive
    });
    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-pier-v1"));
    let containerd =
        Containerd::start(&dir.path().join("containerd"), shim).unwrap_or_else(|e| panic!("{e}"));
    // The kubelet's images live in containerd's `k8s.io` namespace.
    containerd.import("k8s.io", &archive).unwrap_or_else(|e| panic!("{e}"));
    for archive in &more_images {
        containerd.import("k8s.io", archive).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(SANDBOX_IMAGE, IMAGE, "the sandbox image is the one imported");

    // The Pod's folder is named by the kubelet's metadata (namespace and
    // name), and the socket by default after the container.
    let pod_folder = containerd.socket_root().join("shop/web-0");
    let socket = pod_folder.join("echo.sock");
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let annotations = HashMap::from([("pier.dev/listen".to_owned(), "1234".to_owned())]);
    let pod = host_network_pod("shop", "web-0", &logs, annotations);
    let log = || containerd.log();

    let mut cri = cri_client(&dir.path().join("containerd/containerd.sock")).await;
    let pod_id = run_pier_pod(&mut cri, &pod, &log).await;
    // One shim runs the Pod; it is in the sandbox's cgroup, inside the
    // Pod's, which holds the Pod to its limits.
    let shim_pid = shim_of(&pod_id);
    let shim_cgroup = pier_testkit::containerd::cpu_cgroup_of(shim_pid);
    assert!(
        shim_cgroup.ends_with(format!("kubepods/pod3f1c-web-0/{pod_id}")),
        "the shim's cgroup: {}",
        shim_cgroup.display()
    );
    let echo = container_config("echo", IMAGE, &["--port", "1234"]);
    let container_id = start_container(&mut cri, &pod_id, &pod, echo, &log).await;

    // The annotations reached the shim: the socket is in the Pod's
    // folder, and the grant lets echo listen.
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
    let status = container_status(&mut cri, &container_id).await;
    assert_eq!(status.state, ContainerState::ContainerExited as i32);
    assert_eq!(status.exit_code, 143, "SIGTERM ended it; {}", log());
    cri.remove_container(RemoveContainerRequest { container_id })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer: {e}"));
    assert!(!socket.exists(), "removing the container removed its socket");
    assert!(pod_folder.exists(), "the Pod's folder stays while its sandbox runs");

    // Exit codes reach the kubelet as the component asked for them, and a
    // trap as 128 + SIGABRT.
    for (i, (args, code)) in
        [(&["exit", "0"][..], 0), (&["exit", "3"], 3), (&["exit", "42"], 42), (&["panic"], 134)]
            .into_iter()
            .enumerate()
    {
        let name = format!("hello-{i}");
        let hello = container_config(&name, HELLO, args);
        let id = start_container(&mut cri, &pod_id, &pod, hello, &log).await;
        assert_eq!(exit_code_of(&mut cri, &id, &log).await, code, "hello {args:?}; {}", log());
    }

    // Volumes, as the kubelet hands them over: a configMap's folder
    // read-only, an emptyDir's read-write, each a host folder.
    let config_map = dir.path().join("volumes/config");
    let empty_dir = dir.path().join("volumes/data");
    std::fs::create_dir_all(&config_map).unwrap();
    std::fs::create_dir_all(&empty_dir).unwrap();
    std::fs::write(config_map.join("app.toml"), "answer = 42\n").unwrap();
    let mount = |host: &Path, container: &str, readonly| Mount {
        host_path: host.display().to_string(),
        container_path: container.into(),
        readonly,
        ..Default::default()
    };
    let mounts = vec![mount(&config_map, "/config", true), mount(&empty_dir, "/data", false)];
    let args = ["copy-file", "/config/app.toml", "/data/app.toml"];
    let files = ContainerConfig { mounts, ..container_config("files", PROBE, &args) };
    let id = start_container(&mut cri, &pod_id, &pod, files, &log).await;
    assert_eq!(exit_code_of(&mut cri, &id, &log).await, 0, "{}", log());
    assert_eq!(std::fs::read_to_string(empty_dir.join("app.toml")).unwrap(), "answer = 42\n");
    remove_pod(&mut cri, &pod, pod_id, &log).await;
    assert!(!pod_folder.exists(), "removing the Pod removed its folder");
    assert!(!shim_cgroup.exists(), "and the sandbox's cgroup");
}

/// The kubelet's pull of a pier image: PullImage names the image and
/// nothing else (no platform: containerd's CRI plugin pulls for the
/// node's), from a registry containerd reaches over plain HTTP as its
/// `hosts.toml` says; the image is then the CRI's by that name, and a
/// container of it in a Pod exits as hello was asked.
#[tokio::test(flavor = "current_thread")]
async fn the_kubelet_pulls_a_pier_image_from_a_registry_and_runs_it() {
    let dir = tempfile::tempdir().unwrap();
    // The sandbox image is imported, as on a node that has its pause image.
    let (guest, sandbox) = guest_and_echo_image(dir.path());
    let hello = std::fs::read(guest.join("hello.wasm")).unwrap();
    let layout = pier_testkit::oci_image::image_layout(&hello, "hello", "pier/hello:v1", &[])
        .unwrap_or_else(|e| panic!("{e}"));
    let image_id = layout.config_digest.clone();
    let registry =
        Registry::serve(vec![("pier/hello".into(), layout)]).unwrap_or_else(|e| panic!("{e}"));
    let reference = registry.reference("pier/hello", "v1");

    let shim = Path::new(env!("CARGO_BIN_EXE_containerd-shim-pier-v1"));
    let containerd =
        Containerd::start(&dir.path().join("containerd"), shim).unwrap_or_else(|e| panic!("{e}"));
    containerd.import("k8s.io", &sandbox).unwrap_or_else(|e| panic!("{e}"));
    containerd.trust_plain_http(&registry.host()).unwrap_or_else(|e| panic!("{e}"));
    let log = || containerd.log();

    let channel = cri_channel(&dir.path().join("containerd/containerd.sock")).await;
    let mut images = ImageServiceClient::new(channel.clone());
    let image = ImageSpec { image: reference.clone(), ..Default::default() };
    let pulled = images
        .pull_image(PullImageRequest {
            image: Some(image.clone()),
            auth: None,
            sandbox_config: None,
        })
        .await
        .unwrap_or_else(|e| panic!("PullImage {reference}: {e}\n{}", log()))
        .into_inner();
    // The CRI names an image by its config's digest.
    assert_eq!(pulled.image_ref, image_id);
    let requests = registry.requests();
    assert!(
        requests.iter().any(|r| r.starts_with("GET ") && r.contains("/blobs/")),
        "the blobs came from the registry: {requests:?}"
    );
    let status = images
        .image_status(ImageStatusRequest { image: Some(image), verbose: false })
        .await
        .unwrap_or_else(|e| panic!("ImageStatus: {e}"))
        .into_inner()
        .image
        .expect("the pulled image's status");
    assert!(status.repo_tags.contains(&reference), "{:?}", status.repo_tags);

    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let pod = host_network_pod("shop", "pulled-0", &logs, HashMap::new());
    let mut cri = RuntimeServiceClient::new(channel);
    let pod_id = run_pier_pod(&mut cri, &pod, &log).await;
    let hello = container_config("hello", &reference, &["exit", "3"]);
    let id = start_container(&mut cri, &pod_id, &pod, hello, &log).await;
    assert_eq!(exit_code_of(&mut cri, &id, &log).await, 3, "{}", log());
    remove_pod(&mut cri, &pod, pod_id, &log).await;
}
