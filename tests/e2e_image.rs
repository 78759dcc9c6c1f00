//! The operator's image (hack/build-image.sh), run with runc (hack/run-image.sh)
//! as deploy/ runs it: in-cluster configuration from the ServiceAccount's
//! token, the container arguments (its ports too) and memory limit of
//! deploy/05-deployment.yaml, uid 65532 and a read-only root filesystem; its
//! probes called as the kubelet calls deploy/'s, its metrics on the port
//! deploy/'s Service targets, and the NetworkPolicy's ports the container's.

mod common;

use std::process::Command;

use common::tenant::*;
use common::*;
use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use sample_controller::testing::api::POD_NAME_ENV;
use sample_controller::testing::metric_value;

const IMAGE_ENV: &str = "SAMPLE_CONTROLLER_TEST_IMAGE";
const DEPLOYMENT: &str = "deploy/05-deployment.yaml";
/// deploy/'s namespace.
const NS: &str = DEPLOY_NS;

fn image() -> String {
    match std::env::var(IMAGE_ENV) {
        Ok(image) if !image.is_empty() => image,
        _ => panic!(
            "{IMAGE_ENV} is not set: build the image with `hack/build-image.sh` and set {IMAGE_ENV} to the \
             reference it prints (hack/test.sh does both)"
        ),
    }
}

/// The operator's container as deploy/ declares it.
fn deployed_container() -> Container {
    let text = std::fs::read_to_string(DEPLOYMENT).expect("read the deployment manifest");
    let deployment: Deployment = serde_saphyr::from_str(&text).expect("parse the deployment manifest");
    deployment.spec.and_then(|s| s.template.spec).map(|s| s.containers[0].clone()).expect("a container")
}

/// Its arguments, as deploy/ gives them: its ports too (the container
/// shares the host's network, so they are the host's; the image tests run
/// one at a time).
fn container_args(container: &Container) -> Vec<String> {
    let args = container.args.clone().unwrap_or_default();
    for flag in ["--metrics-bind-address=", "--health-probe-bind-address="] {
        assert!(args.iter().any(|a| a.starts_with(flag)), "{DEPLOYMENT} no longer sets {flag}");
    }
    args
}

/// The container's port of this name, or number, as the kubelet and a
/// Service resolve a named port.
fn container_port(container: &Container, port: &IntOrString) -> u16 {
    let ports = container.ports.as_deref().unwrap_or_default();
    let number = match port {
        IntOrString::Int(n) => ports.iter().find(|p| p.container_port == *n),
        IntOrString::String(name) => ports.iter().find(|p| p.name.as_deref() == Some(name.as_str())),
    };
    let number = number.unwrap_or_else(|| panic!("{DEPLOYMENT}'s container has no port {port:?}")).container_port;
    u16::try_from(number).unwrap()
}

/// deploy/'s other manifests that name the container's ports: the metrics
/// Service's targetPort, and each port the NetworkPolicy admits.
fn ports_named_elsewhere() -> (IntOrString, Vec<IntOrString>) {
    let service: Service =
        serde_saphyr::from_str(&std::fs::read_to_string("deploy/07-metrics-service.yaml").unwrap()).unwrap();
    let target = service.spec.and_then(|s| s.ports?.first()?.target_port.clone()).expect("the Service's targetPort");
    let policy: NetworkPolicy =
        serde_saphyr::from_str(&std::fs::read_to_string("deploy/09-network-policy.yaml").unwrap()).unwrap();
    let admitted = policy
        .spec
        .and_then(|s| s.ingress)
        .unwrap_or_default()
        .into_iter()
        .flat_map(|rule| rule.ports.unwrap_or_default())
        .filter_map(|p| p.port)
        .collect();
    (target, admitted)
}

