//! The names a sync puts on the wire: labels, event reasons and messages,
//! condition types. Kept in one place so the
//! docs, the tests and the code cannot drift apart, and so they match
//! upstream sample-controller where upstream has a name for the same thing.
//! Other names live with what they name: the Foo schema's validation
//! messages in [`crate::api::foo`], the client's field manager and
//! User-Agent in [`crate::client`], metric names in
//! [`crate::observe::metrics`] and [`crate::observe::queue_metrics`].

/// `reportingController` of emitted Events.
pub const CONTROLLER_NAME: &str = "sample-controller";

/// Labels of the Deployment, its selector and its pods — upstream's.
pub(crate) const LABEL_APP: &str = "app";
pub(crate) const LABEL_APP_VALUE: &str = "nginx";
pub(crate) const LABEL_CONTROLLER: &str = "controller";

/// Beyond upstream: a label on the Deployment's own metadata (not on the
/// selector or pods, so adding it never rolls pods) that lets the controller
/// watch only the Deployments it made instead of every Deployment in the
/// cluster.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_MANAGED_BY_VALUE: &str = "sample-controller";

/// Container of the Deployment — upstream's.
pub(crate) const CONTAINER_NAME: &str = "nginx";
pub const CONTAINER_IMAGE: &str = "nginx:latest";

/// Event reason when a sync made a change; upstream's `SuccessSynced`.
pub const REASON_SYNCED: &str = "Synced";
/// Event message for [`REASON_SYNCED`]; upstream's `MessageResourceSynced`.
pub(crate) const MESSAGE_SYNCED: &str = "Foo synced successfully";

/// Event reason when the Deployment exists but another owner controls it;
/// upstream's `ErrResourceExists`.
pub(crate) const REASON_RESOURCE_EXISTS: &str = "ErrResourceExists";

/// Upstream's `MessageResourceExists`: `Resource %q already exists and is not
/// managed by Foo`.
pub(crate) fn message_resource_exists(deployment_name: &str) -> String {
    format!("Resource {deployment_name:?} already exists and is not managed by Foo")
}

/// Event reason for a Foo whose spec cannot be acted on (an empty
/// deploymentName is only possible under an older CRD without validation).
pub(crate) const REASON_INVALID_SPEC: &str = "InvalidSpec";
pub(crate) const MESSAGE_EMPTY_DEPLOYMENT_NAME: &str =
    "spec.deploymentName must be set to the name of the Deployment this Foo owns";

/// Event reason when a Deployment this Foo controlled under its previous
/// `spec.deploymentName` is deleted.
pub(crate) const REASON_DELETED_OLD: &str = "DeletedOldDeployment";
pub(crate) fn message_deleted_old(deployment_name: &str) -> String {
    format!("Deleted Deployment {deployment_name:?}, which this Foo no longer names")
}

/// Event reason when the adoption pass left alone a Deployment this Foo
/// controls under a name it no longer gives (upstream leaves those running).
pub const REASON_NOT_ADOPTED: &str = "OldDeploymentNotAdopted";
pub fn message_not_adopted(deployment_name: &str) -> String {
    format!(
        "Deployment {deployment_name:?} is controlled by this Foo but not named by spec.deploymentName: \
         it was left running, unmanaged; delete it when it is no longer needed \
         (kubectl delete deployment {deployment_name})"
    )
}

/// Event `action` fields (the Events API requires one; not shown by kubectl).
pub(crate) const ACTION_RECONCILE: &str = "Reconcile";

/// The one condition a Foo carries: `Ready` is True when its Deployment is
/// ours and has the desired replicas, so `kubectl wait --for=condition=Ready`
/// works.
pub const CONDITION_READY: &str = "Ready";

/// Reasons of the `Ready` condition besides the event reasons above.
pub(crate) const REASON_AVAILABLE: &str = "Available";
pub(crate) const REASON_PROGRESSING: &str = "Progressing";

/// The ValidatingAdmissionPolicy of deploy/11-leader-fence-policy.yaml: the API
/// server names it in every refusal of its ("ValidatingAdmissionPolicy
/// '<name>' with binding '<name>' denied request: ..."), which is how the
/// operator tells a refusal by the fence from any other.
pub const FENCE_POLICY: &str = "sample-controller-leader-fence";

/// The pod's name, set from the downward API in deploy/: the start of the
/// Lease's holder identity, which the fence matches with the pod the
/// request's token is bound to.
pub const POD_NAME_ENV: &str = "POD_NAME";
