//! A tenant cannot make the operator's memory grow with what it writes: a
//! user with the built-in `edit` role in one namespace (which
//! deploy/10-foo-roles.yaml extends to Foos) fills Foos with finalizers and
//! Deployments with annotations, as much as the API server takes. The
//! caches keep only what a sync reads of each object, and the adoption pass
//! decodes its list as it streams in (src/cache/mod.rs, src/reconcile/adoption.rs), so
//! two replicas watching every namespace hold no more at their peak than
//! without those objects, and the takeover between them completes.
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
/// workers received two-megabyte status write responses), and allocator
/// slack. Measured with three times the content (`Hoard::PAST_THE_LIMIT`):
/// the leader +16.0 to +16.4 MiB, the standby +6.5; before the caches and
/// the adoption pass read only what they keep, +321 and +264.
const MARGIN_MIB: f64 = 20.0;
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

#[tokio::test]
async fn a_tenants_finalizers_and_annotations_leave_both_replicas_peak_memory_where_it_was() {
    let (lease_ns, control) = (TestNamespace::new("tenants-lease").await, TestNamespace::new("tenants-control").await);
    let baseline = two_replicas_and_a_takeover(&lease_ns, &control, "baseline", async {}).await;

    let tenant_ns = TenantNamespace(TestNamespace::new("tenant").await);
    let tenant = tenant_of(&tenant_ns.0).await;
    let hoard = hoard(tenant, &tenant_ns.0.name, Hoard::A_THIRD);
    let hoarded = two_replicas_and_a_takeover(&lease_ns, &control, "hoarded", hoard).await;
    remove(tenant_ns).await;

    println!("peak RSS, leader / standby: baseline {baseline:.1?} MiB, with the tenant's objects {hoarded:.1?} MiB");
    for (role, (before, after)) in ["leader", "standby"].iter().zip(baseline.iter().zip(&hoarded)) {
        assert!(
            after - before <= MARGIN_MIB,
            "the {role}'s peak grew from {before:.1} to {after:.1} MiB with the tenant's objects (at most +{MARGIN_MIB} MiB)"
        );
    }
}