/// A memory quantity in bytes (the binary suffixes deploy/ uses).
fn bytes(quantity: &str) -> u64 {
    let (number, unit) = quantity.split_at(quantity.trim_end_matches(char::is_alphabetic).len());
    let scale = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        _ => panic!("unexpected memory unit in {quantity:?}"),
    };
    number.parse::<u64>().expect("a whole number") * scale
}

/// What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount
/// in `pod` (hack/run-image.sh mounts it there): a token for the
/// ServiceAccount bound to the pod, the cluster's CA and the namespace.
async fn service_account_files(pod: &Pod) -> String {
    let dir = format!("{}/image-serviceaccount", env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(&dir).unwrap();
    let token = pod_bound_token(pod).await;
    let plane = std::env::var("LOCAL_UP_DIR").expect("LOCAL_UP_DIR names the local control plane (hack/test.sh)");
    let ca = std::fs::read(format!("{plane}/pki/ca.crt")).expect("the local control plane's CA");
    std::fs::write(format!("{dir}/token"), token.trim()).unwrap();
    std::fs::write(format!("{dir}/ca.crt"), ca).unwrap();
    std::fs::write(format!("{dir}/namespace"), NS).unwrap();
    // Readable by the container's user, 65532.
    Command::new("chmod").args(["-R", "a+rX", &dir]).status().unwrap();
    dir
}

/// The container's process as the kernel runs it.
#[derive(Debug, PartialEq)]
struct Confined {
    uid: String,
    read_only_root: bool,
    /// The limit of its memory cgroup, in bytes.
    memory_limit: u64,
}

/// The container's process, as runc reports it, confined as it is.
fn container_process(script_pid: u32) -> Confined {
    let pid = container_pid(script_pid);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap().split_whitespace().next().unwrap();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts.lines().find(|l| l.split_whitespace().nth(4) == Some("/")).expect("a root mount");
    let read_only = root.split_whitespace().nth(5).unwrap().split(',').any(|o| o == "ro");
    Confined { uid: uid.to_owned(), read_only_root: read_only, memory_limit: memory_cgroup_limit(pid) }
}

/// The memory limit the kernel holds process `pid` to: its memory cgroup's
/// `memory.limit_in_bytes` under cgroup v1 (a `memory` controller line in
/// /proc/PID/cgroup), else its cgroup v2 `memory.max`. Read from the host
/// side, where /proc/PID/cgroup names the path under /sys/fs/cgroup, not
/// from the config runc was given: this is what the container ran under.
fn memory_cgroup_limit(pid: u64) -> u64 {
    let file = memory_cgroup_file(pid, "memory.limit_in_bytes", "memory.max");
    let limit = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {file}: {e}"));
    limit.trim().parse().unwrap_or_else(|_| panic!("{file} holds {limit:?}: no limit"))
}

/// The file of process `pid`'s memory cgroup named `v1` under cgroup v1,
/// `v2` under cgroup v2.
fn memory_cgroup_file(pid: u64, v1: &str, v2: &str) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path_of = |wanted: &dyn Fn(&str) -> bool| {
        cgroups.lines().find_map(|l| {
            let (_, rest) = l.split_once(':')?;
            let (controllers, path) = rest.split_once(':')?;
            wanted(controllers).then(|| path.to_owned())
        })
    };
    match path_of(&|c| c.split(',').any(|c| c == "memory")) {
        Some(path) => format!("/sys/fs/cgroup/memory{path}/{v1}"),
        None => format!("/sys/fs/cgroup{}/{v2}", path_of(&str::is_empty).expect("a cgroup v2 line")),
    }
}

/// How many times the kernel's OOM killer has killed a process of `pid`'s
/// memory cgroup: `oom_kill` of memory.oom_control (v1) or memory.events
/// (v2).
fn oom_kills(pid: u64) -> u64 {
    let file = memory_cgroup_file(pid, "memory.oom_control", "memory.events");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {file}: {e}"));
    let kills = text.lines().find_map(|l| l.strip_prefix("oom_kill "));
    kills.and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no oom_kill count in {file}:\n{text}"))
}

