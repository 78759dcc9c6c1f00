//! `LeaderFence`, `samplecontroller.k8s.io/v1alpha1`: the parameter of the
//! API server's leader fence (deploy/11-leader-fence-policy.yaml). One per
//! install, named after `--leader-election-id` in the Lease's namespace; it
//! names, under each Lease's name, the replica that leads it: the one
//! Lease of deploy/, or each shard's of artifacts/shards, so that the fence
//! admits the holder of any of them and nobody else. The Lease stays the
//! election's lock; a replica that takes it writes its identity here once,
//! conditionally on the resourceVersion it read, before its first write as
//! the leader (kube-lease-fence's `Elector`, which is given this resource's
//! kind; crdgen prints its CRD).
//!
//! Why not the Lease itself: the API server reads a built-in parameter kind
//! through its shared informer, which it stops for good once no binding
//! names that kind for one policy refresh (Kubernetes issue 130887); a
//! `kubectl delete -f deploy/` and apply again then froze the fence's view
//! of the Lease until kube-apiserver restarted. A parameter kind of a CRD is
//! read through an informer of its own, started again with each binding.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Who leads, as the API server's leader fence reads it.
// clippy reads the repeated `type_` of the printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "samplecontroller.k8s.io",
    version = "v1alpha1",
    kind = "LeaderFence",
    plural = "leaderfences",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    // As the Foo CRD: *.k8s.io groups are protected. (The same text as
    // src/api/foo.rs's: kube-derive takes string literals only, not a const.)
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, experimental-only; please get an approval from Kubernetes API reviewers if you're trying to develop a CRD in the *.k8s.io or *.kubernetes.io groups"
    ),
    doc = "Names the replica that holds each Lease of the operator, for the API server's leader fence. Written by the operator's leaders; not to be edited by hand.",
    printcolumn(name = "Holders", type_ = "string", json_path = ".spec.holders"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LeaderFenceSpec {
    /// By Lease name, the holder identity of the replica that leads it: its
    /// pod's name, "_", a per-process suffix. A Lease's entry goes once its
    /// holder has released it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holders: BTreeMap<String, String>,
}

impl LeaderFence {
    /// The holder it names for the Lease `lease`; empty counts as none.
    pub fn holder(&self, lease: &str) -> Option<&str> {
        self.spec.holders.get(lease).map(String::as_str).filter(|h| !h.is_empty())
    }
}
