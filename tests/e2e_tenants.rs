//! A tenant cannot make the operator's memory grow with what it writes: a
//! user with the built-in `edit` role in one namespace (which
//! deploy/10-foo-roles.yaml extends to Foos) fills Foos with finalizers and
//! Deployments with annotations, as much as the API server takes. The
//! caches keep only what a sync reads of each object, their paged lists
//! and the adoption pass's are decoded as they stream in (src/cache/mod.rs,
//! src/client/lists.rs, src/reconcile/adoption.rs), so two replicas
//! watching every namespace hold no more at their peak than without those
//! objects, and the takeover between them completes; and a replica started
//! among those objects, by paged or by streaming lists, holds no more at
//! its peak than one started without them.
//!
//! Its operators watch every namespace, so this binary runs alone
//! (.config/nextest.toml).

mod common;

use std::time::Duration;

use common::tenant::*;
use common::*;

/// How much higher a replica's peak may be than without those objects
/// (`Hoard::A_THIRD`, about 75 MiB of content): the objects as cached (50
/// Foos and 150 Deployments, a few hundred bytes each), the buffers that
/// grow to the largest event and response seen and stay grown (the watch's
/// line buffer, the pooled connections' read buffers: the leader's sixteen
/// workers received two-megabyte status write responses, decoded on as many
/// blocking threads), and allocator slack. Measured: the leader +16.0 to
/// +17.5 MiB (with a third of the objects or all of them: it is their size,
/// not their number), the standby +6.5 to +7.2, a replica started among
/// them +2 to +7; before the caches and the adoption pass read only what
/// they keep, +321 and +264, and a start by paged lists before they were
/// decoded as they stream, +181.
const MARGIN_MIB: f64 = 24.0;
/// The most memory `op` has held since it started (VmHWM), in MiB.
fn peak_mib(op: &Operator) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", op.child.id())).expect("the operator's status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib / 1024.0
}

