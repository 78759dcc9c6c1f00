//! `LeaderFence`, `samplecontroller.k8s.io/v1alpha1`: the parameter of the
//! API server's leader fence (deploy/11-leader-fence-policy.yaml). One per
//! Lease, of the Lease's name and namespace; it names the replica that
//! leads. The Lease stays the election's lock; a replica that takes it
//! writes its identity here once, conditionally on the resourceVersion it
//! read, before its first write as the leader (`leader::Elector`).
//!
//! Why not the Lease itself: the API server reads a built-in parameter kind
//! through its shared informer, which it stops for good once no binding
//! names that kind for one policy refresh (Kubernetes issue 130887); a
//! `kubectl delete -f deploy/` and apply again then froze the fence's view
//! of the Lease until kube-apiserver restarted. A parameter kind of a CRD is
//! read through an informer of its own, started again with each binding.

use kube::CustomResource;
use kube::core::Status;
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
    // src/foo.rs's: kube-derive takes string literals only, not a const.)
    annotation(
        "api-approved.kubernetes.io",
        "unapproved, experimental-only; please get an approval from Kubernetes API reviewers if you're trying to develop a CRD in the *.k8s.io or *.kubernetes.io groups"
    ),
    doc = "Names the replica that holds the Lease of this name, for the API server's leader fence. Written by the operator's leader; not to be edited by hand.",
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.holderIdentity"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct LeaderFenceSpec {
    /// The Lease holder identity of the replica that leads: its pod's name,
    /// "_", a per-process suffix. Unset once it has released the Lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_identity: Option<String>,
}

impl LeaderFence {
    /// The holder it names; empty counts as none.
    pub fn holder(&self) -> Option<&str> {
        self.spec.holder_identity.as_deref().filter(|h| !h.is_empty())
    }

    /// `current` (as read, with its resourceVersion, which makes a write of
    /// the result conditional), or a new one named `name`, naming `holder`.
    pub fn naming(current: Option<LeaderFence>, name: &str, holder: Option<&str>) -> LeaderFence {
        let mut fence = current.unwrap_or_else(|| LeaderFence::new(name, LeaderFenceSpec::default()));
        fence.spec.holder_identity = holder.map(str::to_owned);
        fence
    }
}

/// Where the API server's fence stands for this replica, as its gauge
/// reports it (`sample_controller_leader_fence{state}`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FenceState {
    /// A standby, or a leader handing over: nothing to report.
    #[default]
    NotLeading,
    /// The LeaderFence names this leader.
    InPlace,
    /// Leading where no fence was installed when it took the Lease (no
    /// LeaderFence CRD, or no right to write one): nothing to claim.
    NotInstalled,
    /// Leading, but the LeaderFence does not name this leader: deleted (or
    /// its CRD), or naming another replica, and not claimed again yet. The
    /// API server's fence is open meanwhile (or refuses this leader).
    Open,
}

impl FenceState {
    /// The label value of the gauge.
    pub fn label(self) -> &'static str {
        match self {
            FenceState::NotLeading => "not_leading",
            FenceState::InPlace => "in_place",
            FenceState::NotInstalled => "not_installed",
            FenceState::Open => "open",
        }
    }
}

/// True when the API server answered that it serves no LeaderFences at all
/// (no CRD installed: `kubectl apply -f crds/` installs the Foo's alone), not
/// that one LeaderFence is missing. Two shapes, by whether the group is
/// served: without it, a Status "the server could not find the requested
/// resource"; with it (the Foo CRD serves samplecontroller.k8s.io), a bare
/// "404 page not found" that is no Status at all, which kube reports with
/// its own reason. A missing object is a Status of reason NotFound that
/// names it.
pub fn no_such_kind(status: &Status) -> bool {
    status.code == 404
        && (status.message.contains("could not find the requested resource") || status.reason != "NotFound")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_404(message: &str, reason: &str) -> Status {
        Status::failure(message, reason).with_code(404)
    }

    #[test]
    fn no_crd_reads_as_no_fence_whether_or_not_the_foo_crd_serves_the_group() {
        let group_missing = status_404("the server could not find the requested resource", "NotFound");
        assert!(no_such_kind(&group_missing));
        let group_served = status_404("404 page not found", "Failed to parse error data");
        assert!(no_such_kind(&group_served), "the Foo CRD alone installed: the API server's plain 404");
    }

    #[test]
    fn a_missing_leader_fence_object_is_not_a_missing_crd() {
        let object_missing =
            status_404(r#"leaderfences.samplecontroller.k8s.io "sample-controller" not found"#, "NotFound");
        assert!(!no_such_kind(&object_missing));
        let forbidden = Status::failure("forbidden", "Forbidden").with_code(403);
        assert!(!no_such_kind(&forbidden));
    }

    #[test]
    fn a_claim_keeps_the_resource_version_it_read_so_the_write_is_conditional() {
        let mut read = LeaderFence::new("sample-controller", LeaderFenceSpec { holder_identity: Some("old_1".into()) });
        read.metadata.resource_version = Some("42".into());
        let claimed = LeaderFence::naming(Some(read), "sample-controller", Some("new_2"));
        assert_eq!(claimed.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(claimed.holder(), Some("new_2"));
    }

    #[test]
    fn a_first_claim_creates_the_fence_of_the_lease_name() {
        let created = LeaderFence::naming(None, "sample-controller-shard-a-3d8dfb26", Some("me_1"));
        assert_eq!(created.metadata.name.as_deref(), Some("sample-controller-shard-a-3d8dfb26"));
        assert_eq!(created.metadata.resource_version, None);
        assert_eq!(created.holder(), Some("me_1"));
    }

    #[test]
    fn a_released_fence_names_nobody() {
        let released = LeaderFence::naming(None, "sample-controller", None);
        assert_eq!(released.holder(), None);
        let emptied = LeaderFence::naming(None, "sample-controller", Some(""));
        assert_eq!(emptied.holder(), None, "an empty holder is none, as a released Lease's");
    }
}