/// The container's pid, as runc reports it.
fn container_pid(script_pid: u32) -> u64 {
    let state = Command::new("runc").args(["state", &format!("sample-controller-{script_pid}")]).output().unwrap();
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).expect("runc state");
    state["pid"].as_u64().expect("a running container")
}

/// The operator in its container, on the host's ports (held until it has
/// exited); TERM makes hack/run-image.sh kill it.
struct Contained(Operator, #[allow(dead_code)] HostPorts);

impl Drop for Contained {
    fn drop(&mut self) {
        signal(&self.0, "-TERM");
        let _ = self.0.child.wait();
    }
}

/// A blob of the OCI image layout `dir`, as JSON.
fn blob(dir: &str, digest: &str) -> serde_json::Value {
    let path = format!("{dir}/blobs/{}", digest.replacen(':', "/", 1));
    serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("read {path}: {e}"))).unwrap()
}

/// The image's config (its platform and labels), read from the OCI layout
/// hack/build-image.sh wrote (`DIR:TAG`).
fn image_config(image: &str) -> serde_json::Value {
    let (dir, tag) = image.rsplit_once(':').expect("an OCI layout reference DIR:TAG");
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{dir}/index.json")).unwrap()).unwrap();
    let manifest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap_or_else(|| panic!("no manifest tagged {tag} in {dir}/index.json"));
    let manifest = blob(dir, manifest["digest"].as_str().unwrap());
    blob(dir, manifest["config"]["digest"].as_str().unwrap())
}

/// The image names its platform — the build machine's, the one its binary
/// was compiled for — and the kwok nodes it is scheduled onto carry the
/// same architecture; its labels say which version, commit and license.
#[tokio::test]
async fn the_image_says_what_it_is_and_the_nodes_run_its_platform() {
    let config = image_config(&image());
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    assert_eq!((config["os"].as_str(), config["architecture"].as_str()), (Some("linux"), Some(arch)));
    let nodes = kubectl_ok(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.labels.kubernetes\\.io/arch}"]);
    let nodes: Vec<&str> = nodes.split_whitespace().collect();
    assert!(!nodes.is_empty() && nodes.iter().all(|a| *a == arch), "nodes' architectures {nodes:?}, image's {arch}");

    let labels = &config["config"]["Labels"];
    let label = |key: &str| labels[format!("org.opencontainers.image.{key}")].as_str().unwrap_or_default().to_owned();
    assert_eq!(label("version"), env!("CARGO_PKG_VERSION"));
    assert_eq!(label("licenses"), env!("CARGO_PKG_LICENSE"));
    let head = Command::new("git").args(["rev-parse", "HEAD"]).output().expect("run git");
    let head = String::from_utf8(head.stdout).unwrap();
    assert_eq!(label("revision").trim_end_matches("-modified"), head.trim(), "the commit it was built from");
}

/// deploy/'s memory limit for the operator's container, in bytes.
fn deployed_memory_limit(container: &Container) -> u64 {
    let memory = container.resources.as_ref().and_then(|r| r.limits.as_ref()?.get("memory").cloned());
    bytes(&memory.unwrap_or_else(|| panic!("{DEPLOYMENT} sets no memory limit")).0)
}

/// The image run as `pod`'s container: its token, its name, deploy/'s
/// arguments and memory limit.
async fn run_as_deployed(image: &str, pod: &Pod) -> Contained {
    let container = deployed_container();
    let server = config().await.cluster_url;
    let ports = HostPorts::lock();
    let mut run = Command::new("hack/run-image.sh");
    run.arg(image)
        .arg(service_account_files(pod).await)
        .args(container_args(&container))
        .env(POD_NAME_ENV, pod.name_any())
        .env("KUBERNETES_SERVICE_HOST", server.host().unwrap())
        .env("KUBERNETES_SERVICE_PORT", server.port_u16().unwrap().to_string())
        .env("MEMORY_LIMIT", deployed_memory_limit(&container).to_string());
    Contained(start_logged(run, "image").await, ports)
}