/// Two replicas watching every namespace with streaming lists, as deploy/
/// runs them, contend for a Lease in `lease_ns`; `meanwhile` runs once one
/// leads (the tenant at work); once a Foo in `control` converges, the
/// leader is stopped and the standby must take over and converge another.
/// Each replica's peak memory, leader first.
async fn two_replicas_and_a_takeover(
    lease_ns: &TestNamespace,
    control: &TestNamespace,
    run: &str,
    meanwhile: impl Future<Output = ()>,
) -> [f64; 2] {
    let mut args = election_args(&lease_ns.name, LEASE);
    args.push("--streaming-lists".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let kubeconfig = kubeconfig_path();
    let mut ops = Vec::new();
    for name in ["a", "b"] {
        let log = format!("{}-{run}-{name}", lease_ns.name);
        ops.push(start_logged(cluster_wide_command(&kubeconfig, &args), &log).await);
    }
    let ops: [Operator; 2] = ops.try_into().unwrap_or_else(|_| unreachable!("two replicas"));
    let leader = one_leader(&[&ops[0], &ops[1]]).await;
    let [first, second] = ops;
    let (mut leader_op, standby_op) = if leader == 0 { (first, second) } else { (second, first) };
    meanwhile.await;
    converges(control, &format!("{run}-before")).await;
    let leader_peak = peak_mib(&leader_op);
    signal(&leader_op, "-TERM");
    exited_within(&mut leader_op, Duration::from_secs(10), "the leader to hand over and exit").await;
    wait_until("the standby to lead", TIMEOUT, || async {
        (metric(&standby_op, LEADER_SERIES).await? == 1.0).then_some(())
    })
    .await;
    // Its syncs wait for its adoption pass: a new Foo converging means the
    // pass is through.
    converges(control, &format!("{run}-after")).await;
    let standby_peak = peak_mib(&standby_op);
    // Handed over, so that the next pair finds the Lease released.
    let mut new_leader = standby_op;
    signal(&new_leader, "-TERM");
    exited_within(&mut new_leader, Duration::from_secs(10), "the new leader to hand over and exit").await;
    [leader_peak, standby_peak]
}

/// How a replica fills its caches: paged LISTs (kube-runtime's default, a
/// bare run's) or streaming lists (deploy/'s).
const LISTS: [(&str, &[&str]); 2] = [("paged lists", &[]), ("streaming lists", &["--streaming-lists"])];

/// One replica, without leader election, started now with `lists`: its
/// peak memory once it has listed (at least `foos` Foos cached, by its
/// gauge), adopted and converged a new Foo in `control`.
async fn started(control: &TestNamespace, run: &str, lists: &[&str], foos: usize) -> f64 {
    let log = format!("{}-{run}", control.name);
    let mut op = start_logged(cluster_wide_command(&kubeconfig_path(), lists), &log).await;
    converges(control, run).await;
    wait_until(&format!("{run}: at least {foos} Foos cached"), TIMEOUT, || async {
        (metric(&op, "sample_controller_cached_foos").await? >= foos as f64).then_some(())
    })
    .await;
    let peak = peak_mib(&op);
    signal(&op, "-TERM");
    exited_within(&mut op, Duration::from_secs(10), "the replica to exit").await;
    peak
}

/// Each way of listing, a replica's peak started without the tenant's
/// objects and among them.
async fn starts(control: &TestNamespace, run: &str, foos: usize) -> Vec<f64> {
    let mut peaks = Vec::new();
    for (i, (_, lists)) in LISTS.iter().enumerate() {
        peaks.push(started(control, &format!("{run}-start-{i}"), lists, foos).await);
    }
    peaks
}

/// Every Foo in `ns` gets its status written for its generation: the
/// leader saw each of them.
async fn all_synced(ns: &TestNamespace) {
    let foos = ns.api::<sample_controller::Foo>();
    wait_until("the tenant's Foos synced", CONVERGED_WITHIN, || async {
        let listed = foos.list(&Default::default()).await.ok()?.items;
        let synced =
            |f: &sample_controller::Foo| f.status.as_ref().and_then(|s| s.observed_generation) == f.metadata.generation;
        (!listed.is_empty() && listed.iter().all(synced)).then_some(())
    })
    .await;
}

/// Fails unless each peak of `after` is within [`MARGIN_MIB`] of `before`'s.
fn assert_within_margin(roles: &[&str], before: &[f64], after: &[f64]) {
    for (role, (before, after)) in roles.iter().zip(before.iter().zip(after)) {
        assert!(
            after - before <= MARGIN_MIB,
            "{role}: the peak grew from {before:.1} to {after:.1} MiB with the tenant's objects (at most +{MARGIN_MIB} MiB)"
        );
    }
}

#[tokio::test]
async fn a_tenants_big_objects_leave_each_replicas_peak_where_it_was_whether_it_saw_them_arrive_or_started_among_them()
{
    let (lease_ns, control) = (TestNamespace::new("tenants-lease").await, TestNamespace::new("tenants-control").await);
    let baseline = two_replicas_and_a_takeover(&lease_ns, &control, "baseline", async {}).await;
    let baseline_starts = starts(&control, "baseline", 1).await;

    let tenant_ns = TenantNamespace(TestNamespace::new("tenant").await);
    let tenant = tenant_of(&tenant_ns.0).await;
    let hoard = hoard(tenant, &tenant_ns.0.name, Hoard::A_THIRD);
    let hoarded = two_replicas_and_a_takeover(&lease_ns, &control, "hoarded", hoard).await;
    all_synced(&tenant_ns.0).await;
    let hoarded_starts = starts(&control, "hoarded", Hoard::A_THIRD.foos).await;
    remove(tenant_ns).await;

    println!("peak RSS, leader / standby: baseline {baseline:.1?} MiB, with the tenant's objects {hoarded:.1?} MiB");
    println!(
        "peak RSS of a start by {:?}: baseline {baseline_starts:.1?} MiB, among the tenant's objects {hoarded_starts:.1?} MiB",
        LISTS.map(|(how, _)| how)
    );
    assert_within_margin(&["the leader", "the standby"], &baseline, &hoarded);
    let started_by = LISTS.map(|(how, _)| format!("a replica started by {how}"));
    assert_within_margin(&started_by.each_ref().map(String::as_str), &baseline_starts, &hoarded_starts);
}
