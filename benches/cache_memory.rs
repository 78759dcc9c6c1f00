//! Where a Foo's bytes go in the controller's caches: N Foos and their
//! Deployments, as the API server sends them (with their managedFields and
//! timestamps), decoded as the watches decode them and kept as the caches
//! keep them, every allocation counted. No control plane: what it measures
//! is the caches alone (the Foos and the Deployments in our own stores, the
//! Deployments' index by controller included), beside the trimmed object
//! alone (what kube-runtime's reflector store would keep, in an `Arc`).
//!
//!   cargo bench --bench cache_memory -- <N>
//!
//! Counted are the bytes asked of the allocator; the allocator rounds each
//! block up to its size class, which the benchmark's RSS includes
//! (`hack/bench.sh` prints that, for the whole process).

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicIsize, Ordering};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::runtime::watcher::Event;
use sample_controller::Foo;
use sample_controller::testing::api::{DeploymentView, FooWire, Shard, desired_deployment};
use sample_controller::testing::cache::{
    DeploymentCache, DeploymentStore, FooCache, FooStore, Keep, filled, trim_deployment, trim_foo,
};
use serde_json::{Value, json};

/// Counts the bytes and blocks live, then asks the operator's allocator.
struct Counting;

static ALLOCATOR_BELOW: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);

#[allow(clippy::cast_possible_wrap)] // no allocation is past isize::MAX
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { ALLOCATOR_BELOW.alloc(layout) };
        if !block.is_null() {
            BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { ALLOCATOR_BELOW.dealloc(block, layout) };
        BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { ALLOCATOR_BELOW.realloc(block, layout, new_size) };
        if !moved.is_null() {
            BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        moved
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes and blocks live now.
fn live() -> (isize, isize) {
    (BYTES.load(Ordering::Relaxed), BLOCKS.load(Ordering::Relaxed))
}

/// A Foo as the API server sends it once synced: what any write adds to its
/// metadata (a managedFields entry per writer, timestamps) and its status.
fn foo_json(i: usize) -> Value {
    let name = format!("foo-{i:06}");
    json!({
        "apiVersion": "samplecontroller.k8s.io/v1alpha1",
        "kind": "Foo",
        "metadata": {
            "name": name, "namespace": "bench", "uid": format!("5f0c2a4e-8d3b-4c1a-9e2f-{i:012}"),
            "resourceVersion": format!("{}", 1_000_000 + i), "generation": 1,
            "creationTimestamp": "2026-11-27T00:00:00Z",
            "managedFields": [managed_field("kubectl-client-side-apply"), managed_field("sample-controller")],
        },
        "spec": { "deploymentName": name, "replicas": 1 },
        "status": {
            "availableReplicas": 1, "observedGeneration": 1,
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "Synced", "message": "Foo synced successfully",
                "observedGeneration": 1, "lastTransitionTime": "2026-11-27T00:00:01Z",
            }],
        },
    })
}

fn managed_field(manager: &str) -> Value {
    json!({ "manager": manager, "operation": "Update", "apiVersion": "v1", "time": "2026-11-27T00:00:01Z",
            "fieldsType": "FieldsV1", "fieldsV1": { "f:spec": { "f:replicas": {}, "f:deploymentName": {} } } })
}

