//! Whether the API server confines the operator's ServiceAccount
//! (deploy/13-deployment-writes-policy.yaml, [`crate::api::confinement`]):
//! a server-side dry run of a create the confinement must refuse (the
//! operator's own Deployment for a made-up Foo, with a replica more than a
//! Foo may ask for) and of one it must admit (the same, as the operator
//! builds it). Nothing is written. The leader, when it runs as a
//! ServiceAccount (deploy/'s), asks at start and every
//! `--confinement-check-period` (two requests each time), and reports the
//! answer as `sample_controller_confinement{state}` and, when it is not
//! enforced, an ERROR; `sample-controller check` asks once, impersonating
//! the ServiceAccount.
//!
//! The answer is what counts, not the policy's objects: a binding deleted,
//! a policy edited, an overlay that renamed the ServiceAccount out of its
//! match, a mutating webhook that adds fields to the operator's creates —
//! each shows here as it is.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use kube::core::Status;
use tracing::{error, info};

use crate::api::confinement::CONFINEMENT_POLICY;
use crate::api::deployment::desired_deployment;
use crate::api::foo::{Foo, FooSpec, REPLICAS_MAX, REPLICAS_MIN};
use crate::api::shard::Shard;

/// The made-up Foo the two dry runs create a Deployment for. No Foo of this
/// uid exists: a dry run persists nothing, and admission does not look
/// owners up.
const PROBE_NAME: &str = "sample-controller-confinement-check";
const PROBE_UID: &str = "00000000-0000-4000-8000-000000c0ffee";

/// Where the docs send on-call when the confinement is not enforced.
pub(crate) const RUNBOOK: &str = "docs/operations.md#the-serviceaccounts-confinement-is-off";

/// How one dry run was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Admitted (201, or 409 AlreadyExists: the name taken, after admission).
    Admitted,
    /// Refused by the confinement (403 naming its policy).
    Confined(String),
    /// Refused otherwise, or failed: RBAC, the leader fence, the API server.
    Other(String),
}

/// The confinement's state, as the gauge's `state` label says it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// It refuses what it must and admits the operator's own writes.
    Enforced,
    /// It admitted a write it must refuse: not in force (the binding or the
    /// policy deleted, or not matching this ServiceAccount).
    Open,
    /// It refused the operator's own create: the operator cannot create
    /// Deployments (a mutating webhook adds fields, say).
    RefusesOwnWrites(String),
    /// The dry runs could not tell (RBAC, the fence, an API error).
    Unknown(String),
}

impl State {
    /// The label values of `sample_controller_confinement{state}`.
    pub(crate) const LABELS: [&'static str; 4] = ["enforced", "open", "refuses_own_writes", "unknown"];

    pub(crate) fn label(&self) -> &'static str {
        match self {
            State::Enforced => "enforced",
            State::Open => "open",
            State::RefusesOwnWrites(_) => "refuses_own_writes",
            State::Unknown(_) => "unknown",
        }
    }

    /// One line for a log or `sample-controller check`.
    pub(crate) fn describe(&self) -> String {
        match self {
            State::Enforced => format!(
                "enforced: the API server refused a create of {} replicas and admitted the operator's own",
                REPLICAS_MAX + 1
            ),
            State::Open => format!(
                "NOT enforced: the API server admitted a Deployment of {} replicas from the operator's ServiceAccount; \
                 its policy or binding ({CONFINEMENT_POLICY}) is deleted, or does not match this ServiceAccount \
                 (its name must contain sample-controller): kubectl apply -f deploy/",
                REPLICAS_MAX + 1
            ),
            State::RefusesOwnWrites(why) => {
                format!("refuses the operator's own Deployment creates, so no Foo gets a Deployment: {why}")
            }
            State::Unknown(why) => format!("cannot tell: {why}"),
        }
    }
}

/// The verdict of the two dry runs: `too_many` (a create the confinement
/// must refuse) and `as_built` (one it must admit).
pub(crate) fn verdict(too_many: &Answer, as_built: &Answer) -> State {
    match (too_many, as_built) {
        (Answer::Admitted, _) => State::Open,
        (_, Answer::Confined(why)) => State::RefusesOwnWrites(why.clone()),
        (Answer::Confined(_), Answer::Admitted) => State::Enforced,
        (Answer::Other(why), _) | (_, Answer::Other(why)) => State::Unknown(why.clone()),
    }
}

