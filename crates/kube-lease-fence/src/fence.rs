//! The API server's fence: one object of a custom resource of the user's
//! that names, under each Lease's name, the replica that leads it
//! (`spec.holders`); a ValidatingAdmissionPolicy of the user's refuses the
//! writes of any pod it does not name (the crate's README has both, as
//! templates). A new leader names itself in it, conditionally on the
//! resourceVersion it read, before its first write; the leader watches it
//! and claims it again when its name is deleted or edited there.

use std::time::Instant;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::Status;
use kube::runtime::watcher;
use tracing::{debug, info, warn};

use crate::elector::Elector;
use crate::watch::{Watches, states};

/// Where the API server's fence stands for this replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceState {
    /// A standby, or a leader handing over: nothing to report.
    #[default]
    NotLeading,
    /// The fence's object names this leader.
    InPlace,
    /// Leading where no fence was installed when it took the Lease (none
    /// configured, no CRD, or no right to write its object): nothing to
    /// claim.
    NotInstalled,
    /// Leading, but the fence's object does not name this leader: deleted
    /// (or its CRD), or naming another replica, and not claimed again yet.
    /// The API server's fence is open meanwhile (or refuses this leader).
    Open,
}

impl FenceState {
    /// The state as a metric's label value.
    pub fn label(self) -> &'static str {
        match self {
            FenceState::NotLeading => "not_leading",
            FenceState::InPlace => "in_place",
            FenceState::NotInstalled => "not_installed",
            FenceState::Open => "open",
        }
    }
}

/// The holder a fence's object names for the Lease `lease`
/// (`spec.holders.<lease>`); empty counts as none.
pub fn fence_holder<'a>(fence: &'a DynamicObject, lease: &str) -> Option<&'a str> {
    fence.data.get("spec")?.get("holders")?.get(lease)?.as_str().filter(|h| !h.is_empty())
}

/// How often a claim or a release is tried again at once after a Conflict:
/// the object is shared by every Lease fenced together, so another leader's
/// write of its own name is the usual cause, and reading again is enough.
const CONFLICT_RETRIES: usize = 3;

/// Whether `error` is the API server's fence refusing a write: a denial by
/// the ValidatingAdmissionPolicy named `policy` (403; 422 for a binding
/// whose `parameterNotFoundAction` is `Deny` and finds no fence object).
/// Then call [`WriteGate::doubt`](crate::WriteGate::doubt): the policy's view
/// of the Lease may lag behind a takeover, or the Lease is someone else's.
pub fn is_fence_refusal(error: &kube::Error, policy: &str) -> bool {
    matches!(error, kube::Error::Api(s)
        if (s.code == 403 || s.code == 422) && s.message.contains(&format!("ValidatingAdmissionPolicy '{policy}'")))
}

/// True when the API server answered that it serves no objects of the fence's kind at all
/// (no CRD installed), not
/// that one LeaderFence is missing. Two shapes, by whether the group is
/// served: without it, a Status "the server could not find the requested
/// resource"; with it (another CRD of the group is installed), a bare
/// "404 page not found" that is no Status at all, which kube reports with
/// its own reason. A missing object is a Status of reason NotFound that
/// names it.
pub fn no_such_kind(status: &Status) -> bool {
    status.code == 404
        && (status.message.contains("could not find the requested resource") || status.reason != "NotFound")
}