/// The Deployment the Foo owns, as the API server sends it: the desired one
/// with the API server's metadata and a status.
fn deployment_json(foo: &Foo, i: usize) -> Value {
    let desired: Deployment = desired_deployment(foo, &Default::default()).expect("a Foo that can own a Deployment");
    let mut d = serde_json::to_value(desired).expect("a Deployment serializes");
    let meta = &mut d["metadata"];
    meta["uid"] = json!(format!("9a1b7c3d-2e4f-4a5b-8c6d-{i:012}"));
    meta["resourceVersion"] = json!(format!("{}", 2_000_000 + i));
    meta["generation"] = json!(1);
    meta["creationTimestamp"] = json!("2026-11-27T00:00:00Z");
    meta["annotations"] = json!({ "deployment.kubernetes.io/revision": "1" });
    meta["managedFields"] = json!([managed_field("sample-controller"), managed_field("kube-controller-manager")]);
    d["status"] = json!({ "replicas": 1, "availableReplicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                          "observedGeneration": 1 });
    d
}

/// What a cache of the objects `decode` makes costs, per object: in all
/// (from their decoding on), and, beside it, the trimmed object alone in
/// the block an `Arc` gives it (what kube-runtime's store would keep).
struct Cost {
    total: f64,
    objects: f64,
    blocks: f64,
}

async fn cost<K, S, T>(decode: impl Fn() -> Vec<K>, trim: impl Fn() -> T) -> Cost
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    S: Keep<K>,
    T: Fn(&mut K) + Send + Sync + 'static,
{
    let before = live();
    let mut trimmed = decode();
    trimmed.iter_mut().for_each(trim());
    let n = trimmed.len() as f64;
    let in_vec = (trimmed.capacity() * std::mem::size_of::<K>()) as f64;
    // An `Arc`'s block: the object and two counters.
    let objects = (live().0 - before.0) as f64 - in_vec + n * (std::mem::size_of::<K>() + 16) as f64;
    drop(trimmed);

    let before = live();
    let cache = filled::<K, S>(decode(), trim()).await;
    let (bytes, blocks) = (live().0 - before.0, live().1 - before.1);
    drop(cache);
    Cost { total: bytes as f64 / n, objects: objects / n, blocks: blocks as f64 / n }
}

fn report(what: &str, cost: &Cost) {
    println!(
        "  {what}: {:.0} B per object in {:.1} blocks (the trimmed object alone, in an Arc: {:.0} B)",
        cost.total, cost.blocks, cost.objects,
    );
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // cargo passes `--bench` before the arguments.
    let n = std::env::args().skip(1).find(|a| a != "--bench").ok_or("usage: cache_memory <N>")?;
    let n: usize = n.parse()?;
    let shard = Shard::all();
    let foos = || -> Vec<Foo> {
        (0..n).map(|i| Foo::from(serde_json::from_value::<FooWire>(foo_json(i)).expect("a Foo decodes"))).collect()
    };
    let deployments = || -> Vec<DeploymentView> {
        let owners = foos();
        let decode = |(i, foo)| serde_json::from_value(deployment_json(foo, i)).expect("a Deployment decodes");
        owners.iter().enumerate().map(decode).collect()
    };
    let foo_cost = cost::<_, FooStore, _>(foos, || trim_foo(&shard)).await;
    let deployment_cost = cost::<_, DeploymentStore, _>(deployments, || trim_deployment(&shard)).await;
    println!("the controller's caches, {n} Foos and their Deployments, bytes asked of the allocator:");
    report("Foos", &foo_cost);
    report("Deployments", &deployment_cost);
    let total = foo_cost.total + deployment_cost.total;
    println!(
        "  in all: {total:.0} B per Foo ({:.2} KiB) in {:.1} blocks; sizes: Foo {} B, DeploymentView {} B, ObjectMeta {} B",
        total / 1024.0,
        foo_cost.blocks + deployment_cost.blocks,
        std::mem::size_of::<Foo>(),
        std::mem::size_of::<DeploymentView>(),
        std::mem::size_of::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(),
    );
    resident(n, &shard).await;
    Ok(())
}

/// A page of a list, as the watch's events (between its `Init` and
/// `InitDone`).
fn listed<K>(page: Vec<K>) -> impl futures::Stream<Item = kube::runtime::watcher::Result<Event<K>>> {
    futures::stream::iter(page.into_iter().map(|o| Ok(Event::InitApply(o))))
}

/// Resident memory: what the kernel counts, the allocator's rounding and
/// what it keeps around the live blocks included.
fn rss() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0.0);
    pages * 4096.0
}

/// Both caches filled as the watches fill them, a page of 500 decoded and
/// stored at a time, and what that leaves resident once the allocator has
/// returned what it freed (its background thread purges within seconds).
async fn resident(n: usize, shard: &Shard) {
    const PAGE: usize = 500;
    let settle = std::time::Duration::from_secs(25);
    tokio::time::sleep(settle).await;
    let (before, asked) = (rss(), live().0);
    let foos = FooCache::new(trim_foo(shard));
    let deployments = DeploymentCache::new(trim_deployment(shard));
    foos.reflect(futures::stream::iter([Ok(Event::Init)])).for_each(|_| async {}).await;
    deployments.reflect(futures::stream::iter([Ok(Event::Init)])).for_each(|_| async {}).await;
    for start in (0..n).step_by(PAGE) {
        let page: Vec<Foo> = (start..n.min(start + PAGE))
            .map(|i| Foo::from(serde_json::from_value::<FooWire>(foo_json(i)).expect("a Foo decodes")))
            .collect();
        let views: Vec<DeploymentView> = page
            .iter()
            .zip(start..)
            .map(|(foo, i)| serde_json::from_value(deployment_json(foo, i)).expect("a Deployment decodes"))
            .collect();
        foos.reflect(listed(page)).for_each(|_| async {}).await;
        deployments.reflect(listed(views)).for_each(|_| async {}).await;
    }
    foos.reflect(futures::stream::iter([Ok(Event::InitDone)])).for_each(|_| async {}).await;
    deployments.reflect(futures::stream::iter([Ok(Event::InitDone)])).for_each(|_| async {}).await;
    let filled = live().0 - asked;
    tokio::time::sleep(settle).await;
    let grown = rss() - before;
    println!(
        "  resident, filled a page at a time and {}s later: {:.0} B per Foo, for {:.0} B asked ({:.2}x)",
        settle.as_secs(),
        grown / n as f64,
        filled as f64 / n as f64,
        grown / filled as f64,
    );
    drop((foos, deployments));
}