#[tokio::test]
async fn the_image_runs_in_cluster_as_deployed_reconciles_the_example_foo_and_answers_probes() {
    // Run as one of deploy/'s pods would be: its token, its name.
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let op = run_as_deployed(&image(), &pods[0]).await;
    let want = Confined {
        uid: "65532".into(),
        read_only_root: true,
        memory_limit: deployed_memory_limit(&deployed_container()),
    };
    assert_eq!(container_process(op.0.child.id()), want, "user, root filesystem and memory cgroup of the container");

    let ns = TestNamespace::new("image").await;
    ns.kubectl_ok(&["apply", "-f", "artifacts/examples/example-foo.yaml"]);
    wait_available(&ns.api(), "example-foo", 1, GC_TIMEOUT).await;
    let deployment = deployment(&ns, "example-foo").await.expect("its Deployment");
    assert_eq!(deployment.owner_references()[0].name, "example-foo");
    // Events go out in the background, behind those of every Foo this
    // all-namespace operator found (other tests' leftovers included).
    wait_until("a Synced event from the container", TIMEOUT, || async {
        ns.controller_events().await.into_iter().find(|e| e.reason.as_deref() == Some("Synced"))
    })
    .await;

    // Its probes as the kubelet calls them: deploy/'s paths, on the port
    // they name, resolved to the container's; the listeners it bound are
    // the container's declared ports.
    let container = deployed_container();
    let (target, admitted) = ports_named_elsewhere();
    assert_eq!(op.0.metrics, container_port(&container, &target), "the metrics Service's targetPort");
    let declared: BTreeSet<u16> =
        container.ports.iter().flatten().map(|p| u16::try_from(p.container_port).unwrap()).collect();
    let allowed: BTreeSet<u16> = admitted.iter().map(|p| container_port(&container, p)).collect();
    assert_eq!(allowed, declared, "the NetworkPolicy admits the container's ports, and no other");
    for (probe, which) in [(&container.liveness_probe, "liveness"), (&container.readiness_probe, "readiness")] {
        let get = probe.as_ref().and_then(|p| p.http_get.clone()).unwrap_or_else(|| panic!("no {which} httpGet"));
        assert_eq!(get.scheme.as_deref().unwrap_or("HTTP"), "HTTP", "{which}");
        let port = container_port(&container, &get.port);
        assert_eq!(port, op.0.probes, "the {which} probe's port is the one the probes listen on");
        let path = get.path.unwrap_or_else(|| "/".into());
        assert_eq!(http_get(port, &path).await.map(|r| r.0), Some(200), "the {which} probe, GET {path} on {port}");
    }
    // Secure metrics, as deploy/ serves them: HTTPS, for a token allowed to
    // read them (and no one else), on the Service's targetPort.
    let scraper = TestNamespace::new("image-scraper").await;
    let token = metrics_reader_token(&scraper.name, "scraper");
    let metrics_port = container_port(&container, &target);
    assert_eq!(https_get(metrics_port, "/metrics", None, &[]).0, 401, "metrics without a token");
    let metrics = wait_until("the scraper's token to be allowed", TIMEOUT, || async {
        let (code, _, body) = https_get(metrics_port, "/metrics", Some(&token), &[]);
        (code == 200).then_some(body)
    })
    .await;
    let leading = metric_value(&metrics, "leader_election_master_status{name=\"sample-controller\"}");
    assert_eq!(leading, Some(1.0), "it leads with deploy/'s --leader-elect");
    let synced = metric_value(&metrics, SUCCESS_SERIES).unwrap_or_default();
    assert!(synced >= 1.0, "{SUCCESS_SERIES} = {synced}");
    // Configured in-cluster: its Lease is in the namespace it read from the
    // mounted files.
    assert_eq!(holding_pod().await, Some(pods[0].name_any()), "its Lease, held in its pod's name");
}

