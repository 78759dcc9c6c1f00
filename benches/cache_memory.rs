//! Where a Foo's bytes go in the controller's caches: N Foos and their
//! Deployments, as the API server sends them (with their managedFields and
//! timestamps), decoded as the watches decode them and kept as the caches
//! keep them, every allocation counted. No control plane: what it measures
//! is the caches alone (the Foos in kube-runtime's reflector store: a key
//! per object, an `Arc` each, a hash map; the Deployments in our own store
//! and its index by controller), beside the trimmed object alone.
//!
//!   cargo bench --bench cache_memory -- <N>
//!
//! Counted are the bytes asked of the allocator; the allocator rounds each
//! block up to its size class, which the benchmark's RSS includes
//! (`hack/bench.sh` prints that, for the whole process).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use k8s_openapi::api::apps::v1::Deployment;
use sample_controller::Foo;
use sample_controller::testing::api::{DeploymentView, FooWire, Shard, desired_deployment};
use sample_controller::testing::cache::{DeploymentStore, FooStore, Keep, filled, trim_deployment, trim_foo};
use serde_json::{Value, json};

/// Counts the bytes and blocks live, then asks the system allocator.
struct Counting;

static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);

#[allow(clippy::cast_possible_wrap)] // no allocation is past isize::MAX
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
            BLOCKS.fetch_add(1, Ordering::Relaxed);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(block, layout) };
        BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        BLOCKS.fetch_sub(1, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { System.realloc(block, layout, new_size) };
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
    Ok(())
}