impl<W: Watches> Elector<W> {
    /// The LeaderFence as a watch of it reports it, while a fence is
    /// installed: none to watch (and no request made) where there was none
    /// to claim.
    pub(crate) fn fence_changes(&self) -> futures::stream::BoxStream<'static, FenceSeen> {
        let Some(api) = self.fences.clone().filter(|_| !matches!(self.claim, Claim::NoFence)) else {
            return futures::stream::pending().boxed();
        };
        let wc = watcher::Config::default().fields(&format!("metadata.name={}", self.fence_name()));
        fence_states(&self.watches, api, wc, self.cfg.lease_name.clone()).boxed()
    }

    /// What the fence watch reports, while leading: a LeaderFence that no
    /// longer names this leader (deleted, or edited to name another
    /// replica) is claimed again at the next renewal, within a retry
    /// period; one whose CRD was deleted, once the CRD is served again.
    /// Until then the gauge says the fence is open.
    pub(crate) fn saw_fence(&mut self, seen: FenceSeen) {
        let (name, kind) = (&self.fence_name(), self.kind());
        match (&self.claim, seen) {
            (Claim::Written(_), FenceSeen::Names(Some(h))) if h == self.cfg.identity => return,
            (Claim::Written(_), FenceSeen::Names(Some(other))) => {
                warn!(fence = %name, holder = %other, "the {kind} names another replica; claiming it again at the next renewal")
            }
            (Claim::Written(_), FenceSeen::Names(None)) => {
                warn!(fence = %name, "the {kind} was deleted, or no longer names this Lease's holder; claiming it again at the next renewal")
            }
            (Claim::Written(_), FenceSeen::NoKind) => {
                warn!(fence = %name, "the {kind} CRD was deleted: the API server's fence is open until it is installed again")
            }
            // Its CRD, deleted since this leader claimed it, is served again.
            (Claim::NoFence, FenceSeen::Names(_)) if self.claimed_once => {
                info!(fence = %name, "the {kind} CRD is installed again; claiming it at the next renewal")
            }
            _ => return,
        }
        self.start_claim();
        self.gate.set_state(FenceState::Open);
    }

    /// The fence's kind, as its user configured it, for the log.
    fn kind(&self) -> String {
        self.cfg.fence.as_ref().map_or_else(|| "fence".to_owned(), |fence| fence.resource.kind.clone())
    }

    /// The fence's object's name.
    fn fence_name(&self) -> String {
        self.cfg.fence.as_ref().map_or_else(String::new, |fence| fence.name.clone())
    }

    /// Claim the fence at the next renewal, if there is one to claim.
    pub(crate) fn start_claim(&mut self) {
        if self.fences.is_some() {
            self.claim = Claim::Pending;
        } else {
            self.no_fence();
        }
    }

    /// The fence's object `current` (as read, with its resourceVersion,
    /// which makes a write of the result conditional), or a new one, naming
    /// `holder` under the Lease's name (`None`: naming nobody there); what
    /// it names for other Leases is kept.
    fn naming(&self, current: Option<DynamicObject>, holder: Option<&str>) -> DynamicObject {
        let resource = self.cfg.fence.as_ref().map_or_else(|| ApiResource::erase::<Lease>(&()), |f| f.resource.clone());
        let mut fence = current.unwrap_or_else(|| DynamicObject::new(&self.fence_name(), &resource));
        if !fence.data["spec"].is_object() {
            fence.data["spec"] = serde_json::json!({});
        }
        if !fence.data["spec"]["holders"].is_object() {
            fence.data["spec"]["holders"] = serde_json::json!({});
        }
        let holders = &mut fence.data["spec"]["holders"];
        match holder {
            Some(holder) => holders[&self.cfg.lease_name] = holder.into(),
            None => {
                if let Some(map) = holders.as_object_mut() {
                    map.remove(&self.cfg.lease_name);
                }
            }
        }
        fence
    }

    /// After the Lease was taken or renewed at `attempt`: the fence holds
    /// once the API server's fence names this replica too, and no write is
    /// made before.
    pub(crate) async fn renewed_and_claimed(&mut self, attempt: Instant) {
        if self.claim_fence(attempt).await {
            self.gate.renewed(attempt, self.cfg.renew_deadline);
        } else {
            self.gate.unclaimed();
        }
    }

    /// Make the API server's fence name this replica, which holds the
    /// Lease, before its first write as the leader: the LeaderFence is read
    /// and written with the resourceVersion read, so a deposed leader that
    /// resumes between the two cannot overwrite a newer claim (its write
    /// fails with Conflict, and ours is tried again at the next renewal).
    /// Both requests are made within the renew deadline of `attempt` (the
    /// renewal they follow), as every write of a leader is. True once
    /// claimed, or when there is nothing to claim: no fence configured, no
    /// CRD of its kind (no fence installed), or no right to write one (an
    /// install without the fence; if a policy is bound after all, its
    /// refusals say so).
    /// False, logged, while a claim fails: the replica holds the Lease and
    /// writes nothing.
    async fn claim_fence(&mut self, attempt: Instant) -> bool {
        if !matches!(self.claim, Claim::Pending) {
            return true;
        }
        let Some(api) = self.fences.clone() else {
            self.no_fence();
            return true;
        };
        let (name, kind) = (self.fence_name(), self.kind());
        let left = self.cfg.renew_deadline.saturating_sub(attempt.elapsed());
        let Ok(outcome) = tokio::time::timeout(left, self.write_claim(&api, &name)).await else {
            warn!(fence = %name, "claiming the {kind} took past the renew deadline; claiming again at the next renewal");
            return false;
        };
        match outcome {
            Ok(written) => {
                info!(fence = %name, identity = %self.cfg.identity, "leader fence names this replica");
                self.claim = Claim::Written(Box::new(written));
                self.claimed_once = true;
                self.gate.set_state(FenceState::InPlace);
                true
            }
            Err(kube::Error::Api(s)) if no_such_kind(&s) => {
                info!(fence = %name, "no {kind} CRD in the cluster: no API server fence to claim");
                self.no_fence();
                true
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                warn!(fence = %name, error = %s.message, "may not write the {kind}: if the API server's leader fence is bound, it stays open while no {kind} exists, and refuses this replica's writes while one names another replica");
                self.no_fence();
                true
            }
            Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() || s.is_not_found() => {
                warn!(fence = %name, "the {kind} changed while this replica claimed it; claiming again at the next renewal");
                self.gate.set_state(FenceState::Open);
                false
            }
            Err(e) => {
                warn!(fence = %name, error = %e, "cannot claim the {kind}; writing nothing until it names this replica");
                self.gate.set_state(FenceState::Open);
                false
            }
        }
    }

    /// Nothing to claim: never installed, or gone since this leader claimed
    /// it (which the gauge reports as open).
    fn no_fence(&mut self) {
        self.claim = Claim::NoFence;
        let state = if self.claimed_once { FenceState::Open } else { FenceState::NotInstalled };
        self.gate.set_state(state);
    }

    /// The fence's object read, then written naming this replica under
    /// its Lease: replaced from the copy read (conditional on its
    /// resourceVersion), or created. Read and written again at once after
    /// a Conflict (another Lease's leader wrote its own name meanwhile),
    /// a few times: this replica holds the Lease, so nobody else may name
    /// itself under it.
    async fn write_claim(&self, api: &Api<DynamicObject>, name: &str) -> Result<DynamicObject, kube::Error> {
        let mut tries = 0;
        loop {
            let current = api.get_opt(name).await?;
            let exists = current.is_some();
            let ours = self.naming(current, Some(&self.cfg.identity));
            let params = self.post_params();
            let written =
                if exists { api.replace(name, &params, &ours).await } else { api.create(&params, &ours).await };
            match written {
                Err(kube::Error::Api(s)) if (s.is_conflict() || s.is_already_exists()) && tries < CONFLICT_RETRIES => {
                    tries += 1;
                }
                written => return written,
            }
        }
    }

    /// After a release: the fence's object names nobody under this Lease,
    /// as the Lease, unless the next leader claimed it already (each write
    /// is conditional on the copy it is made from, which must still name
    /// this replica). Errors are only logged: the next leader claims it
    /// anyway.
    pub(crate) async fn release_fence(&mut self) {
        let Claim::Written(ours) = std::mem::replace(&mut self.claim, Claim::Pending) else { return };
        let Some(api) = self.fences.clone() else { return };
        let name = self.fence_name();
        let mut current = Some(*ours);
        for _ in 0..=CONFLICT_RETRIES {
            let Some(copy) = current.take() else { break };
            if fence_holder(&copy, &self.cfg.lease_name) != Some(self.cfg.identity.as_str()) {
                debug!(fence = %name, "leader fence not released: claimed since");
                return;
            }
            let released = self.naming(Some(copy), None);
            match api.replace(&name, &self.post_params(), &released).await {
                Ok(_) => {
                    debug!(fence = %name, "leader fence released");
                    return;
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => current = api.get_opt(&name).await.ok().flatten(),
                Err(e) => {
                    debug!(fence = %name, error = %e, "leader fence not released (gone, or the API server failed)");
                    return;
                }
            }
        }
    }
}

