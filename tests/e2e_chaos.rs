//! Chaos: the operator process while its control plane fails under it.
//! kube-apiserver and etcd are SIGKILLed and restarted (hack/local-chaos.sh),
//! the operator is SIGKILLed at random moments (`CHAOS_SEED` replays them),
//! its leader is paused in the middle of a convergence, Foos change while it
//! is down. Each scenario ends by checking the end state exactly, prints how
//! long recovery took, and asserts the bound docs/operations.md states.
//!
//! The scenarios take the shared control plane down, so they run one at a
//! time, in their own test binary (cargo runs test binaries one after the
//! other).

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use sample_controller::Foo;
use sample_controller::constants::{FENCE_POLICY, USER_AGENT};
use sample_controller::decision::{DeploymentAction, decide};
use sample_controller::deployment::DeploymentView;
use sample_controller::leader_fence::LeaderFence;
use sample_controller::shard::UNSHARDED;
use serde_json::json;

/// One scenario at a time: they stop the plane everyone uses. (Under
/// cargo-nextest, a process per test, .config/nextest.toml does it.)
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// "A few hundred Foos" converging while things fail.
const MANY: usize = 200;
/// The target (docs/operations.md): an edit made once the API server serves again
/// reaches its Deployment within 5 s; plus 3 s of margin for a loaded 2-core
/// CI machine (measured: 0.1-4.2 s).
const RECOVERY_BOUND: Duration = Duration::from_secs(8);
/// A convergence of `MANY` Foos interrupted by an outage finishes within
/// seconds of the component's return (measured: 1-7 s); 15 s of bound.
const CONVERGENCE_BOUND: Duration = Duration::from_secs(15);
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(180);

/// `hack/local-chaos.sh ACTION COMPONENT` on the test control plane.
fn chaos(action: &str, component: &str) {
    let dir = std::env::var("LOCAL_UP_DIR").unwrap_or_else(|_| {
        panic!(
            "the chaos tests restart components of the local control plane and need LOCAL_UP_DIR, \
             the directory hack/local-up.sh ran in; run them through hack/test.sh"
        )
    });
    let status = Command::new("hack/local-chaos.sh")
        .args([action, component])
        .env("LOCAL_UP_DIR", dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run hack/local-chaos.sh");
    assert!(status.success(), "hack/local-chaos.sh {action} {component} failed");
}

/// Kill `component`, leave it down for `outage`, start it again; returns
/// when it serves.
async fn outage(component: &str, outage: Duration) {
    chaos("kill", component);
    // Time under test: how long the component stays down.
    tokio::time::sleep(outage).await;
    chaos("start", component);
}

/// After an API server outage the plane's own clients — controller-manager,
/// scheduler, kwok — resume their watches on client-go's schedule (up to
/// 30 s between attempts, then a minute or more to catch up): after four
/// outages in a row the scheduler bound a Pod 90 s after it was created, to
/// a node cordoned meanwhile. The next scenarios and test binaries need a
/// plane that sees what they do (a new namespace's ServiceAccount, a cordon,
/// a Pod to run), so the three are restarted; the operator is not — its
/// recovery is what these tests measure.
fn restart_plane_clients_after(component: &str) {
    if component == "kube-apiserver" {
        for client in ["kube-controller-manager", "kube-scheduler", "kwok"] {
            chaos("kill", client);
            chaos("start", client);
        }
    }
}

async fn operator(ns: &TestNamespace, tag: &str, extra: &[&str]) -> Operator {
    spawn_operator(&ns.name, &kubeconfig_path(), extra, &format!("{}-{tag}", ns.name)).await
}

fn kill(op: &mut Operator) {
    op.child.kill().expect("SIGKILL the operator");
    op.child.wait().expect("reap the operator");
}

/// Foos `foo-0` .. `foo-{n-1}`, each naming a Deployment of its own name,
/// replicas 1 to 3.
async fn create_foos(ns: &TestNamespace, n: usize) {
    let api = ns.api::<Foo>();
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let name = format!("foo-{i}");
                create_foo(&api, &name, &name, Some(i as i32 % 3 + 1)).await;
            }
        })
        .await;
}