/// The image, confined to deploy/'s memory limit, through a tenant's Foos
/// and Deployments filled to the API server's limits (tests/common/tenant.rs,
/// about 225 MiB of content): never OOM-killed, and a Foo created after
/// them converges.
#[tokio::test]
async fn the_image_under_deploys_memory_limit_is_not_oom_killed_by_a_tenants_objects() {
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let mut op = run_as_deployed(&image(), &pods[0]).await;
    let pid = container_pid(op.0.child.id());
    let tenant_ns = TenantNamespace(TestNamespace::new("image-tenant").await);
    hoard(tenant_of(&tenant_ns.0).await, &tenant_ns.0.name, Hoard::PAST_THE_LIMIT).await;
    let control = TestNamespace::new("image-control").await;
    converges(&control, "after-the-tenant").await;
    assert!(op.0.child.try_wait().unwrap().is_none(), "the container exited");
    assert_eq!(oom_kills(pid), 0, "the container was OOM-killed under {DEPLOYMENT}'s limit");
    remove(tenant_ns).await;
}

/// The install block of README.md: the fenced block after the comment
/// that says the test command runs it.
fn readme_install_block() -> String {
    let readme = std::fs::read_to_string("README.md").expect("read README.md");
    let marker = "<!-- The block below is run as written";
    let after = &readme[readme.find(marker).expect("README.md's install block, marked")..];
    let body = after.split_once("```sh\n").expect("a sh block after the marker").1;
    body.split_once("\n```").expect("the block's end").0.to_owned()
}

/// The CNCF distribution registry (hack/build-registry.sh) on a port of
/// loopback, over plain HTTP, storing under the test's directory; stopped
/// when dropped. `bin` holds a `skopeo` that runs the real one with a
/// registries.conf marking this registry insecure (a registry without TLS
/// must be): put first on PATH, the README's `skopeo copy` runs as written
/// and nothing outside the test's directory is configured.
struct Registry {
    _process: Process,
    addr: String,
    bin: String,
}

impl Registry {
    /// PATH with the shim first.
    fn path(&self) -> String {
        format!("{}:{}", self.bin, std::env::var("PATH").unwrap_or_default())
    }
}