/// Where this replica's claim on the fence stands.
#[derive(Debug)]
pub(crate) enum Claim {
    Pending,
    /// As the API server answered our write: what a release writes from.
    Written(Box<DynamicObject>),
    /// No fence to claim, or no right to claim it.
    NoFence,
}

/// What the leader's watch of its fence's object reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum FenceSeen {
    /// The holder it names (`None`: deleted, or released).
    Names(Option<String>),
    /// The API server serves no fence's objects: the CRD is gone.
    NoKind,
}

/// What the fence's object names under `lease`, as the watch sees it
/// ([`states`]); errors other than a missing CRD only logged.
fn fence_states<W: Watches>(
    watches: &W,
    api: Api<DynamicObject>,
    wc: watcher::Config,
    lease: String,
) -> impl Stream<Item = FenceSeen> + use<W> {
    states(watches, api, wc).filter_map(move |state| {
        std::future::ready(match state {
            Ok(fence) => {
                Some(FenceSeen::Names(fence.as_ref().and_then(|f| fence_holder(f, &lease)).map(str::to_owned)))
            }
            Err(watcher::Error::InitialListFailed(kube::Error::Api(s))) if no_such_kind(&s) => Some(FenceSeen::NoKind),
            Err(e) => {
                debug!(error = %e, "leader fence watch");
                None
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use kube::Client;

    use super::*;
    use crate::test_support::{config, dummy_client};

    #[tokio::test]
    async fn a_leader_of_a_cluster_without_the_fence_crd_claims_no_fence_and_writes() {
        // Another CRD of the group is installed, not the fence's: the API
        // server serves the group but no leaderfences, and answers the claim
        // with a bare "404 page not found", no Status.
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let server = tokio::spawn(async move {
            let mut paths = Vec::new();
            while let Some((request, reply)) = handle.next_request().await {
                paths.push(request.uri().path().to_owned());
                let body = kube::client::Body::from(b"404 page not found\n".to_vec());
                reply.send_response(http::Response::builder().status(404).body(body).unwrap());
            }
            paths
        });
        let mut e = Elector::new(Client::new(service, "default"), config("me")).unwrap();
        assert!(e.claim_fence(Instant::now()).await, "nothing to claim: the leader writes");
        assert!(matches!(e.claim, Claim::NoFence));
        assert!(e.claim_fence(Instant::now()).await, "and it asks no more");
        drop(e);
        let paths = server.await.unwrap();
        assert!(
            paths.iter().all(|p| p.ends_with("/leaderfences/install") || p.ends_with("/leaderfences")),
            "{paths:?}"
        );
        assert!(!paths.is_empty() && paths.len() <= 2, "one claim's requests, not one per renewal: {paths:?}");
    }

    /// An elector whose claim on the LeaderFence was written.
    fn claimed(identity: &str) -> Elector {
        let mut e = Elector::new(dummy_client(), config(identity)).unwrap();
        let written = e.naming(None, Some(identity));
        e.claim = Claim::Written(Box::new(written));
        e.claimed_once = true;
        e.gate.set_state(FenceState::InPlace);
        e
    }

    #[tokio::test]
    async fn a_leaderfence_deleted_or_naming_another_is_claimed_again_and_reported_open_meanwhile() {
        for seen in [FenceSeen::Names(None), FenceSeen::Names(Some("other_1".into())), FenceSeen::NoKind] {
            let mut e = claimed("me");
            e.saw_fence(seen.clone());
            assert!(matches!(e.claim, Claim::Pending), "{seen:?}: claimed again at the next renewal");
            assert_eq!(e.gate.state(), FenceState::Open, "{seen:?}");
        }
        let mut e = claimed("me");
        e.saw_fence(FenceSeen::Names(Some("me".into())));
        assert!(matches!(e.claim, Claim::Written(_)), "our own claim, as the watch delivers it");
        assert_eq!(e.gate.state(), FenceState::InPlace);
    }

    #[tokio::test]
    async fn a_fence_whose_crd_came_back_is_claimed_again_but_one_never_installed_is_not_an_alarm() {
        let mut deleted = claimed("me");
        deleted.no_fence();
        assert_eq!(deleted.gate.state(), FenceState::Open, "deleted since it was claimed");
        deleted.saw_fence(FenceSeen::NoKind);
        assert!(matches!(deleted.claim, Claim::NoFence), "still gone: nothing to claim yet");
        deleted.saw_fence(FenceSeen::Names(None));
        assert!(matches!(deleted.claim, Claim::Pending), "served again: claimed at the next renewal");

        let mut never = Elector::new(dummy_client(), config("me")).unwrap();
        never.no_fence();
        assert_eq!(never.gate.state(), FenceState::NotInstalled);
        never.saw_fence(FenceSeen::Names(None));
        assert!(matches!(never.claim, Claim::NoFence));
    }

    fn status_404(message: &str, reason: &str) -> Status {
        Status::failure(message, reason).with_code(404)
    }

    #[test]
    fn no_crd_reads_as_no_fence_whether_or_not_another_crd_serves_the_group() {
        let group_missing = status_404("the server could not find the requested resource", "NotFound");
        assert!(no_such_kind(&group_missing));
        let group_served = status_404("404 page not found", "Failed to parse error data");
        assert!(no_such_kind(&group_served), "another CRD of the group installed: the API server's plain 404");
    }

    #[test]
    fn a_missing_leader_fence_object_is_not_a_missing_crd() {
        let object_missing =
            status_404(r#"leaderfences.samplecontroller.k8s.io "sample-controller" not found"#, "NotFound");
        assert!(!no_such_kind(&object_missing));
        let forbidden = Status::failure("forbidden", "Forbidden").with_code(403);
        assert!(!no_such_kind(&forbidden));
    }

    #[tokio::test]
    async fn a_claim_keeps_the_resource_version_it_read_so_the_write_is_conditional() {
        let e = Elector::new(dummy_client(), config("me")).unwrap();
        let mut read = e.naming(None, Some("old_1"));
        read.metadata.resource_version = Some("42".into());
        let claimed = e.naming(Some(read), Some("new_2"));
        assert_eq!(claimed.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(fence_holder(&claimed, "l"), Some("new_2"));
    }

    #[tokio::test]
    async fn a_first_claim_creates_the_fence_object_naming_the_holder_under_its_lease() {
        let created = Elector::new(dummy_client(), config("me")).unwrap().naming(None, Some("me_1"));
        assert_eq!(created.metadata.name.as_deref(), Some("install"));
        assert_eq!(created.metadata.resource_version, None);
        assert_eq!((created.types.as_ref().map(|t| t.kind.as_str())), Some("LeaderFence"));
        assert_eq!(fence_holder(&created, "l"), Some("me_1"));
        assert_eq!(created.data["spec"]["holders"], serde_json::json!({ "l": "me_1" }));
    }

    #[tokio::test]
    async fn a_claim_or_a_release_keeps_what_the_object_names_for_other_leases() {
        let e = Elector::new(dummy_client(), config("me")).unwrap();
        let mut shared = e.naming(None, Some("old_1"));
        shared.data["spec"]["holders"]["shard-b"] = "b-pod_7".into();
        let claimed = e.naming(Some(shared), Some("me_2"));
        assert_eq!(claimed.data["spec"]["holders"], serde_json::json!({ "l": "me_2", "shard-b": "b-pod_7" }));
        let released = e.naming(Some(claimed), None);
        assert_eq!(released.data["spec"]["holders"], serde_json::json!({ "shard-b": "b-pod_7" }));
        assert_eq!(fence_holder(&released, "l"), None);
        assert_eq!(fence_holder(&released, "shard-b"), Some("b-pod_7"));
    }

    #[tokio::test]
    async fn a_released_fence_names_nobody() {
        let e = Elector::new(dummy_client(), config("me")).unwrap();
        assert_eq!(fence_holder(&e.naming(None, None), "l"), None);
        let emptied = e.naming(None, Some(""));
        assert_eq!(fence_holder(&emptied, "l"), None, "an empty holder is none, as a released Lease's");
    }
}