/// The two Deployments, for a made-up Foo in `namespace` carrying a value
/// of each label the shard's Deployments follow: (one of more replicas than
/// a Foo may ask for, one as the operator builds it).
pub(crate) fn probes(namespace: &str, shard: &Shard) -> (Deployment, Deployment) {
    let mut foo = Foo::new(PROBE_NAME, FooSpec { deployment_name: PROBE_NAME.into(), replicas: Some(REPLICAS_MIN) });
    foo.metadata.namespace = Some(namespace.to_owned());
    foo.metadata.uid = Some(PROBE_UID.to_owned());
    let followed = shard.keys().map(|k| (k.to_owned(), Some("check".to_owned()))).collect();
    // A made-up Foo has a uid and a name: desired_deployment builds one.
    let as_built = desired_deployment(&foo, &followed).unwrap_or_default();
    let mut too_many = as_built.clone();
    if let Some(spec) = too_many.spec.as_mut() {
        spec.replicas = Some(REPLICAS_MAX + 1);
    }
    (too_many, as_built)
}

/// Whether `status` is a refusal by the confinement: its policy named in
/// the message or in one of the causes (another policy, the leader fence,
/// may be the one the message names).
pub(crate) fn by_the_confinement(status: &Status) -> bool {
    let names = |text: &str| text.contains(CONFINEMENT_POLICY);
    status.code == 403
        && (names(&status.message)
            || status.details.as_ref().is_some_and(|d| d.causes.iter().any(|c| names(&c.message))))
}

/// One dry run of `deployment`'s create through `api`.
pub(crate) async fn dry_run(api: &Api<Deployment>, deployment: &Deployment) -> Answer {
    let params = PostParams { dry_run: true, ..PostParams::default() };
    match api.create(&params, deployment).await {
        Ok(_) => Answer::Admitted,
        Err(kube::Error::Api(s)) if s.is_already_exists() => Answer::Admitted,
        Err(kube::Error::Api(s)) if by_the_confinement(&s) => Answer::Confined(s.message),
        Err(kube::Error::Api(s)) => Answer::Other(format!("{} ({})", s.message, s.code)),
        Err(e) => Answer::Other(e.to_string()),
    }
}

/// Both dry runs, in `namespace`, and their verdict.
pub(crate) async fn probe(api: &Api<Deployment>, namespace: &str, shard: &Shard) -> State {
    let (too_many, as_built) = probes(namespace, shard);
    verdict(&dry_run(api, &too_many).await, &dry_run(api, &as_built).await)
}

/// Who the client is, as the API server knows it (a SelfSubjectReview,
/// which every user may make): the confinement judges ServiceAccounts
/// only, so a run as anyone else (`cargo run` with a user's kubeconfig)
/// has nothing to check.
pub(crate) async fn who_am_i(client: &kube::Client) -> kube::Result<String> {
    let review =
        Api::<SelfSubjectReview>::all(client.clone()).create(&PostParams::default(), &Default::default()).await?;
    Ok(review.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default())
}

/// Whether `user` is a ServiceAccount, which the confinement judges.
pub(crate) fn is_service_account(user: &str) -> bool {
    user.starts_with("system:serviceaccount:")
}