async fn set_replicas(ns: &TestNamespace, foo: &str, replicas: i32) {
    let patch = json!({ "spec": { "replicas": replicas } });
    ns.api::<Foo>().patch(foo, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("edit Foo");
}

async fn deployments(ns: &TestNamespace) -> Vec<Deployment> {
    ns.api::<Deployment>().list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// The exact end state, or what is still wrong: one Deployment per Foo,
/// named by it, controlled by it (this very Foo's uid), with its replicas;
/// no Deployment without its Foo; every status exactly what a sync of the
/// Deployment as it is now would write (generation, availability, Ready).
async fn end_state(ns: &TestNamespace) -> Result<(), String> {
    let foos = ns.api::<Foo>().list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
    let deployments = ns.api::<Deployment>().list(&ListParams::default()).await.map_err(|e| e.to_string())?.items;
    if deployments.len() != foos.len() {
        return Err(format!("{} Deployments for {} Foos", deployments.len(), foos.len()));
    }
    let by_name: HashMap<String, &Deployment> = deployments.iter().map(|d| (d.name_any(), d)).collect();
    for foo in &foos {
        let name = &foo.spec.deployment_name;
        let d = by_name.get(name).ok_or_else(|| format!("Foo {} has no Deployment {name}", foo.name_any()))?;
        let controllers: Vec<_> = d.owner_references().iter().filter(|r| r.controller == Some(true)).collect();
        if controllers.len() != 1 || Some(&controllers[0].uid) != foo.uid().as_ref() {
            return Err(format!("Deployment {name} is not controlled by Foo {}: {controllers:?}", foo.name_any()));
        }
        if replicas(d) != foo.spec.replicas {
            return Err(format!(
                "Deployment {name} has {:?} replicas, its Foo asks {:?}",
                replicas(d),
                foo.spec.replicas
            ));
        }
        // From the spec: the status shows the Deployment's available
        // replicas, this generation, and Ready exactly when all are available.
        let status = foo.status.clone().unwrap_or_default();
        let available = d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0);
        let want = foo.spec.replicas.unwrap_or(1);
        let ready = status.conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str());
        let expected_ready = if available >= want { "True" } else { "False" };
        if status.available_replicas != available
            || status.observed_generation != foo.metadata.generation
            || ready != Some(expected_ready)
        {
            return Err(format!(
                "Foo {} status {status:?}; its Deployment has {available} of {want} available",
                foo.name_any()
            ));
        }
        // And the controller's own rule agrees that nothing is left to do.
        let next = decide(foo, Some(&DeploymentView::from((*d).clone())), &[], UNSHARDED, &Time(Timestamp::now()));
        if next.deployment != DeploymentAction::Keep || next.status.is_some() {
            return Err(format!("Foo {} not in sync: a sync would still {next:?}", foo.name_any()));
        }
    }
    Ok(())
}