async fn start_registry() -> Registry {
    const REGISTRY_ENV: &str = "SAMPLE_CONTROLLER_TEST_REGISTRY";
    let binary = std::env::var(REGISTRY_ENV).unwrap_or_else(|_| {
        panic!("{REGISTRY_ENV} is not set: build the registry with `hack/build-registry.sh` and set {REGISTRY_ENV} to the path it prints (hack/test.sh does both)")
    });
    let dir = format!("{}/registry", env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(format!("{dir}/data")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let config = format!("{dir}/config.yml");
    std::fs::write(
        &config,
        format!("version: 0.1\nlog: {{level: warn}}\nstorage: {{filesystem: {{rootdirectory: {dir}/data}}}}\nhttp: {{addr: \"{addr}\"}}\n"),
    )
    .unwrap();
    let log = std::fs::File::create(format!("{dir}/registry.log")).unwrap();
    let process = Process::start(
        Command::new(binary).args(["serve", &config]).stdout(log.try_clone().unwrap()).stderr(log),
        "the registry",
    );
    let conf = format!("{dir}/registries.conf");
    std::fs::write(&conf, format!("[[registry]]\nlocation = \"{addr}\"\ninsecure = true\n")).unwrap();
    let skopeo = String::from_utf8(Command::new("sh").args(["-c", "command -v skopeo"]).output().unwrap().stdout)
        .expect("a path");
    assert!(!skopeo.trim().is_empty(), "skopeo is not installed (hack/test.sh installs it)");
    let bin = format!("{dir}/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let shim = format!("{bin}/skopeo");
    std::fs::write(&shim, format!("#!/bin/sh\nexec {} --registries-conf {conf} \"$@\"\n", skopeo.trim())).unwrap();
    Command::new("chmod").args(["+x", &shim]).status().unwrap();
    let registry = Registry { _process: process, addr, bin };
    wait_until("the registry to answer", TIMEOUT, || async { (http_get(port, "/v2/").await?.0 == 200).then_some(()) })
        .await;
    registry
}

/// The digest the registry serves for `repository:tag`.
fn served_digest(registry: &Registry, repository: &str, tag: &str) -> String {
    let url = format!("http://{}/v2/{repository}/manifests/{tag}", registry.addr);
    let accept = "Accept: application/vnd.oci.image.manifest.v1+json";
    let head = Command::new("curl").args(["-fsSI", "-H", accept, &url]).output().expect("run curl");
    let head = String::from_utf8_lossy(&head.stdout).into_owned();
    let digest = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("docker-content-digest").then(|| value.trim().to_owned())
    });
    digest.unwrap_or_else(|| panic!("no digest for {repository}:{tag} from the registry:\n{head}"))
}

/// README.md's install, run as written with REGISTRY set to a real
/// registry: the image built, pushed and pinned by digest in deploy/'s
/// pods; then that image, pulled back from the registry as a node would,
/// run as one of those pods converges a Foo.
#[tokio::test]
async fn the_readmes_install_runs_as_written_and_deploys_the_pushed_image() {
    let registry = start_registry().await;
    let mut install = Command::new("bash");
    install
        .args(["-euo", "pipefail", "-c", &readme_install_block()])
        .env("REGISTRY", &registry.addr)
        .env("KUBECONFIG", kubeconfig_path())
        .env("PATH", registry.path());
    // In a user's shell, not the test runner's: the variables cargo and
    // nextest set for a test (ring's build script watches
    // CARGO_MANIFEST_DIR) would make the block's cargo build everything
    // again rather than reuse the image's. A user's own CARGO_* settings
    // stay.
    for (name, _) in std::env::vars() {
        let per_test = ["CARGO_PKG_", "CARGO_BIN_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_PRIMARY_", "NEXTEST"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || ["CARGO", "CARGO_TARGET_TMPDIR", "CARGO_RUSTC_CURRENT_DIR"].contains(&name.as_str());
        if per_test {
            install.env_remove(name);
        }
    }
    let install = install.output().expect("run bash");
    let output = format!("{}{}", String::from_utf8_lossy(&install.stdout), String::from_utf8_lossy(&install.stderr));
    assert!(install.status.success(), "README.md's install failed:\n{output}");

    let digest = served_digest(&registry, "sample-controller", env!("CARGO_PKG_VERSION"));
    let pinned = format!("{}/sample-controller@{digest}", registry.addr);
    let pods = wait_until("deploy/'s pods to run the pushed image", TIMEOUT, || async {
        let pods = deploy_pods().await;
        pods.iter()
            .all(|p| p.spec.as_ref().is_some_and(|s| s.containers[0].image.as_deref() == Some(&pinned)))
            .then_some(pods)
    })
    .await;

    let pulled = format!("{}/pulled", env!("CARGO_TARGET_TMPDIR"));
    let _ = std::fs::remove_dir_all(&pulled);
    let pull = Command::new("skopeo")
        .args(["copy", "--quiet", &format!("docker://{pinned}"), &format!("oci:{pulled}:pulled")])
        .env("PATH", registry.path())
        .status()
        .expect("run skopeo");
    assert!(pull.success(), "pull {pinned}");
    let _lease = FreshLease::new();
    let _op = run_as_deployed(&format!("{pulled}:pulled"), &pods[0]).await;
    let ns = TestNamespace::new("install").await;
    ns.kubectl_ok(&["apply", "-f", "artifacts/examples/example-foo.yaml"]);
    wait_available(&ns.api(), "example-foo", 1, GC_TIMEOUT).await;
}