/// Probe now and every `period` for ever (only now if it is zero), through
/// `client` in `namespace`, reporting each state to `report` and logging
/// each change of state (an ERROR while the confinement is open or refuses
/// the operator's writes). A client that is no ServiceAccount probes
/// nothing, and says so once.
pub(crate) async fn keep_probing(
    client: kube::Client,
    namespace: String,
    shard: Shard,
    period: Duration,
    report: impl Fn(&State),
) {
    match who_am_i(&client).await {
        Ok(user) if !is_service_account(&user) => {
            info!(user = %user, "not a ServiceAccount: the ServiceAccount's confinement does not apply, and is not checked");
            return std::future::pending().await;
        }
        Ok(_) => {}
        // Probed all the same: the dry runs say what they find.
        Err(e) => info!(error = %e, "cannot tell who this client is; checking the ServiceAccount's confinement"),
    }
    let api: Api<Deployment> = Api::namespaced(client, &namespace);
    let mut last: Option<&'static str> = None;
    loop {
        let state = probe(&api, &namespace, &shard).await;
        report(&state);
        if last != Some(state.label()) {
            match &state {
                State::Enforced | State::Unknown(_) => info!(
                    namespace = %namespace, state = state.label(), "the ServiceAccount's confinement {}", state.describe()
                ),
                State::Open | State::RefusesOwnWrites(_) => error!(
                    namespace = %namespace, state = state.label(), runbook = RUNBOOK,
                    "the ServiceAccount's confinement {}", state.describe()
                ),
            }
            last = Some(state.label());
        }
        if period.is_zero() {
            return std::future::pending().await;
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::deployment::controlling_foo;

    fn confined() -> Answer {
        Answer::Confined("spec.replicas=11".into())
    }

    #[test]
    fn only_a_service_account_is_checked() {
        assert!(is_service_account("system:serviceaccount:ops:x-sample-controller"));
        assert!(!is_service_account("kubernetes-admin"));
        assert!(!is_service_account("system:serviceaccounts:ops"), "a group, not a user");
    }

    #[test]
    fn enforced_only_when_it_refuses_what_it_must_and_admits_the_operators_own() {
        assert_eq!(verdict(&confined(), &Answer::Admitted), State::Enforced);
        assert_eq!(verdict(&Answer::Admitted, &Answer::Admitted), State::Open, "binding deleted");
        assert_eq!(verdict(&Answer::Admitted, &confined()), State::Open, "open first: it is the alarm");
        assert_eq!(verdict(&confined(), &confined()).label(), "refuses_own_writes");
        let fenced = Answer::Other("the leader fence refused".into());
        assert_eq!(verdict(&confined(), &fenced).label(), "unknown");
        assert_eq!(verdict(&fenced, &Answer::Admitted).label(), "unknown");
    }

    #[test]
    fn the_probes_are_the_operators_own_deployment_and_the_same_with_a_replica_too_many() {
        let shard = Shard::parse("shard=a").unwrap();
        let (too_many, as_built) = probes("ops", &shard);
        let owner = controlling_foo(&as_built).expect("a controller ownerReference to a Foo");
        assert_eq!((owner.name.as_str(), owner.namespace.as_deref()), (PROBE_NAME, Some("ops")));
        assert_eq!(as_built.metadata.labels.as_ref().unwrap().get("shard").map(String::as_str), Some("check"));
        assert_eq!(as_built.spec.as_ref().unwrap().replicas, Some(REPLICAS_MIN));
        assert_eq!(too_many.spec.as_ref().unwrap().replicas, Some(REPLICAS_MAX + 1));
        let mut same = too_many.clone();
        same.spec.as_mut().unwrap().replicas = as_built.spec.as_ref().unwrap().replicas;
        assert_eq!(same, as_built, "nothing else differs");
    }

    #[test]
    fn a_refusal_is_the_confinements_when_its_policy_is_named_in_the_message_or_a_cause() {
        let message =
            format!("admission webhook denied: ValidatingAdmissionPolicy '{CONFINEMENT_POLICY}' with binding ...");
        assert!(by_the_confinement(&Status::failure(&message, "Forbidden").with_code(403)));
        let prefixed = "ValidatingAdmissionPolicy 'x-sample-controller-deployment-writes' with binding ...";
        assert!(by_the_confinement(&Status::failure(prefixed, "Forbidden").with_code(403)), "under a namePrefix");
        let mut fence_first =
            Status::failure("ValidatingAdmissionPolicy 'sample-controller-leader-fence' ...", "Forbidden")
                .with_code(403);
        assert!(!by_the_confinement(&fence_first));
        fence_first.details =
            Some(serde_json::from_value(serde_json::json!({ "causes": [{ "message": message }] })).unwrap());
        assert!(by_the_confinement(&fence_first), "the confinement's refusal among the causes");
        assert!(!by_the_confinement(&Status::failure(&message, "Conflict").with_code(409)));
    }
}