/// Wait for [`end_state`]; returns how long that took.
async fn converged(ns: &TestNamespace, what: &str) -> Duration {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < CONVERGE_TIMEOUT {
        match end_state(ns).await {
            Ok(()) => return start.elapsed(),
            Err(e) => last = e,
        }
        // The end state spans many objects and no watch shows it at once:
        // polled, and the time to reach it measured at this resolution.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{what}: not converged after {CONVERGE_TIMEOUT:?}: {last}");
}

/// Foos whose status shows all their replicas available.
async fn ready_foos(ns: &TestNamespace) -> usize {
    let foos = ns.api::<Foo>().list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
    let ready = |f: &Foo| {
        f.status.as_ref().is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    };
    foos.iter().filter(|f| ready(f)).count()
}

/// Wait until at least `n` Deployments exist: the middle of a convergence.
async fn until_deployments(ns: &TestNamespace, n: usize) {
    wait_until(&format!("{n} Deployments"), TIMEOUT, || async { (deployments(ns).await.len() >= n).then_some(()) })
        .await;
}

/// Edit a Foo and time until its Deployment shows it.
async fn edit_to_deployment(ns: &TestNamespace, foo: &str, replicas: i32) -> Duration {
    let start = Instant::now();
    set_replicas(ns, foo, replicas).await;
    loop {
        if deployment(ns, foo).await.is_some_and(|d| common::replicas(&d) == Some(replicas)) {
            return start.elapsed();
        }
        assert!(start.elapsed() < CONVERGE_TIMEOUT, "the edit of {foo} never reached its Deployment");
        // Polled at 20 ms: the time the edit takes is measured, and a watch
        // of its own would compete with the plane just restarted.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn steady_state_outage(component: &str, prefix: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNamespace::new(prefix).await;
    let op = operator(&ns, "op", &[]).await;
    create_foos(&ns, 20).await;
    converged(&ns, "before the outage").await;

    chaos("kill", component);
    // Readiness does not follow the API server (docs/operations.md, Failure behaviour):
    // restarting the operator would not bring it back.
    for _ in 0..3 {
        // Time under test: readiness holds through the outage, second by second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let readyz = http_get(op.probes, "/readyz").await.map(|(code, _)| code);
        assert_eq!(readyz, Some(200), "/readyz while {component} is down");
    }
    chaos("start", component);
    // `start` returned once the component serves (kube-apiserver: /readyz ok).
    let recovery = edit_to_deployment(&ns, "foo-0", 5).await;
    println!("{component} SIGKILL, 3 s down: an edit made once it served again reached its Deployment in {recovery:?}");
    assert!(recovery < RECOVERY_BOUND, "recovery took {recovery:?}");
    converged(&ns, "after the outage").await;
    restart_plane_clients_after(component);
}

async fn outage_during_convergence(component: &str, prefix: &str) {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNamespace::new(prefix).await;
    create_foos(&ns, MANY).await;
    let _op = operator(&ns, "op", &[]).await;
    until_deployments(&ns, MANY / 4).await;

    outage(component, Duration::from_secs(3)).await;
    let took = converged(&ns, "after the outage").await;
    println!("{component} SIGKILL during the convergence of {MANY} Foos: converged {took:?} after it served again");
    assert!(took < CONVERGENCE_BOUND, "converging took {took:?}");
    restart_plane_clients_after(component);
}

#[tokio::test]
async fn api_server_killed_in_steady_state() {
    steady_state_outage("kube-apiserver", "chaos-apiserver").await;
}

#[tokio::test]
async fn api_server_killed_during_convergence() {
    outage_during_convergence("kube-apiserver", "chaos-apiserver-busy").await;
}

#[tokio::test]
async fn etcd_killed_in_steady_state() {
    steady_state_outage("etcd", "chaos-etcd").await;
}

#[tokio::test]
async fn etcd_killed_during_convergence() {
    outage_during_convergence("etcd", "chaos-etcd-busy").await;
}

#[tokio::test]
async fn operator_killed_at_random_moments_while_foos_converge() {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNamespace::new("chaos-crash").await;
    create_foos(&ns, MANY).await;
    // Kill points spread over the convergence: each round kills the
    // operator once a seed-chosen number of Foos (rising, 10-60 % of them)
    // shows all its replicas available. The seed is printed, and
    // CHAOS_SEED=<seed> replays a run.
    let seed: u32 = match std::env::var("CHAOS_SEED") {
        Ok(seed) => seed.parse().expect("CHAOS_SEED must be a number"),
        Err(_) => Timestamp::now().subsec_nanosecond().unsigned_abs(),
    };
    println!("operator kills: CHAOS_SEED={seed}");
    let mut thresholds: Vec<usize> =
        (0..4u32).map(|round| MANY / 10 + seed.rotate_left(round * 8) as usize % (MANY / 2)).collect();
    thresholds.sort_unstable();
    for (round, threshold) in thresholds.into_iter().enumerate() {
        let mut op = operator(&ns, &format!("crash-{round}"), &[]).await;
        wait_until(&format!("{threshold} Foos ready"), CONVERGE_TIMEOUT, || async {
            (ready_foos(&ns).await >= threshold).then_some(())
        })
        .await;
        kill(&mut op);
        // Only the operator writes Foo statuses: with it dead, the count is
        // frozen, and below MANY it had work left (pods still to report).
        let ready = ready_foos(&ns).await;
        if ready == MANY {
            // The first kill comes while Deployments' pods are still to come
            // up. A later operator may find only status writes left (the pods
            // came up while it was down), which it finishes within one poll
            // of the count: then no work is left to interrupt.
            assert!(round > 0, "the first kill landed after convergence (CHAOS_SEED={seed})");
            println!("operator SIGKILL #{round} landed after convergence: no kill is left to test");
            break;
        }
        println!("operator SIGKILL #{round} with {ready} of {MANY} Foos ready");
    }
    let _op = operator(&ns, "final", &[]).await;
    let took = converged(&ns, "after the crashes").await;
    println!("operator killed during the convergence of {MANY} Foos: converged {took:?} after the restart");
    assert!(took < CONVERGENCE_BOUND, "converging took {took:?} (CHAOS_SEED={seed})");
}

#[tokio::test]
async fn a_leader_paused_mid_convergence_is_replaced_and_the_api_server_refuses_its_writes_when_it_resumes() {
    let _one = ONE_AT_A_TIME.lock().await;
    // Two replicas as deploy/ runs them, each with a token bound to one of
    // its pods: the API server's leader fence knows which pod writes.
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let ns = TestNamespace::new("chaos-leader").await;
    let mut a = spawn_replica(&ns.name, &pods[0], LEASE).await;
    let mut b = spawn_replica(&ns.name, &pods[1], LEASE).await;
    let old = wait_until("a Lease holder", TIMEOUT, holding_pod).await;
    create_foos(&ns, MANY).await;
    until_deployments(&ns, MANY / 4).await;

    // SIGSTOP, not SIGKILL: the old leader stays alive, with its syncs and
    // queued events in flight, and would write if it could.
    let (paused, survivor) = if old == pods[0].name_any() { (&mut a, &b) } else { (&mut b, &a) };
    signal(paused, "-STOP");
    // Statuses are frozen until a new leader takes over: below MANY ready,
    // the paused leader had work left.
    assert!(ready_foos(&ns).await < MANY, "the pause must land mid-convergence");
    let new =
        wait_until("another pod holding the Lease", TIMEOUT, || async { holding_pod().await.filter(|h| *h != old) })
            .await;
    let lease = deploy_lease().await.expect("the Lease");
    let took_over = lease.spec.and_then(|s| s.acquire_time).expect("the new holder's acquireTime").0;
    let took = converged(&ns, "after the takeover").await;
    println!("leader SIGSTOP during the convergence of {MANY} Foos: converged {took:?} after the takeover");
    assert!(took < CONVERGENCE_BOUND, "converging took {took:?}");
    assert_eq!(metric(survivor, DEPLOY_LEADER_SERIES).await, Some(1.0));

    // What a request sent before the pause and answered after it would be:
    // a write with the old leader's own token, refused by the API server.
    let old_pod = pods.iter().find(|p| p.name_any() == old).unwrap();
    let status = json!({ "status": { "availableReplicas": 0 } });
    let late = Api::<Foo>::namespaced(pod_client(old_pod).await, &ns.name)
        .patch_status("foo-0", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect_err("the API server must refuse the old leader's pod");
    assert!(late.to_string().contains(FENCE_POLICY), "{late}");

    // Resumed, it finds its renewal past the deadline and exits, to come
    // back as a standby.
    signal(paused, "-CONT");
    let resumed = Timestamp::now();
    let started = Instant::now();
    let exited = loop {
        if let Some(status) = paused.child.try_wait().expect("wait for the old leader") {
            break status;
        }
        assert!(started.elapsed() < TIMEOUT, "the resumed old leader never exited");
        // A child process's exit has no watch: polled.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!exited.success(), "it exits non-zero, having lost the lease: {exited:?}");
    // What the operator sent (its User-Agent: not the write above), by pod.
    let requests = audited(&ns.name, USER_AGENT);
    let by_old: Vec<_> = requests.iter().filter(|r| r.pod.as_deref() == Some(old.as_str())).collect();
    assert!(!by_old.is_empty(), "the audit log names the old leader's pod");
    let late: Vec<_> = by_old.iter().filter(|r| r.at > took_over && WRITES.contains(&r.verb.as_str())).collect();
    // Its own fence: each write is made only while the fence holds, and it
    // did not when the old leader resumed; what can still arrive is a
    // request that had passed its check when the pause came — at most one
    // per worker and one Event, sent the moment it resumed.
    let in_flight_at_most = 16 + 1;
    let after_resuming = late.iter().filter(|r| r.at > resumed + std::time::Duration::from_secs(1)).count();
    assert!(
        late.len() <= in_flight_at_most && after_resuming == 0,
        "the old leader ({old}) went on writing after {new} took over: {late:?}"
    );
    // The API server's fence: none of it admitted.
    let admitted: Vec<_> = late.iter().filter(|r| r.code.is_none_or(|c| c < 400)).collect();
    println!("old leader's writes after the takeover: {} sent, {} admitted", late.len(), admitted.len());
    assert!(
        admitted.is_empty(),
        "the API server admitted writes of {old}'s replica after {new} took over: {admitted:?}"
    );
}

/// A leader whose every write the API server's fence refuses — its Role
/// lacks LeaderFences (deploy/'s binary upgraded without its RBAC), and the
/// LeaderFence names the other replica — says so where on-call looks: an
/// ERROR once a lease duration has passed, the refusal's gauge past the
/// threshold of SampleControllerLeaderFenceRefuses, and the unsynced Foo in
/// SampleControllerFoosNotSynced's gauges (deploy/monitoring; the alerts'
/// timing is tested with promtool, tests/alerts).
#[tokio::test]
async fn a_leader_the_fence_refuses_for_good_says_so_in_an_error_and_in_the_alerts_gauges() {
    let _one = ONE_AT_A_TIME.lock().await;
    let pods = install_deploy().await;
    let _lease = FreshLease::new();
    let _role_back = ApplyOnDrop("deploy/04-leader-election-role.yaml");
    let without_fences =
        r#"[{"op":"test","path":"/rules/1/resources/0","value":"leaderfences"},{"op":"remove","path":"/rules/1"}]"#;
    kubectl_ok(&[
        "-n",
        DEPLOY_NS,
        "patch",
        "role",
        "sample-controller-leader-election",
        "--type=json",
        "-p",
        without_fences,
    ]);
    let other = format!("{}_1", pods[1].name_any());
    let fence = LeaderFence::naming(None, DEPLOY_LEASE, Some(&other));
    let fences: Api<LeaderFence> = Api::namespaced(admin_client().await, DEPLOY_NS);
    fences.create(&PostParams::default(), &fence).await.expect("the LeaderFence naming the other replica");
    let ns = TestNamespace::new("chaos-refused").await;
    let leader = spawn_replica(&ns.name, &pods[0], LEASE).await;
    wait_until("the replica leading", TIMEOUT, || async {
        (metric(&leader, DEPLOY_LEADER_SERIES).await == Some(1.0)).then_some(())
    })
    .await;
    create_one_foo(&ns, "refused").await;

    let log = format!("{}/{}-{}.log", env!("CARGO_TARGET_TMPDIR"), ns.name, pods[0].name_any());
    wait_until("the ERROR saying the fence refuses this leader", TIMEOUT, || async {
        let log = std::fs::read_to_string(&log).ok()?;
        log.lines()
            .find(|l| l.contains(" ERROR ") && l.contains("leader fence has refused every write"))
            .map(str::to_owned)
    })
    .await;
    // SampleControllerLeaderFenceRefuses: `> 60` seconds.
    let refused = wait_until("a minute of refusals", Duration::from_secs(120), || async {
        metric(&leader, "sample_controller_leader_fence_refused_seconds").await.filter(|s| *s > 60.0)
    })
    .await;
    let unsynced = metric(&leader, "sample_controller_unsynced_foos").await;
    let oldest = metric(&leader, "sample_controller_unsynced_foo_oldest_seconds").await.unwrap_or_default();
    println!("refused for {refused} s; unsynced Foos {unsynced:?}, the oldest for {oldest} s");
    assert_eq!(unsynced, Some(1.0), "the Foo the leader cannot write is unsynced");
    assert!(oldest >= 50.0, "it has waited since its creation: {oldest} s");
    assert!(deployment(&ns, "refused").await.is_none(), "no write of the refused leader was admitted");
}

#[tokio::test]
async fn foo_edits_made_while_the_operator_is_down_are_picked_up_on_restart() {
    let _one = ONE_AT_A_TIME.lock().await;
    let ns = TestNamespace::new("chaos-down").await;
    let mut op = operator(&ns, "before", &[]).await;
    create_foos(&ns, 20).await;
    converged(&ns, "before the edits").await;
    signal(&op, "-TERM");
    op.child.wait().unwrap();

    for i in 0..10 {
        set_replicas(&ns, &format!("foo-{i}"), 10 - i).await;
    }
    let rename = json!({ "spec": { "deploymentName": "renamed" } });
    ns.api::<Foo>().patch("foo-10", &PatchParams::default(), &Patch::Merge(&rename)).await.unwrap();
    for name in ["foo-11", "foo-12"] {
        delete_deployment(&ns, name).await;
    }
    ns.api::<Foo>().delete("foo-13", &DeleteParams::background()).await.unwrap();
    create_one_foo(&ns, "late").await;

    let _op = operator(&ns, "after", &[]).await;
    let took = converged(&ns, "after the restart").await;
    println!("Foo edits made while the operator was down: in place {took:?} after its restart");
    assert!(took < CONVERGENCE_BOUND, "took {took:?}");
    assert!(deployment(&ns, "foo-10").await.is_none(), "the renamed Foo's old Deployment is removed");
}

async fn create_one_foo(ns: &TestNamespace, name: &str) {
    create_foo(&ns.api(), name, name, Some(2)).await;
}
